"""Run a function on W real processes joined by ``torch.distributed`` (gloo), on this host.

The generic launcher of the project (moved here from ``sim/distributed/launch.py``, which
re-exports it, because ``costmodel`` may not import ``sim``): the collectives benchmark
(``costmodel.collectives.bench``) and the expert-parallel layer (``sim.distributed``) use it.
``run_workers`` is the general entry (backend, an explicit port, core placement policy);
``run_ep`` keeps the expert-parallel layer's historical signature and messages.

``run_ep(world_size, fn, args, timeout_s=...)`` starts W processes from a ``spawn``
context (``torch.multiprocessing``; spawn, not fork: a forked child would inherit the
parent's thread pools and locks), each of which:

1. sets ``MASTER_ADDR=127.0.0.1`` and ``MASTER_PORT`` (a free port the parent found by
   binding port 0; another program could take it in between, then init fails and says so),
   ``torch.set_num_threads(1)``, and pins itself to its own core with
   ``os.sched_setaffinity`` when this process may use at least W cores (otherwise no
   pinning, and the returned ``note`` says why);
2. joins the group with ``init_process_group("gloo", timeout=timeout_s)`` (the timeout
   bounds the rendezvous and every collective), waits at a barrier, runs
   ``fn(rank, world_size, *args)``, waits at a second barrier and puts its result (or its
   traceback) on a queue; once that is flushed into the pipe it leaves the group and exits
   with ``os._exit`` (skipping the interpreter's teardown, which with torch loaded costs
   seconds).

The parent waits at most ``timeout_s`` in all, raises ``EPWorkerError`` with the first
failing rank's traceback, or ``EPTimeoutError`` naming the ranks that did not answer, and
in every case terminates (then kills) each process it started that is still running.
With ``keep_awake=True`` the ranks' cores are kept awake while they run (one ``SCHED_IDLE``
spinner per pinned core, ``costmodel.collectives.awake``), so a rank that waits in a
collective does not park its core; the spinners end with the launch, however it ends.

``fn`` must be a module-level function (spawned processes import it by name) and its
result picklable; return numpy arrays rather than tensors (a tensor sent through a torch
queue lives in shared memory owned by a process that is about to exit).
"""

from __future__ import annotations

import logging
import os
import pickle
import queue as queue_module
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

log = logging.getLogger(__name__)

MAX_WORLD_SIZE = 64  # processes on one host; beyond this a launcher of its own (torchrun, Slurm) fits better
MAX_TIMEOUT_S = 3600.0
_POLL_S = 0.2  # how often the parent looks at its children while waiting for results
_EXIT_GRACE_S = 0.5  # a rank that exited may still have its result in the pipe
_JOIN_S = 5.0  # per process, after terminate() and again after kill()


class EPWorkerError(RuntimeError):
    """A rank raised or exited without a result."""


class EPTimeoutError(TimeoutError):
    """Not every rank answered within ``timeout_s``."""


@dataclass(frozen=True)
class EPRun:
    results: list[Any]  # fn's return value per rank, in rank order
    cores: tuple[int, ...] | None  # core of each rank, None when not pinned
    note: str  # how the ranks were placed on cores


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pick_cores(world_size: int) -> tuple[tuple[int, ...] | None, str]:
    """One core per rank from this process's affinity set, or None and the reason."""
    if not hasattr(os, "sched_getaffinity"):
        return None, "not pinned: os.sched_setaffinity is not available on this platform"
    available = sorted(os.sched_getaffinity(0))
    if len(available) < world_size:
        return None, f"not pinned: {len(available)} cores available for world_size={world_size}"
    cores = tuple(available[:world_size])
    return cores, f"rank r pinned to core {list(cores)}[r]"


PLACEMENTS = ("auto", "require", "none")  # pin when possible / pin or refuse / never pin
BACKENDS = ("gloo",)  # process groups this host launcher starts (NCCL needs one GPU per rank)


class WorkerSetupError(ValueError):
    """The ranks cannot be placed or connected as asked (checked before any process starts)."""


