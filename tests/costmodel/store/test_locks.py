"""Locks: concurrent profile writers lose and duplicate nothing; a second measuring process
waits or refuses, naming the one that measures."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from costmodel.measure.device import fingerprint
from costmodel.measure.runtime import Runtime
from costmodel.store.locks import LockBusyError, MeasureLockConfig, measuring
from costmodel.store.profile import DeviceProfile

ROOT = Path(__file__).resolve().parents[3]

WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from costmodel.families.sort import SortSpec
    from costmodel.store.profile import DeviceProfile

    folder, go, first, last, name = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    profile = DeviceProfile.load(folder)
    while not go.exists():
        time.sleep(0.01)
    for n in range(first, last + 1):  # one write per row: as many chances to interleave as possible
        spec = SortSpec(n)
        rows = [{"key": spec.key(), "round": r, **spec.to_record(), "median_s": n * 1e-6, "iqr_s": 0.0,
                 "noisy": False, "flops": 0.0, "bytes_moved": spec.bytes_moved(), "writer": name} for r in (0, 1)]
        profile.append_measurements(rows)
        profile.record_skipped([{"key": f"{name}-{n}", "family": "sort", "reason": "test"}])
        profile.add_provenance({"command": f"{name} {n}"})
    print("done", flush=True)
""")

HOLDER = textwrap.dedent("""
    import sys
    from costmodel.store.locks import MeasureLockConfig, measuring

    with measuring("bench suite=holder-test", MeasureLockConfig(path=sys.argv[1])):
        print("held", flush=True)
        sys.stdin.readline()  # hold until the test closes stdin (or kills this process)
""")


def _python(code: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, **kw)


def test_two_processes_writing_one_profile_keep_every_row_exactly_once(tmp_path):
    profile = DeviceProfile.open(tmp_path, fingerprint(torch.device("cpu"), "float32"))
    go = tmp_path / "go"
    writers = [_python(WRITER, str(profile.path), str(go), "1", "30", "A"),
               _python(WRITER, str(profile.path), str(go), "16", "45", "B")]  # 16..30 written by both
    time.sleep(0.5)
    go.touch()
    for w in writers:
        out, err = w.communicate(timeout=300)
        assert w.returncode == 0 and "done" in out, err[-3000:]
    raw = profile.measurements()
    assert profile.rejected() == []
    assert sorted(zip(raw["key"], raw["round"])) == sorted(
        (profile_key, r) for profile_key in {f"dtype=int64|family=sort|n={n}" for n in range(1, 46)} for r in (0, 1))
    assert len(pd.read_csv(profile.path / "measurements.csv")) == 90  # the file itself: every row once
    assert len(profile.skipped()) == 60
    assert len(profile.provenance()) == 60
    assert not list(profile.path.glob(".*.tmp"))


@pytest.fixture
def holder(tmp_path):
    """Another process holding the measuring lock at tmp_path/measuring.lock."""
    lock = tmp_path / "measuring.lock"
    proc = _python(HOLDER, str(lock), stdin=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "held", proc.stderr.read()
    yield proc, lock
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=60)


def test_a_second_measuring_process_refuses_naming_the_holder(holder):
    proc, lock = holder
    with pytest.raises(LockBusyError) as err:
        with measuring("bench suite=quick", MeasureLockConfig(mode="refuse", path=str(lock))):
            pytest.fail("measured while another process held the lock")
    message = str(err.value)
    assert f"pid {proc.pid}" in message and "bench suite=holder-test" in message and "since" in message
    assert "measure_lock.mode=wait" in message


def test_a_second_measuring_process_waits_then_measures(holder, caplog):
    proc, lock = holder
    entered = threading.Event()
    notes: list[dict] = []

    def second() -> None:
        with measuring("bench suite=quick", MeasureLockConfig(mode="wait", timeout_s=300, path=str(lock))) as note:
            notes.append(note)
            entered.set()

    thread = threading.Thread(target=second)
    with caplog.at_level("WARNING"):
        thread.start()
        for _ in range(600):  # the waiting message comes before the wait
            if "Waiting for it to finish" in caplog.text:
                break
            time.sleep(0.05)
        assert f"pid {proc.pid}" in caplog.text and "Waiting for it to finish before bench suite=quick" in caplog.text
        assert not entered.is_set()  # the holder still holds it
        proc.stdin.close()  # the holder finishes
        thread.join(timeout=120)
    assert entered.is_set() and f"pid {proc.pid}" in notes[0]["waited_for"][0] and notes[0]["waited_s"] > 0


def test_waiting_past_the_timeout_is_an_error_naming_the_holder(holder):
    proc, lock = holder
    with pytest.raises(LockBusyError, match=rf"waited .* \(measure_lock.timeout_s=0.3\) .*pid {proc.pid}"):
        with measuring("bench", MeasureLockConfig(mode="wait", timeout_s=0.3, path=str(lock))):
            pass


def test_mode_off_measures_anyway_and_says_so(holder, caplog):
    proc, lock = holder
    with measuring("bench", MeasureLockConfig(mode="off", path=str(lock))) as note:
        pass
    assert f"pid {proc.pid}" in note["disturbed_by"] and "measuring anyway" in caplog.text


def test_a_killed_holder_releases_the_lock(holder):
    proc, lock = holder
    proc.kill()
    proc.wait(timeout=60)
    with measuring("bench", MeasureLockConfig(mode="refuse", path=str(lock))) as note:
        assert "waited_for" not in note


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    config = MeasureLockConfig(mode="refuse", path=str(tmp_path / "m.lock"))
    with measuring("experiment", config):
        with measuring("its calibration", config) as inner:
            assert inner["nested"]


@pytest.mark.parametrize("value, message", [
    ({"mode": "sometimes"}, r"measure_lock.mode must be one of \['wait', 'refuse', 'off'\], got 'sometimes'"),
    ({"timeout_s": 0}, "measure_lock.timeout_s must be a number of seconds > 0, got 0"),
    ({"timeout_s": "long"}, "measure_lock.timeout_s must be a number of seconds > 0, got 'long'"),
    ({"wait": True}, r"measure_lock.wait must not be set \(measure_lock takes only \['mode', 'path', 'timeout_s'\]\), got True"),
    ("wait", "measure_lock must be a mapping"),
])
def test_bad_measure_lock_settings_are_clear_errors(value, message):
    cfg = {"device": "cpu", "dtype": "float32", "timing": {}, "limits": {"cpu": {"max_flops": 1, "max_bytes": 1}},
           "profile": {"root": "p"}, "measure_lock": value}
    with pytest.raises(ValueError, match=message):
        Runtime.from_cfg(cfg)


def test_a_busy_profile_lock_times_out_naming_its_holder(tmp_path):
    from costmodel.store.locks import file_lock, read_holder

    lock = tmp_path / ".lock"
    proc = _python("import sys\nfrom costmodel.store.locks import file_lock\n"
                   "with file_lock(sys.argv[1], what='writing in the test'):\n"
                   " print('held', flush=True); sys.stdin.readline()", str(lock), stdin=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == "held", proc.stderr.read()
        assert read_holder(lock)["pid"] == proc.pid
        with pytest.raises(LockBusyError, match=rf"could not lock .* within 0.3 s: held by pid {proc.pid} .*"
                                                r"\(writing in the test; command"):
            with file_lock(lock, timeout_s=0.3):
                pytest.fail("locked while another process held the lock")
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    with file_lock(lock):  # released; and the holder's record went with it
        assert read_holder(lock)["pid"] != proc.pid
    assert lock.read_text() == ""
