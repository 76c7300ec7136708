"""experiment=pyg_conv: PyTorch Geometric's own convolutions, captured, predicted and measured.

PyG's ``GCNConv`` and ``SAGEConv`` (as a user runs them: GCN adds self loops and computes
its normalisation every call) and a 3-layer ``GraphSAGE`` model (forward and a training
step) on the project's graph generators (``sim.workloads.graphs``) across the degree-skew sweep of
``gnn_degree``. Every call is captured once (``sim.capture.dispatch``), its kernels calibrated on
first use (the suite is the captured kernels), predicted with L0-L3 and timed.

Outputs: results.csv, summary.json (``details.coverage_pct``: median share of the measured
time on modelled ops), latency_vs_skew.png, predicted_vs_measured.png.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")
import torch  # noqa: E402

from costmodel.measure.runtime import Runtime  # noqa: E402
from sim.predict.heldout import trace_kernels  # noqa: E402
from experiments.captured import (  # noqa: E402
    CapturedWorkload, coverage_details, measure_captured, missing_extra_error, training_details,
)
from costmodel.cli.config_schema import Interval, ListOf, Options, Rule, is_int  # noqa: E402
from experiments.common import (  # noqa: E402
    calibration_options, check_common, config_dict, console, instantiate_sweep, output_dir, plot_latency_by_backend, plot_predicted_vs_measured, print_summary, skew_axis_label,
    print_table, summary, write_outputs,
)
from sim.api import capture_module  # noqa: E402
from sim.predict.calibration import calibrated_model, captured_suite  # noqa: E402
from sim.capture.dispatch import capture_trace  # noqa: E402
from sim.workloads.graphs import check_edge_index, degree_stats  # noqa: E402

CONVS = ("gcn", "sage")


def _pyg() -> Any:
    try:
        import torch_geometric
    except ImportError:
        raise missing_extra_error("torch-geometric", "pyg", "pyg_conv") from None
    return torch_geometric


#: pyg_conv's fields (beside the shared ones, ``experiments.common.COMMON_CONSTRAINTS``)
CONSTRAINTS: dict[str, Any] = {
    **{f"pyg.{key}": Interval(int, 1, None)
       for key in ("num_nodes", "num_edges", "in_features", "hidden_features", "out_features")},
    "pyg.convs": ListOf(Options(CONVS), min_len=0, words=f"a list of some of {list(CONVS)}"),
    # a cross-field rule: with no conv listed, the GraphSAGE model is all there is to run
    "pyg.model_layers": Rule(lambda v, cfg: is_int(v) and (1 if not cfg["pyg"]["convs"] else 0) <= v <= 4,
                             lambda cfg: "an integer in [0, 4] (0 = no GraphSAGE model)" if cfg["pyg"]["convs"] else
                             "an integer in [1, 4] (pyg.convs is empty: with 0 there is nothing to run)"),
}


def make_graphs(cfg: Mapping[str, Any], seed: int) -> list[tuple[Any, torch.Tensor]]:
    p = cfg["pyg"]
    options = dict(cfg["graph"].get("options") or {})
    graphs = []
    for i, (value, gen) in enumerate(instantiate_sweep(cfg["graph"], "graph")):
        edge_index = gen(p["num_nodes"], p["num_edges"], seed=seed + i, **options)
        check_edge_index(edge_index, p["num_nodes"])
        graphs.append((value, edge_index))
    return graphs


def _seeded(module: torch.nn.Module, seed: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(seed)  # PyG initialises its own weights: seed them (reset_parameters uses the global RNG)
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()
    return module.to(device=device, dtype=dtype)


def validate(cfg: Any) -> list[tuple[Any, Any]]:
    """Every key checked, torch-geometric importable and every graph of the sweep drawn and
    checked, nothing measured; returns the graphs."""
    cfg = config_dict(cfg)
    check_common(cfg, CONSTRAINTS)
    _pyg()
    return make_graphs(cfg, int(cfg.get("seed", 0)))  # validates the sweep and every edge index


def run(cfg: Any, out_dir: str | Path | None = None, *, plan: Any = None) -> dict[str, Any]:
    """``plan``: what ``validate(cfg)`` returned (the entry point's one check), else validated here."""
    cfg = config_dict(cfg)
    p = cfg["pyg"]
    graphs = validate(cfg) if plan is None else plan
    from torch_geometric.nn import GCNConv, GraphSAGE, SAGEConv

    rt = Runtime.from_cfg(cfg, checked=True)
    dtype = getattr(torch, rt.dtype)
    out = output_dir(cfg, out_dir)
    N = p["num_nodes"]
    x = torch.randn(N, p["in_features"], generator=torch.Generator().manual_seed(rt.seed)).to(rt.device, dtype)
    convs = {"gcn": GCNConv(p["in_features"], p["out_features"]), "sage": SAGEConv(p["in_features"], p["out_features"])}
    convs = {k: _seeded(v, rt.seed, rt.device, dtype) for k, v in convs.items() if k in p["convs"]}
    sage_model = None
    if p["model_layers"]:
        sage_model = _seeded(GraphSAGE(p["in_features"], p["hidden_features"], num_layers=int(p["model_layers"]),
                                       out_channels=p["out_features"]), rt.seed, rt.device, dtype)
    generator_name = cfg["graph"]["generator"]["_target_"].rsplit(".", 1)[-1]

    console.print("capturing the convolutions' kernel traces")
    workloads: list[CapturedWorkload] = []
    for i, (value, edge_index) in enumerate(graphs):
        ei = edge_index.to(rt.device)
        st = degree_stats(edge_index, N)
        columns = {"point": i, "generator": generator_name, "param": cfg["graph"]["sweep"]["param"], "value": value,
                   "num_edges": int(edge_index.shape[1]), "degree_cv": st["degree_cv"],
                   "out_degree_cv": st["out_degree_cv"], "max_degree": st.get("max_degree")}
        modules = list(convs.items()) + ([(f"graphsage{p['model_layers']}", sage_model)] if sage_model else [])
        for name, module in modules:

            def forward(module=module, ei=ei) -> Any:
                with torch.no_grad():
                    return module(x, ei)

            forward()
            workloads.append(CapturedWorkload(name, forward, capture_trace(forward),
                                              {**columns, "module": name, "backend": name, "kind": "forward"}))
            if module is sage_model and p["train_step"]:

                def step(ei=ei) -> None:
                    sage_model.zero_grad(set_to_none=True)
                    sage_model(x, ei).float().sum().backward()

                step()
                workloads.append(CapturedWorkload(f"{name} train", step, capture_module(sage_model, (x, ei), backward=True),
                                                  {**columns, "module": name, "backend": f"{name} train",
                                                   "kind": "train_step"}))

    model = calibrated_model(rt, captured_suite([w.captured for w in workloads]), suite_name="pyg_conv",
                             progress=bool(cfg.get("progress", True)),
                             heldout=trace_kernels(w.captured.kernels() for w in workloads), **calibration_options(cfg))
    df = measure_captured(cfg, rt, model, workloads, what="pyg_conv", description="measure pyg convs")
    summ = summary("pyg_conv", rt.fingerprint.describe(), df, details={
        **coverage_details(df),
        "graph": {k: p[k] for k in ("num_nodes", "num_edges", "in_features", "hidden_features", "out_features")},
        "generator": generator_name, "sweep_param": cfg["graph"]["sweep"]["param"],
        "per_module_median_ape_L3_pct": df.groupby("backend")["ape_L3_pct"].median().to_dict(),
        "latency_ratio_max_over_min_per_module": df.groupby("backend")["measured_s"].agg(lambda s: s.max() / s.min()).to_dict(),
        "training": training_details(df), "model_profile": str(model.fingerprint.id),
    })
    write_outputs(out, df, summ)
    plot_latency_by_backend(df, "value", out / "latency_vs_skew.png", xlabel=skew_axis_label(df, cfg["graph"]["sweep"]["param"]),
                            title="PyG convolutions: latency vs degree skew")
    plot_predicted_vs_measured(df, out / "predicted_vs_measured.png", title="pyg_conv: predicted vs measured", hue="backend")
    print_table(df, {"backend": "", "value": "", "degree_cv": ".2f", "measured_s": "ms", "pred_L0_s": "ms",
                     "pred_L2_s": "ms", "pred_L3_s": "ms", "ape_L3_pct": ".1f", "coverage_measured_pct": ".1f",
                     "capture_over_call": ".2f"}, title="PyG convolutions: predicted vs measured (ms; APE %)")
    print_summary(summ)
    console.print(f"outputs in {out}")
    return summ
