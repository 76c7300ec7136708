"""experiment=flops_spectrum: FLOPs' explanatory power, from dense MLPs to GNN aggregation.

Six workload classes (large dense MLP, small-batch MLP, MoE under spread and concentrated
routing, GNN aggregation on uniform and skewed graphs), a few sizes each. Per class: the
median APE of L0 (FLOPs / peak), the R^2 of latency on FLOPs (proportional fit latency =
FLOPs / rate, with the rate fitted per class and, stricter, one rate for the whole
device), and the same for L3. The seed article's table "FLOPs explains dense GEMMs well,
GNN aggregation hardly at all", measured. Outputs: results.csv, classes.csv,
summary.json, latency_vs_flops.png, predicted_vs_measured.png.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from costmodel.families.gather import gather  # noqa: E402
from costmodel.families.scatter import scatter  # noqa: E402
from costmodel.measure.scope import kernel_scope  # noqa: E402
from costmodel.families.gather import GatherSpec  # noqa: E402
from costmodel.families.scatter import ScatterSpec  # noqa: E402
from costmodel.measure.runtime import Runtime  # noqa: E402
from costmodel.cli.config_schema import Interval, ListOf  # noqa: E402
from experiments.common import calibration_options, check_common, config_dict, console, output_dir, plot_predicted_vs_measured, print_summary, print_table, summary, write_outputs  # noqa: E402
from experiments.workloads import evaluate_workloads, heldout_for  # noqa: E402
from sim.predict.heldout import trace_kernels  # noqa: E402
from sim.predict.calibration import aggregation_suite, calibrated_model, gemm_suite, moe_suite, drift_references, small_op_suite  # noqa: E402
from sim.workloads.graphs import degree_stats, rmat  # noqa: E402
from sim.workloads.gnn_layer import GNNConfig  # noqa: E402
from sim.workloads.memory import check_fits_device, combine, gnn_need, mlp_need, moe_need  # noqa: E402
from sim.workloads.mlp_layer import MLP, MLPConfig, mlp_trace  # noqa: E402
from sim.workloads.moe_layer import DispatchPlan, MoEConfig, MoELayer, moe_trace  # noqa: E402
from sim.workloads.routing import ZipfRouting, route  # noqa: E402
from sim.workloads.workload import Workload  # noqa: E402

CLASSES = ("dense MLP", "small-batch MLP", "MoE spread", "MoE concentrated", "GNN agg uniform", "GNN agg skewed")


def r_squared(measured: np.ndarray, predicted: np.ndarray) -> float:
    """1 - SS_res / SS_tot (can be negative: worse than predicting the mean)."""
    ss_tot = float(((measured - measured.mean()) ** 2).sum())
    return 1.0 - float(((measured - predicted) ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan")


def proportional_rate(flops: np.ndarray, latency: np.ndarray) -> float:
    """Least-squares rate R for latency = FLOPs / R (fit of latency on FLOPs through 0)."""
    return float((flops * flops).sum() / (flops * latency).sum())


_POSITIVE = Interval(int, 1, None)
#: one positive integer or a non-empty list of them
_POSITIVE_INTS = [_POSITIVE, ListOf(_POSITIVE, words="a non-empty list of them")]
#: flops_spectrum's fields (beside the shared ones, ``experiments.common.COMMON_CONSTRAINTS``);
#: the layer fields themselves are checked by MLPConfig, MoEConfig and GNNConfig
CONSTRAINTS: dict[str, Any] = {
    "spectrum.dense_mlp.sizes": ListOf(ListOf(_POSITIVE, min_len=2, max_len=2), words="a non-empty list of [d_model, d_hidden] pairs"),
    "spectrum.small_batch_mlp.batches": _POSITIVE_INTS,
    "spectrum.moe.spread_exponent": Interval(float, 0, 50, words="a Zipf exponent in [0, 50]"),
    "spectrum.moe.concentrated_exponent": Interval(float, 0, 50, words="a Zipf exponent in [0, 50]"),
    "spectrum.moe.tokens": _POSITIVE_INTS,
    "spectrum.gnn.num_nodes": _POSITIVE_INTS,
    "spectrum.gnn.width": _POSITIVE_INTS,
    "spectrum.gnn.edges": _POSITIVE_INTS,
    "spectrum.gnn.uniform_a": Interval(float, 0, 1, words="an R-MAT a in [0, 1]"),
    "spectrum.gnn.skewed_a": Interval(float, 0, 1, words="an R-MAT a in [0, 1]"),
}


def _ints(value: Any) -> list[int]:
    """One integer or a list of them (checked by ``CONSTRAINTS``) as a list."""
    return list(value) if isinstance(value, list) else [value]


def mlp_configs(sp: dict, dt: str) -> list[tuple[str, MLPConfig]]:
    """(class, config) of every dense and small-batch MLP of ``spectrum``."""
    sizes = sp["dense_mlp"]["sizes"]
    mlps = [("dense MLP", MLPConfig(sp["dense_mlp"]["batch"], d, h, dt)) for d, h in sizes]
    s = sp["small_batch_mlp"]
    mlps += [("small-batch MLP", MLPConfig(b, s["d_model"], s["d_hidden"], dt))
             for b in _ints(s["batches"])]
    return mlps


def moe_configs(sp: dict, dt: str) -> list[tuple[str, float, MoEConfig]]:
    """(class, Zipf exponent, config) of every MoE point of ``spectrum``."""
    m = sp["moe"]
    out = []
    for cls, key in (("MoE spread", "spread_exponent"), ("MoE concentrated", "concentrated_exponent")):
        expo = m[key]
        for t in _ints(m["tokens"]):
            out.append((cls, float(expo), MoEConfig(tokens=t, d_model=m["d_model"], d_ff=m["d_ff"],
                                                    num_experts=m["num_experts"], top_k=m["top_k"],
                                                    backend=m["backend"], dtype=dt)))
    return out


def gnn_points(sp: dict) -> tuple[int, int, list[int], list[tuple[str, float]]]:
    """(nodes, width, edge counts, (class, R-MAT a) per class) of ``spectrum.gnn``."""
    g = sp["gnn"]
    n, width, edges = _ints(g["num_nodes"])[0], _ints(g["width"])[0], _ints(g["edges"])
    classes = [(cls, float(g[key])) for cls, key in (("GNN agg uniform", "uniform_a"), ("GNN agg skewed", "skewed_a"))]
    return n, width, edges, classes


def validate(cfg: Any) -> None:
    """Every check of ``run`` that needs no measuring (also run on every job of a ``-m``
    sweep before the first starts): base keys, every workload's config, and whether all
    workloads (built side by side) fit the device's memory."""
    cfg = config_dict(cfg)
    device = check_common(cfg, CONSTRAINTS)
    sp, dt = cfg["spectrum"], str(cfg["dtype"])
    needs = [mlp_need(c) for _, c in mlp_configs(sp, dt)]
    needs += [moe_need(c) for _, _, c in moe_configs(sp, dt)]
    n, width, edges, classes = gnn_points(sp)
    agg = GNNConfig(num_nodes=n, in_features=width, out_features=width, dtype=dt)
    needs += [gnn_need(agg, num_edges=e) for e in edges for _ in classes]
    check_fits_device(combine(needs), device, what="the workloads of flops_spectrum",
                      knobs=["spectrum.dense_mlp.sizes", "spectrum.moe.d_model", "spectrum.gnn.edges"])


