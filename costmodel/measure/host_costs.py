"""What a layer's host pays per op beyond its kernels' microbenchmarks, measured on its own.

A kernel's runner repeats one call in a tight loop, so the call finds its Python path, the
dispatcher's tables, its code and the branch predictors hot. A layer strings different ops
one after another, and each pays more than it does alone. Two ceilings of a profile measure
that, without any layer:

- ``interleave_overhead_s``: ten small ops of ten kinds (the kinds of a MoE router and
  dispatch) timed as one sequence, minus the sum of each timed alone, per op. Charged to
  every kernel of a trace at the levels that model per-call costs (L2, L3).
- ``view_op_s`` and ``view_cold_overhead_s``: ten views of ten kinds (``view``, ``t``,
  ``select``, ``unsqueeze``, ``expand``, ``reshape``, ``slice``, ``transpose``, and a view and a
  transpose of those), which launch no kernel but cost host time: per op warm, and per op
  after the caches were evicted minus warm (the first call of each kind in a cold layer).
  Charged to the view ops a captured trace records (``sim.api.predict_captured``); the
  project's hand-written traces list kernels only.

On the AMD EPYC VM a view costs 1.2-1.7 us warm and 11-19 us cold, and a small op 2.4-2.7
us more in a sequence than alone. ``scripts/bench_in_situ.py`` found ops that launch no
kernel costing 3-10 us each inside transformers' MoE blocks (1.5-3.7 ms a block), and later
calls of small kernels 7-12 us over their runners. On CUDA every cost here is 0: kernels
launch asynchronously and the host runs ahead of the device.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch

from costmodel.measure.timing import TimingConfig, evict_caches, measure

#: repetitions of the cold view chain (each after an eviction), interleaved with warm ones
HOST_REPS = 30


def interleaved_ops(device: torch.device, dtype: str) -> list[Callable[[], Any]]:
    """Ten small ops of ten kinds, each on its own inputs (so each can also run alone)."""
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 256, generator=gen).to(device, dt)
    w = torch.randn(256, 16, generator=gen).to(device, dt)
    h = torch.randn(64, 256, generator=gen).to(device, dt)
    idx = torch.randint(0, 32, (64,), generator=gen).to(device)
    return [
        lambda: x @ w,
        lambda: torch.softmax(h, -1),
        lambda: torch.topk(h, 2),
        lambda: torch.sort(idx),
        lambda: torch.bincount(idx, minlength=32),
        lambda: x[idx],
        lambda: h * 2.0,
        lambda: torch.nn.functional.silu(h),
        lambda: torch.zeros_like(x).index_add_(0, idx[:32], x),
        lambda: h.sum(-1),
    ]


def view_chain(device: torch.device, dtype: str) -> tuple[Callable[[], Any], int]:
    """Ten views of different kinds in one call, and how many."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(64, 256, generator=gen).to(device, getattr(torch, dtype))

    def chain() -> Any:
        a, b = h.view(-1), h.t()
        out = (h[0], h.unsqueeze(0), h[:1].expand(8, -1), h.reshape(32, -1), h[:, :8], h.transpose(0, 1))
        return a.view(64, -1), b.t(), out
    return chain, 10


def host_costs_from(alone_s: list[float], sequence_s: float, views_warm_s: list[float], views_cold_s: list[float],
                    n_views: int) -> dict[str, float]:
    """The three ceilings from medians: (sequence - sum alone) / ops, warm views / n, (cold - warm) / n; each >= 0."""
    warm = float(np.median(views_warm_s))
    return {"interleave_overhead_s": max(0.0, (sequence_s - float(np.sum(alone_s))) / len(alone_s)),
            "view_op_s": warm / n_views,
            "view_cold_overhead_s": max(0.0, (float(np.median(views_cold_s)) - warm) / n_views)}


def measure_host_costs(device: torch.device, dtype: str, timing: TimingConfig, reps: int = HOST_REPS) -> dict[str, Any]:
    """The ceilings of the module docstring, with their evidence; CUDA: all 0."""
    if device.type != "cpu":
        return {"interleave_overhead_s": 0.0, "view_op_s": 0.0, "view_cold_overhead_s": 0.0, "evidence": {}}
    if reps < 3:
        raise ValueError(f"host-cost reps must be >= 3, got {reps}")
    per_round = timing.per_round()
    ops = interleaved_ops(device, dtype)

    def sequence() -> None:
        for op in ops:
            op()

    alone: list[list[float]] = [[] for _ in ops]
    seq: list[float] = []
    for _ in range(timing.rounds):
        for i, op in enumerate(ops):
            alone[i].append(measure(op, device=device, config=per_round).median_s)
        seq.append(measure(sequence, device=device, config=per_round).median_s)
    chain, n_views = view_chain(device, dtype)
    warm, cold = [], []
    for _ in range(reps):
        chain()
        start = time.perf_counter()
        chain()
        warm.append(time.perf_counter() - start)
        evict_caches(device, timing)
        start = time.perf_counter()
        chain()
        cold.append(time.perf_counter() - start)
    alone_s = [float(np.median(a)) for a in alone]
    return {**host_costs_from(alone_s, float(np.median(seq)), warm, cold, n_views),
            "evidence": {"ops": len(ops), "alone_s": alone_s, "sequence_s": seq, "views": n_views, "reps": reps,
                         "views_warm_median_s": float(np.median(warm)), "views_cold_median_s": float(np.median(cold))}}


def with_host_costs(ceilings: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """``ceilings`` with the host costs and their evidence (``evidence.host_costs``)."""
    values = {k: v for k, v in measured.items() if k != "evidence"}
    return {**ceilings, **values, "evidence": {**ceilings.get("evidence", {}), "host_costs": measured["evidence"]}}