def usable_cores() -> list[int]:
    """Cores this process may run on (its affinity set), or all CPUs where that is unknown."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def check_port(port: object) -> int:
    """An explicit port: an integer in [1024, 65535] that nothing on 127.0.0.1 listens on."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        raise WorkerSetupError(f"port must be an integer in [1024, 65535] (or None for a free one), got {port!r}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as err:
            raise WorkerSetupError(f"port {port} on 127.0.0.1 is in use ({err.strerror}); pass another port, "
                                   "or port=None to let the launcher pick a free one") from None
    return port


def place_ranks(world_size: int, placement: str = "auto") -> tuple[tuple[int, ...] | None, str]:
    """Cores for the ranks under a placement policy: ``auto`` pins one core per rank when this
    process may use W cores (else unpinned, with the reason), ``require`` pins or raises
    ``WorkerSetupError`` naming world_size and the range this host can place, ``none`` never pins."""
    if placement not in PLACEMENTS:
        raise WorkerSetupError(f"placement must be one of {list(PLACEMENTS)}, got {placement!r}")
    if placement == "none":
        return None, "not pinned: placement='none'"
    if placement == "require":
        n = len(usable_cores())
        if world_size > n:
            raise WorkerSetupError(
                f"world_size={world_size} cannot be placed one rank per core: this process may use {n} core(s), "
                f"so world_size must be in [1, {n}]; pass allow_oversubscribe=True to run unpinned, ranks "
                "sharing cores (the timings then measure the sharing too)")
    return pick_cores(world_size)


def _check_args(world_size: object, fn: object, timeout_s: object, field: str = "ep.world_size") -> None:
    if not isinstance(world_size, int) or isinstance(world_size, bool) or not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"{field} must be an integer in [1, {MAX_WORLD_SIZE}], got {world_size!r}")
    ok = isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool)
    if not ok or not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}] seconds, got {timeout_s!r}")
    try:
        pickle.dumps(fn)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means the same thing here
        raise ValueError(f"fn must be a module-level function (spawned processes import it by name), "
                         f"got {fn!r}: {exc}") from None


def _worker(rank: int, world_size: int, port: int, core: int | None, timeout_s: float,
            fn: Callable[..., Any], args: Sequence[Any], results: Any, backend: str = "gloo") -> None:
    try:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        torch.set_num_threads(1)
        if core is not None:
            os.sched_setaffinity(0, {core})
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
        dist.barrier()
        result = fn(rank, world_size, *args)
        pickle.dumps(result)  # an unpicklable result fails here, with a traceback, not in the queue's thread
        dist.barrier()  # no rank leaves the group while a peer may still be in a collective with it
        outcome = (rank, True, result)
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent
        outcome = (rank, False, traceback.format_exc())
    # the outcome is in the pipe before this rank leaves the group, so a failing rank's
    # traceback reaches the parent before its peers fail for want of it
    results.put(outcome)
    results.close()
    results.join_thread()
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        # leave without the interpreter's teardown: with torch loaded it took 2.5 s per
        # process on a busy 2-core host
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if outcome[1] else 1)


def run_ep(world_size: int, fn: Callable[..., Any], args: Sequence[Any] = (), *, timeout_s: float = 60.0,
           keep_awake: bool = False) -> EPRun:
    """``fn(rank, world_size, *args)`` on ``world_size`` gloo processes; results by rank."""
    return run_workers(world_size, fn, args, timeout_s=timeout_s, world_size_field="ep.world_size",
                       keep_awake=keep_awake)


def run_workers(world_size: int, fn: Callable[..., Any], args: Sequence[Any] = (), *, timeout_s: float = 60.0,
                backend: str = "gloo", port: int | None = None, placement: str = "auto",
                world_size_field: str = "world_size", keep_awake: bool = False) -> EPRun:
    """``fn(rank, world_size, *args)`` on ``world_size`` processes joined by ``backend`` over
    127.0.0.1 (``port``: a free one when None, else checked free); ranks placed on cores by
    ``placement`` (``place_ranks``); with ``keep_awake`` (pinned ranks only) a lowest-priority
    spinner per rank core keeps a rank blocked in a collective from parking its core
    (``costmodel.collectives.awake``). Every argument is checked before a process starts."""
    _check_args(world_size, fn, timeout_s, world_size_field)
    if backend not in BACKENDS:
        raise WorkerSetupError(f"backend must be one of {list(BACKENDS)} for this host launcher, got {backend!r}")
    if not isinstance(keep_awake, bool):
        raise WorkerSetupError(f"keep_awake must be true or false, got {keep_awake!r}")
    port = free_port() if port is None else check_port(port)
    cores, note = place_ranks(world_size, placement)
    log.info("run_workers: world_size=%d, backend=%s, %s", world_size, backend, note)
    if keep_awake:
        from costmodel.collectives.awake import keep_cores_awake  # noqa: PLC0415

        with keep_cores_awake(cores, float(timeout_s) + 2 * _JOIN_S) as awake:
            run = _launch(world_size, fn, args, timeout_s, backend, port, cores, note)
        return EPRun(results=run.results, cores=run.cores, note=f"{run.note}; {awake}")
    return _launch(world_size, fn, args, timeout_s, backend, port, cores, note)


