"""A workload is something runnable with a trace: predict it, measure it, compare.

Every experiment builds a list of ``Workload`` (a layer or a bare kernel, its kernel trace,
a zero-argument callable that runs it, and descriptive columns), then
``evaluate_workloads`` predicts each trace with every cost-model level, measures every
callable in interleaved rounds and returns one tidy row per workload with the APE of
every level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pandas as pd
import torch

from costmodel.kernels import KernelSpec
from costmodel.predictor import LEVELS, CostModel
from costmodel.timing import TimingConfig
from experiments.common import add_errors, measure_interleaved, print_table
from sim.calibration import DriftReference, drift_summary
from sim.simulator import per_kernel_errors, predict_trace, profile_kernels, summarise_kernels


@dataclass
class Workload:
    label: str  # short name for tables and plots
    trace: Sequence[KernelSpec]  # what it executes
    run: Callable[[], Any] | None  # runs it once (None: predicted only, measure=false)
    columns: dict[str, Any] = field(default_factory=dict)  # experiment-specific descriptors

    @property
    def flops(self) -> float:
        return float(sum(s.flops() for s in self.trace))

    @property
    def bytes_moved(self) -> float:
        return float(sum(s.bytes_moved() for s in self.trace))


def predict_workloads(model: CostModel, workloads: Sequence[Workload]) -> pd.DataFrame:
    rows = []
    for w in workloads:
        pred = predict_trace(model, w.trace, quiet=True)
        rows.append({"label": w.label, **w.columns, "flops": w.flops, "bytes_moved": w.bytes_moved,
                     "kernels": len(w.trace), **{f"pred_{lv}_s": float(pred[lv].sum()) for lv in LEVELS}})
    return pd.DataFrame(rows)


def evaluate_workloads(
    model: CostModel, workloads: Sequence[Workload], *, device: torch.device, timing: TimingConfig,
    description: str, progress: bool = True, peak_flops_per_s: float | None = None,
    references: Sequence[DriftReference] = (),
) -> pd.DataFrame:
    """Predicted (every level) and measured latency of every workload, with errors.

    ``references`` (profiled kernels, ``drift_references``) are timed in the same rounds as
    the workloads, as the profile timed them (no layer-style cache eviction); how fast they
    ran against the profile is ``df.attrs["profile_drift"]`` ({} without references).
    """
    predicted = predict_workloads(model, workloads)
    timed = measure_interleaved([w.run for w in workloads] + [r.run for r in references], device=device,
                                timing=timing, description=description, progress=progress,
                                evict=[timing.cold_cache] * len(workloads) + [False] * len(references))
    measured = pd.DataFrame(timed[:len(workloads)])
    df = add_errors(pd.concat([predicted, measured], axis=1))
    df.attrs["rounds"] = timing.rounds
    df.attrs["freshness"] = dict(getattr(model, "freshness", {}) or {})
    df.attrs["profile_drift"] = drift_summary([t["measured_s"] for t in timed[len(workloads):]], references)
    df["achieved_gflops"] = df["flops"] / df["measured_s"] / 1e9
    df["intensity_flops_per_byte"] = df["flops"] / df["bytes_moved"]
    if peak_flops_per_s:
        df["mfu"] = df["flops"] / df["measured_s"] / peak_flops_per_s
    return df


def per_kernel_table(model: CostModel, workloads: Sequence[Workload], *, device: torch.device,
                     iterations: int, timing: TimingConfig | None = None) -> pd.DataFrame:
    """Every kernel of every workload, profiled inside the real run, next to its predictions
    (from cold caches, like the layer timer, when ``timing.cold_cache``)."""
    tables = []
    cold = timing if timing is not None and timing.cold_cache else None
    for w in workloads:
        measured = profile_kernels(w.run, w.trace, device=device, iterations=iterations, cold=cold)
        errors = per_kernel_errors(predict_trace(model, w.trace, quiet=True), measured)
        errors.insert(0, "workload", w.label)
        tables.append(errors)
    return pd.concat(tables, ignore_index=True)


def print_kernel_breakdown(per_kernel: pd.DataFrame, title: str) -> None:
    """Per workload and family: profiled time, L3 and L0 predictions, share of the time."""
    fam = pd.concat([summarise_kernels(t).assign(workload=w) for w, t in per_kernel.groupby("workload", sort=False)])
    print_table(fam, {"workload": "", "family": "", "kernels": "", "measured_s": "ms", "L3": "ms", "ape_L3_pct": ".1f",
                      "L0": "ms", "share_of_time": ".0%"}, title=title)
