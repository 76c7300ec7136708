"""experiment=gemm_same_flops: equal 2MKN, very different latency.

For each FLOP level, the balanced / medium-skinny / tall-skinny trio of GEMMs (seed
article, "Same FLOPs, Different Latency"), sized so the tall-skinny weight fits the
device: measured latency, achieved FLOP/s and share of measured peak, arithmetic
intensity against the ridge point, and each level's prediction. Outputs: results.csv,
summary.json, achieved_flops.png, predicted_vs_measured.png.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from costmodel.measure.ceilings import device_memory_bytes  # noqa: E402
from costmodel.measure.runners import make_runner  # noqa: E402
from costmodel.measure.runtime import Runtime  # noqa: E402
from costmodel.measure.suite import equal_flops_trio, trio_flops  # noqa: E402
from experiments.common import calibration_options, check_common, config_dict, console, output_dir, plot_predicted_vs_measured, print_summary, print_table, summary, write_outputs  # noqa: E402
from experiments.workloads import evaluate_workloads, heldout_for  # noqa: E402
from sim.workloads.workload import Workload  # noqa: E402
from costmodel.cli.config_schema import Interval, ListOf  # noqa: E402
from sim.predict.heldout import trace_kernels  # noqa: E402
from sim.predict.calibration import calibrated_model, drift_references, gemm_suite  # noqa: E402


_FRACTION = Interval(float, 0, 1, closed="right")
#: gemm_same_flops's fields (beside the shared ones, ``experiments.common.COMMON_CONSTRAINTS``)
CONSTRAINTS: dict[str, Any] = {
    "gemm.flops_levels": [ListOf(_FRACTION, words="a non-empty list of fractions in (0, 1]"), _FRACTION],
    "gemm.max_operand_bytes": Interval(int, 1024, None, words="an integer >= 1024 (bytes)"),
}


def trio_workloads(cfg: dict, device: torch.device) -> list[tuple[str, float, Any]]:
    """(shape name, FLOP level, GEMM) per trio member and level (the levels and operand bound
    checked by ``CONSTRAINTS``), the largest trio sized to the device's memory (``trio_flops``)."""
    levels, bound = cfg["gemm"]["flops_levels"], cfg["gemm"]["max_operand_bytes"]
    levels = [levels] if isinstance(levels, (int, float)) else levels
    dtype = str(cfg["dtype"])
    top = trio_flops(device_memory_bytes(device), dtype, bound)
    return [(name, float(f), spec) for f in levels for name, spec in equal_flops_trio(top * float(f), dtype)]


def validate(cfg: Any) -> list[tuple[str, float, Any]]:
    """Every check of ``run`` that needs no measuring (also run on every job of a ``-m``
    sweep before the first starts): base keys and the trio's levels. Returns the shapes."""
    cfg = config_dict(cfg)
    return trio_workloads(cfg, check_common(cfg, CONSTRAINTS))


def run(cfg: Any, out_dir: str | Path | None = None, *, plan: Any = None) -> dict[str, Any]:
    """``plan``: what ``validate(cfg)`` returned (the entry point's one check), else validated here."""
    cfg = config_dict(cfg)
    shapes = validate(cfg) if plan is None else plan
    rt = Runtime.from_cfg(cfg, checked=True)
    out = output_dir(cfg, out_dir)
    suite = gemm_suite([s for _, _, s in shapes])
    model = calibrated_model(rt, suite, suite_name="gemm_same_flops",
                             progress=bool(cfg.get("progress", True)),
                             heldout=trace_kernels([[s] for _, _, s in shapes]), **calibration_options(cfg))
    ceilings = model.ceilings
    workloads = [
        Workload(f"{name} {s.m}x{s.k}x{s.n}", [s], make_runner(s, rt.device, seed=rt.seed),
                 {"shape": name, "flops_level": f, "m": s.m, "k": s.k, "n": s.n})
        for name, f, s in shapes
    ]
    heldout = heldout_for(rt, model, [w.trace for w in workloads], what="gemm_same_flops")
    df = evaluate_workloads(model, workloads, device=rt.device, timing=rt.timing, heldout=heldout,
                            references=drift_references(rt, suite), description="measure gemms",
                            progress=bool(cfg.get("progress", True)), peak_flops_per_s=ceilings["peak_flops_per_s"])
    df["ai_over_ridge"] = df["intensity_flops_per_byte"] / ceilings["ridge_flops_per_byte"]
    df["roofline_bound_gflops"] = np.minimum(ceilings["peak_flops_per_s"],
                                             ceilings["bandwidth_bytes_per_s"] * df["intensity_flops_per_byte"]) / 1e9
    spread = df.groupby("flops_level")["measured_s"].agg(lambda s: float(s.max() / s.min()))
    summ = summary("gemm_same_flops", rt.fingerprint.describe(), df, details={
        "peak_gflops": ceilings["peak_flops_per_s"] / 1e9, "ridge_flops_per_byte": ceilings["ridge_flops_per_byte"],
        "latency_spread_at_equal_flops": {str(k): v for k, v in spread.items()},
        "mfu_by_shape": df.groupby("shape")["mfu"].median().to_dict(),
    })
    write_outputs(out, df, summ)
    _plot(df, out, ceilings)
    plot_predicted_vs_measured(df, out / "predicted_vs_measured.png", title="same-FLOPs GEMMs: predicted vs measured",
                               hue="shape")
    print_table(df, {"shape": "", "m": "", "k": "", "n": "", "flops": ".3g", "measured_s": "ms", "achieved_gflops": ".1f",
                     "mfu": ".1%", "intensity_flops_per_byte": ".1f", "ai_over_ridge": ".2f", "pred_L0_s": "ms",
                     "pred_L2_s": "ms", "pred_L3_s": "ms", "ape_L0_pct": ".0f", "ape_L3_pct": ".1f"},
                title="same FLOPs, different latency (ms)")
    print_summary(summ)
    console.print(f"at equal FLOPs the slowest shape is {spread.max():.1f}x the fastest; outputs in {out}")
    return summ


def _plot(df, out: Path, ceilings: dict) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    levels = sorted(df["flops_level"].unique(), reverse=True)
    shapes = ["balanced", "medium-skinny", "tall-skinny"]
    width = 0.8 / len(levels)
    for j, f in enumerate(levels):
        g = df[df["flops_level"] == f].set_index("shape").reindex(shapes)
        x = np.arange(len(shapes)) + j * width
        ax.bar(x, g["achieved_gflops"], width, label=f"{g['flops'].iloc[0] / 1e9:.2f} GFLOP")
        ax.scatter(x, g["roofline_bound_gflops"], marker="_", s=300, color="black", zorder=3)
    ax.axhline(ceilings["peak_flops_per_s"] / 1e9, color="grey", ls="--", label="measured peak")
    ax.set_xticks(np.arange(len(shapes)) + width * (len(levels) - 1) / 2, shapes)
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_yscale("log")
    ax.set_title("equal 2MKN, different shapes (black ticks: roofline bound)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "achieved_flops.png", dpi=120)
    plt.close(fig)
