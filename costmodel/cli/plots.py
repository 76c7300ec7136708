"""Plots of measured kernels: the device's measured roofline with every kernel on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")  # files only, no screen needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def roofline_plot(
    kernels: pd.DataFrame,
    ceilings: Mapping[str, Any],
    path: Path,
    *,
    title: str,
    color_by: str = "family",
    extra: pd.DataFrame | None = None,
) -> Path:
    """Achieved FLOP/s vs arithmetic intensity under the measured roofs (log-log).

    ``kernels`` needs columns flops, bytes_moved, median_s and ``color_by``; kernels
    with no FLOPs (gather, sort, histogram, copies) have no place on this plot and are
    counted in the legend. ``extra`` (same columns plus ``label`` and optionally
    ``experiment``) is drawn as large markers, e.g. whole layers, one marker per experiment.
    """
    peak = float(ceilings["peak_flops_per_s"])
    bw = float(ceilings["bandwidth_bytes_per_s"])
    has_flops = kernels["flops"] > 0
    shown = kernels[has_flops]
    fig, ax = plt.subplots(figsize=(9, 6))
    ai = shown["flops"] / shown["bytes_moved"]
    lo = min(float(ai.min()) if len(ai) else 0.01, 0.01) / 2
    hi = max(float(ai.max()) if len(ai) else 100.0, 10 * peak / bw) * 2
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.plot(xs, np.minimum(peak, bw * xs), color="black", lw=2, label="measured roofline")
    ax.axvline(peak / bw, color="grey", ls=":", lw=1)
    ax.text(peak / bw, peak * 1.15, f"ridge {peak / bw:.1f} FLOP/B", ha="center", fontsize=8)
    for name, g in shown.groupby(color_by):
        ax.scatter(g["flops"] / g["bytes_moved"], g["flops"] / g["median_s"], s=14, alpha=0.7, label=f"{name} ({len(g)})")
    if extra is not None and len(extra):
        groups = extra.groupby("experiment") if "experiment" in extra else [("layers", extra)]
        for (name, g), marker in zip(groups, "*PXDv^<>"):
            ax.scatter(g["flops"] / g["bytes_moved"], g["flops"] / g["median_s"], s=80, marker=marker,
                       edgecolor="black", facecolor="white", linewidth=1.2, zorder=5, label=f"layers: {name} ({len(g)})")
        if len(extra) <= 12:  # a few layers can carry their names; more would be unreadable
            for _, r in extra.iterrows():
                ax.annotate(str(r["label"]), (r["flops"] / r["bytes_moved"], r["flops"] / r["median_s"]), fontsize=7,
                            xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity [FLOP / ideal byte]")
    ax.set_ylabel("achieved [FLOP/s]")
    hidden = int((~has_flops).sum())
    ax.set_title(title + (f"\n({hidden} kernels without FLOPs not shown)" if hidden else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