def build_workloads(cfg: dict, rt: Runtime) -> tuple[list[Workload], list]:
    sp, dt, dev, gen = cfg["spectrum"], rt.dtype, rt.device, torch.Generator().manual_seed(rt.seed)
    tensor = lambda *shape: torch.randn(*shape, generator=gen).to(dev, getattr(torch, dt))  # noqa: E731
    workloads: list[Workload] = []
    suite: list = []
    mlps = mlp_configs(sp, dt)
    for cls, c in mlps:
        module, x = MLP(c, device=dev, seed=rt.seed), tensor(c.batch, c.d_model)
        trace = mlp_trace(c)
        workloads.append(Workload(f"{cls} B={c.batch} D={c.d_model}", trace, lambda m=module, x=x: m(x), {"class": cls}))
        suite += gemm_suite([k for k in trace if k.family == "gemm"]) + small_op_suite(trace)
    moes = moe_configs(sp, dt)
    for cls, expo in dict.fromkeys((cls, expo) for cls, expo, _ in moes):
        for i, c in enumerate(c for k, _, c in moes if k == cls):
            t = c.tokens
            routing = route(ZipfRouting(float(expo)), tokens=t, num_experts=c.num_experts, top_k=c.top_k, seed=rt.seed + i)
            layer, x = MoELayer(c, device=dev, seed=rt.seed), tensor(t, c.d_model)
            workloads.append(Workload(f"{cls} T={t}", moe_trace(c, DispatchPlan.from_routing(routing)),
                                      lambda layer=layer, x=x, r=routing: layer(x, r), {"class": cls}))
            suite += moe_suite([c])
    n, width, edges, classes = gnn_points(sp)
    cvs: list[float] = []
    for cls, a in classes:
        for i, e in enumerate(edges):
            ei = rmat(n, e, a=float(a), b=None, c=None, d=None, seed=rt.seed + i)
            st = degree_stats(ei, n)
            cvs += [st["degree_cv"], st["out_degree_cv"]]
            src, dst, x = ei[0].to(dev), ei[1].to(dev), tensor(n, width)
            trace = [GatherSpec(e, width, n, round(st["out_degree_cv"], 3), False, dt),
                     ScatterSpec(e, width, n, "sum", "index_add", round(st["degree_cv"], 3), False, dt)]

            def aggregate(x=x, src=src, dst=dst):
                with kernel_scope("gather"):
                    msg = gather(x, src)
                with kernel_scope("scatter"):
                    return scatter(msg, dst, n, reduce="sum", backend="index_add")

            workloads.append(Workload(f"{cls} E={e}", trace, aggregate, {"class": cls, "degree_cv": st["degree_cv"]}))
    suite += aggregation_suite(n, edges, width, (min(cvs), max(cvs)), dt)
    return workloads, list(dict.fromkeys(suite))


