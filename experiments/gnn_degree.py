"""experiment=gnn_degree: GNN layer latency vs degree skew, per aggregation backend.

At fixed node and edge counts the graph generator's skew knob is swept (R-MAT from
uniform to hub-dominated by default); for every point and backend: degree statistics,
FLOPs, the L0-L3 predictions of the layer's trace, and the real layer's measured latency
(interleaved rounds). One point is profiled kernel by kernel. Outputs: results.csv,
per_kernel.csv, summary.json, latency_vs_skew.png, predicted_vs_measured.png.

``measure=false`` predicts only: no layer is built or timed and nothing is calibrated;
results.csv holds the predictions and summary.json the common schema with null errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from costmodel.model.predictor import LEVELS  # noqa: E402
from costmodel.cli.config_schema import Interval, Names  # noqa: E402
from costmodel.measure.runtime import Runtime  # noqa: E402
from experiments.common import (  # noqa: E402
    backend_list, calibration_options, check_common, check_measure_keys, config_dict, console, instantiate_sweep,
    output_dir, plot_latency_by_backend, plot_predicted_by_backend, plot_predicted_vs_measured,
    skew_axis_label, summary, write_outputs,
)
from experiments.workloads import (  # noqa: E402
    kernel_point_table, measure_sweep, predict_only, print_sweep_report,
)
from sim.predict.heldout import trace_kernels  # noqa: E402
from sim.workloads.backends import gnn_backend  # noqa: E402
from sim.predict.calibration import calibrated_model, drift_references, fitted_model, gnn_suite  # noqa: E402
from sim.workloads.gnn_layer import GNNConfig, GNNLayer, GraphPlan, backend_unavailable_reason, gnn_trace  # noqa: E402
from sim.workloads.graphs import check_edge_index, check_graph_options, degree_stats  # noqa: E402
from sim.workloads.memory import check_fits_device, combine, gnn_need  # noqa: E402
from sim.workloads.workload import Workload  # noqa: E402


#: this experiment can predict without measuring (``measure=false``)
MEASURES = "optional"

#: the GNN layer's fields, shared by gnn_degree and gnn_partition (beside
#: ``experiments.common.COMMON_CONSTRAINTS``); kind, aggregation, edge order and backend
#: names are checked by ``GNNConfig`` against what sim registers
CONSTRAINTS: dict[str, Any] = {
    **{f"gnn.{key}": Interval(int, 1, None) for key in ("num_nodes", "num_edges", "in_features", "out_features")},
    "gnn.backends": Names(what="backend"),
}


def gnn_configs(cfg: Mapping[str, Any], dtype: str) -> list[GNNConfig]:
    g = cfg["gnn"]
    backends = backend_list(g["backends"])
    return [
        GNNConfig(num_nodes=g["num_nodes"], in_features=g["in_features"], out_features=g["out_features"],
                  kind=g["kind"], aggregation=g["aggregation"], backend=b, edge_order=g["edge_order"], dtype=dtype)
        for b in backends
    ]


def graph_sweep(cfg: Mapping[str, Any]) -> tuple[int, dict[str, bool], list[tuple[Any, Any]]]:
    """(edges, graph options, (sweep value, generator) per point), all validated (``gnn.num_edges``
    by ``CONSTRAINTS``); nothing generated."""
    num_edges = cfg["gnn"]["num_edges"]
    options = check_graph_options(cfg["graph"].get("options"))
    return num_edges, options, instantiate_sweep(cfg["graph"], "graph")


def make_graphs(cfg: Mapping[str, Any], seed: int,
                sweep: tuple[int, dict[str, bool], list[tuple[Any, Any]]] | None = None) -> list[tuple[Any, torch.Tensor]]:
    """(sweep value, edge index) per point of the graph generator's sweep (``graph_sweep(cfg)``,
    unless already built)."""
    num_nodes = cfg["gnn"]["num_nodes"]
    num_edges, options, sweep = graph_sweep(cfg) if sweep is None else sweep
    graphs = []
    for i, (value, gen) in enumerate(sweep):
        edge_index = gen(num_nodes, num_edges, seed=seed + i, **options)
        check_edge_index(edge_index, num_nodes)
        graphs.append((value, edge_index))
    return graphs


def validate(cfg: Any) -> tuple[list[GNNConfig], tuple[int, dict[str, bool], list[tuple[Any, Any]]]]:
    """The schema check (``CONSTRAINTS`` with the shared ones) and what ``run`` derives from
    the config without measuring: the layer configs, the graph generator, its sweep and
    options, whether the layers fit the device's memory. Run once per job, by the entry point
    (and on every job of a ``-m`` sweep before the first starts); returns ``run``'s plan:
    (configs, ``graph_sweep``)."""
    cfg = config_dict(cfg)
    device = check_common(cfg, CONSTRAINTS)
    configs = gnn_configs(cfg, str(cfg["dtype"]))
    num_edges, options, sweep = graphs = graph_sweep(cfg)
    edges_bound = num_edges * (2 if options.get("undirected") else 1)  # undirected adds the reversed edges
    check_fits_device(combine([gnn_need(c, num_edges=edges_bound, graphs=len(sweep)) for c in configs]), device,
                      what=f"the GNN layers of gnn_degree ({len(configs)} backends x {len(sweep)} graphs)",
                      knobs=["gnn.num_nodes", "gnn.num_edges", "gnn.in_features", "gnn.out_features",
                             "graph.sweep.values", "gnn.backends"])
    return configs, graphs


def _src_read_shares(configs: list[GNNConfig], graphs: list[tuple[float, torch.Tensor]]) -> list[float]:
    """Three shares of source nodes read (lowest, middle, highest of the sweep's graphs) for
    the calibration kernels of backends whose cost depends on them (sparse_csr); none when
    no layer's backend needs them."""
    if not any(gnn_backend(c.backend).needs_source_read_shares for c in configs):
        return []
    n = configs[0].num_nodes
    shares = [GraphPlan.from_edge_index(ei, n, sorted_by_dst=False).csr_src_read_share or 1.0 for _, ei in graphs]
    return sorted({round(float(v), 2) for v in np.linspace(min(shares), max(shares), 3)})


def runnable_configs(configs: list[GNNConfig]) -> tuple[list[GNNConfig], dict[str, str]]:
    """The configs whose backend can run here, and {backend: why not} of the others (each
    named on the console and skipped); none at all is an error naming them."""
    unavailable = {c.backend: r for c in configs if (r := backend_unavailable_reason(c))}
    for backend, reason in unavailable.items():
        console.print(f"[yellow]backend {backend!r} is unavailable here and is skipped:[/] {reason}")
    configs = [c for c in configs if c.backend not in unavailable]
    if not configs:
        raise ValueError(f"no requested GNN backend can run here: {unavailable}")
    return configs, unavailable


def run(cfg: Any, out_dir: str | Path | None = None, *, plan: Any = None) -> dict[str, Any]:
    """``plan``: what ``validate(cfg)`` returned (the entry point's one check), else validated here."""
    cfg = config_dict(cfg)
    configs, sweep = validate(cfg) if plan is None else plan
    rt = Runtime.from_cfg(cfg, checked=True)
    configs, unavailable = runnable_configs(configs)
    graphs = make_graphs(cfg, rt.seed, sweep)  # checks every edge index before any timing
    measuring = check_measure_keys(cfg)
    out = output_dir(cfg, out_dir)
    base = configs[0]
    stats = [degree_stats(ei, base.num_nodes) for _, ei in graphs]
    cvs = [s["degree_cv"] for s in stats] + [s["out_degree_cv"] for s in stats]
    suite = gnn_suite(configs, num_edges=int(graphs[0][1].shape[1]), cv_range=(min(cvs), max(cvs)),
                      src_read_shares=_src_read_shares(configs, graphs))
    workloads = []
    generator_name = cfg["graph"]["generator"]["_target_"].rsplit(".", 1)[-1]
    for i, ((value, edge_index), st) in enumerate(zip(graphs, stats)):
        for c in configs:
            if measuring:
                layer = GNNLayer(c, device=rt.device, seed=rt.seed)
                plan, run_layer = layer.set_graph(edge_index), (lambda layer=layer: layer(x))
            else:
                plan = GraphPlan.from_edge_index(edge_index, c.num_nodes, sorted_by_dst=c.edge_order == "dst_sorted")
                run_layer = None
            workloads.append(Workload(c.backend, gnn_trace(c, plan), run_layer, {
                "point": i, "generator": generator_name, "param": cfg["graph"]["sweep"]["param"], "value": value,
                "backend": c.backend, **st, "width": c.agg_width, "model_flops": c.useful_flops(plan.num_edges)}))
    if measuring:  # the layers' traces are known first: calibration keeps them out of the held-out evidence
        model = calibrated_model(rt, suite, suite_name="gnn", progress=bool(cfg.get("progress", True)),
                                 heldout=trace_kernels(w.trace for w in workloads), **calibration_options(cfg))
        x = torch.randn(base.num_nodes, base.in_features, generator=torch.Generator().manual_seed(rt.seed)).to(
            rt.device, getattr(torch, base.dtype))
    else:
        model = fitted_model(rt, profile_id=cfg["profile"].get("id"))
    details = {
        "layer": {k: cfg["gnn"][k] for k in ("num_nodes", "num_edges", "in_features", "out_features", "kind",
                                              "aggregation", "edge_order")},
        "graph": cfg["graph"]["generator"]["_target_"], "sweep_param": cfg["graph"]["sweep"]["param"],
        "backends": [c.backend for c in configs], "unavailable_backends": unavailable,
        "degree_cv_range": [float(min(s["degree_cv"] for s in stats)), float(max(s["degree_cv"] for s in stats))],
    }
    if not measuring:
        return _predict_only(cfg, rt, model, workloads, details, out)
    df, model = measure_sweep(cfg, rt, model, workloads, what="gnn_degree", suite="gnn",
                              references=lambda: drift_references(rt, suite),
                              description="measure gnn layers (and their kernels)")
    df["winner"] = df.groupby("point")["measured_s"].transform("min") == df["measured_s"]

    kp, per_kernel = kernel_point_table(cfg, rt, model, workloads, len(graphs), out)  # held out, as the headline

    winners = df[df["winner"]][["value", "degree_cv", "backend"]]
    summ = summary("gnn_degree", rt.fingerprint.describe(), df, details={
        **details,
        "winner_per_point": winners.to_dict("records"),
        "per_backend_median_ape_pct": {b: {lv: float(g[f"ape_{lv}_pct"].median()) for lv in LEVELS}
                                       for b, g in df.groupby("backend")},
        "flops_share_of_l0_error": "L0 predicts FLOPs / peak; aggregation has ~1 FLOP per element moved",
        "kernel_point": {"index": kp, "value": graphs[kp][0]},
    })
    write_outputs(out, df, summ)
    _plots(df, out, cfg)
    param = cfg["graph"]["sweep"]["param"]
    return print_sweep_report(
        df, per_kernel, summ, out, title=f"GNN layer latency vs {param} (ms; APE %)",
        columns={"value": "", "backend": "", "degree_cv": ".2f", "max_over_mean": ".0f", "measured_s": "ms",
                 "measured_iqr_s": "ms", "pred_L0_s": "ms", "pred_L2_s": "ms", "pred_L3_s": "ms",
                 "ape_L0_pct": ".1f", "ape_L3_pct": ".1f", "winner": ""},
        breakdown_title=f"per-kernel breakdown at {param}={graphs[kp][0]} (profiler, ms)")


def _predict_only(cfg: Mapping[str, Any], rt: Runtime, model: Any, workloads: list[Workload],
                  details: dict[str, Any], out: Path) -> dict[str, Any]:
    """measure=false: the sweep's predictions, the common summary with null errors, one plot."""
    param = cfg["graph"]["sweep"]["param"]

    def winners(df: pd.DataFrame) -> dict[str, Any]:
        df["predicted_winner"] = df.groupby("point")["pred_L3_s"].transform("min") == df["pred_L3_s"]
        return {"predicted_winner_per_point": df[df["predicted_winner"]][["value", "degree_cv", "backend"]].to_dict("records")}

    return predict_only(
        "gnn_degree", model, workloads, details, out, extra=winners,
        plot=lambda df: plot_predicted_by_backend(
            df, "value", out / "latency_vs_skew.png", xlabel=skew_axis_label(df, param),
            title="GNN layer (predicted only): latency vs degree skew"),
        columns={"value": "", "backend": "", "degree_cv": ".2f", "pred_L0_s": "ms", "pred_L2_s": "ms",
                 "pred_L3_s": "ms", "predicted_winner": ""},
        title=f"GNN layer predicted latency vs {param} (ms; measure=false: nothing measured)")


def _plots(df: pd.DataFrame, out: Path, cfg: Mapping[str, Any]) -> None:
    plot_latency_by_backend(df, "value", out / "latency_vs_skew.png",
                            xlabel=skew_axis_label(df, cfg["graph"]["sweep"]["param"]),
                            title="GNN layer: latency vs degree skew, per aggregation backend")
    plot_predicted_vs_measured(df, out / "predicted_vs_measured.png", title="GNN layer: predicted vs measured",
                               hue="backend")
