"""experiment=moe_skew: MoE layer latency as routing concentrates, at constant FLOPs.

For every point of the routing generator's concentration sweep and every expert backend:
imbalance metrics, FLOPs, the L0-L3 predictions of the layer's trace, and the real
module's measured latency (interleaved rounds). One skewed point is also profiled kernel
by kernel. Outputs: results.csv, per_kernel.csv, summary.json, latency_vs_concentration.png,
predicted_vs_measured.png.

``measure=false`` predicts only: no layer is built or timed and nothing is calibrated
(the profile's fitted model as it is); results.csv holds the predictions, summary.json
the common schema with null errors, and the plot shows the predicted curves.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from costmodel.model.predictor import LEVELS  # noqa: E402
from costmodel.cli.config_schema import Interval, Names, at_most  # noqa: E402
from costmodel.measure.runtime import Runtime  # noqa: E402
from experiments.common import (  # noqa: E402
    backend_list, calibration_options, check_common, check_measure_keys, config_dict, console, instantiate_sweep,
    output_dir, plot_latency_by_backend, plot_predicted_by_backend, plot_predicted_vs_measured,
    summary, write_outputs,
)
from experiments.workloads import (  # noqa: E402
    kernel_point_table, measure_sweep, predict_only, print_sweep_report,
)
from sim.predict.heldout import trace_kernels  # noqa: E402
from sim.predict.calibration import calibrated_model, drift_references, fitted_model, moe_suite  # noqa: E402
from sim.workloads.moe_layer import DispatchPlan, MoEConfig, MoELayer, backend_unavailable_reason, moe_trace  # noqa: E402
from sim.workloads.memory import check_fits_device, combine, moe_need  # noqa: E402
from sim.workloads.routing import route  # noqa: E402
from sim.workloads.workload import Workload  # noqa: E402


#: this experiment can predict without measuring (``measure=false``)
MEASURES = "optional"

def routing_generators(cfg: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    """(sweep value, generator) per point; every value validated before anything runs."""
    return instantiate_sweep(cfg["routing"], "routing")


#: moe_skew's fields (beside the shared ones, ``experiments.common.COMMON_CONSTRAINTS``);
#: what the fields cannot say (the backends registered, the generator's keywords, memory)
#: ``validate`` derives once
CONSTRAINTS: dict[str, Any] = {
    **{f"moe.{key}": Interval(int, 1, None) for key in ("tokens", "d_model", "d_ff", "num_experts")},
    "moe.top_k": at_most("moe.num_experts"),
    "moe.backends": Names(what="backend"),
    "routing.capacity_factor": [Interval(float, 0, None, closed="neither", words="a number > 0 (such as 1.25)"), None],
}


def moe_configs(cfg: Mapping[str, Any], dtype: str) -> list[MoEConfig]:
    m = cfg["moe"]
    return [
        MoEConfig(tokens=m["tokens"], d_model=m["d_model"], d_ff=m["d_ff"], num_experts=m["num_experts"],
                  top_k=m["top_k"], expert=m["expert"], backend=b, dtype=dtype)
        for b in backend_list(m["backends"])
    ]


def validate(cfg: Any) -> tuple[list[MoEConfig], list[tuple[Any, Any]], float | None]:
    """The schema check (``CONSTRAINTS`` with the shared ones) and what ``run`` derives from
    the config without measuring: the layer configs, the routing generators, whether the
    layers fit the device's memory. Run once per job, by the entry point before the
    measuring lock (and on every job of a ``-m`` sweep before the first starts); returns
    ``run``'s plan: (configs, generators, capacity factor)."""
    cfg = config_dict(cfg)
    device = check_common(cfg, CONSTRAINTS)
    configs = moe_configs(cfg, str(cfg["dtype"]))
    generators = routing_generators(cfg)
    capacity = cfg["routing"].get("capacity_factor")
    capacity = None if capacity is None else float(capacity)
    base = configs[0]
    max_rows = None if capacity is None else math.ceil(capacity * base.tokens * base.top_k / base.num_experts)
    check_fits_device(combine([moe_need(c, max_rows_per_expert=max_rows) for c in configs]), device,
                      what=f"the MoE layers of moe_skew ({len(configs)} backends)",
                      knobs=["moe.d_model", "moe.d_ff", "moe.num_experts", "moe.tokens", "moe.backends"])
    return configs, generators, capacity


