"""Shared by the bring-your-own-module experiments (hf_moe, pyg_conv): predict captured
traces, measure the real calls, and measure how much of the real time the registry covers.

A ``CapturedWorkload`` is a zero-argument call (an inference forward or a training step)
with the trace captured from one run of it. ``evaluate_captured`` predicts every trace
with every level (``sim.api.predict_captured``: unmapped ops by the roofline fallback),
times every call in interleaved rounds (``experiments.common.measure_interleaved``), and
profiles each call once per op (``sim.predict.simulator.profile_aten_ops``) to get the share of the
measured time on ops of modelled families (``coverage_measured_pct``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pandas as pd
import torch

from costmodel.measure.timing import TimingConfig
from costmodel.model.predictor import CostModel, LEVELS
from experiments.common import add_errors, measure_interleaved
from experiments.workloads import Pairing, error_parts_of, heldout_scored, scored_tables
from sim.api import predict_captured
from sim.capture.dispatch import CapturedTrace
from sim.predict.simulator import measured_coverage, profile_aten_ops


@dataclass
class CapturedWorkload:
    label: str  # short name for tables and plots
    run: Callable[[], Any]  # the timed call
    captured: CapturedTrace  # what one run of it dispatched
    columns: dict[str, Any] = field(default_factory=dict)


def missing_extra_error(package: str, extra: str, experiment: str) -> ImportError:
    return ImportError(
        f"experiment={experiment} needs {package}, which is not installed: pip install -e '.[{extra}]' "
        f"(or pip install {package})"
    )


def evaluate_captured(model: CostModel, workloads: Sequence[CapturedWorkload], *, device: torch.device,
                      timing: TimingConfig, description: str, progress: bool = True,
                      coverage_iterations: int = 3, pairing: Pairing | None = None, heldout: Any = None) -> pd.DataFrame:
    """One row per workload: predictions per level, coverage (predicted and measured),
    measured latency and APE per level, capture cost over one measured call.

    With ``pairing`` (``calibration.paired``) the traces' distinct mapped kernels are timed
    in the same rounds as the calls and the models refitted before predicting, as in
    ``experiments.workloads.evaluate_workloads``. With ``heldout`` (``sim.predict.heldout``) the
    headline predictions are held out, the lookup and the replay beside them
    (``experiments.workloads.scored_tables``)."""
    from sim.predict.paired import kernel_jobs, layer_kernel_jobs, paired_order  # noqa: PLC0415

    traces = [w.captured.kernels() for w in workloads]
    jobs = kernel_jobs(traces, device, cold=timing.cold_cache) if pairing else []
    hrefs = list(heldout.references) if heldout is not None else []  # held-out drift references
    n = len(workloads)
    first_kernel = n + len(hrefs)
    held_refs = list(range(n, first_kernel))
    companions = ({i: ks + held_refs for i, ks in layer_kernel_jobs(traces, first_kernel).items()} if jobs else
                  {i: held_refs for i in range(n)})
    start = time.perf_counter()
    timed = measure_interleaved([w.run for w in workloads] + [r.run for r in hrefs] + jobs, device=device,
                                timing=timing, description=description, progress=progress,
                                evict=[timing.cold_cache] * n + [False] * (len(hrefs) + len(jobs)),
                                order=paired_order(traces, first_kernel) if jobs else None,
                                watch=range(n), companions=companions)
    wall_s = time.perf_counter() - start
    measured = pd.DataFrame(timed[:n]).drop(columns="rounds")
    lookup = add_errors(pd.concat([_predicted_rows(model, workloads), measured], axis=1))
    replay = (None if pairing is None else
              pairing.finish(model, jobs, timed[first_kernel:], lambda m: _predicted_rows(m, workloads), measured,
                             wall_s))
    held, drift_scaled = heldout_scored(heldout, lambda m, f: _predicted_rows(m, workloads, f), measured,
                                        timed[n:first_kernel])
    df = scored_tables(lookup, replay, held, heldout, heldout_drift=drift_scaled)
    if heldout is not None and jobs:
        df.attrs["heldout_by_kind"] = error_parts_of(traces, heldout.model, jobs, timed[first_kernel:], measured, model)
    df.attrs["rounds"] = timing.rounds
    df.attrs["freshness"] = dict(getattr(model, "freshness", {}) or {})
    coverage = []
    for w in workloads:
        share, _ = measured_coverage(profile_aten_ops(w.run, device=device, iterations=coverage_iterations),
                                     w.captured.kinds_by_profiler_name())
        coverage.append(100 * share)
    df["coverage_measured_pct"] = coverage
    df["capture_over_call"] = df["capture_s"] / df["measured_s"]
    df["achieved_gflops"] = df["flops"] / df["measured_s"] / 1e9
    return df


def _predicted_rows(model: CostModel, workloads: Sequence[CapturedWorkload],
                    l3_factor: Callable[[str], float] | None = None) -> pd.DataFrame:
    rows = []
    for w in workloads:
        pred = predict_captured(w.captured, model, l3_factor=l3_factor)
        counts = w.captured.counts()
        rows.append({
            "label": w.label, **w.columns, "flops": pred.flops,
            "bytes_moved": float(sum(s.bytes_moved() for s in pred.trace)),
            "kernels": counts["kernel"], "unmapped_ops": counts["unmapped"],
            "unmapped_names": ";".join(pred.unmapped["aten_op"]) if pred.unmapped is not None else "",
            **{f"pred_{lv}_s": pred.total_s[lv] for lv in LEVELS},
            "pred_forward_L3_s": pred.phase_s.get("forward", {}).get("L3", 0.0),
            "pred_backward_L3_s": pred.phase_s.get("backward", {}).get("L3", 0.0),
            "coverage_pred_pct": 100 * pred.coverage["L3"], "capture_s": w.captured.capture_s,
        })
    return pd.DataFrame(rows)


def coverage_details(df: pd.DataFrame) -> dict[str, Any]:
    """details.coverage_pct (median measured coverage over rows) and its companions."""
    return {
        "coverage_pct": float(df["coverage_measured_pct"].median()),
        "coverage_min_pct": float(df["coverage_measured_pct"].min()),
        "coverage_predicted_pct": float(df["coverage_pred_pct"].median()),
        "unmapped_ops": sorted({n for names in df["unmapped_names"] for n in str(names).split(";") if n}),
        "capture_over_call_median": float(df["capture_over_call"].median()),
    }


def training_details(df: pd.DataFrame) -> dict[str, Any]:
    """Forward vs training step, predicted and measured, per module at its training point:
    the step/forward ratio (rule of thumb ~3x for GEMM-heavy layers: backward ~2x forward)
    and the step's L3 error. The forward is the inference forward (no autograd graph)."""
    out: dict[str, Any] = {}
    for (module, point), g in df.groupby(["module", "point"], sort=False):
        step, fwd = g[g["kind"] == "train_step"], g[g["kind"] != "train_step"]
        if fwd.empty or step.empty:
            continue
        f, s = fwd.iloc[0], step.iloc[0]
        out[str(module)] = {
            "measured_step_over_forward": float(s["measured_s"] / f["measured_s"]),
            "predicted_step_over_forward_L3": float(s["pred_L3_s"] / f["pred_L3_s"]),
            "predicted_backward_over_forward_L3": float(s["pred_backward_L3_s"] / max(s["pred_forward_L3_s"], 1e-12)),
            "train_step_ape_L3_pct": float(s["ape_L3_pct"]), "forward_ape_L3_pct": float(f["ape_L3_pct"]),
        }
    steps = df[df["kind"] == "train_step"]
    if not steps.empty:
        out["train_step_median_ape_pct"] = {lv: float(steps[f"ape_{lv}_pct"].median()) for lv in LEVELS}
    return out


def measure_captured(cfg: Any, rt: Any, model: CostModel, workloads: Sequence[CapturedWorkload], *, what: str,
                     description: str) -> pd.DataFrame:
    """The measuring part both captured-module experiments (hf_moe, pyg_conv) share: the
    held-out models (``heldout_for``), the paired kernels (``pairing_for``, suite ``what``),
    every workload timed with its measured coverage (``coverage.iterations`` profiler passes)
    and scored (``evaluate_captured``)."""
    from experiments.workloads import heldout_for, pairing_for  # noqa: PLC0415

    heldout = heldout_for(rt, model, [w.captured.kernels() for w in workloads], what=what)
    pairing = pairing_for(cfg, rt, what)
    return evaluate_captured(model, workloads, device=rt.device, timing=rt.timing, description=description,
                             progress=bool(cfg.get("progress", True)),
                             coverage_iterations=int(cfg["coverage"]["iterations"]), pairing=pairing, heldout=heldout)
