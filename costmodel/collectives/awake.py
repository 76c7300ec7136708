"""Keep the ranks' cores awake while they run: one lowest-priority spinner per core.

Why. A rank that waits in a gloo collective blocks in the kernel; with nothing else to run,
its core goes idle, and on a virtual machine an idle vCPU is halted and handed back to the
hypervisor. Waking it when the peer's bytes arrive then takes the host's scheduler, not the
guest's: on the 2-core EPYC VM about one host tick, ~4 ms, in one of the two dispatch
all-to-alls of most expert-parallel steps (dispatch 3.9 ms median, p90 5.4 ms; with the cores
kept awake 0.30 / 0.64 ms; ``scripts/bench_keep_awake.py``). That wait belongs to the
hypervisor, not to the layer, and it is bimodal, so it decides a point's median by chance.
A dedicated host boots with ``idle=poll`` for the same reason, and NCCL's proxy threads poll
instead of sleeping.

How. ``keep_cores_awake(cores, seconds)`` starts, per core, a small Python process (no torch)
pinned to that core under ``SCHED_IDLE``: Linux runs it only when nothing else on the core
is runnable and preempts it the moment a rank wakes (sched(7)), so a rank computing loses
nothing to it, while a rank blocked in a collective leaves the core spinning instead of
halted. The spinner touches no memory beyond the interpreter's own loop. Each spinner exits
by itself when its parent is gone or after ``seconds`` (every loop here is bounded), and the
context manager terminates, then kills, each one on exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator, Sequence

_JOIN_S = 5.0
#: the spinner: pinned, SCHED_IDLE, spins in blocks of ~1 ms between checks of its parent and its deadline
_SPINNER = """
import os, sys, time
core, parent, end = int(sys.argv[1]), int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
os.sched_setaffinity(0, {core})
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
print("ready", flush=True)
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(20000):
        pass
"""


class KeepAwakeError(RuntimeError):
    """The spinners could not be started as asked."""


def supported() -> tuple[bool, str]:
    """Whether this host can run the spinners (Linux: ``SCHED_IDLE`` and core affinity), and why not."""
    if not (hasattr(os, "SCHED_IDLE") and hasattr(os, "sched_setaffinity")):
        return False, f"{sys.platform} has no SCHED_IDLE / sched_setaffinity: cores left to idle"
    return True, "one SCHED_IDLE spinner per rank core (costmodel.collectives.awake)"


def start_spinners(cores: Sequence[int], seconds: float) -> list[subprocess.Popen]:
    """One spinner per core of ``cores``, each running at most ``seconds``; returns once every
    one is pinned and idle-class (else stops those started and raises ``KeepAwakeError``)."""
    if not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0):
        raise KeepAwakeError(f"seconds must be a number > 0, got {seconds!r}")
    procs: list[subprocess.Popen] = []
    try:
        for core in cores:
            procs.append(subprocess.Popen([sys.executable, "-S", "-c", _SPINNER, str(int(core)), str(os.getpid()),
                                           f"{float(seconds):.3f}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        for core, p in zip(cores, procs):
            line = p.stdout.readline() if p.stdout else ""
            if line.strip() != "ready":
                err = p.stderr.read() if p.stderr and p.wait(timeout=_JOIN_S) is not None else ""
                raise KeepAwakeError(f"the spinner for core {core} did not start: "
                                     f"{err.strip().splitlines()[-1] if err.strip() else 'no output'}")
    except BaseException:
        stop_spinners(procs)
        raise
    return procs


def stop_spinners(procs: Sequence[subprocess.Popen], grace_s: float = _JOIN_S) -> None:
    """Terminate, then kill, each process still running (a spinner, or any helper process started
    with ``subprocess.Popen``); every wait is bounded by ``grace_s``; their pipes are closed."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=grace_s)
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()


@contextmanager
def keep_cores_awake(cores: Sequence[int] | None, seconds: float) -> Iterator[str]:
    """Spinners on ``cores`` for at most ``seconds`` while the block runs; yields a note.
    ``cores`` None (ranks not pinned) or a host without SCHED_IDLE: nothing started, the note says so."""
    if cores is None:
        yield "cores not kept awake: the ranks are not pinned"
        return
    ok, why = supported()
    if not ok:
        yield why
        return
    procs = start_spinners(cores, seconds)
    try:
        yield f"cores {list(cores)} kept awake: {why}"
    finally:
        stop_spinners(procs)