def class_table(df: pd.DataFrame) -> pd.DataFrame:
    device_rate = proportional_rate(df["flops"].to_numpy(), df["measured_s"].to_numpy())
    rows = []
    for cls in CLASSES:
        g = df[df["class"] == cls]
        if g.empty:
            continue
        f, y = g["flops"].to_numpy(), g["measured_s"].to_numpy()
        rows.append({
            "class": cls, "n": len(g), "achieved_gflops": float(np.median(f / y) / 1e9),
            "L0_median_ape_pct": float(g["ape_L0_pct"].median()),
            "r2_flops_class_rate": r_squared(y, f / proportional_rate(f, y)),
            "r2_flops_device_rate": r_squared(y, f / device_rate),
            "flops_device_rate_median_ape_pct": float(np.median(np.abs(f / device_rate - y) / y) * 100),
            "L3_median_ape_pct": float(g["ape_L3_pct"].median()),
            "r2_L3": r_squared(y, g["pred_L3_s"].to_numpy()),
        })
    return pd.DataFrame(rows)


def run(cfg: Any, out_dir: str | Path | None = None, *, plan: Any = None) -> dict[str, Any]:
    """``plan``: what ``validate(cfg)`` returned (the entry point's one check), else validated here."""
    cfg = config_dict(cfg)
    if plan is None:
        validate(cfg)
    rt = Runtime.from_cfg(cfg, checked=True)
    out = output_dir(cfg, out_dir)
    workloads, suite = build_workloads(cfg, rt)
    model = calibrated_model(rt, suite, suite_name="flops_spectrum", progress=bool(cfg.get("progress", True)),
                             heldout=trace_kernels([w.trace for w in workloads]), **calibration_options(cfg))
    heldout = heldout_for(rt, model, [w.trace for w in workloads], what="flops_spectrum")
    df = evaluate_workloads(model, workloads, device=rt.device, timing=rt.timing, heldout=heldout,
                            references=drift_references(rt, suite), description="measure workloads",
                            progress=bool(cfg.get("progress", True)), peak_flops_per_s=model.ceilings["peak_flops_per_s"])
    classes = class_table(df)
    classes.to_csv(out / "classes.csv", index=False)
    pooled = r_squared(df["measured_s"].to_numpy(), df["flops"].to_numpy() / proportional_rate(
        df["flops"].to_numpy(), df["measured_s"].to_numpy()))
    summ = summary("flops_spectrum", rt.fingerprint.describe(), df, details={
        "classes": classes.to_dict("records"), "r2_flops_device_rate_all": pooled,
        "r2_log_latency_on_log_flops_all": float(np.corrcoef(np.log(df["flops"]), np.log(df["measured_s"]))[0, 1] ** 2),
    })
    write_outputs(out, df, summ)
    _plot(df, out)
    plot_predicted_vs_measured(df, out / "predicted_vs_measured.png", title="FLOPs spectrum: predicted vs measured",
                               hue="class")
    print_table(classes, {"class": "", "n": "", "achieved_gflops": ".1f", "L0_median_ape_pct": ".1f",
                          "r2_flops_class_rate": ".2f", "r2_flops_device_rate": ".2f",
                          "flops_device_rate_median_ape_pct": ".0f", "L3_median_ape_pct": ".1f", "r2_L3": ".3f"},
                title="how much latency FLOPs explains, per workload class")
    print_summary(summ)
    console.print(f"outputs in {out}")
    return summ


def _plot(df: pd.DataFrame, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for cls in CLASSES:
        g = df[df["class"] == cls]
        ax.scatter(g["flops"], g["measured_s"] * 1e3, label=cls, s=30)
    f = np.geomspace(df["flops"].min(), df["flops"].max(), 50)
    rate = proportional_rate(df["flops"].to_numpy(), df["measured_s"].to_numpy())
    ax.plot(f, f / rate * 1e3, "k--", lw=1, label=f"latency = FLOPs / {rate / 1e9:.0f} GFLOP/s (one rate)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOPs")
    ax.set_ylabel("measured latency [ms]")
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=8)
    ax.set_title("FLOPs is a workload metric: same FLOPs, latency by class")
    fig.tight_layout()
    fig.savefig(out / "latency_vs_flops.png", dpi=120)
    plt.close(fig)
