"""The command line as a user meets it: bench, fit, compare, and their errors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from costmodel.measure.device import Fingerprint

ROOT = Path(__file__).resolve().parents[3]
TINY = ["+timing_budget=tiny", "timing.rounds=2"]  # conf/timing_budget/tiny.yaml, two rounds


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "costmodel", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200",
                               "MOEGNN_MODEL_CACHE": os.environ["MOEGNN_MODEL_CACHE"]})


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
    assert set(ceilings["recold_fraction_by_mib"]) == {"1", "4", "8", "16", "32", "64"}
    assert all(v >= 0 for v in ceilings["recold_fraction_by_mib"].values())
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
                                                "ratio_median", "ratio_p10", "ratio_p90",
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
        (["bench", "suite=collectives", "bench.world_size=99"], "bench.world_size must be an integer in [2, "),
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


def _default_sigint() -> None:
    """In the child before exec: SIGINT as a terminal delivers it. A child inherits an ignored
    SIGINT, and Python then keeps ignoring it; in the full suite something had left the test
    process's SIGINT ignored, and the interrupted bench ran to the end (exit 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(*args: str, cwd: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "costmodel", *args], cwd=cwd, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, text=True, preexec_fn=_default_sigint,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200",
                               "MOEGNN_MODEL_CACHE": os.environ["MOEGNN_MODEL_CACHE"]})


