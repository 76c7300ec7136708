"""What each rank runs in the collectives benchmark: build the buffers once, warm up, then
time every repeat as barrier -> ``perf_counter`` around the one collective.

Imported by name in every spawned rank, so it imports only torch and numpy (no pandas,
scikit-learn or the rest of ``costmodel``).

Per item (a plain dict: op, dtype, element counts), every rank:

1. allocates its input and output once (outside the timed region);
2. runs ``warmup`` untimed calls, each after a barrier;
3. agrees with its peers on the repeat count: ``budget_s`` / the slowest rank's last
   warm-up call (an ``all_reduce`` MAX), clipped to [``min_repeats``, ``max_repeats``], so
   every rank makes the same number of calls and a suite's time stays bounded;
4. times each repeat: ``dist.barrier()``, ``t0 = perf_counter()``, the collective,
   ``perf_counter() - t0``: the seconds this rank spends in the call, waits for slower
   peers included (as the rank would in a real step).

With ``step`` (the suite's step protocol: repeats, evict_bytes, lead_s) every item is then
timed ``repeats`` more times as a layer's step makes the call: a write of ``evict_bytes``
(the cache eviction of the project's cold-cache timing), ``dist.barrier()``, ``lead_s`` of
local 128x128 GEMMs (calibrated once per rank), ``t0``, the collective. Every rank makes the
same calls in the same order.

It returns its own per-repeat times for every item (with ``step``: a (warm, step) pair of
arrays per item); the parent combines ranks (per-rank median, mean and IQR, the max over
ranks per repeat). Rank 0 prints one progress line per item.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


def _collective(item: dict[str, Any], rank: int, world_size: int):
    """A zero-argument callable running the item's collective on buffers made once."""
    dtype = getattr(torch, item["dtype"])
    op = item["op"]
    if op == "all_to_all":
        counts = np.asarray(item["send_elems"], dtype=np.int64)
        in_splits = [int(x) for x in counts[rank]]
        out_splits = [int(x) for x in counts[:, rank]]
        inp = torch.ones(sum(in_splits), dtype=dtype)
        out = torch.empty(sum(out_splits), dtype=dtype)
        return lambda: dist.all_to_all_single(out, inp, out_splits, in_splits)
    numel = int(item["numel"])  # n in elements (NCCL-tests' size)
    if op == "all_reduce":
        buf = torch.ones(numel, dtype=dtype)
        return lambda: dist.all_reduce(buf)
    chunk = numel // world_size
    if op == "all_gather":
        inp, out = torch.ones(chunk, dtype=dtype), torch.empty(numel, dtype=dtype)
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: fn(out, inp)
    if op == "reduce_scatter":
        inp, out = torch.ones(numel, dtype=dtype), torch.empty(chunk, dtype=dtype)
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: fn(out, inp)
    raise ValueError(f"unknown collective op {op!r}")


class StepLead:
    """What precedes a call in the step protocol: an eviction buffer and ``lead_s`` of GEMMs."""

    def __init__(self, evict_bytes: int, lead_s: float):
        self.buffer = torch.zeros(max(1, int(evict_bytes) // 4), dtype=torch.float32) if evict_bytes else None
        self.a = torch.randn(128, 128)
        start, n = time.perf_counter(), 20
        for _ in range(n):
            torch.mm(self.a, self.a)
        per_gemm_s = (time.perf_counter() - start) / n
        self.gemms = int(round(lead_s / per_gemm_s)) if lead_s > 0 else 0

    def evict(self) -> None:
        if self.buffer is not None:
            self.buffer.add_(1.0)

    def lead(self) -> None:
        for _ in range(self.gemms):
            torch.mm(self.a, self.a)


def measure_items(rank: int, world_size: int, items: list[dict[str, Any]], timing: dict[str, Any],
                  progress: bool = True, step: dict[str, Any] | None = None) -> list:
    """Per item, this rank's seconds per timed repeat (float64 array); with ``step``, a
    (warm, step) pair of arrays per item."""
    lead = StepLead(int(step["evict_bytes"]), float(step["lead_s"])) if step else None
    out: list[np.ndarray] = []
    warmup, lo, hi, budget = (int(timing["warmup"]), int(timing["min_repeats"]), int(timing["max_repeats"]),
                              float(timing["budget_s"]))
    start = time.perf_counter()
    for i, item in enumerate(items):
        call = _collective(item, rank, world_size)
        last = 0.0
        for _ in range(max(1, warmup)):
            dist.barrier()
            t0 = time.perf_counter()
            call()
            last = time.perf_counter() - t0
        slowest = torch.tensor([last], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        repeats = int(min(hi, max(lo, budget // max(float(slowest.item()), 1e-9))))
        times = np.empty(repeats)
        for r in range(repeats):  # bounded: at most max_repeats
            dist.barrier()
            t0 = time.perf_counter()
            call()
            times[r] = time.perf_counter() - t0
        line = f"rank0 median {np.median(times) * 1e6:9.1f} us  ({repeats} repeats)"
        if lead is not None:
            in_step = np.empty(int(step["repeats"]))
            for r in range(len(in_step)):  # bounded: step.repeats
                lead.evict()
                dist.barrier()
                lead.lead()
                t0 = time.perf_counter()
                call()
                in_step[r] = time.perf_counter() - t0
            out.append((times, in_step))
            line += f"; in a step mean {in_step.mean() * 1e6:9.1f} us"
        else:
            out.append(times)
        if progress and rank == 0:
            print(f"[collectives {i + 1}/{len(items)} {time.perf_counter() - start:6.1f}s] {item['op']:<14} "
                  f"{item.get('pattern', ''):<10} {item['nominal_bytes']:>10.0f} B  {line}", file=sys.stderr, flush=True)
    return out


def fail_mid_run(rank: int, world_size: int, items: list[dict[str, Any]], timing: dict[str, Any],
                 progress: bool = False, step: dict[str, Any] | None = None, die_rank: int = 1) -> list:
    """Test probe: ``die_rank`` leaves abruptly after one collective, its peers block in the next."""
    call = _collective(items[0], rank, world_size)
    call()
    if rank == die_rank:
        import os
        os._exit(7)
    call()
    return measure_items(rank, world_size, items, timing, progress, step)
