"""Predict a layer from its trace, measure the real module, and time each kernel in it.

- ``predict_trace``: every kernel of a trace through every cost-model level
  (vectorised), summed per level: predicted end-to-end latency.
- ``predict_traces``: the same for many traces at once (a design sweep): every distinct
  kernel over all traces featurised and predicted once, then summed per trace.
- ``measure_callable``: the real forward pass through the timing harness (median of
  repeats after warm-up, spread kept).
- ``profile_kernels``: the real forward pass under ``torch.profiler``; each
  ``kernel_scope`` range is matched, in order, to the trace entry it executes, so
  per-kernel errors are visible and cannot cancel unseen in the end-to-end number.
  The profiler's own cost per recorded event is measured (``profiler_overhead_s``) and
  subtracted once per event a kernel records.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

from costmodel.families.descriptor import KernelSpec
from costmodel.measure.scope import SCOPE_PREFIX, kernel_scope
from costmodel.measure.timing import Measurement, TimingConfig, evict_caches, measure
from costmodel.model.cold_start import charges_at, cold_start_kind, cold_start_per_kind_s, recold_curve
from costmodel.model.composition import composition_charges_s, per_call_s
from costmodel.model.features import kernel_table
from costmodel.model.models import ExtrapolationWarning
from costmodel.model.predictor import CostModel, LEVELS

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # above USDT (5), kineto's most verbose-proof level: no profiler chatter


class TraceMismatchError(RuntimeError):
    """The module executed different kernels than its trace lists."""


def predict_trace(
    model: CostModel, trace: Sequence[KernelSpec], levels: Sequence[str] = LEVELS, *, quiet: bool = False
) -> pd.DataFrame:
    """Per-kernel predictions (seconds), one column per level, plus label and family.

    Every kernel also pays the measured cost of running among other kinds
    (``costmodel.model.composition``); with a cold-cache profile the first kernel of each kind in the layer also pays the
    measured cold start (``costmodel.model.cold_start``: code and small tensors out of cache
    after the eviction a cold layer starts from), and a later one its re-cooling share, at the
    levels that model overheads (L2, L3);
    L0 and L1 are FLOPs-only by definition.
    """
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore", ExtrapolationWarning)
        pred = model.predict(trace, levels)
    for lv in levels:
        pred[lv] += composition_charges_s(model, lv, trace)
    pred.insert(0, "family", [s.family for s in trace])
    pred.insert(1, "kernel", [s.label() for s in trace])
    pred.insert(2, "flops", [s.flops() for s in trace])
    return pred


@dataclass(frozen=True)
class TraceBatch:
    """Many traces as one table of their distinct kernels: ``table`` (a kernel table, one
    row per distinct descriptor), ``flat`` (the table row of every kernel of every trace, in
    order) and ``lengths`` (kernels per trace)."""

    table: pd.DataFrame
    flat: np.ndarray
    lengths: np.ndarray
    specs: tuple[KernelSpec, ...] = ()  # the descriptor of each table row

    def trace(self, i: int) -> list[KernelSpec]:
        """The descriptors of trace ``i``, in order (needs ``specs``)."""
        start = int(self.lengths[:i].sum())
        return [self.specs[j] for j in self.flat[start:start + int(self.lengths[i])]]

    def mib_since_kind(self) -> np.ndarray:
        """Per kernel of every trace (``flat`` order): MiB the kernels between it and the previous
        kernel of its kind in the same trace moved; NaN at a kind's first kernel in its trace
        (``costmodel.model.cold_start.mib_since_kind``, vectorised over the traces)."""
        if not len(self.flat):
            return np.zeros(0, dtype=np.float64)
        kind_ids: dict[str, int] = {}
        row_kind = np.fromiter((kind_ids.setdefault(cold_start_kind(s), len(kind_ids)) for s in self.specs),
                               dtype=np.int64, count=len(self.specs))
        moved = self.table["bytes_moved"].to_numpy(dtype=np.float64)[self.flat]
        after = np.cumsum(moved)  # bytes moved up to and including each kernel (differences within a trace hold)
        owner = np.repeat(np.arange(len(self.lengths)), self.lengths)
        group = owner * len(kind_ids) + row_kind[self.flat]
        order = np.lexsort((np.arange(len(group)), group))  # by (trace, kind), then position
        same = np.r_[False, group[order][1:] == group[order][:-1]]
        since = np.full(len(group), np.nan)
        later, prev = order[same], order[np.r_[same[1:], False]]
        since[later] = (after[later] - moved[later] - after[prev]) / 2**20
        return since

    def keys(self) -> list[str] | None:
        """Each table row's descriptor key (L3 looks up measured kernels by it)."""
        return [s.key() for s in self.specs] if self.specs else None

    @classmethod
    def from_traces(cls, traces: Sequence[Sequence[KernelSpec]]) -> "TraceBatch":
        unique: dict[KernelSpec, int] = {}
        lengths = np.fromiter((len(t) for t in traces), dtype=np.int64, count=len(traces))
        flat = np.fromiter((unique.setdefault(s, len(unique)) for t in traces for s in t), dtype=np.int64,
                           count=int(lengths.sum()))
        return cls(kernel_table(unique) if unique else pd.DataFrame(), flat, lengths, tuple(unique))


