"""What a layer timed from evicted caches pays to start each kind of kernel it runs.

A cold layer (``timing.cold_cache``) starts with its code, dispatcher tables and small
tensors out of cache. Kernels are profiled with hot code, so each kind of kernel a layer
runs pays once more: the first call of ``elementwise/mul`` brings its code paths back into
cache, and the second call finds them there. The charge is the profile's
``ceilings.cold_call_overhead_s``, measured on a chain of ten small ops of ten different
kinds after an eviction minus the same chain warm, per op (``costmodel.measure.ceilings``):
a cost per distinct kind by construction, so it is charged per distinct kind of a trace,
at the kind's first kernel.

Charged per kernel instead, it grows with the number of calls, not of kinds: so charged,
OLMoE's block (649 kernels) was predicted 1.38x its measured time,
Qwen3-MoE's 1.47x, DeepSeek-V3's 1.56x, while blocks of 34-89 kernels sat at 1.03-1.05x
(``results/cpu_epyc/unseen_modules``, held out, AMD EPYC VM). ``scripts/bench_composition.py``
measured the same on the ``moe_skew`` layer: tiny twins of it (d_model 8) cost 0.55-0.93 ms
a cold call whatever their 15-90 kernels, and the first call of each small kind 18-118 us
over the kind's runner.

A kind is the code path (``kernel_kind``: the family plus the field that picks the aten op)
and the dtype. L0 and L1 are FLOPs-only by definition and never pay it; nor does a warm
profile, nor CUDA (where the chain measures 0).

**Re-cooling.** A later call of a kind finds its code warm only if the layer has not streamed
enough data since the kind last ran to push it out again. An eager expert loop streams an
expert's weights (8-24 MiB at the ``moe_skew`` sizes) between two calls of the same small op,
and ``scripts/bench_in_situ.py`` timed those later calls inside transformers' eager blocks at
10-28 us over their runners, about the first call's extra (AMD EPYC VM). The profile's
``ceilings.recold_fraction_by_mib`` (``costmodel.measure.ceilings.measure_recold_fraction``) is
the cold chain re-timed after a GEMM streamed S MiB, as a fraction of its cost after a full
eviction, at a few S. A later call is charged the per-kind cost times that fraction at the
bytes the layer's kernels moved since the kind's previous call (linear between measured
sizes, 0 at 0 bytes, the last value beyond the largest). A profile without the curve (made
before it existed, or warm, or CUDA) charges first calls only.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

#: levels that model per-call costs (the roofline's per-call overhead and the fitted L3)
CHARGED_LEVELS = ("L2", "L3")


def kernel_kind(spec: Any) -> str:
    """The code path a kernel runs: its family plus the field that picks the aten op
    (``op``, ``impl`` or ``backend``), e.g. ``elementwise/add``, ``scatter/index_add``."""
    sub = next((getattr(spec, f) for f in ("op", "impl", "backend") if getattr(spec, f, None)), None)
    return f"{spec.family}/{sub}" if sub else spec.family


def cold_start_kind(spec: Any) -> str:
    """What one cold start warms: the kernel's code path and its dtype, e.g. ``gemm/float32``."""
    return f"{kernel_kind(spec)}/{spec.dtype}"


def cold_start_per_kind_s(model: Any, level: str) -> float:
    """Seconds a cold-cache layer pays at ``level`` for each distinct kind it runs:
    ``ceilings.cold_call_overhead_s`` at L2 and L3 of a cold profile, else 0."""
    if model.fingerprint.cache != "cold" or level not in CHARGED_LEVELS:
        return 0.0
    return float(model.ceilings.get("cold_call_overhead_s", 0.0))


def recold_curve(model: Any, level: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The profile's re-cooling curve at ``level``: (MiB streamed, fraction of the cold cost),
    starting at (0, 0); None where nothing is charged (no curve, a warm profile, L0/L1)."""
    curve = model.ceilings.get("recold_fraction_by_mib") if cold_start_per_kind_s(model, level) > 0 else None
    if not curve:
        return None
    mib = np.array([0.0, *(float(k) for k in curve)])
    order = np.argsort(mib)
    return mib[order], np.array([0.0, *(float(v) for v in curve.values())])[order]


def first_of_kind(kinds: Iterable[str]) -> np.ndarray:
    """True at the first occurrence of each kind, in order."""
    seen: set[str] = set()
    out = []
    for k in kinds:
        out.append(k not in seen)
        seen.add(k)
    return np.asarray(out, dtype=bool)


def mib_since_kind(trace: Sequence[Any]) -> np.ndarray:
    """Per kernel of ``trace``: MiB the kernels between it and the previous kernel of its kind
    moved (``bytes_moved``); NaN at the first kernel of each kind."""
    moved, last, out = 0.0, {}, []
    for s in trace:
        k = cold_start_kind(s)
        out.append((moved - last[k]) / 2**20 if k in last else np.nan)
        moved += float(s.bytes_moved())
        last[k] = moved
    return np.asarray(out, dtype=np.float64)


def charges_at(per_kind_s: float, curve: tuple[np.ndarray, np.ndarray] | None, mib_since: np.ndarray) -> np.ndarray:
    """Per kernel, from its MiB since the kind's previous kernel (NaN at a kind's first):
    ``per_kind_s`` at a first kernel and, with a re-cooling ``curve``, ``per_kind_s`` times the
    curve at the MiB streamed since at every later one (0 without a curve)."""
    since = np.asarray(mib_since, dtype=np.float64)
    first = np.isnan(since)
    out = per_kind_s * first.astype(np.float64)
    if curve is not None and per_kind_s:
        out[~first] = per_kind_s * np.interp(since[~first], *curve)
    return out


def charges_s(per_kind_s: float, curve: tuple[np.ndarray, np.ndarray] | None, trace: Sequence[Any]) -> np.ndarray:
    """Per kernel of ``trace``: its cold start and re-cooling charges (``charges_at``)."""
    if not per_kind_s or not len(trace):
        return np.zeros(len(trace), dtype=np.float64)
    return charges_at(per_kind_s, curve, mib_since_kind(trace))


def cold_start_charges_s(model: Any, level: str, trace: Sequence[Any]) -> np.ndarray:
    """Per kernel of ``trace``, its cold-start charge at ``level``: the per-kind charge at the
    first kernel of each kind and its re-cooling share at later ones. Summed, the trace's cold start."""
    return charges_s(cold_start_per_kind_s(model, level), recold_curve(model, level), trace)


def cold_start_s(model: Any, level: str, trace: Sequence[Any]) -> float:
    """The trace's whole cold start at ``level`` (``cold_start_charges_s`` summed)."""
    return float(cold_start_charges_s(model, level, trace).sum())


def distinct_kinds(trace: Sequence[Any]) -> int:
    """How many kinds ``trace`` runs (each pays one cold start in a cold layer)."""
    return len({cold_start_kind(s) for s in trace})
