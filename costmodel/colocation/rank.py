"""What each rank runs in the co-location measurement: one measured rank, the others its twins.

Imported by name in every spawned rank (``costmodel.collectives.workers.run_workers``), so it
imports only torch, numpy and the kernel runners (no pandas or scikit-learn).

Every rank first pins itself to its core of ``cores`` (the launcher pinned it to one of this
process's first W cores; the measurement may ask for others) and applies the profile's
allocator mode. Then, per kernel (a descriptor record), every rank builds the same runner
(``costmodel.measure.runners.make_runner``: seeded inputs, cold operands rotated through the arena
as the profile's rows were measured) and warms it up; then, per round, two or three conditions,
their order rotating between rounds so that slow drift does not favour one:

- **alone**: rank 0 times the kernel (``costmodel.measure.timing.measure``: warm-up, blocks, median
  and IQR, retried while noisy) while every twin waits in a barrier (a blocked gloo barrier
  sleeps; it does not spin);
- **beside**: all ranks leave a barrier together; each twin runs the same kernel back to
  back until rank 0 sets ``stop`` after its measurement (or until ``twin_max_s`` passes: a
  bounded loop), while rank 0 times it as above;
- **stream** (with ``stream``): the same, but every other rank runs the *stream neighbour*
  instead of the twin: ``StreamNeighbour``, a copy through two ``STREAM_BUFFER_BYTES``
  buffers (8x the EPYC VM's 32 MiB last-level cache), the heaviest memory traffic one core
  can make. A twin tells how a kernel fares beside itself; the stream tells how it fares beside
  the worst neighbour, which is what a device beside *different* work needs
  (``ColocationFactors.factor(..., pressure=)``): a cache-resident GEMM runs at 1.0x beside
  its twin and 1.1-1.2x beside a stream.

Before the kernels, rank 0 times the stream neighbour alone (its bytes per second: the scale
a neighbour's pressure is measured against). Rank 0 returns, per kernel, its per-round
``Measurement`` data for each condition; a twin returns how many calls it ran beside each
measurement and whether its deadline cut it short.
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
#: each of the stream neighbour's two buffers: 256 MiB, 8x the 32 MiB last-level cache of the EPYC VM,
#: so every copy streams from and to memory
STREAM_BUFFER_BYTES = 256 * 2**20
#: one call of the stream neighbour copies this many bytes of the buffer (a slice; the next call the next
#: slice), so it looks at the stop flag every few milliseconds
STREAM_SLICE_BYTES = 8 * 2**20


class StreamNeighbour:
    """The standard memory-streaming neighbour: each call copies the next ``STREAM_SLICE_BYTES``
    slice of a ``STREAM_BUFFER_BYTES`` float32 buffer into another (reads and writes
    2 x slice bytes; ``bytes_per_call``)."""

    def __init__(self, buffer_bytes: int = STREAM_BUFFER_BYTES, slice_bytes: int = STREAM_SLICE_BYTES) -> None:
        n, m = buffer_bytes // 4, slice_bytes // 4
        self.src = torch.ones(n, dtype=torch.float32)
        self.dst = torch.zeros_like(self.src)  # pages touched now: no page fault is timed
        self.slices = [(i, min(i + m, n)) for i in range(0, n, m)]
        self.bytes_per_call = 2 * 4 * m
        self.i = 0
        for _ in self.slices:  # one pass over both buffers before any timing
            self()

    def __call__(self) -> None:
        a, b = self.slices[self.i]
        self.dst[a:b].copy_(self.src[a:b])
        self.i = (self.i + 1) % len(self.slices)


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


def conditions(round_index: int, stream: bool) -> tuple[str, ...]:
    """The conditions of one round, rotated by the round's index (each condition takes each
    place in turn, so slow drift does not favour one)."""
    names = ("alone", "beside", "stream") if stream else ("alone", "beside")
    k = round_index % len(names)
    return names[k:] + names[:k]


def measure_pairs(rank: int, world_size: int, items: list[dict[str, Any]], cores: list[int], timing: dict[str, Any],
                  rounds: int, cold: bool, allocator: str, stop: Any, twin_max_s: float,
                  progress: bool, stream: bool = False) -> dict[str, Any]:
    """Every item alone, beside its twins and (``stream``) beside the stream neighbour (module
    docstring); rank 0's timings or a twin's counts, per item, under ``"items"``, and rank 0's
    timing of the stream neighbour alone under ``"stream_alone"``."""
    os.sched_setaffinity(0, {int(cores[rank])})
    torch.set_num_threads(1)
    configure_allocator(allocator)
    cfg = TimingConfig(**timing)
    device = torch.device("cpu")
    out: dict[str, Any] = {"items": [], "stream_alone": None}
    neighbour = StreamNeighbour() if stream else None
    if neighbour is not None:
        dist.barrier()
        if rank == 0:
            m = measure(neighbour, device=device, config=cfg)
            out["stream_alone"] = {**_record(m), "bytes_per_call": neighbour.bytes_per_call,
                                   "buffer_bytes": STREAM_BUFFER_BYTES, "bytes_per_s": neighbour.bytes_per_call / m.median_s}
            neighbour = None  # rank 0 never runs it again: free its 512 MiB
        dist.barrier()
    for i, item in enumerate(items):
        spec = from_record(item)
        runner = make_runner(spec, device, seed=0, cold=cold)
        runner()  # first-call costs (allocation, lazy init) before any condition
        result: dict[str, Any] = {"key": spec.key(), "alone": [], "beside": [], "twin": [], "stream": [],
                                  "stream_twin": []}
        for r in range(rounds):
            for condition in conditions(r, stream):
                if rank == 0:
                    stop.clear()  # before the barrier: no twin looks at it until it has passed
                dist.barrier()
                if condition == "alone":
                    if rank == 0:
                        result["alone"].append(_record(measure(runner, device=device, config=cfg)))
                elif rank == 0:
                    try:
                        result[condition].append(_record(measure(runner, device=device, config=cfg)))
                    finally:
                        stop.set()
                elif condition == "beside":
                    result["twin"].append(_twin(runner, stop, twin_max_s))
                else:
                    record = _twin(neighbour, stop, twin_max_s)
                    result["stream_twin"].append({**record, "bytes_per_s": record["calls"] * neighbour.bytes_per_call
                                                  / max(record["seconds"], 1e-12)})
                dist.barrier()
        runner = None
        out["items"].append(result)
        if progress and rank == 0:
            a = statistics.median(x["median_s"] for x in result["alone"])
            b = statistics.median(x["median_s"] for x in result["beside"])
            line = (f"colocation: {i + 1}/{len(items)} {spec.label()[:60]}: alone {a * 1e6:,.1f} us, "
                    f"beside its twin {b * 1e6:,.1f} us ({b / a:.2f}x)")
            if stream:
                c = statistics.median(x["median_s"] for x in result["stream"])
                line += f", beside the stream {c * 1e6:,.1f} us ({c / a:.2f}x)"
            print(line, flush=True)
    sys.stdout.flush()
    return out
