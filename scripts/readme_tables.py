"""Markdown tables for the README from committed experiment outputs.

    python scripts/readme_tables.py results/cpu_epyc > /tmp/tables.md
    python scripts/readme_tables.py results/cpu_epyc/moe_v12 results/cpu_epyc/gnn_v8

Reads <dir>/<run>/summary.json (or <run>/summary.json for a run given itself) (and results.csv, classes.csv where present) and prints,
per run: the levels' error summary and the experiment's headline table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from experiments.common import format_cell


def fmt(v: object, spec: str = ".1f") -> str:
    return "-" if v is None or (isinstance(v, float) and v != v) else format(v, spec)


def levels_table(s: dict) -> str:
    rows = ["| level | median APE % | p90 APE % | max APE % | Spearman |", "|---|---|---|---|---|"]
    for lv in ("L0", "L1", "L2", "L3"):
        rows.append(f"| {lv} | {fmt(s['median_ape_pct'][lv])} | {fmt(s['p90_ape_pct'][lv])} | "
                    f"{fmt(s['max_ape_pct'][lv])} | {fmt(s['spearman'][lv], '.3f')} |")
    d = s["details"]
    drift = d.get("profile_drift") or {}
    rows.append("")
    rows.append(f"{s['n_points']} points; run-to-run noise {fmt(s['noise_cv_pct'])}% CV; noise floor "
                f"{fmt(d.get('noise_floor_median_ape_pct'))}% median APE"
                + (f", {fmt((d.get('noise_floor_max_ape_pct') or {}).get('median'))}% max APE"
                   if d.get("noise_floor_max_ape_pct") else "")
                + (f"; machine at {drift['now_over_profile_median']:.2f}x its calibration-time kernel times"
                   if drift else ""))
    return "\n".join(rows)


def frame_table(df: pd.DataFrame, cols: dict[str, str]) -> str:
    head = "| " + " | ".join(cols) + " |"
    sep = "|" + "---|" * len(cols)
    lines = [head, sep]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(format_cell(r[c], spec) for c, spec in cols.items()) + " |")
    return "\n".join(lines)


def run_dirs(paths: list[str]) -> list[Path]:
    """Each path is a run (it holds summary.json) or a folder of runs."""
    out: list[Path] = []
    for p in map(Path, paths):
        out += [p] if (p / "summary.json").exists() else sorted(r for r in p.iterdir() if (r / "summary.json").exists())
    return out


def main(paths: list[str]) -> None:
    for run in run_dirs(paths):
        s = json.loads((run / "summary.json").read_text())
        print(f"\n### {run.name} ({s['experiment']})\n")
        print(levels_table(s))
        if not (run / "results.csv").exists():  # a predict-only run of a design sweep keeps predictions elsewhere
            continue
        res = pd.read_csv(run / "results.csv")
        name = s["experiment"]
        if name == "moe_skew":
            print()
            piv = res.pivot_table(index="value", columns="backend", values=["measured_s", "pred_L3_s"], sort=False)
            piv.columns = [f"{a}_{b}" for a, b in piv.columns]
            piv = piv.reset_index()
            metrics = res.groupby("value", sort=False)[["max_over_mean", "norm_entropy"]].first().reset_index()
            piv = metrics.merge(piv, on="value")
            cols = {"value": "", "max_over_mean": ".2f", "norm_entropy": ".2f"}
            for b in res["backend"].unique():
                cols[f"measured_s_{b}"] = "ms"
                cols[f"pred_L3_s_{b}"] = "ms"
            print(frame_table(piv, cols))
            print(f"\nL0 (FLOPs / peak) predicts {res['pred_L0_s'].iloc[0] * 1e3:.2f} ms for every point.")
        elif name == "gnn_degree":
            print()
            piv = res.pivot_table(index="degree_cv", columns="backend", values="measured_s").reset_index()
            print(frame_table(piv, {"degree_cv": ".2f", **{b: "ms" for b in res["backend"].unique()}}))
        elif name == "gemm_same_flops":
            print()
            print(frame_table(res, {"shape": "", "m": "", "k": "", "n": "", "flops": ".3g", "measured_s": "ms",
                                    "achieved_gflops": ".1f", "mfu": ".1%", "ai_over_ridge": ".2f",
                                    "pred_L0_s": "ms", "pred_L3_s": "ms"}))
        elif name == "mlp_batch":
            print()
            print(frame_table(res, {"batch": "", "flops_vs_first": ".0f", "latency_vs_first": ".2f",
                                    "achieved_gflops": ".1f", "measured_s": "ms", "pred_L0_s": "ms",
                                    "pred_L3_s": "ms"}))
        elif name == "flops_spectrum":
            print()
            cls = pd.read_csv(run / "classes.csv")
            print(frame_table(cls, {"class": "", "n": "", "achieved_gflops": ".1f", "L0_median_ape_pct": ".1f",
                                    "r2_flops_class_rate": ".2f", "r2_flops_device_rate": ".2f",
                                    "L3_median_ape_pct": ".1f", "r2_L3": ".2f"}))
        elif name == "roofline":
            print()
            lay = res[res["kind"] == "layer"]
            if len(lay):
                g = lay.groupby("experiment").agg(layers=("label", "size"), median_mfu=("mfu", "median"),
                                                  max_mfu=("mfu", "max")).reset_index()
                print(frame_table(g, {"experiment": "", "layers": "", "median_mfu": ".1%", "max_mfu": ".1%"}))


if __name__ == "__main__":
    main(sys.argv[1:] or ["results/cpu_epyc"])