def _launch(world_size: int, fn: Callable[..., Any], args: Sequence[Any], timeout_s: float, backend: str, port: int,
            cores: tuple[int, ...] | None, note: str) -> EPRun:
    """Start the ranks, collect their results (``run_workers``); every process ends before it returns."""
    ctx = mp.get_context("spawn")
    results_q = ctx.Queue()
    deadline = time.monotonic() + timeout_s
    procs = []
    try:
        for rank in range(world_size):
            core = None if cores is None else cores[rank]
            p = ctx.Process(target=_worker, args=(rank, world_size, port, core, float(timeout_s), fn, tuple(args),
                                                  results_q, backend), daemon=True, name=f"ep-rank{rank}")
            p.start()
            procs.append(p)
        got: dict[int, Any] = {}
        while len(got) < world_size:  # bounded by the deadline
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [r for r in range(world_size) if r not in got]
                raise EPTimeoutError(f"ranks {missing} of world_size={world_size} gave no result within "
                                     f"timeout_s={timeout_s:g}; every process was terminated")
            try:
                rank, ok, payload = results_q.get(timeout=min(_POLL_S, remaining))
            except queue_module.Empty:
                exited = [r for r, p in enumerate(procs) if r not in got and p.exitcode is not None]
                if exited:
                    try:  # its result may still be on its way through the pipe
                        rank, ok, payload = results_q.get(timeout=_EXIT_GRACE_S)
                    except queue_module.Empty:
                        r = exited[0]
                        raise EPWorkerError(f"rank {r} exited with code {procs[r].exitcode} without a result") from None
                else:
                    continue
            if not ok:
                raise _failure(rank, payload, procs, got, results_q, world_size)
            got[rank] = payload
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        return EPRun(results=[got[r] for r in range(world_size)], cores=cores, note=note)
    finally:
        _stop(procs)
        results_q.close()
        results_q.cancel_join_thread()


def _failure(rank: int, payload: str, procs: list, got: dict, results_q: Any, world_size: int) -> EPWorkerError:
    """The error for a failed rank, naming the root cause when there is one: a peer that died
    without a result (killed, ``os._exit``) makes the others fail in their next collective
    ("Connection reset by peer"), and that failure may reach the parent first."""
    deadline = time.monotonic() + _EXIT_GRACE_S
    failed = {rank: payload}
    while time.monotonic() < deadline:  # bounded: other outcomes already on their way
        try:
            r, ok, other = results_q.get(timeout=_POLL_S / 4)
        except queue_module.Empty:
            if all(p.exitcode is not None for r, p in enumerate(procs) if r not in got and r not in failed):
                break
            continue
        if ok:
            got[r] = other
        else:
            failed[r] = other
    dead = [r for r, p in enumerate(procs) if r not in got and r not in failed and p.exitcode not in (None, 0)]
    if dead:
        d = dead[0]
        return EPWorkerError(f"rank {d} of world_size={world_size} exited with code {procs[d].exitcode} without a "
                             f"result; its peers then failed (rank {rank}):\n{payload}")
    return EPWorkerError(f"rank {rank} of world_size={world_size} failed:\n{payload}")


def _stop(procs: list) -> None:
    """Terminate, then kill, every process in ``procs`` still alive; each wait is bounded."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=_JOIN_S)
        if p.is_alive():
            p.kill()
            p.join(timeout=_JOIN_S)
