"""Run placements for real: one worker process per device, pinned, its share back to back.

A CPU "device" is a process with ``threads`` torch threads pinned to ``cores``
(``os.sched_setaffinity``). ``run_placements`` starts one spawned worker per device, which
builds (from the workloads' picklable factories) every workload any of the placements
puts on it and runs each once to warm up. Then, for ``repeats`` rounds, every placement in
turn: each worker evicts the caches (untimed), waits at a barrier so that all devices start
together, runs its assigned workloads back to back and reports each one's start and end
(``time.perf_counter``, relative to its own start) and its wall time. The makespan of one
repeat is the slowest device's wall time; a placement's measured makespan is the median
over repeats. Rounds interleave the placements, so a slow spell of a shared machine
spreads over all of them.

Devices whose cores overlap (e.g. a 2-thread device on cores 0-1 beside a 1-thread device on
core 1) cannot run at the same time without contending, so then each device runs its share
alone, one after the other, and the makespan of a repeat is the largest of their wall times
(``PlacementRun.concurrent`` says which was done).

``device_context`` applies the same pinning and thread count to the calling process for a
while (calibrating and measuring a device from the main process).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from sim.place.placement import Device, Placement, PlacementError, PlacementWorkload, WorkloadFactory

#: seconds the parent waits for a worker's answer before giving up on it
WORKER_TIMEOUT_S = 900.0


def available_cores() -> set[int]:
    return set(os.sched_getaffinity(0))


def check_cores(name: str, cores: Sequence[int] | None) -> None:
    """A clear error when ``cores`` are not all available to this process."""
    if cores is None:
        return
    missing = sorted(set(cores) - available_cores())
    if missing:
        raise PlacementError(f"device {name!r}: cores {missing} are not available to this process "
                             f"(available: {sorted(available_cores())})")


def _pin(cores: Sequence[int] | None, threads: int) -> None:
    if cores is not None:
        os.sched_setaffinity(0, set(cores))  # before the thread count: new pool threads inherit it
    torch.set_num_threads(threads)


@contextmanager
def device_context(cores: Sequence[int] | None, threads: int) -> Iterator[None]:
    """Run the body pinned to ``cores`` with ``threads`` torch threads; restore both after."""
    old_cores, old_threads = available_cores(), torch.get_num_threads()
    check_cores("context", cores)
    _pin(cores, threads)
    try:
        yield
    finally:
        os.sched_setaffinity(0, old_cores)
        torch.set_num_threads(old_threads)


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process needs to act as one device (picklable)."""

    name: str
    torch_device: str
    threads: int
    cores: tuple[int, ...] | None
    allocator: str
    evict_bytes: int  # written before every timed repeat (untimed): every repeat starts from cold caches

    @classmethod
    def of(cls, device: Device, *, allocator: str, evict_bytes: int) -> "WorkerSpec":
        return cls(device.name, str(device.torch_device), device.threads, device.cores, allocator, evict_bytes)


def _worker(spec: WorkerSpec, factories: Mapping[str, WorkloadFactory], conn: Any, barrier: Any) -> None:
    """Worker main loop: build, warm up, then answer ``run`` commands until ``None``."""
    try:
        from costmodel.measure.allocator import configure_allocator
        from costmodel.measure.timing import TimingConfig, evict_caches

        _pin(spec.cores, spec.threads)
        configure_allocator(spec.allocator)
        device = torch.device(spec.torch_device)
        evict_cfg = TimingConfig(cpu_evict_bytes=spec.evict_bytes, cuda_flush_bytes=spec.evict_bytes)
        fns = {name: f.build(device) for name, f in factories.items()}
        for fn in fns.values():  # first-call costs (allocation, lazy init) stay out of the timings
            fn()
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        sync()
        conn.send(("ready", {"pid": os.getpid(), "threads": torch.get_num_threads(),
                             "cores": sorted(os.sched_getaffinity(0))}))
        while True:
            names = conn.recv()
            if names is None:
                break
            evict_caches(device, evict_cfg)
            sync()
            if barrier is not None:
                barrier.wait(timeout=WORKER_TIMEOUT_S)
            start = time.perf_counter()
            spans = []
            for name in names:
                t0 = time.perf_counter() - start
                fns[name]()
                sync()
                spans.append((name, t0, time.perf_counter() - start))
            conn.send(("done", {"wall_s": time.perf_counter() - start, "spans": spans}))
    except BaseException:  # report, then exit: the parent raises it
        if barrier is not None:
            barrier.abort()  # release the other devices waiting to start
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:
            pass


