"""experiment=mlp_batch: doing more FLOPs can make the hardware more efficient.

A dense two-layer MLP at batch sizes from 1 upwards: FLOPs grow linearly with B, latency
much less (small B reads the whole weights for a few rows), so achieved FLOP/s rises.
Each level's prediction beside the measurement. Outputs: results.csv, summary.json,
batch_scaling.png, predicted_vs_measured.png.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from costmodel.measure.runtime import Runtime  # noqa: E402
from experiments.common import calibration_options, check_common, config_dict, console, output_dir, plot_predicted_vs_measured, print_summary, print_table, summary, write_outputs  # noqa: E402
from experiments.workloads import evaluate_workloads, heldout_for  # noqa: E402
from sim.workloads.workload import Workload  # noqa: E402
from sim.predict.heldout import trace_kernels  # noqa: E402
from sim.predict.calibration import calibrated_model, drift_references, gemm_suite, small_op_suite  # noqa: E402
from costmodel.cli.config_schema import Interval, ListOf  # noqa: E402
from sim.workloads.memory import check_fits_device, mlp_need  # noqa: E402
from sim.workloads.mlp_layer import MLP, MLPConfig, mlp_trace  # noqa: E402


#: mlp_batch's fields (beside the shared ones, ``experiments.common.COMMON_CONSTRAINTS``)
CONSTRAINTS: dict[str, Any] = {
    "mlp.d_model": Interval(int, 1, None),
    "mlp.d_hidden": Interval(int, 1, None),
    "mlp.batches": [ListOf(Interval(int, 1, None), words="a non-empty list of batch sizes (integers >= 1)"),
                    Interval(int, 1, None)],
}


def mlp_configs(cfg: dict) -> list[MLPConfig]:
    m = cfg["mlp"]
    batches = m["batches"]
    batches = [batches] if isinstance(batches, int) else list(batches)
    return [MLPConfig(batch=b, d_model=m["d_model"], d_hidden=m["d_hidden"], dtype=str(cfg["dtype"])) for b in batches]


def validate(cfg: Any) -> list[MLPConfig]:
    """Every check of ``run`` that needs no measuring (also run on every job of a ``-m``
    sweep before the first starts): base keys, the MLP sizes and batches, and whether the
    largest batch fits the device's memory. Returns the configs."""
    cfg = config_dict(cfg)
    device = check_common(cfg, CONSTRAINTS)
    configs = mlp_configs(cfg)
    largest = max(configs, key=lambda c: c.batch)
    check_fits_device(mlp_need(largest), device, what=f"the MLP of mlp_batch at batch {largest.batch}",
                      knobs=["mlp.d_model", "mlp.d_hidden", "mlp.batches"])
    return configs


def run(cfg: Any, out_dir: str | Path | None = None, *, plan: Any = None) -> dict[str, Any]:
    """``plan``: what ``validate(cfg)`` returned (the entry point's one check), else validated here."""
    cfg = config_dict(cfg)
    configs = validate(cfg) if plan is None else plan
    rt = Runtime.from_cfg(cfg, checked=True)
    out = output_dir(cfg, out_dir)
    traces = [mlp_trace(c) for c in configs]
    gemms = [s for t in traces for s in t if s.family == "gemm"]
    suite = gemm_suite(gemms) + small_op_suite([s for t in traces for s in t])
    model = calibrated_model(rt, suite, suite_name="mlp_batch", progress=bool(cfg.get("progress", True)),
                             heldout=trace_kernels(traces), **calibration_options(cfg))
    module = MLP(configs[-1], device=rt.device, seed=rt.seed)  # weights shared by every batch size
    gen = torch.Generator().manual_seed(rt.seed)
    workloads = []
    for c, trace in zip(configs, traces):
        x = torch.randn(c.batch, c.d_model, generator=gen).to(rt.device, getattr(torch, c.dtype))
        workloads.append(Workload(f"B={c.batch}", trace, lambda x=x: module(x), {"batch": c.batch}))
    heldout = heldout_for(rt, model, [w.trace for w in workloads], what="mlp_batch")
    df = evaluate_workloads(model, workloads, device=rt.device, timing=rt.timing, heldout=heldout,
                            references=drift_references(rt, suite), description="measure mlp",
                            progress=bool(cfg.get("progress", True)), peak_flops_per_s=model.ceilings["peak_flops_per_s"])
    first = df.iloc[0]
    df["flops_vs_first"] = df["flops"] / first["flops"]
    df["latency_vs_first"] = df["measured_s"] / first["measured_s"]
    summ = summary("mlp_batch", rt.fingerprint.describe(), df, details={
        "d_model": cfg["mlp"]["d_model"], "d_hidden": cfg["mlp"]["d_hidden"],
        "flops_growth": float(df["flops_vs_first"].iloc[-1]), "latency_growth": float(df["latency_vs_first"].iloc[-1]),
        "achieved_gflops_first_last": [float(df["achieved_gflops"].iloc[0]), float(df["achieved_gflops"].iloc[-1])],
    })
    write_outputs(out, df, summ)
    _plot(df, out)
    plot_predicted_vs_measured(df, out / "predicted_vs_measured.png", title="MLP batch scaling: predicted vs measured")
    print_table(df, {"batch": "", "flops": ".3g", "measured_s": "ms", "flops_vs_first": ".0f", "latency_vs_first": ".2f",
                     "achieved_gflops": ".1f", "mfu": ".1%", "pred_L0_s": "ms", "pred_L2_s": "ms", "pred_L3_s": "ms",
                     "ape_L0_pct": ".0f", "ape_L3_pct": ".1f"}, title="MLP latency vs batch (ms)")
    print_summary(summ)
    console.print(f"FLOPs grew {summ['details']['flops_growth']:.0f}x, latency {summ['details']['latency_growth']:.1f}x; "
                  f"outputs in {out}")
    return summ


def _plot(df, out: Path) -> None:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    a1.plot(df["batch"], df["flops_vs_first"], "k--", label="FLOPs (x B=first)")
    a1.errorbar(df["batch"], df["latency_vs_first"], yerr=df["measured_iqr_s"] / df["measured_s"].iloc[0] / 2, fmt="o-",
                label="measured latency (x first)")
    a1.plot(df["batch"], df["pred_L3_s"] / df["measured_s"].iloc[0], "x:", label="L3 predicted latency")
    a1.set_xscale("log", base=2)
    a1.set_yscale("log")
    a1.set_xlabel("batch B")
    a1.set_title("FLOPs grow with B; latency far less")
    a1.legend(fontsize=8)
    a1.grid(True, which="both", alpha=0.2)
    a2.plot(df["batch"], df["achieved_gflops"], "o-")
    a2.set_xscale("log", base=2)
    a2.set_xlabel("batch B")
    a2.set_ylabel("achieved GFLOP/s")
    a2.set_title("achieved FLOP/s rises with B")
    a2.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    fig.savefig(out / "batch_scaling.png", dpi=120)
    plt.close(fig)
