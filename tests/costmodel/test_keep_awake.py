"""costmodel.collectives.awake: one SCHED_IDLE spinner pinned per rank core while ranks run,
each gone afterwards (stopped, or by itself at its deadline); run_workers says so in its note;
bad input is refused before anything starts."""

from __future__ import annotations

import os
import re
import time

import psutil
import pytest

from costmodel.collectives.awake import KeepAwakeError, keep_cores_awake, start_spinners, stop_spinners
from costmodel.collectives.workers import run_workers, usable_cores

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux-only")


def _spinners() -> list[psutil.Process]:
    return [c for c in psutil.Process().children(recursive=True)
            if c.is_running() and c.status() != psutil.STATUS_ZOMBIE and "SCHED_IDLE" in " ".join(c.cmdline())]


def test_a_spinner_is_pinned_idle_class_and_stopped():
    core = usable_cores()[0]
    procs = start_spinners([core], 30.0)
    try:
        (p,) = procs
        assert p.poll() is None
        assert os.sched_getscheduler(p.pid) == os.SCHED_IDLE
        assert os.sched_getaffinity(p.pid) == {core}
    finally:
        stop_spinners(procs)
    assert procs[0].poll() is not None and _spinners() == []


def test_a_spinner_ends_by_itself_at_its_deadline():
    procs = start_spinners([usable_cores()[0]], 0.3)
    try:
        procs[0].wait(timeout=10)  # bounded: it checks its deadline every ~1 ms of spinning
        assert procs[0].returncode == 0
    finally:
        stop_spinners(procs)


def test_unpinned_ranks_start_nothing_and_bad_seconds_are_refused():
    with keep_cores_awake(None, 10.0) as note:
        assert note == "cores not kept awake: the ranks are not pinned" and _spinners() == []
    for bad in (0, -1.0, "10", True):
        with pytest.raises(KeepAwakeError, match=re.escape(f"seconds must be a number > 0, got {bad!r}")):
            start_spinners([0], bad)


def _sleep_briefly(rank: int, world_size: int) -> int:
    time.sleep(0.05)
    return rank


def test_run_workers_keeps_the_cores_awake_and_leaves_no_spinner():
    if len(usable_cores()) < 2:
        pytest.skip("two ranks need two cores to be pinned")
    run = run_workers(2, _sleep_briefly, timeout_s=60, keep_awake=True)
    assert run.results == [0, 1]
    assert f"cores {list(run.cores)} kept awake: one SCHED_IDLE spinner per rank core" in run.note
    assert _spinners() == []
    with pytest.raises(ValueError, match=re.escape("keep_awake must be true or false, got 'yes'")):
        run_workers(2, _sleep_briefly, timeout_s=60, keep_awake="yes")