@dataclass(frozen=True)
class PlacementRun:
    """Real runs of one placement: every repeat's per-device wall time and workload spans."""

    placement_key: tuple[int, ...]
    concurrent: bool  # devices ran at the same time (else each alone, one after the other)
    devices: tuple[str, ...]
    walls_s: np.ndarray  # [repeats, devices]
    spans: pd.DataFrame  # repeat, device, workload, start_s, end_s

    @property
    def makespans_s(self) -> np.ndarray:
        """Per repeat: the slowest device's wall time."""
        return self.walls_s.max(axis=1)

    @property
    def measured_makespan_s(self) -> float:
        return float(np.median(self.makespans_s))

    def timeline(self) -> pd.DataFrame:
        """Median start and end of every workload over the repeats (a Gantt chart's bars)."""
        if self.spans.empty:
            return pd.DataFrame(columns=["workload", "device", "start_s", "end_s"])
        return self.spans.groupby(["device", "workload"], sort=False, as_index=False)[["start_s", "end_s"]].median()


def devices_can_run_together(devices: Sequence[Device]) -> bool:
    """Pinned to pairwise disjoint cores (unpinned or overlapping devices would contend)."""
    if any(d.cores is None for d in devices):
        return len(devices) == 1
    seen: set[int] = set()
    for d in devices:
        if seen & set(d.cores):  # type: ignore[arg-type]
            return False
        seen |= set(d.cores)  # type: ignore[arg-type]
    return True


def run_placements(placements: Sequence[Placement], workloads: Sequence[PlacementWorkload], devices: Sequence[Device], *,
                   repeats: int, allocator: str = "steady", evict_bytes: int = 128 * 1024**2,
                   concurrent: bool | None = None, progress: bool = True) -> dict[tuple[int, ...], PlacementRun]:
    """Run each distinct placement ``repeats`` times for real (see the module docstring);
    keyed by ``Placement.key()``. ``concurrent`` None: together when the devices' cores
    are disjoint, else one device at a time."""
    if not isinstance(repeats, int) or repeats < 1:
        raise PlacementError(f"repeats must be a positive integer, got {repeats!r}")
    if not placements:
        raise PlacementError("no placements to run")
    by_name = {w.name: w for w in workloads}
    names = tuple(d.name for d in devices)
    for p in placements:
        if p.devices != names or any(w not in by_name for w in p.workloads):
            raise PlacementError("every placement must be over the given devices and workloads")
    for d in devices:
        check_cores(d.name, d.cores)
    together = devices_can_run_together(devices) if concurrent is None else bool(concurrent)
    distinct = list({p.key(): p for p in placements}.values())
    needed = [sorted({w for p in distinct for w in p.assignment()[d.name]}) for d in devices]

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(devices)) if together else None
    workers, conns = [], []
    try:
        for d, names_d in zip(devices, needed):
            parent_conn, child_conn = ctx.Pipe()
            spec = WorkerSpec.of(d, allocator=allocator, evict_bytes=evict_bytes)
            proc = ctx.Process(target=_worker, args=(spec, {n: by_name[n].factory for n in names_d}, child_conn, barrier),
                               name=f"placement-{d.name}", daemon=True)
            proc.start()
            workers.append(proc)
            conns.append(parent_conn)
        for d, conn, proc in zip(devices, conns, workers):
            _receive(conn, proc, d.name, "ready")
        walls = {p.key(): np.zeros((repeats, len(devices))) for p in distinct}
        spans: dict[tuple[int, ...], list[dict[str, Any]]] = {p.key(): [] for p in distinct}
        from costmodel.measure.bench import make_progress

        bar = make_progress(progress)
        with bar:
            task = bar.add_task("run placements for real", total=repeats * len(distinct), current="")
            for r in range(repeats):
                for p in distinct:
                    bar.update(task, current=f"repeat {r + 1}/{repeats}")
                    share = p.assignment()
                    order = [(k, d) for k, d in enumerate(devices)]
                    if together:
                        for k, d in order:
                            conns[k].send(share[d.name])
                        results = [(k, d, _receive(conns[k], workers[k], d.name, "done")) for k, d in order]
                    else:
                        results = []
                        for k, d in order:
                            conns[k].send(share[d.name])
                            results.append((k, d, _receive(conns[k], workers[k], d.name, "done")))
                    for k, d, res in results:
                        walls[p.key()][r, k] = res["wall_s"]
                        spans[p.key()] += [{"repeat": r, "device": d.name, "workload": w, "start_s": s, "end_s": e}
                                           for w, s, e in res["spans"]]
                    bar.advance(task)
    finally:
        for conn in conns:
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for proc in workers:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()
    return {p.key(): PlacementRun(p.key(), together, names, walls[p.key()],
                                  pd.DataFrame(spans[p.key()], columns=["repeat", "device", "workload", "start_s", "end_s"]))
            for p in distinct}


def _receive(conn: Any, proc: Any, name: str, expected: str) -> Any:
    if not conn.poll(WORKER_TIMEOUT_S):
        raise RuntimeError(f"device worker {name!r} sent nothing for {WORKER_TIMEOUT_S:g} s")
    try:
        kind, payload = conn.recv()
    except EOFError:
        raise RuntimeError(f"device worker {name!r} exited (code {proc.exitcode})") from None
    if kind == "error":
        raise RuntimeError(f"device worker {name!r} failed:\n{payload}")
    if kind != expected:
        raise RuntimeError(f"device worker {name!r} answered {kind!r}, expected {expected!r}")
    return payload
