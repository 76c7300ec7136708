"""`python -m costmodel fit`: fit L0-L3 on a profile, evaluate held-out, persist, report.

Writes into the run's output dir: ``fit_report.json`` ({family: {level: metrics}} for the
held-out split, the same under "extrapolation"), ``roofline.png``; caches the fitted models
in this user's model cache (``costmodel.store.model_cache``), never in the profile folder, so a
read-only or shared profile can be fitted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from costmodel.cli.console import make_console
from rich.table import Table

from costmodel.cli.plots import roofline_plot
from costmodel.measure.runtime import Runtime
from costmodel.model.evaluation import evaluate_folds, evaluate_split, extrapolation_split, heldout_folds
from costmodel.model.models import make_levels
from costmodel.model.predictor import CostModel, LEVELS, training_table
from costmodel.store.profile import DeviceProfile

console = make_console(width=170)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report_table(report: dict[str, Any], title: str) -> Table:
    table = Table(title=title)
    table.add_column("family")
    table.add_column("n")
    for level in LEVELS:
        table.add_column(f"{level} med/p90 APE %", justify="right")
    table.add_column("L3 within 10%", justify="right")
    table.add_column("L3 pred/meas (p10-p90)", justify="right")
    table.add_column("L3 spearman", justify="right")
    table.add_column("noise floor %", justify="right")
    for family, levels in report.items():
        l3 = levels["L3"]
        table.add_row(
            family, str(l3["n_test"]),
            *(f"{_fmt(levels[lv]['median_ape_pct'], '.1f')} / {_fmt(levels[lv]['p90_ape_pct'], '.0f')}" for lv in LEVELS),
            _fmt(l3["within_10pct"], ".0%"),
            f"{_fmt(l3.get('ratio_median'), '.2f')} ({_fmt(l3.get('ratio_p10'), '.2f')}-{_fmt(l3.get('ratio_p90'), '.2f')})",
            _fmt(l3["spearman"], ".3f"), _fmt(l3.get("noise_floor_median_ape_pct"), ".1f"),
        )
    return table


def evaluate_profile(profile: DeviceProfile, *, folds: int, quantile: float, cv_folds: int,
                     seed: int) -> dict[str, Any]:
    """The fit_report.json content for a profile: every shape held out once (grouped K-fold),
    then the extrapolation split."""
    X, y, ceilings = training_table(profile)
    levels = make_levels(ceilings, cv_folds=cv_folds)
    report: dict[str, Any] = evaluate_folds(levels, X, y, heldout_folds(X, folds=folds, seed=seed))
    train, test = extrapolation_split(X, quantile=quantile)
    report["extrapolation"] = evaluate_split(levels, X, y, train, test)
    return report


def output_dir() -> Path:
    try:
        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        return Path.cwd()


def run(cfg: DictConfig) -> dict[str, Any]:
    rt = Runtime.from_cfg(cfg)
    if cfg.fit.profile_path:
        # fitting measures nothing, so any device's profile can be fitted and evaluated here
        # (the committed profiles of both machine types from one machine); the note says so
        profile = DeviceProfile.load(cfg.fit.profile_path)
        if profile.fingerprint != rt.fingerprint:
            console.print(f"[yellow]note[/]: {profile.path} was measured on another device or software stack "
                          f"({profile.fingerprint.differences(rt.fingerprint)}); fitting and evaluating it here "
                          "measures nothing, and the cached models serve predictions for that device only")
    else:
        profile = rt.open_profile(create=False)
    console.print(f"profile: {profile.path}\ndevice: {profile.fingerprint.describe()}")
    rows, rejected = len(profile.measurements()), profile.rejected()
    if rejected:
        console.print(f"[yellow]rejected {len(rejected)} rows[/] of {profile.path / 'measurements.csv'} (each named "
                      f"above with its line and reason); fitting on the {rows} valid rows. The next "
                      "`python -m costmodel bench` (or calibration) measures the rejected kernels and rounds again.")
    else:
        console.print(f"all {rows} rows of measurements.csv are valid")
    start = time.perf_counter()
    report = evaluate_profile(
        profile, folds=cfg.fit.heldout_folds, quantile=float(cfg.fit.extrapolation_quantile),
        cv_folds=int(cfg.fit.cv_folds), seed=rt.seed,
    )
    model = CostModel.fit_profile(profile, cv_folds=int(cfg.fit.cv_folds))
    cached = model.save(profile)  # the user's model cache; None when the cache was refused (a warning says why)
    out = output_dir()
    out.mkdir(parents=True, exist_ok=True)
    extrapolation = report.pop("extrapolation")
    (out / "fit_report.json").write_text(json.dumps({**report, "extrapolation": extrapolation}, indent=2) + "\n")
    frame = profile.kernels()
    roofline_plot(frame, model.ceilings, out / "roofline.png", title=f"measured kernels on {profile.fingerprint.device_name}")
    console.print(report_table(report, f"held-out shapes (grouped {cfg.fit.heldout_folds}-fold: every shape predicted once by a model that never saw it); noise floor = median APE of a perfect model"))
    console.print(report_table(extrapolation, "extrapolation (shapes larger than any in training)"))
    forms = ", ".join(f"{f}: {m}" for f, m in model.meta["l3_form"].items())
    console.print(f"L3 form per family (chosen by grouped CV): {forms}")
    where = f"models cached in {cached}" if cached else "models not cached (see the warning above)"
    console.print(f"fitted in {time.perf_counter() - start:.1f} s; {where}; report in {out}")
    return {"report": report, "extrapolation": extrapolation, "output_dir": str(out), "rejected_rows": len(rejected)}
