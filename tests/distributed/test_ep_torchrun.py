"""scripts/ep_torchrun.py: the EP layer under torchrun (the way onto Slurm and many hosts),
two gloo ranks on this host, output equal to the single-device layer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sim.distributed.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ep_torchrun.py"
SMALL = ["--tokens", "16", "--d-model", "16", "--d-ff", "16", "--experts", "4", "--repeats", "3"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}


def test_two_ranks_under_torchrun_equal_the_single_device_layer():
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={free_port()}", str(SCRIPT), *SMALL, "--zipf", "2", "--check",
                           "--timeout-s", "60"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180, env=_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "output vs the single-device layer: max |diff|" in done.stdout
    assert "EP step on 2 ranks (gloo, contiguous, zipf 2.0)" in done.stdout


def test_without_a_launcher_it_says_how_to_start_it():
    done = subprocess.run([sys.executable, str(SCRIPT), *SMALL], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=_env())
    assert done.returncode != 0
    assert "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set" in done.stderr and "torchrun" in done.stderr