def _wait_for(predicate, what: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _hold_measuring_lock(lock: Path) -> subprocess.Popen:
    """Another measuring process: holds the lock at ``lock`` until its stdin closes."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from costmodel.store.locks import MeasureLockConfig, measuring\n"
         "with measuring('holder', MeasureLockConfig(path=sys.argv[1])):\n print('held', flush=True); sys.stdin.readline()",
         str(lock)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={"PYTHONPATH": str(ROOT)})
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_bench_refuses_in_one_line_while_another_process_measures(tmp_path):
    lock = tmp_path / "measuring.lock"
    holder = _hold_measuring_lock(lock)
    try:
        done = _run("bench", f"profile.root={tmp_path / 'profiles'}", "bench.families=[sort]", f"measure_lock.path={lock}",
                    "measure_lock.mode=refuse", f"hydra.run.dir={tmp_path / 'out'}", *TINY, cwd=tmp_path)
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert done.returncode == 75
    out = done.stdout + done.stderr
    assert "Traceback" not in out and f"another process is measuring on this machine: pid {holder.pid}" in out
    assert not list((tmp_path / "profiles").glob("*/measurements.csv"))  # nothing was measured


def test_two_benches_on_one_profile_root_wait_their_turn_and_keep_every_row_once(tmp_path):
    """The issue's target: two `bench` at once -> every row once, and the second waited with a message."""
    lock = tmp_path / "measuring.lock"
    holder = _hold_measuring_lock(lock)  # a third measuring process holds it until both benches wait
    args = [f"profile.root={tmp_path / 'profiles'}", "bench.families=[sort,histogram]", f"measure_lock.path={lock}", *TINY]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    benches = [_start("bench", *args, f"hydra.run.dir={tmp_path / name}", cwd=tmp_path, log=log)
               for name, log in zip("ab", logs)]
    try:
        _wait_for(lambda: all("Waiting for it to finish before bench suite=quick" in log.read_text() for log in logs),
                  "both benches to wait for the holder")
        assert all(f"pid {holder.pid}" in log.read_text() for log in logs)
        holder.stdin.close()
        for bench in benches:
            assert bench.wait(timeout=600) == 0
    finally:
        for proc in (holder, *benches):
            if proc.poll() is None:
                proc.kill()
    texts = [log.read_text() for log in logs]
    assert all("Traceback" not in t for t in texts)
    (folder,) = (tmp_path / "profiles").iterdir()
    raw = pd.read_csv(folder / "measurements.csv")
    assert not raw.duplicated(["key", "round"]).any() and set(raw["round"]) == {0, 1}
    runs = [r for r in json.loads((folder / "provenance.json").read_text()) if r.get("suite") == "quick"]
    assert len(runs) == 2 and sum(r["rows_added"] for r in runs) == len(raw)
    # the one that measured second waited for the first bench (named by pid), and found its rows
    # (it measures only rounds the first skipped as too slow on this shared machine)
    first, second = runs
    assert f"pid {holder.pid}" in second["measure_lock"]["waited_for"][0]
    assert any(f"pid {b.pid}" in second["measure_lock"]["waited_for"][-1] for b in benches)
    assert first["rows_added"] > 0 and second["already_present"] > 0


def test_ctrl_c_during_bench_says_what_was_kept_and_the_rerun_counts_it(tmp_path):
    root = tmp_path / "profiles"
    # long enough (about 40 s) that the interrupt lands mid-run on a fast, quiet machine too:
    # the first rows reach the disk at the first flush, seconds after the start (at 0.5 s,
    # about 15 s in all, one fresh-clone run finished before the signal landed)
    args = ["bench", f"profile.root={root}", "bench.families=[sort,histogram,elementwise]",
            "timing.min_run_time_s=1.5", "timing.rounds=3", f"hydra.run.dir={tmp_path / 'out'}"]
    log = tmp_path / "bench.log"
    bench = _start(*args, cwd=tmp_path, log=log)
    try:
        _wait_for(lambda: any(root.glob("*/measurements.csv")), "the first rows on disk")
        bench.send_signal(signal.SIGINT)
        assert bench.wait(timeout=300) == 130
    finally:
        if bench.poll() is None:
            bench.kill()
    text = log.read_text()
    assert "Traceback" not in text
    assert "interrupted: this run's" in text and "Rerun the same command to resume" in text
    (folder,) = root.iterdir()
    raw = pd.read_csv(folder / "measurements.csv")
    counts = raw.groupby("key").size()
    complete, partial = int((counts == 3).sum()), int((counts < 3).sum())
    assert f"{complete} are complete and {partial} partially measured" in text
    again = _run(*args[:-1], "timing.min_run_time_s=0.006", f"hydra.run.dir={tmp_path / 'out2'}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"before this run {complete} were complete in the profile" in again.stdout.replace("\n", " ")
    if partial:
        assert f"{partial} partially measured (now resumed)" in again.stdout.replace("\n", " ")
    assert not pd.read_csv(folder / "measurements.csv").duplicated(["key", "round"]).any()


def test_fit_names_and_counts_rejected_rows(profile_root, tmp_path):
    (folder,) = (profile_root / "profiles").iterdir()
    copy = tmp_path / "profiles" / folder.name
    shutil.copytree(folder, copy)
    file = copy / "measurements.csv"
    text = file.read_text()
    cut = text[: text.rindex("e-0") + 2]  # cut after the 'e-' of the last row's last such number
    file.write_text(cut)
    lines = cut.count("\n") + 1  # the line cut short
    done = _run("fit", f"profile.root={tmp_path / 'profiles'}", f"hydra.run.dir={tmp_path / 'fit'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = (done.stdout + done.stderr).replace("\n", "")
    assert f"measurements.csv:{lines}: has " in out and "cut short" in out
    assert "rejected 1 rows" in out and f"fitting on the {lines - 2} valid rows" in out


def test_fit_evaluates_another_devices_profile_and_says_so(profile_root, tmp_path):
    (folder,) = (profile_root / "profiles").iterdir()
    copy = tmp_path / "other_device"
    shutil.copytree(folder, copy)
    fp = json.loads((copy / "fingerprint.json").read_text())
    fp["device_name"] = "Some Other CPU"
    fp["id"] = Fingerprint(**{k: v for k, v in fp.items() if k != "id"}).id  # a consistent foreign fingerprint
    (copy / "fingerprint.json").write_text(json.dumps(fp))
    done = _run("fit", f"fit.profile_path={copy}", f"hydra.run.dir={tmp_path / 'fit'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = (done.stdout + done.stderr).replace("\n", "")
    assert "measured on another device" in out and "Some Other CPU" in out and "measures nothing" in out
    assert json.loads((tmp_path / "fit" / "fit_report.json").read_text())["all"]["L3"]["n_test"] > 0


def test_profile_root_that_is_a_file_is_one_clear_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    done = _run("bench", "profile.root=afile", f"hydra.run.dir={tmp_path / 'out'}", cwd=tmp_path)
    assert done.returncode != 0
    out = done.stdout + done.stderr  # the one-line user error goes through Hydra's logging
    assert "profile.root=" in out and "afile cannot be a folder" in out and "Traceback" not in out


def test_a_killed_bench_leaves_a_whole_file_and_resumes_without_duplicates(tmp_path):
    root = tmp_path / "profiles"
    args = ["bench", f"profile.root={root}", "bench.families=[sort,histogram,elementwise]", *TINY]
    bench = _start(*args, "timing.min_run_time_s=0.05", f"hydra.run.dir={tmp_path / 'out'}", cwd=tmp_path,
                   log=tmp_path / "bench.log")
    try:
        _wait_for(lambda: any(root.glob("*/measurements.csv")), "the first rows on disk")
        bench.kill()  # SIGKILL: no handler runs
        bench.wait(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
    (folder,) = root.iterdir()
    kept = pd.read_csv(folder / "measurements.csv")
    assert len(kept) > 0 and kept["median_s"].notna().all()
    again = _run(*args, f"hydra.run.dir={tmp_path / 'out2'}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    final = pd.read_csv(folder / "measurements.csv")
    assert not final.duplicated(["key", "round"]).any() and len(final) > len(kept)
    assert set(map(tuple, kept[["key", "round"]].values)) <= set(map(tuple, final[["key", "round"]].values))
    assert not list(folder.glob(".*.tmp"))
