"""experiment=roofline: everything measured, on this device's measured roofline.

Points: every kernel of this device's profile (achieved FLOP/s vs arithmetic intensity)
and every layer of the other experiments' latest results (found by
``roofline.results_globs``), with MFU = achieved / measured peak and the bound the
roofline puts on each. Kernel rows carry the cost models' in-sample predictions; layer
rows carry the predictions their experiment made. Outputs: results.csv, summary.json,
roofline.png.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from costmodel.cli.plots import roofline_plot
from costmodel.measure.runtime import Runtime
from costmodel.model.features import roofline_time_s
from costmodel.model.predictor import CostModel, LEVELS
from costmodel.cli.config_schema import Names
from experiments.common import add_errors, check_common, config_dict, console, output_dir, print_summary, print_table, summary, write_outputs


#: this experiment reads profiles and results and times nothing
MEASURES = "never"

def latest_results(patterns: list[str]) -> pd.DataFrame:
    """The newest results.csv of every other experiment, stacked, with its experiment name."""
    newest: dict[str, Path] = {}
    for pattern in patterns:
        for f in map(Path, glob.glob(pattern)):
            summary_file = f.with_name("summary.json")
            if not summary_file.exists():
                continue
            name = json.loads(summary_file.read_text()).get("experiment", "?")
            if name != "roofline" and (name not in newest or f.stat().st_mtime > newest[name].stat().st_mtime):
                newest[name] = f
    frames = []
    for name, f in sorted(newest.items()):
        df = pd.read_csv(f)
        if {"flops", "bytes_moved", "measured_s"} <= set(df.columns):
            label = df["label"] if "label" in df else df.get("backend", pd.Series([""] * len(df))).astype(str)
            frames.append(df.assign(kind="layer", experiment=name, source=str(f), label=label.astype(str)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


#: roofline's fields (beside the shared ones, ``experiments.common.COMMON_CONSTRAINTS``)
CONSTRAINTS: dict[str, Any] = {"roofline.results_globs": Names(what="glob", min_len=0)}


def validate(cfg: Any) -> list[str]:
    """Every check of ``run`` that needs no measuring (also run on every job of a ``-m``
    sweep before the first starts): base keys and ``roofline.results_globs``. Returns the globs.
    (Whether a fitted profile exists is checked by ``run``: an earlier job may create it.)"""
    cfg = config_dict(cfg)
    check_common(cfg, CONSTRAINTS)
    globs = cfg["roofline"]["results_globs"]
    return [globs] if isinstance(globs, str) else list(globs)


def run(cfg: Any, out_dir: str | Path | None = None, *, plan: Any = None) -> dict[str, Any]:
    """``plan``: what ``validate(cfg)`` returned (the entry point's one check), else validated here."""
    cfg = config_dict(cfg)
    globs = validate(cfg) if plan is None else plan
    rt = Runtime.from_cfg(cfg, checked=True)
    profile = rt.open_profile(create=False)
    model = CostModel.load(profile, expected=rt.fingerprint, allow_stale=True)
    out = output_dir(cfg, out_dir)
    ceil = model.ceilings
    kernels = profile.kernels()
    pred = model.predict_table(kernels)
    kernels = kernels.assign(kind="kernel", experiment="profile", label=kernels["family"],
                             measured_s=kernels["median_s"], measured_iqr_s=kernels["iqr_s"],
                             **{f"pred_{lv}_s": pred[lv].to_numpy() for lv in LEVELS})
    layers = latest_results(globs)
    cols = ["kind", "experiment", "label", "flops", "bytes_moved", "measured_s", "measured_iqr_s",
            "round_cv", *(f"pred_{lv}_s" for lv in LEVELS)]
    df = pd.concat([kernels.reindex(columns=cols), layers.reindex(columns=cols)], ignore_index=True)
    df = add_errors(df)
    df["achieved_gflops"] = df["flops"] / df["measured_s"] / 1e9
    df["intensity_flops_per_byte"] = df["flops"] / df["bytes_moved"]
    df["mfu"] = df["flops"] / df["measured_s"] / ceil["peak_flops_per_s"]
    df["roofline_s"] = roofline_time_s(df["flops"].to_numpy(float), df["bytes_moved"].to_numpy(float), ceil)
    df["share_of_roofline"] = df["roofline_s"] / df["measured_s"]  # 1 = running at the roof
    df["bound"] = np.where(df["intensity_flops_per_byte"] >= ceil["ridge_flops_per_byte"], "compute", "memory")
    summ = summary("roofline", rt.fingerprint.describe(), df, details={
        "kernels": int((df["kind"] == "kernel").sum()), "layers": int((df["kind"] == "layer").sum()),
        "experiments_found": sorted(layers["experiment"].unique().tolist()) if len(layers) else [],
        "note": "kernel rows: in-sample predictions of the fitted models; layer rows: their experiment's predictions",
        "peak_gflops": ceil["peak_flops_per_s"] / 1e9, "bandwidth_gbs": ceil["bandwidth_bytes_per_s"] / 1e9,
        "median_mfu_by_experiment": df[df["flops"] > 0].groupby("experiment")["mfu"].median().to_dict(),
    })
    write_outputs(out, df, summ)
    extra = df[df["kind"] == "layer"].assign(median_s=lambda d: d["measured_s"],
                                             label=lambda d: d["experiment"].str[:4] + ":" + d["label"].str[:18])
    roofline_plot(kernels.assign(median_s=kernels["measured_s"]), ceil, out / "roofline.png",
                  title=f"measured roofline of {rt.fingerprint.device_name}", extra=extra[extra["flops"] > 0])
    if len(layers):
        by_exp = df[df["kind"] == "layer"].groupby("experiment").agg(
            layers=("label", "size"), median_mfu=("mfu", "median"), max_mfu=("mfu", "max"),
            median_share_of_roofline=("share_of_roofline", "median"), memory_bound=("bound", lambda b: (b == "memory").mean()),
        ).reset_index()
        print_table(by_exp, {"experiment": "", "layers": "", "median_mfu": ".1%", "max_mfu": ".1%",
                             "median_share_of_roofline": ".1%", "memory_bound": ".0%"},
                    title="layers of the other experiments on the roofline (MFU = achieved / measured peak)")
    else:
        console.print("[yellow]no results.csv of other experiments found: run them first to place layers on the roofline[/]")
    print_summary(summ)
    console.print("kernel rows are the models' own training data (in-sample errors); held-out errors: "
                  "`python -m costmodel fit` (fit_report.json)")
    console.print(f"outputs in {out}")
    return summ
