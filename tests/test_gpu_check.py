"""scripts/gpu_check.sh, proved on the CPU: its dry run in a venv with only the GPU image's packages.

The lent GPU machine has no hydra-core, omegaconf or antlr4 and no package index; the script
installs them from the carried wheel folder (.whl, ``make gpu-wheels``) with ``pip --no-index
--target``. The dry run does exactly that in an image-like venv (scripts/image_venv.py), then
runs every stage on the CPU with tiny sizes. Marked ``slow`` (a few minutes); CI runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from image_venv import make_image_venv  # noqa: E402

pytestmark = pytest.mark.slow
STAGES = ["preflight", "gpu_overrides", "gpu_tests", "torchrun", "bench", "fit", "moe_skew", "gnn_degree", "hf_moe", "pyg_conv",
          "moe_design", "gemm_same_flops", "mlp_batch"]


@pytest.fixture(scope="module")
def image_python(tmp_path_factory) -> Path:
    if not any((ROOT / ".whl").glob("*.whl")):
        pytest.fail("no wheels in .whl/: run `make gpu-wheels` first (CI does, in .ci/run)")
    return make_image_venv(tmp_path_factory.mktemp("image") / "venv", Path(sysconfig.get_paths()["purelib"]))


def _dry_run(python: Path, out: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environ.update(DRY_RUN="1", PY=str(python), OUT=str(out), PIP_NO_INDEX="1", **env)
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=2400)


def test_image_venv_lacks_what_the_image_lacks(image_python):
    for missing in ("hydra", "omegaconf", "antlr4", "sim"):
        probe = subprocess.run([str(image_python), "-c", f"import {missing}"], cwd="/", capture_output=True)
        assert probe.returncode != 0, f"{missing} must not be importable in the image venv"
    subprocess.run([str(image_python), "-c", "import torch, pandas, sklearn, scipy, matplotlib, rich, pytest"],
                   check=True, cwd="/")
    refused = subprocess.run([str(image_python), "-m", "pip", "download", "--no-deps", "-d", "/tmp", "hydra-core"],
                             capture_output=True, text=True)
    assert refused.returncode != 0  # pip there is pointed at no index


def test_dry_run_every_stage_survives_a_failing_one(image_python, tmp_path):
    out = tmp_path / "out"
    # one stage given a bad override must fail alone: the stages after it still run
    done = _dry_run(image_python, out, EXTRA_mlp_batch="mlp.batches=[0]")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wall = json.loads((out / "wall.json").read_text())
    status = {s["stage"]: s["status"] for s in wall["stages"]}
    assert [s["stage"] for s in wall["stages"]] == STAGES
    assert status.pop("mlp_batch") == "failed"
    assert set(status.values()) == {"ok"}, status
    assert all(s["wall_s"] > 0 and s["budget_s"] >= 20 for s in wall["stages"])
    # what comes back from the device: at most 8 files, everything else in one tarball
    assert len([p for p in out.rglob("*") if p.is_file()]) <= 8
    with tarfile.open(out / "gpu_results.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("measurements.csv") for n in names)
    assert any("/model_cache/" in n and n.endswith(".joblib") for n in names)  # the user's cache, not the profile
    assert not any(n.endswith("models.joblib") for n in names)
    for exp in ("moe_skew", "gnn_degree", "gemm_same_flops", "moe_design", "hf_moe", "pyg_conv"):
        assert f"./{exp}/summary.json" in names, names
    assert "./logs/mlp_batch.log" in names
    env = json.loads((out / "env.json").read_text())
    assert env["versions"]["hydra"] == "1.3.2"  # from the carried wheel, not from anywhere else


def test_a_stage_that_would_overrun_the_total_is_not_started_and_the_gpu_profile_seeds_the_run(image_python, tmp_path):
    out = tmp_path / "out"
    # budgets at 1x: preflight (30 s) and bench (60 s) fit in 100 s, moe_skew (180 s) does not
    done = _dry_run(image_python, out, STAGES="bench moe_skew", SCALE="1", TOTAL_S="100", SEED="1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    status = {s["stage"]: s["status"] for s in json.loads((out / "wall.json").read_text())["stages"]}
    assert status == {"preflight": "ok", "bench": "ok", "moe_skew": "no_time"}
    log = (out / "gpu_check.log").read_text()
    assert 'STAGES="moe_skew"' in log  # the rerun line for what was not started
    gpu_profiles = sorted(p.name for p in (ROOT / "profiles").glob("cuda-*") if (p / "fingerprint.json").exists())
    for name in gpu_profiles:  # the committed GPU profile travels into the run's profile root, and back
        assert f"seeded {name}" in log
        with tarfile.open(out / "gpu_results.tar.gz") as tar:
            assert f"./profiles/{name}/measurements.csv" in tar.getnames()
