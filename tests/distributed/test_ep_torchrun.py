"""scripts/ep_torchrun.py and scripts/gnn_partition_torchrun.py: the EP and partitioned GNN
layers under torchrun (the way onto Slurm, many hosts and GPUs), two gloo ranks on this host,
outputs equal to the single-device layers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sim.distributed.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ep_torchrun.py"
GNN_SCRIPT = ROOT / "scripts" / "gnn_partition_torchrun.py"
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


def test_two_partitioned_gnn_ranks_under_torchrun_equal_the_single_device_layer():
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={free_port()}", str(GNN_SCRIPT), "--nodes", "256", "--edges", "2048",
                           "--in-features", "8", "--out-features", "8", "--partitioner", "metis", "--device", "cpu",
                           "--repeats", "3", "--check", "--timeout-s", "60"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180, env=_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "output vs the single-device layer: max |diff|" in done.stdout
    assert re.search(r"partitioned GNN step on 2 ranks \(gloo, metis, rmat a 0.57\): [0-9.]+ ms median over 3 "
                     r"repeats, IQR [0-9.]+ ms; edge cut [1-9][0-9]*, halo rows received per rank \[[1-9]", done.stdout)


def test_asking_for_a_gpu_on_a_host_without_one_stops_before_any_group():
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    done = subprocess.run([sys.executable, str(GNN_SCRIPT), "--device", "cuda"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**_env(), "RANK": "0", "WORLD_SIZE": "1",
                                                      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    assert done.returncode != 0
    assert "--device cuda: this host has no CUDA device" in done.stderr