def predict_traces(
    model: CostModel, traces: Sequence[Sequence[KernelSpec]] | TraceBatch, levels: Sequence[str] = LEVELS, *,
    quiet: bool = True,
) -> pd.DataFrame:
    """Predicted end-to-end seconds of many traces, one row per trace: ``pred_<level>_s``
    per level, plus ``kernels``, ``flops`` and ``bytes_moved`` (sums over the trace).

    Each distinct descriptor over all traces is featurised and predicted once (one kernel
    table through ``CostModel.predict_table``), then broadcast back and summed per trace
    with ``np.bincount``; the sums equal ``predict_trace``'s per trace (the cold start of
    each distinct kind and the re-cooling of later calls included at L2/L3 of a cold profile).
    """
    batch = traces if isinstance(traces, TraceBatch) else TraceBatch.from_traces(traces)
    n = len(batch.lengths)
    owner = np.repeat(np.arange(n), batch.lengths)
    out = pd.DataFrame({"kernels": batch.lengths})
    if batch.table.empty:
        for col in (*(f"pred_{lv}_s" for lv in levels), "flops", "bytes_moved"):
            out[col] = 0.0
        return out
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore", ExtrapolationWarning)
        pred = model.predict_table(batch.table, levels, keys=batch.keys())
    since = batch.mib_since_kind()
    for lv in levels:
        charges = charges_at(cold_start_per_kind_s(model, lv), recold_curve(model, lv), since) + per_call_s(model, lv)
        per_kernel = pred[lv].to_numpy()[batch.flat] + charges
        out[f"pred_{lv}_s"] = np.bincount(owner, weights=per_kernel, minlength=n)
    for col in ("flops", "bytes_moved"):
        out[col] = np.bincount(owner, weights=batch.table[col].to_numpy()[batch.flat], minlength=n)
    return out


def measure_callable(fn: Callable[[], Any], device: torch.device, timing: TimingConfig) -> Measurement:
    """A whole layer: with ``timing.cold_cache`` every timed call starts from cold caches."""
    return measure(fn, device=device, config=timing, evict_cpu_cache=timing.cold_cache)


def profiler_overhead_s(device: torch.device, iterations: int = 200) -> float:
    """What the profiler adds per recorded event: a kernel scope holding a one-element add
    (two events) profiled, minus the same unprofiled, halved (medians). Kernels are charged
    this once per event they record (their scope and every nested aten op), so tiny
    kernels are not billed for the profiler's own bookkeeping."""
    x = torch.ones(1, device=device)

    def tiny() -> None:
        with kernel_scope("overhead"):
            x.add_(0)

    plain = []
    for _ in range(iterations):
        start = time.perf_counter()
        tiny()
        plain.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(iterations):
            tiny()
    scoped = [ev.cpu_time_total * 1e-6 for ev in prof.events() if ev.name == SCOPE_PREFIX + "overhead"]
    return max(float(np.median(scoped)) - float(np.median(plain)), 0.0) / 2


def _events_under(event: Any) -> int:
    return 1 + sum(_events_under(child) for child in event.cpu_children)


