"""What each rank runs in the co-location measurement: one measured rank, the others its twins.

Imported by name in every spawned rank (``costmodel.collectives.workers.run_workers``), so it
imports only torch, numpy and the kernel runners (no pandas or scikit-learn).

Every rank first pins itself to its core of ``cores`` (the launcher pinned it to one of this
process's first W cores; the measurement may ask for others) and applies the profile's
allocator mode. Then, per kernel (a descriptor record), every rank builds the same runner
(``costmodel.measure.runners.make_runner``: seeded inputs, cold operands rotated through the arena
as the profile's rows were measured) and warms it up; then, per round, two conditions, their
order alternating between rounds so that slow drift does not favour one:

- **alone**: rank 0 times the kernel (``costmodel.measure.timing.measure``: warm-up, blocks, median
  and IQR, retried while noisy) while every twin waits in a barrier (a blocked gloo barrier
  sleeps; it does not spin);
- **beside**: all ranks leave a barrier together; each twin runs the same kernel back to
  back until rank 0 sets ``stop`` after its measurement (or until ``twin_max_s`` passes: a
  bounded loop), while rank 0 times it as above.

Rank 0 returns, per kernel, its per-round ``Measurement`` data for both conditions; a twin
returns how many calls it ran beside each measurement and whether its deadline cut it short.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from costmodel.families.descriptor import from_record
from costmodel.measure.allocator import configure_allocator
from costmodel.measure.runners import make_runner
from costmodel.measure.timing import Measurement, TimingConfig, measure

CHECK_EVERY_S = 1e-3  # a twin looks at the stop flag at most this often (cheap next to any kernel)


def _twin(runner: Any, stop: Any, twin_max_s: float) -> dict[str, Any]:
    """Run ``runner`` back to back until ``stop`` is set or ``twin_max_s`` passes."""
    start = time.monotonic()
    deadline = start + twin_max_s
    calls, last_check = 0, start
    while True:  # bounded by the deadline
        runner()
        calls += 1
        now = time.monotonic()
        if now - last_check >= CHECK_EVERY_S:
            last_check = now
            if stop.is_set():
                return {"calls": calls, "seconds": now - start, "cut_short": False}
            if now >= deadline:
                return {"calls": calls, "seconds": now - start, "cut_short": True}


def _record(m: Measurement) -> dict[str, Any]:
    return {**m.summary(), "times_s": list(m.times_s)}


def measure_pairs(rank: int, world_size: int, items: list[dict[str, Any]], cores: list[int], timing: dict[str, Any],
                  rounds: int, cold: bool, allocator: str, stop: Any, twin_max_s: float,
                  progress: bool) -> list[dict[str, Any]]:
    """Every item alone and beside its twins (module docstring); rank 0's timings or a twin's counts."""
    os.sched_setaffinity(0, {int(cores[rank])})
    torch.set_num_threads(1)
    configure_allocator(allocator)
    cfg = TimingConfig(**timing)
    device = torch.device("cpu")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        spec = from_record(item)
        runner = make_runner(spec, device, seed=0, cold=cold)
        runner()  # first-call costs (allocation, lazy init) before any condition
        result: dict[str, Any] = {"key": spec.key(), "alone": [], "beside": [], "twin": []}
        for r in range(rounds):
            for condition in (("alone", "beside") if r % 2 == 0 else ("beside", "alone")):
                if rank == 0:
                    stop.clear()  # before the barrier: no twin looks at it until it has passed
                dist.barrier()
                if condition == "alone":
                    if rank == 0:
                        result["alone"].append(_record(measure(runner, device=device, config=cfg)))
                elif rank == 0:
                    try:
                        result["beside"].append(_record(measure(runner, device=device, config=cfg)))
                    finally:
                        stop.set()
                else:
                    result["twin"].append(_twin(runner, stop, twin_max_s))
                dist.barrier()
        runner = None
        out.append(result)
        if progress and rank == 0:
            a = statistics.median(x["median_s"] for x in result["alone"])
            b = statistics.median(x["median_s"] for x in result["beside"])
            print(f"colocation: {i + 1}/{len(items)} {spec.label()[:60]}: alone {a * 1e6:,.1f} us, "
                  f"beside {b * 1e6:,.1f} us ({b / a:.2f}x)", flush=True)
    sys.stdout.flush()
    return out