def run(cfg: Any, out_dir: str | Path | None = None, *,
        plan: tuple[list[MoEConfig], list[tuple[Any, Any]], float | None] | None = None) -> dict[str, Any]:
    """``plan``: what ``validate(cfg)`` returned (the entry point's one check), else validated here."""
    cfg = config_dict(cfg)
    configs, generators, capacity = validate(cfg) if plan is None else plan
    rt = Runtime.from_cfg(cfg, checked=True)
    unavailable = {c.backend: r for c in configs if (r := backend_unavailable_reason(c, rt.device))}
    for backend, reason in unavailable.items():
        console.print(f"[yellow]backend {backend!r} is unavailable here and is skipped:[/] {reason}")
    configs = [c for c in configs if c.backend not in unavailable]
    if not configs:
        raise ValueError(f"no requested MoE backend can run here: {unavailable}")
    measuring = check_measure_keys(cfg)
    out = output_dir(cfg, out_dir)

    base = configs[0]
    points = []  # (index, value, generator, routing, plan): the routings first, so calibration knows the traces
    for i, (value, gen) in enumerate(generators):
        routing = route(gen, tokens=base.tokens, num_experts=base.num_experts, top_k=base.top_k,
                        seed=rt.seed + i, capacity_factor=capacity)
        points.append((i, value, gen, routing, DispatchPlan.from_routing(routing)))
    traces = {(i, c.backend): moe_trace(c, plan) for i, _, _, _, plan in points for c in configs}

    suite = moe_suite(configs)
    if measuring:
        model = calibrated_model(rt, suite, suite_name="moe", progress=bool(cfg.get("progress", True)),
                                 heldout=trace_kernels(traces.values()), **calibration_options(cfg))
    else:
        model = fitted_model(rt, profile_id=cfg["profile"].get("id"))
    if measuring:
        x = torch.randn(base.tokens, base.d_model, generator=torch.Generator().manual_seed(rt.seed)).to(
            rt.device, getattr(torch, base.dtype))
        layers = {c.backend: MoELayer(c, device=rt.device, seed=rt.seed) for c in configs}
    workloads = []
    for i, value, gen, routing, plan in points:
        columns = {"point": i, "generator": type(gen).__name__, "param": cfg["routing"]["sweep"]["param"],
                   "value": value, **routing.metrics()}
        for c in configs:
            run_layer = (lambda layer=layers[c.backend], r=routing: layer(x, r)) if measuring else None
            workloads.append(Workload(c.backend, traces[i, c.backend], run_layer,
                                      {**columns, "backend": c.backend, "model_flops": c.useful_flops(plan.assignments)}))
    details = {
        "layer": {k: cfg["moe"][k] for k in ("tokens", "d_model", "d_ff", "num_experts", "top_k", "expert")},
        "routing": cfg["routing"]["generator"].get("_target_"), "sweep_param": cfg["routing"]["sweep"]["param"],
        "capacity_factor": capacity, "backends": [c.backend for c in configs], "unavailable_backends": unavailable,
        "model_profile": str(model.fingerprint.id),
    }
    if not measuring:
        return _predict_only(cfg, rt, model, workloads, details, out)
    df, model = measure_sweep(cfg, rt, model, workloads, what="moe_skew", suite="moe",
                              references=lambda: drift_references(rt, suite),
                              description="measure moe layers (and their kernels)")
    # --- per-kernel errors at one skewed point, every backend (held out too, as the headline)
    kp, per_kernel = kernel_point_table(cfg, rt, model, workloads, len(generators), out)

    summ = summary("moe_skew", rt.fingerprint.describe(), df, details={
        **details,
        "model_flops_constant": bool(df["model_flops"].nunique() == 1),
        "latency_ratio_max_over_min_per_backend": df.groupby("backend")["measured_s"].agg(lambda s: s.max() / s.min()).to_dict(),
        "per_backend_median_ape_pct": {b: {lv: float(g[f"ape_{lv}_pct"].median()) for lv in LEVELS} for b, g in df.groupby("backend")},
        "kernel_point": {"index": kp, "value": generators[kp][0]},
    })
    write_outputs(out, df, summ)
    _plots(df, out, cfg)
    param = cfg["routing"]["sweep"]["param"]
    return print_sweep_report(
        df, per_kernel, summ, out, title=f"MoE layer latency vs {param} (ms; APE %)",
        columns={"value": "", "backend": "", "max_over_mean": ".2f", "norm_entropy": ".2f", "measured_s": "ms",
                 "measured_iqr_s": "ms", "pred_L0_s": "ms", "pred_L2_s": "ms", "pred_L3_s": "ms", "ape_L0_pct": ".1f",
                 "ape_L3_pct": ".1f", "achieved_gflops": ".1f"},
        breakdown_title=f"per-kernel breakdown at {param}={generators[kp][0]} (profiler, ms)")


def _predict_only(cfg: Mapping[str, Any], rt: Runtime, model: Any, workloads: list[Workload],
                  details: dict[str, Any], out: Path) -> dict[str, Any]:
    """measure=false: the sweep's predictions, the common summary with null errors, one plot."""
    param = cfg["routing"]["sweep"]["param"] or "point"
    return predict_only(
        "moe_skew", model, workloads, details, out,
        extra=lambda df: {"model_flops_constant": bool(df["model_flops"].nunique() == 1)},
        plot=lambda df: plot_predicted_by_backend(
            df, "value" if cfg["routing"]["sweep"]["param"] else "point", out / "latency_vs_concentration.png",
            xlabel=f"routing {param} (the swept concentration knob)",
            title="MoE layer (predicted only): latency vs routing concentration"),
        columns={"value": "", "backend": "", "max_over_mean": ".2f", "norm_entropy": ".2f", "pred_L0_s": "ms",
                 "pred_L2_s": "ms", "pred_L3_s": "ms"},
        title=f"MoE layer predicted latency vs {param} (ms; measure=false: nothing measured)")


def _plots(df: pd.DataFrame, out: Path, cfg: Mapping[str, Any]) -> None:
    param = cfg["routing"]["sweep"]["param"] or "point"
    # the swept knob on x: max/mean load saturates at E/top_k, stacking the last points on one line
    plot_latency_by_backend(df, "value" if cfg["routing"]["sweep"]["param"] else "point", out / "latency_vs_concentration.png",
                                            xlabel=f"routing {param} (the swept concentration knob)",
                            l0_label="L0 = FLOPs / peak (flat)",
                            title="MoE layer: same FLOPs, latency moves with routing concentration")
    plot_predicted_vs_measured(df, out / "predicted_vs_measured.png", title="MoE layer: predicted vs measured",
                               hue="backend")