def profile_kernels(
    fn: Callable[[], Any], trace: Sequence[KernelSpec], *, device: torch.device, iterations: int = 5,
    cold: TimingConfig | None = None,
) -> pd.DataFrame:
    """Median per-kernel time inside the real forward pass, aligned with ``trace``
    (the profiler's own per-event overhead subtracted on CPU); with ``cold`` (a timing
    config), caches are evicted before each profiled pass, as the layer timer does."""
    fn()  # warm-up outside the profiler
    overhead = profiler_overhead_s(device) if device.type == "cpu" else 0.0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    per_iter: list[list[float]] = []
    # One profiler session for all passes, events read at the end: starting and stopping
    # the profiler and building its event lists allocate, and on the CPU those allocations
    # carve up the large free blocks the layer's activations reuse, so per-pass sessions made
    # the padded MoE layer take 32k-65k page faults and +10-40% per pass.
    with profile(activities=activities) as prof:
        for _ in range(iterations):
            if cold is not None:
                evict_caches(device, cold)
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    all_scopes = [ev for ev in prof.events() if ev.name.startswith(SCOPE_PREFIX)]
    expected = [s.family for s in trace]
    n = len(expected)
    if len(all_scopes) != iterations * n:
        raise TraceMismatchError(
            f"the module ran {len(all_scopes) / iterations:g} kernels per pass but its trace lists {n}: {expected[:12]}..."
        )
    for i in range(iterations):
        scopes = all_scopes[i * n:(i + 1) * n]
        families = [ev.name[len(SCOPE_PREFIX):] for ev in scopes]
        if families != expected:
            raise TraceMismatchError(
                f"the module ran {len(families)} kernels {families[:12]}... but its trace lists "
                f"{len(expected)} {expected[:12]}..."
            )
        if device.type == "cuda":
            per_iter.append([_device_time_us(ev) * 1e-6 for ev in scopes])
        else:
            per_iter.append([max(ev.cpu_time_total * 1e-6 - overhead * _events_under(ev), 1e-7) for ev in scopes])
    times = np.array(per_iter)
    return pd.DataFrame({
        "family": [s.family for s in trace],
        "kernel": [s.label() for s in trace],
        "measured_s": np.median(times, axis=0),
        "measured_iqr_s": np.subtract(*np.percentile(times, [75, 25], axis=0)),
        "profiler_overhead_s": overhead,
    })


def _device_time_us(event: Any) -> float:
    total = getattr(event, "device_time_total", None)
    if total is None:
        total = getattr(event, "cuda_time_total", 0.0)
    return float(total)


def per_kernel_errors(predicted: pd.DataFrame, measured: pd.DataFrame, levels: Sequence[str] = LEVELS) -> pd.DataFrame:
    """Join predictions and profiled times by trace position, with APE per level."""
    out = predicted.copy()
    out["measured_s"] = measured["measured_s"].to_numpy()
    out["measured_iqr_s"] = measured["measured_iqr_s"].to_numpy()
    for lv in levels:
        out[f"ape_{lv}_pct"] = 100 * (out[lv] - out["measured_s"]).abs() / out["measured_s"]
    return out


def summarise_kernels(errors: pd.DataFrame, levels: Sequence[str] = LEVELS) -> pd.DataFrame:
    """Per-family totals of a per-kernel error table: where the time goes, where the error is."""
    agg = {"kernels": ("kernel", "size"), "measured_s": ("measured_s", "sum"), **{lv: (lv, "sum") for lv in levels}}
    out = errors.groupby("family").agg(**agg).sort_values("measured_s", ascending=False)
    for lv in levels:
        out[f"ape_{lv}_pct"] = 100 * (out[lv] - out["measured_s"]).abs() / out["measured_s"]
    out["share_of_time"] = out["measured_s"] / out["measured_s"].sum()
    return out.reset_index()


def profile_aten_ops(fn: Callable[[], Any], *, device: torch.device, iterations: int = 3) -> pd.DataFrame:
    """Median per-pass self time of every aten op name in the real run (torch profiler):
    the measured side of a captured trace's coverage. On CUDA the device self time of each
    op (its kernels) is used, on the CPU the CPU self time; the profiler's own per-event
    overhead is subtracted on the CPU, as in ``profile_kernels``."""
    fn()  # warm-up outside the profiler
    overhead = profiler_overhead_s(device) if device.type == "cpu" else 0.0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(iterations):
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    totals: dict[str, float] = {}
    for ev in prof.events():
        if not ev.name.startswith("aten::"):
            continue
        if device.type == "cuda":
            seconds = float(getattr(ev, "self_device_time_total", 0.0)) * 1e-6
        else:
            seconds = max(ev.self_cpu_time_total * 1e-6 - overhead, 0.0)
        totals[ev.name] = totals.get(ev.name, 0.0) + seconds
    return pd.DataFrame({"aten_op": list(totals), "measured_s": [v / iterations for v in totals.values()]})


def measured_coverage(op_times: pd.DataFrame, kinds_by_op: dict[str, set[str]]) -> tuple[float, pd.DataFrame]:
    """Share of measured self time on ops the registry modelled.

    ``kinds_by_op`` maps a profiler name (``aten::mm``) to the kinds its captured calls got
    (kernel / absorbed / view / unmapped). Time of names the capture never saw (composite
    wrappers such as ``aten::linear``, whose self time is dispatch overhead around mapped
    ops) is left out of both sides; a name with any unmapped call counts as unmapped."""
    rows = op_times.copy()
    rows["kinds"] = rows["aten_op"].map(lambda n: ",".join(sorted(kinds_by_op.get(n, set()))))
    seen = rows[rows["kinds"] != ""]
    unmapped = seen["kinds"].str.contains("unmapped")
    total = float(seen["measured_s"].sum())
    covered = float(seen.loc[~unmapped, "measured_s"].sum())
    return (covered / total if total > 0 else 1.0), rows
