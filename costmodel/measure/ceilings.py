"""Measured device ceilings: the roofline of *this* device, measured, not quoted.

- peak matmul FLOP/s: the best achieved rate over a few large square GEMMs;
- memory bandwidth: a large tensor copy, counting bytes read plus bytes written
  (STREAM's "Copy" convention, McCalpin 1995);
- per-call overhead: the median time of a one-element add (dispatch and launch cost);
- cold-call overhead (CPU): what each *kind* of op of a layer timed from evicted caches pays
  on top, because its code, dispatcher tables and small tensors start out of cache: a chain
  of ten small ops of ten different kinds timed after ``evict_caches`` minus the same chain
  warm, per op (measured on the Intel VM: ~50 us per op, 0.69 vs 0.19 ms for the chain; 14 us
  on the AMD EPYC VM when its profile was made, 9-34 us there since). Kernels are profiled
  with rotated operands but hot code, so layer predictions add it once per distinct kind
  (``costmodel.model.cold_start``); paired
  runs re-time the chain beside their layers (their replay uses that value) and the profile
  keeps the median of its last ``COLD_CALL_HISTORY`` measurements (``sim.predict.paired``);
  0 on CUDA, whose L2 flush leaves the host's caches alone;
- re-cooling curve (CPU, ``recold_fraction_by_mib``): the same chain, warm, then timed again
  after one GEMM streamed S MiB of weights through the caches (S = ``RECOLD_MIB``), as a
  fraction of the chain's extra after a full eviction: how much of a kind's cold cost a later
  call pays after the layer moved S MiB since the kind last ran (``costmodel.model.cold_start``).
  On the AMD EPYC VM (1 MiB L2 per core, 32 MiB L3): about 0.1 up to 4 MiB, 0.2 at 8, 0.7 at 16
  and 1.1-1.3 from 32 MiB on (``scripts/bench_in_situ.py`` reads the same inside eager MoE blocks);
- host costs (CPU, ``costmodel.measure.host_costs``): what a small op pays in a sequence of
  ops of other kinds beyond its tight-loop runner (``interleave_overhead_s``), and what an op
  that launches no kernel (a view) costs warm and cold (``view_op_s``, ``view_cold_overhead_s``);
- ridge point: peak / bandwidth, the arithmetic intensity where the two roofs meet
  (Williams et al. 2009);
- parallel units: SMs on a GPU, threads on a CPU (for the tile/wave features).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from costmodel.families.descriptor import DTYPE_BYTES
from costmodel.measure.host_costs import measure_host_costs, with_host_costs
from costmodel.measure.timing import Measurement, TimingConfig, evict_caches, measure
from costmodel.store.profile import DeviceProfile

COLD_CHAIN_OPS = 10
#: the cold-call overhead a profile predicts with is the median of the chain's last this many
#: measurements (each one sitting's rounds, ``with_cold_call_overhead``): one sitting's value
#: swung 10-32 us per op on the EPYC VM within a day
COLD_CALL_HISTORY = 7


#: MiB a GEMM streams before the chain is re-timed (the re-cooling curve's points), and the
#: repetitions of each (every one interleaves all sizes, the warm chain and a full eviction)
RECOLD_MIB = (1, 4, 8, 16, 32, 64)
RECOLD_REPS = 30


def device_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return int(open("/proc/meminfo").read().split("MemTotal:")[1].split()[0]) * 1024
    except (OSError, IndexError, ValueError):
        return 8 * 1024**3


def ceiling_sizes(device: torch.device, dtype: str) -> dict[str, Any]:
    """Shapes big enough to reach the roofs, small enough for this device's memory."""
    mem = device_memory_bytes(device)
    if device.type == "cuda":
        gemm_sizes, copy_bytes = [4096, 8192, 16384 if dtype != "float32" else 8192], [1024**3, 4 * 1024**3]
    else:
        gemm_sizes, copy_bytes = [1024, 2048], [128 * 1024**2, 512 * 1024**2]
    return {"gemm_sizes": gemm_sizes, "copy_numels": [min(b, mem // 16) // DTYPE_BYTES[dtype] for b in copy_bytes]}


def _row(m: Measurement) -> dict[str, Any]:
    return {k: v for k, v in m.summary().items() if k in ("median_s", "iqr_s", "runs", "noisy")}


def measure_ceilings(device: torch.device, dtype: str, timing: TimingConfig) -> dict[str, Any]:
    """Measure peak FLOP/s, bandwidth, per-call and cold-call overhead on ``device`` in ``dtype``.

    A roof is the best the device achieves, so each is the best median over a few sizes
    measured in ``timing.rounds`` separate passes (a shared machine's slow spells would
    otherwise lower the roof).
    """
    torch_dtype = getattr(torch, dtype)
    sizes = ceiling_sizes(device, dtype)
    per_round = timing.per_round()
    gemm_rows, copy_rows = [], []
    for round_ in range(timing.rounds):
        for n in sizes["gemm_sizes"]:
            a = torch.randn(n, n, device=device).to(torch_dtype)
            b = torch.randn(n, n, device=device).to(torch_dtype)
            m = measure(lambda: torch.matmul(a, b), device=device, config=per_round)
            gemm_rows.append({"round": round_, "n": n, "flops_per_s": 2.0 * n**3 / m.median_s, **_row(m)})
        for numel in sizes["copy_numels"]:
            src = torch.randn(numel, device=device).to(torch_dtype)
            dst = torch.empty_like(src)
            m = measure(lambda: dst.copy_(src), device=device, config=per_round)
            copy_bytes = 2.0 * numel * DTYPE_BYTES[dtype]  # read + write
            copy_rows.append({"round": round_, "bytes_moved": copy_bytes, "bytes_per_s": copy_bytes / m.median_s, **_row(m)})
    peak = max(r["flops_per_s"] for r in gemm_rows)
    bandwidth = max(r["bytes_per_s"] for r in copy_rows)

    x = torch.ones(1, device=device, dtype=torch_dtype)
    m_tiny = measure(lambda: x + x, device=device, config=timing)
    cold = measure_cold_call_overhead(device, dtype, timing)
    recold = measure_recold_fraction(device, dtype, timing)
    host = measure_host_costs(device, dtype, timing)

    units = (
        torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda"
        else torch.get_num_threads()
    )
    return {
        "dtype": dtype,
        "device_kind": device.type,
        "parallel_units": units,  # SMs on a GPU, threads on a CPU
        "peak_flops_per_s": peak,
        "bandwidth_bytes_per_s": bandwidth,
        "overhead_s": m_tiny.median_s,
        "cold_call_overhead_s": cold["cold_call_overhead_s"],
        "recold_fraction_by_mib": recold["recold_fraction_by_mib"],
        **{k: v for k, v in host.items() if k != "evidence"},
        "ridge_flops_per_byte": peak / bandwidth,
        "evidence": {
            "gemm": gemm_rows,
            "copy": copy_rows,
            "tiny_add": _row(m_tiny),
            "cold_chain": cold["evidence"],
            "recold_chain": recold["evidence"],
            "host_costs": host["evidence"],
        },
    }


def _small_op_chain(device: torch.device, dtype: torch.dtype):
    """Ten small ops of different kinds, as a MoE or GNN layer strings them (router-sized)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 256, generator=gen).to(device, dtype)
    w = torch.randn(256, 16, generator=gen).to(device, dtype)
    idx = torch.randint(0, 32, (64,), generator=gen).to(device)

    def chain() -> torch.Tensor:
        probs = torch.softmax(x @ w, -1)  # 1 gemm, 2 softmax
        _, experts = torch.topk(probs, 2)  # 3
        _, order = torch.sort(experts.reshape(-1))  # 4
        torch.bincount(experts.reshape(-1), minlength=16)  # 5
        rows = idx[order]  # 6
        scaled = x[rows] * 2.0  # 7 gather, 8 scale
        return torch.zeros_like(x).index_add_(0, rows, scaled)  # 9 zeros, 10 index_add
    return chain


def cold_chain(device: torch.device, dtype: str):
    """The chain the cold-call overhead is measured on (``sim.predict.paired`` times it beside the layers)."""
    return _small_op_chain(device, getattr(torch, dtype))


def cold_call_overhead_from(cold_s: list[float], warm_s: list[float]) -> float:
    """Per-op cold-call overhead from the chain's round medians: (cold - warm) / ops, >= 0."""
    return max(0.0, (float(np.median(cold_s)) - float(np.median(warm_s))) / COLD_CHAIN_OPS)


def measure_cold_call_overhead(device: torch.device, dtype: str, timing: TimingConfig) -> dict[str, Any]:
    """Per-op cost of starting from evicted caches (see the module docstring); CUDA: 0."""
    if device.type != "cpu":
        return {"cold_call_overhead_s": 0.0, "evidence": {}}
    chain = cold_chain(device, dtype)
    per_round = timing.per_round()
    cold, warm = [], []
    for _ in range(timing.rounds):
        cold.append(measure(chain, device=device, config=per_round, evict_cpu_cache=True).median_s)
        warm.append(measure(chain, device=device, config=per_round).median_s)
    return {"cold_call_overhead_s": cold_call_overhead_from(cold, warm),
            "evidence": {"chain_ops": COLD_CHAIN_OPS, "cold_s": cold, "warm_s": warm}}


def recold_fraction_from(warm_s: list[float], evicted_s: list[float], after_s: dict[int, list[float]]) -> dict[str, float]:
    """Per streamed size: (median chain after it - median warm) / (median after eviction - median warm),
    >= 0; {} where the eviction costs the chain nothing measurable."""
    warm, full = float(np.median(warm_s)), float(np.median(evicted_s)) - float(np.median(warm_s))
    if full <= 0:
        return {}
    return {str(mib): max(0.0, (float(np.median(t)) - warm) / full) for mib, t in after_s.items()}


def measure_recold_fraction(device: torch.device, dtype: str, timing: TimingConfig,
                            sizes_mib: tuple[int, ...] = RECOLD_MIB, reps: int = RECOLD_REPS) -> dict[str, Any]:
    """The re-cooling curve (see the module docstring); CUDA: {} (no cold charge there).

    Each repetition runs the chain warm and times it again: right away (warm), after a GEMM
    [4, 1024] x [1024, n] streamed S MiB of weights (each S), and after ``evict_caches``. The
    sizes interleave, so a slow spell of the machine moves every column together."""
    if device.type != "cpu":
        return {"recold_fraction_by_mib": {}, "evidence": {}}
    if not sizes_mib or min(sizes_mib) <= 0 or reps < 3:
        raise ValueError(f"recold sizes must be > 0 MiB and reps >= 3, got sizes {list(sizes_mib)} and reps {reps}")
    torch_dtype = getattr(torch, dtype)
    chain = cold_chain(device, dtype)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(4, 1024, generator=gen).to(device, torch_dtype)
    weights = {mib: torch.randn(1024, max(1, mib * 2**20 // (1024 * DTYPE_BYTES[dtype])), generator=gen).to(device, torch_dtype)
               for mib in sizes_mib}
    warm, evicted, after = [], [], {mib: [] for mib in sizes_mib}

    def timed() -> float:
        start = time.perf_counter()
        chain()
        return time.perf_counter() - start

    for _ in range(reps):
        chain()
        warm.append(timed())
        for mib, w in weights.items():
            chain()
            torch.matmul(a, w)
            after[mib].append(timed())
        chain()
        evict_caches(device, timing)
        evicted.append(timed())
    return {"recold_fraction_by_mib": recold_fraction_from(warm, evicted, after),
            "evidence": {"chain_ops": COLD_CHAIN_OPS, "reps": reps, "stream": "GEMM [4, 1024] x [1024, n] (MKL reads n columns)",
                         "warm_s": _median_iqr(warm), "evicted_s": _median_iqr(evicted),
                         "after_mib_s": {str(mib): _median_iqr(t) for mib, t in after.items()}}}


def _median_iqr(seconds: list[float]) -> dict[str, float]:
    q1, med, q3 = np.percentile(seconds, [25, 50, 75])
    return {"median": float(med), "iqr": float(q3 - q1)}


def with_recold_fraction(ceilings: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """``ceilings`` with the re-cooling curve and its evidence (``evidence.recold_chain``)."""
    return {**ceilings, "recold_fraction_by_mib": measured["recold_fraction_by_mib"],
            "evidence": {**ceilings.get("evidence", {}), "recold_chain": measured["evidence"]}}


def with_cold_call_overhead(ceilings: dict[str, Any], overhead_s: float, evidence: dict[str, Any]) -> dict[str, Any]:
    """``ceilings`` with one more measurement of the cold-call overhead: it joins the history
    (``evidence.cold_call_history``, the last ``COLD_CALL_HISTORY``; a profile's value from
    before the history is its first entry) and ``cold_call_overhead_s`` becomes the history's
    median; the chain timings it came from are kept (``evidence.cold_chain``)."""
    old = dict(ceilings.get("evidence", {}))
    history = list(old.get("cold_call_history", []))
    if not history and ceilings.get("cold_call_overhead_s") is not None:
        history = [{"overhead_s": float(ceilings["cold_call_overhead_s"]), "at": None}]
    history = (history + [{"overhead_s": float(overhead_s), "at": evidence.get("paired_at")}])[-COLD_CALL_HISTORY:]
    return {**ceilings, "cold_call_overhead_s": float(np.median([h["overhead_s"] for h in history])),
            "evidence": {**old, "cold_chain": evidence, "cold_call_history": history}}


def ensure_ceilings(
    profile: DeviceProfile, device: torch.device, dtype: str, timing: TimingConfig, *, remeasure: bool = False
) -> dict[str, Any]:
    """The profile's ceilings, measuring (and saving) them first if it has none.

    Call it holding the machine's measuring lock. When another process stored ceilings
    meanwhile (a shared profile root), theirs are kept and returned, so every process
    predicts with the same roofs.
    """
    ceilings = profile.ceilings()
    if ceilings is None or remeasure:
        print("measuring ceilings (peak matmul FLOP/s, copy bandwidth, per-call overhead)", flush=True)
        ceilings = profile.write_ceilings(measure_ceilings(device, dtype, timing), replace=remeasure)
    if "cold_call_overhead_s" not in ceilings:  # profiles measured before this ceiling existed: add it
        print("measuring the cold-call overhead (small ops after evicting the caches)", flush=True)
        cold = measure_cold_call_overhead(device, dtype, timing)
        _, ceilings = profile.update_ceilings(  # another process's value, stored meanwhile, is kept (as above)
            lambda stored: stored if "cold_call_overhead_s" in stored else
            with_cold_call_overhead(stored or ceilings, cold["cold_call_overhead_s"], cold["evidence"]))
    if "recold_fraction_by_mib" not in ceilings:  # profiles measured before the re-cooling curve existed
        print("measuring the re-cooling curve (small ops after a GEMM streamed 1-64 MiB)", flush=True)
        recold = measure_recold_fraction(device, dtype, timing)
        _, ceilings = profile.update_ceilings(
            lambda stored: stored if "recold_fraction_by_mib" in stored else with_recold_fraction(stored or ceilings, recold))
    if "interleave_overhead_s" not in ceilings:  # profiles measured before the host costs existed
        print("measuring host costs (small ops in a sequence against alone; views warm and cold)", flush=True)
        host = measure_host_costs(device, dtype, timing)
        _, ceilings = profile.update_ceilings(
            lambda stored: stored if "interleave_overhead_s" in stored else with_host_costs(stored or ceilings, host))
    return ceilings
