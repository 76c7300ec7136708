"""The command line as a user meets it: bench, fit, compare, and their errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TINY = ["timing.min_run_time_s=0.006", "timing.min_runs=3", "timing.rounds=2", "timing.retries=0"]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "costmodel", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"})


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    done = _run("bench", f"profile.root={root / 'profiles'}", "bench.families=[sort,histogram,elementwise]",
                "hydra.run.dir=" + str(root / "bench_out"), *TINY, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def test_bench_writes_a_profile_with_ceilings(profile_root):
    (folder,) = (profile_root / "profiles").iterdir()
    ceilings = json.loads((folder / "ceilings.json").read_text())
    assert ceilings["peak_flops_per_s"] > 0 and ceilings["cold_call_overhead_s"] >= 0
    assert (folder / "measurements.csv").read_text().count("\n") > 20
    assert json.loads((folder / "provenance.json").read_text())[0]["suite"] == "quick"


def test_fit_reports_every_family_and_level(profile_root):
    done = _run("fit", f"profile.root={profile_root / 'profiles'}", "hydra.run.dir=" + str(profile_root / "fit_out"),
                cwd=profile_root)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((profile_root / "fit_out" / "fit_report.json").read_text())
    assert {"sort", "histogram", "elementwise", "all", "extrapolation"} <= set(report)
    assert set(report["elementwise"]) == {"L0", "L1", "L2", "L3"}
    assert set(report["elementwise"]["L3"]) == {"median_ape_pct", "p90_ape_pct", "max_ape_pct", "within_10pct",
                                                "spearman", "n_test", "noise_floor_median_ape_pct"}
    assert (profile_root / "fit_out" / "roofline.png").exists()


def test_compare_two_profiles(profile_root):
    (folder,) = (profile_root / "profiles").iterdir()
    out = profile_root / "stability.json"
    done = _run("compare", str(folder), str(folder), "--json", str(out), cwd=profile_root)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(out.read_text())["all"]["median_rel_diff_pct"] == 0.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "suite=huge"], "Could not find 'suite/huge'"),
        (["bench", "bench.families=[conv]"], "bench.families: unknown family 'conv'"),
        (["bench", "dtype=float8"], "dtype must be one of"),
        (["bench", "device=cuda"], "device='cuda' was asked for"),
        (["fit", "profile.root=does-not-exist"], "no profile for this device"),
        (["frobnicate"], "bench"),
    ],
)
def test_bad_input_is_a_clear_error(args, message, tmp_path):
    if args == ["bench", "device=cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = _run(*args, f"hydra.run.dir={tmp_path}" if args[0] in ("bench", "fit") else "--help", cwd=tmp_path)
    assert done.returncode != 0
    assert message in done.stderr + done.stdout
    if args[0] in ("bench", "fit") and "suite=huge" not in args:  # a bad value: one line, exit status 2
        assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout
        assert len((done.stderr + done.stdout).strip().splitlines()) == 1
