"""What every experiment shares: interleaved measurement, the summary.json schema, tables, plots.

summary.json has the same shape for every experiment::

    {"experiment": str, "device": str, "n_points": int, "noise_cv_pct": float,
     "median_ape_pct": {"L0": .., "L1": .., "L2": .., "L3": ..}, "p90_ape_pct": {...},
     "max_ape_pct": {...}, "spearman": {...}, "details": {...}}

APE is the absolute percentage error of predicted vs measured latency over every row of
results.csv; ``noise_cv_pct`` is the median, over rows, of the coefficient of variation
of that row's per-round medians (run-to-run noise, which bounds any model's accuracy).
``details.noise_floor_median_ape_pct`` is the median APE a perfect model would score
against measurements this noisy; ``details.noise_floor_max_ape_pct`` (p10, median, p90)
the distribution of the largest APE it would score over the run's points
(``costmodel.model.evaluation``): a max target below its median is met by luck in under half
of the runs, whatever the model. ``details.l3_beyond_noise``: the share of points whose L3
error exceeds twice their measurement's noise (a perfect model: 4.55%).
``details.freshness`` is the check before the run (``costmodel.measure.freshness``: per-family
ratio of reference kernels timed then vs profiled, which families were re-measured);
``details.profile_drift`` is how fast the experiment's profiled kernels ran, timed in the
same rounds as its layers, against the profile; ``details.drift_scaled_ape_pct`` the
errors each level would have had with its predictions multiplied by that factor (what
is left when the machine's change since calibration is taken out; the headline errors
are never adjusted).

Three scorings (``sim.predict.heldout``; docs/method.md): the top-level errors are the
``details.scoring`` one, **held-out** in every measuring experiment (models refitted
without any kernel of the run's traces, no lookup, ceilings as before the run;
``details.heldout`` says on how many kernels and how long the fit took). Beside it, each
with median, p90, max and L3/measured per backend: ``details.profile_lookup`` (the profile
as loaded, profiled kernels predicted by their measurement) and ``details.replay``
(``calibration.paired``: the layers' own kernels timed in the same rounds as the layers,
written into the profile and looked up: the composition check). ``details.paired`` says
how many kernels were timed and how fast against the profile. Paired runs time no drift
references. ``details.l3_over_measured`` (rows with a ``backend``): per backend, the median
and the 10th/90th percentiles of held-out L3 predicted / measured: APE hides the sign.

``details.run`` says which code the run measured and when (``experiments.run_provenance``:
commit, whether the code differed from it, the UTC time the summary was written).

With ``measure=false`` (predict only) the schema is the same: ``n_points`` counts the
predicted rows, every error, ``spearman`` and ``noise_cv_pct`` are null, and
``details.measured`` is false (true otherwise).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from costmodel.cli.console import make_console  # noqa: E402
from experiments.run_provenance import run_provenance  # noqa: E402
from rich.table import Table  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from costmodel.cli.config_schema import Interval, Options, Rule  # noqa: E402
from costmodel.measure.bench import make_progress  # noqa: E402
from costmodel.measure.freshness import POLICIES  # noqa: E402
from costmodel.model.committee import NEIGHBOUR_PICKS  # noqa: E402
from costmodel.model.predictor import LEVELS  # noqa: E402
from costmodel.measure.timing import TimingConfig, measure  # noqa: E402

console = make_console(width=160)


def config_dict(cfg: Any) -> dict[str, Any]:
    """A plain, resolved dict of an experiment's config (a composed DictConfig, with or
    without Hydra's own ``hydra`` node, or a dict already)."""
    from omegaconf import OmegaConf

    if isinstance(cfg, dict):
        return cfg
    if "hydra" in cfg:  # a job config composed by a sweeper: Hydra's node resolves only inside a job
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    return out


def _profile_id_needs_predict_only(value: Any, cfg: Mapping[str, Any]) -> bool:
    return value is None or cfg.get("measure", True) is False


#: conf/config.yaml's keys every experiment shares (beside conf/base.yaml's,
#: ``costmodel.cli.config_schema.BASE_CONSTRAINTS``), and the blocks several have
COMMON_CONSTRAINTS: dict[str, Any] = {
    "progress": bool,
    "measure": bool,
    "profile.id": Rule(_profile_id_needs_predict_only,
                       "null with measure=true (another device's profile predicts only: set measure=false; "
                       "measurements on this machine are compared with its own profile)"),
    "calibration.refresh": [Options(list(POLICIES)), bool, None],
    "calibration.tolerance": Interval(float, 0, 10, closed="neither", words="a number in (0, 10) (0.1 = 10% either way)"),
    "calibration.paired": bool,
    "calibration.neighbours": Options(list(NEIGHBOUR_PICKS)),
    "per_kernel.point": Interval(int, None, None, words="an integer index into the sweep"),
    "per_kernel.iterations": Interval(int, 1, None),
    "coverage.iterations": Interval(int, 1, None),
}


def check_common(cfg: Mapping[str, Any], constraints: Mapping[str, Any] | None = None) -> torch.device:
    """The schema check every experiment's ``validate`` starts with: conf/base.yaml's keys,
    ``COMMON_CONSTRAINTS`` and the experiment's own ``constraints`` (its module's
    ``CONSTRAINTS``), in one pass with one error format (``costmodel.cli.config_schema.check``,
    through ``costmodel.measure.runtime.check_cfg``, no side effects); returns the device."""
    from costmodel.measure.runtime import check_cfg

    return check_cfg(cfg, {**COMMON_CONSTRAINTS, **dict(constraints or {})})


def check_measure_keys(cfg: Mapping[str, Any]) -> bool:
    """``measure`` (checked by ``check_common``): whether this run measures."""
    return bool(cfg.get("measure", True))


def backend_list(value: Any) -> list[str]:
    """A backends key (checked by a ``Names`` constraint): one name or a list of names."""
    return [value] if isinstance(value, str) else list(value)


def validate_experiment(cfg: Any) -> Any:
    """Run ``experiments.<cfg.name>.validate(cfg)`` (every experiment module has one: the
    schema check and the plan it builds, which it returns): the validator
    ``costmodel.cli.sweep_check.ValidateSweep`` applies to each job of a sweep, and what the
    entry point (``sim.__main__``) runs once before handing the plan to ``run``."""
    import importlib

    name = cfg.get("name")
    if not isinstance(name, str) or name == "???":
        raise ValueError("name is not set: choose an experiment with experiment=NAME")
    return importlib.import_module(f"experiments.{name}").validate(cfg)


def output_dir(cfg: Mapping[str, Any], out_dir: str | Path | None) -> Path:
    """Hydra's run dir when launched by Hydra; else the given dir; else outputs/NAME/time."""
    if out_dir is None:
        try:
            from hydra.core.hydra_config import HydraConfig

            out_dir = HydraConfig.get().runtime.output_dir
        except ValueError:
            out_dir = Path("outputs") / str(cfg["name"]) / time.strftime("%Y-%m-%d_%H-%M-%S")
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def calibration_options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``calibration.refresh`` / ``tolerance`` / ``neighbours`` (checked by ``check_common``) as
    ``calibrated_model`` keywords."""
    from costmodel.measure.freshness import DEFAULT_TOLERANCE

    section = cfg.get("calibration") or {}
    refresh = section.get("refresh", "auto")
    refresh = "always" if refresh is True else "never" if refresh in (False, None) else str(refresh).lower()
    return {"refresh": refresh, "tolerance": float(section.get("tolerance", DEFAULT_TOLERANCE)),
            "neighbours": str(section.get("neighbours", "committee"))}


def paired_enabled(cfg: Mapping[str, Any]) -> bool:
    """``calibration.paired`` (default true, checked by ``check_common``): time the
    experiment's own kernels in the same rounds as its layers and refit before predicting
    (``sim.predict.paired``)."""
    return bool((cfg.get("calibration") or {}).get("paired", True))


#: arguments a generator gets from the experiment, never from its config section
CALLER_ARGUMENTS = ("seed",)


def generator_keys(section: Mapping[str, Any], what: str) -> list[str]:
    """The keyword arguments ``section['generator']``'s ``_target_`` accepts from its config
    (explicit parameters with a default or keyword-only, not the caller's ``seed``); a
    missing or unknown target, or a key it does not take, is a ValueError naming them."""
    import inspect

    from hydra.utils import get_object

    gen_cfg = section.get("generator")
    if not isinstance(gen_cfg, Mapping) or not gen_cfg.get("_target_"):
        raise ValueError(f"{what}.generator must be a mapping with a _target_ (see conf/{what}/*.yaml)")
    target = str(gen_cfg["_target_"])
    try:
        obj = get_object(target)
    except Exception as err:  # ImportError / AttributeError wrapped by Hydra
        raise ValueError(f"{what}.generator._target_: cannot import {target!r}: {err.__cause__ or err}") from None
    params = inspect.signature(obj).parameters.values()
    allowed = [p.name for p in params
               if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and (p.kind == p.KEYWORD_ONLY or p.default is not p.empty)
               and p.name not in CALLER_ARGUMENTS]
    unknown = [k for k in gen_cfg if not str(k).startswith("_") and k not in allowed]
    if unknown:
        raise ValueError(f"{what}.generator: {target} takes no key {', '.join(map(repr, unknown))}; "
                         f"allowed: {allowed}")
    return allowed


def instantiate_sweep(section: Mapping[str, Any], what: str) -> list[tuple[Any, Any]]:
    """(sweep value, instantiated generator) per point of a generator config with a
    ``sweep: {param, values}`` block; every key and value is validated before anything runs."""
    from hydra.utils import instantiate

    allowed = generator_keys(section, what)
    sweep = section.get("sweep")
    if not isinstance(sweep, Mapping) or "param" not in sweep or "values" not in sweep:
        raise ValueError(f"{what}.sweep must be a mapping with param and values")
    param, values = sweep["param"], sweep["values"]
    if param is not None and param not in allowed:
        raise ValueError(f"{what}.sweep.param must be one of {allowed} (or null), got {param!r}")
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"{what}.sweep.values must list at least one value, got {values!r}")
    out = []
    for v in values:
        overrides = {} if param is None else {param: v}
        try:
            gen = instantiate(section["generator"], **overrides)
            if hasattr(gen, "func"):  # a partial generator function: check its arguments now
                import inspect

                inspect.signature(gen.func).bind_partial(*gen.args, **gen.keywords)
        except Exception as err:  # Hydra wraps the generator's ValueError/TypeError
            cause = err.__cause__ or err
            raise ValueError(f"{what}.sweep: {param}={v!r}: {cause}") from None
        out.append((v, gen))
    return out


def measure_interleaved(
    jobs: Sequence[Callable[[], Any] | Any], *, device: torch.device, timing: TimingConfig, description: str,
    progress: bool = True, evict: Sequence[bool] | None = None, order: Sequence[int] | None = None,
    watch: Sequence[int] | None = None, companions: Mapping[int, Sequence[int]] | None = None,
) -> list[dict[str, Any]]:
    """Time every job in ``timing.rounds`` round-robin passes (each with 1/rounds of the
    time budget, no retries: the rounds are the retries), so slow drift of a shared
    machine spreads over all jobs instead of biasing the ones measured during a busy spell.

    Per job: median of the round medians, IQR over all timed blocks, the CV of the round
    medians (run-to-run noise), whether any round was flagged noisy, and ``rounds`` (the
    Measurement of each round). ``evict`` says per job whether each timed call starts from
    evicted caches (default: ``timing.cold_cache``). A job with a ``build()`` method (a
    ``sim.predict.paired.KernelJob``) is built just before each of its timings and dropped after.
    ``order`` (a permutation of the job indices; default as given) is the order of the odd
    rounds; even rounds run it backwards, so a job timed just before another in one round
    is timed just after it in the next, and a steady drift cancels out of their ratio.
    Results are returned in job order whatever the timing order.

    Then, up to ``timing.extra_rounds`` times, the ``watch`` jobs (default: all) whose round
    medians still have a CV above ``timing.max_round_cv`` get another round, each with its
    ``companions`` (job indices timed with it, e.g. the kernels a layer's prediction sums),
    in the same alternating order; ``rounds_timed`` says how many rounds each job got.
    """
    rounds = timing.rounds
    evict = [timing.cold_cache] * len(jobs) if evict is None else list(evict)
    if len(evict) != len(jobs):
        raise ValueError(f"evict has {len(evict)} flags for {len(jobs)} jobs")
    forward = list(range(len(jobs))) if order is None else list(order)
    if sorted(forward) != list(range(len(jobs))):
        raise ValueError(f"order must be a permutation of the {len(jobs)} job indices")
    watched = list(range(len(jobs))) if watch is None else list(watch)
    companions = dict(companions or {})
    per_round = replace(timing.per_round(), retries=0)
    per_job: list[list[Any]] = [[] for _ in jobs]

    def round_cv(i: int) -> float:
        medians = np.array([m.median_s for m in per_job[i]])
        return float(medians.std(ddof=1) / medians.mean()) if len(medians) > 1 else float(per_job[i][0].cv)

    bar = make_progress(progress)
    total = len(jobs) * rounds
    with bar:
        task = bar.add_task(description, total=total, current="")

        def timed_round(r: int, subset: set[int] | None, label: str) -> None:
            for i in (forward if r % 2 == 0 else forward[::-1]):
                if subset is not None and i not in subset:
                    continue
                job = jobs[i]
                bar.update(task, current=label)
                fn = job.build() if hasattr(job, "build") else job
                per_job[i].append(measure(fn, device=device, config=per_round, evict_cpu_cache=evict[i]))
                del fn
                bar.advance(task)

        for r in range(rounds):
            timed_round(r, None, f"round {r + 1}/{rounds}")
        for extra in range(timing.extra_rounds):
            noisy = [i for i in watched if len(per_job[i]) > 1 and round_cv(i) > timing.max_round_cv]
            if not noisy:
                break
            subset = set(noisy).union(*(companions.get(i, ()) for i in noisy))
            total += len(subset)
            bar.update(task, total=total)
            console.print(f"{description}: {len(noisy)} of {len(watched)} still vary more than "
                          f"{100 * timing.max_round_cv:.0f}% between rounds: extra round {extra + 1}/"
                          f"{timing.extra_rounds} ({len(subset)} jobs with their kernels)")
            timed_round(rounds + extra, subset, f"extra round {extra + 1} ({len(noisy)} noisy)")
    out = []
    for i, ms in enumerate(per_job):
        medians = np.array([m.median_s for m in ms])
        blocks = np.concatenate([np.asarray(m.times_s) for m in ms])
        q1, q3 = np.percentile(blocks, [25, 75])
        out.append({
            "measured_s": float(np.median(medians)),
            "measured_iqr_s": float(q3 - q1),
            "round_cv": round_cv(i),
            "rounds_timed": len(ms),
            "noisy": bool(any(m.noisy for m in ms)),
            "rounds": ms,
        })
    return out


def add_errors(df: pd.DataFrame, levels: Sequence[str] = LEVELS) -> pd.DataFrame:
    for lv in levels:
        df[f"ape_{lv}_pct"] = 100 * (df[f"pred_{lv}_s"] - df["measured_s"]).abs() / df["measured_s"]
    return df


def _clean(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def summary(name: str, device: str, df: pd.DataFrame, *, levels: Sequence[str] = LEVELS,
            details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The summary.json every experiment writes (schema in the module docstring)."""
    out: dict[str, Any] = {
        "experiment": name,
        "device": device,
        "n_points": int(len(df)),
        "noise_cv_pct": float(100 * df["round_cv"].median()) if "round_cv" in df else None,
    }
    for key, fn in (("median_ape_pct", np.median), ("p90_ape_pct", lambda a: np.percentile(a, 90)), ("max_ape_pct", np.max)):
        out[key] = {lv: _clean(fn(df[f"ape_{lv}_pct"].to_numpy())) for lv in levels}
    out["spearman"] = {
        lv: _clean(spearmanr(df[f"pred_{lv}_s"], df["measured_s"]).statistic) if df[f"pred_{lv}_s"].nunique() > 1 else None
        for lv in levels
    }
    out["details"] = {"measured": True, "run": run_provenance(), **dict(details or {})}
    if df.attrs.get("profile_drift") and "profile_drift" not in out["details"]:  # set by evaluate_workloads
        out["details"]["profile_drift"] = df.attrs["profile_drift"]
    if df.attrs.get("freshness") and "freshness" not in out["details"]:  # the check before the run
        out["details"]["freshness"] = df.attrs["freshness"]
    if df.attrs.get("paired") and "paired" not in out["details"]:  # kernels timed beside the layers
        out["details"]["paired"] = df.attrs["paired"]
    if "scoring" in df.attrs:  # evaluate_workloads / evaluate_captured: which scoring is the headline
        out["details"]["scoring"] = df.attrs["scoring"]
        out["details"]["heldout"] = df.attrs.get("heldout", {"scored": False})
        for name in ("profile_lookup", "replay", "heldout_drift_scaled", "heldout_by_kind"):
            if name in df.attrs:
                out["details"][name] = df.attrs[name]
    if "backend" in df and "pred_L3_s" in df:
        out["details"]["l3_over_measured"] = l3_over_measured(df)
    drift = out["details"].get("profile_drift") or {}
    if drift:
        factor = drift["now_over_profile_median"]
        scaled = {lv: (100 * (df[f"pred_{lv}_s"] * factor - df["measured_s"]).abs() / df["measured_s"]).to_numpy()
                  for lv in levels}
        out["details"]["drift_scaled_ape_pct"] = {
            "factor": factor,
            "median": {lv: _clean(np.median(a)) for lv, a in scaled.items()},
            "p90": {lv: _clean(np.percentile(a, 90)) for lv, a in scaled.items()},
            "max": {lv: _clean(np.max(a)) for lv, a in scaled.items()},
        }
    if {"round_cv"} <= set(df.columns):
        from costmodel.model.evaluation import beyond_noise, noise_floor_max_ape_pct, noise_floor_median_ape_pct, point_sigma

        sigma = point_sigma(df, df.attrs.get("rounds", 1))
        out["details"]["noise_floor_median_ape_pct"] = noise_floor_median_ape_pct(sigma)
        out["details"]["noise_floor_max_ape_pct"] = {
            name: _clean(noise_floor_max_ape_pct(sigma, q)) for name, q in (("p10", 0.1), ("median", 0.5), ("p90", 0.9))}
        if "ape_L3_pct" in df and "L3" in levels:
            out["details"]["l3_beyond_noise"] = beyond_noise(df["ape_L3_pct"].to_numpy() / 100, sigma)
    return out


def ratio_summary(ratios: Any, count_key: str = "points") -> dict[str, float]:
    """Predicted / measured ratios summarised: median, 10th and 90th percentile, and their count."""
    r = np.asarray(ratios, dtype=float)
    return {"median": float(np.median(r)), "p10": float(np.percentile(r, 10)), "p90": float(np.percentile(r, 90)),
            count_key: int(r.size)}


def ratio_words(summaries: Mapping[str, Mapping[str, float]]) -> str:
    """``name 0.92x (0.82-1.02)`` per ``ratio_summary``: median (10th-90th percentile)."""
    return ", ".join(f"{name} {s['median']:.2f}x ({s['p10']:.2f}-{s['p90']:.2f})" for name, s in summaries.items())


def l3_over_measured(df: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per backend, L3 predicted / measured: median, 10th and 90th percentile, points."""
    ratio = df["pred_L3_s"] / df["measured_s"]
    return {str(b): ratio_summary(r) for b, r in ratio.groupby(df["backend"], sort=True)}


def predict_only_summary(name: str, device: str, df: pd.DataFrame, *, levels: Sequence[str] = LEVELS,
                         details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """summary.json of a run that predicted and measured nothing: the common schema with
    null errors, so readers of every summary need no special case."""
    empty = {lv: None for lv in levels}
    return {"experiment": name, "device": device, "n_points": int(len(df)), "noise_cv_pct": None,
            "median_ape_pct": dict(empty), "p90_ape_pct": dict(empty), "max_ape_pct": dict(empty),
            "spearman": dict(empty), "details": {"measured": False, "run": run_provenance(), **dict(details or {})}}


def write_outputs(out: Path, df: pd.DataFrame, summ: Mapping[str, Any]) -> None:
    df.to_csv(out / "results.csv", index=False)
    (out / "summary.json").write_text(json.dumps(summ, indent=2, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (np.bool_,)):
        return bool(o)
    return str(o)


def print_table(df: pd.DataFrame, columns: Mapping[str, str], title: str) -> None:
    """Rich table of selected columns; format specs like '.3f', 'ms' (seconds shown as ms)."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right")
    for _, row in df.iterrows():
        table.add_row(*(format_cell(row[col], fmt) for col, fmt in columns.items()))
    console.print(table)


def format_cell(v: Any, spec: str) -> str:
    """One table cell: 'ms' / 'us' show seconds in those units, '' is str(v), else a format spec;
    a missing value (None, NaN) is '-'."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if spec == "ms":
        return f"{v * 1e3:,.3f}"
    if spec == "us":
        return f"{v * 1e6:,.1f}"
    return str(v) if spec == "" else format(v, spec)


#: a profile drift beyond this factor (either way) gets a warning with the summary
DRIFT_WARN_RATIO = 1.5


def scoring_title(details: Mapping[str, Any]) -> str:
    """What the headline errors are, in words (``details.scoring``)."""
    return {"held-out": "held out: models refitted without this run's kernels, no lookup",
            "replay": "replay: this run's kernels timed beside the layers (not a prediction)",
            "lookup": "lookup: the profile as loaded, profiled kernels by their measurement"}.get(
        str(details.get("scoring")), "")


def print_summary(summ: Mapping[str, Any]) -> None:
    scoring = scoring_title(summ["details"])
    table = Table(title=f"{summ['experiment']} on {summ['device']}: {summ['n_points']} points, "
                        f"run-to-run noise {summ['noise_cv_pct'] or 0:.1f}% CV"
                        + (f"\nheadline errors {scoring}" if scoring else ""))
    for col in ("level", "median APE %", "p90 APE %", "max APE %", "Spearman"):
        table.add_column(col, justify="right")
    def fmt(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    for lv in summ["median_ape_pct"]:
        table.add_row(lv, *(fmt(summ[k][lv], ".1f") for k in ("median_ape_pct", "p90_ape_pct", "max_ape_pct")),
                      fmt(summ["spearman"][lv], ".3f"))
    console.print(table)
    floor = summ["details"].get("noise_floor_median_ape_pct")
    if floor is not None:
        console.print(f"noise floor: a perfect model would score a median APE of ~{floor:.1f}% against these measurements")
    max_floor = summ["details"].get("noise_floor_max_ape_pct") or {}
    if max_floor.get("median") is not None:
        console.print(f"noise floor of the maximum: a perfect model's max APE over these {summ['n_points']} points would be "
                      f"~{max_floor['median']:.1f}% (10-90% of runs: {max_floor['p10']:.1f}-{max_floor['p90']:.1f}%)")
    beyond = summ["details"].get("l3_beyond_noise") or {}
    if beyond.get("share_beyond_2_sigma") is not None:
        console.print(f"L3 errors beyond twice the measurement noise: {beyond['share_beyond_2_sigma']:.0%} of "
                      f"{beyond['points']} points (a perfect model: {beyond['perfect_model_share']:.1%})")
    fresh = summ["details"].get("freshness") or {}
    if fresh.get("refreshed"):
        console.print(f"profile refreshed before this run: {fresh['refreshed_kernels']} kernels of "
                      f"{', '.join(fresh['stale_families'])} re-measured (drift then: "
                      + ", ".join(f"{f} {fresh['family_ratio'].get(f, 1.0):.2f}x" for f in fresh["stale_families"]) + ")")
    elif fresh.get("family_ratio"):
        console.print(f"profile fresh before this run: every family within ±{100 * fresh['tolerance']:.0f}% "
                      f"({fresh['checked_kernels']} reference kernels)")
    signed = summ["details"].get("l3_over_measured") or {}
    if signed:
        console.print("L3 predicted / measured per backend, median (10th-90th percentile): "
                      + ratio_words(signed)
                      + "; below 1 the model under-predicts")
    held = summ["details"].get("heldout") or {}
    if held.get("scored"):
        console.print(f"held-out fit: {held['fitted_rows']} profiled kernels, {held['excluded_profile_rows']} left out "
                      f"(this run's {held['excluded_kernels']} distinct kernels), {held['fit_s']:.1f} s")
        drift = held.get("drift") or {}
        if drift.get("references"):
            rows = drift.get("vs_profiled_row") or {}
            console.print("held-out drift (measured now / the held-out model's time of "
                          f"{drift['references']} reference kernels, none of this run's; not applied to the headline): "
                          + ", ".join(f"{f} {r:.2f}x" for f, r in drift["by_family"].items())
                          + f", other families {drift['overall']:.2f}x"
                          + (" (against their profiled rows: " + ", ".join(f"{f} {r:.2f}x" for f, r in rows.items())
                             + ")" if rows else ""))
    elif "scoring" in summ["details"]:
        console.print("[yellow]not held out: these errors include kernels the profile measured (lookup or replay); "
                      "they check composition, not prediction[/]")
    for name, words in (("heldout_drift_scaled", "held out, scaled by that drift (a side score)"),
                        ("profile_lookup", "profile lookup (the profile as loaded, its kernels by measurement)"),
                        ("replay", "replay (this run's kernels timed beside the layers: composition check)")):
        side = summ["details"].get(name)
        if side:
            signed = side.get("l3_over_measured") or {}
            console.print(f"{words}: L3 median {side['median_ape_pct']['L3']:.1f}%, p90 {side['p90_ape_pct']['L3']:.1f}%, "
                          f"max {side['max_ape_pct']['L3']:.1f}%"
                          + ("; L3/measured " + ", ".join(f"{b} {v['median']:.2f}x" for b, v in signed.items())
                             if signed else ""))
    paired = summ["details"].get("paired") or {}
    if paired and paired.get("now_over_profile_median") is not None:
        console.print(f"paired calibration: the layers' {paired['kernels']} kernels ran at "
                      f"{paired['now_over_profile_median']:.2f}x their profiled time, timed in the same rounds as "
                      "the layers")
    drift = summ["details"].get("profile_drift") or {}
    if drift:
        console.print(f"profile drift: kernels now take {drift['now_over_profile_median']:.2f}x their profiled time "
                      f"(median of {drift['kernels']}, IQR {drift['now_over_profile_iqr']:.2f}, timed in the same rounds "
                      "as the layers); the machine changed by that much since calibration")
        scaled = summ["details"].get("drift_scaled_ape_pct")
        if scaled and "L3" in scaled["median"]:
            console.print(f"L3 with predictions scaled by that drift: median {scaled['median']['L3']:.1f}%, "
                          f"p90 {scaled['p90']['L3']:.1f}%, max {scaled['max']['L3']:.1f}% (headline errors unscaled)")
        ratio = round(drift["now_over_profile_median"], 2)  # judged as printed
        if not round(1 / DRIFT_WARN_RATIO, 2) <= ratio <= DRIFT_WARN_RATIO:
            console.print(f"[yellow]warning: profile drift {ratio:.2f}x is outside [{1 / DRIFT_WARN_RATIO:.2f}, "
                          f"{DRIFT_WARN_RATIO:.2f}]: the device is not in the state it was profiled in (other work "
                          "running? a slow phase?), so prediction errors here measure the machine, not the model; "
                          "rerun on a quiet machine or with calibration.refresh=always[/]")


def plot_latency_by_backend(df: pd.DataFrame, x: str, path: Path, *, xlabel: str, title: str,
                            l0_label: str = "L0 = FLOPs / peak") -> None:
    """Measured latency (median, IQR bars) and the L3 prediction against ``x``, one colour per
    backend, with the L0 line: the plot every sweep experiment draws."""
    fig, ax = plt.subplots(figsize=(8, 5))
    scoring = f" ({df.attrs['scoring']})" if df.attrs.get("scoring") else ""
    for i, (backend, g) in enumerate(df.groupby("backend")):
        color = f"C{i}"
        ax.errorbar(g[x], g["measured_s"] * 1e3, yerr=g["measured_iqr_s"] * 1e3 / 2, fmt="o-", color=color,
                    label=f"{backend}: measured (IQR)")
        ax.plot(g[x], g["pred_L3_s"] * 1e3, "x--", color=color, label=f"{backend}: L3 predicted{scoring}")
    g0 = df[df["backend"] == df["backend"].iloc[0]]
    ax.plot(g0[x], g0["pred_L0_s"] * 1e3, "k:", lw=2, label=l0_label)
    _finish_latency_plot(fig, ax, path, xlabel=xlabel, ylabel="layer latency [ms]", title=title)


def plot_predicted_by_backend(df: pd.DataFrame, x: str, path: Path, *, xlabel: str, title: str) -> None:
    """measure=false: the L3 prediction (and L2) against ``x``, one colour per backend, with
    the L0 line; nothing measured, so no error bars."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (backend, g) in enumerate(df.groupby("backend")):
        ax.plot(g[x], g["pred_L3_s"] * 1e3, "o-", color=f"C{i}", label=f"{backend}: L3 predicted")
        ax.plot(g[x], g["pred_L2_s"] * 1e3, ":", color=f"C{i}", alpha=0.6, label=f"{backend}: L2 roofline")
    g0 = df[df["backend"] == df["backend"].iloc[0]]
    ax.plot(g0[x], g0["pred_L0_s"] * 1e3, "k:", lw=2, label="L0 = FLOPs / peak")
    _finish_latency_plot(fig, ax, path, xlabel=xlabel, ylabel="predicted layer latency [ms]", title=title)


def skew_axis_label(df: pd.DataFrame, param: str) -> str:
    """The swept knob, with the in-degree CV it produced at both ends."""
    ends = df.sort_values("value")["degree_cv"]
    return f"graph {param} (the swept skew knob; in-degree CV {ends.iloc[0]:.2f} to {ends.iloc[-1]:.2f})"


def _plain_log_ticks(axis: Any) -> None:
    """1-2-5 ticks as plain numbers on a log axis (no 6x10^1; minor labels off: they collide)."""
    axis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _finish_latency_plot(fig: Any, ax: Any, path: Path, *, xlabel: str, ylabel: str, title: str) -> None:
    """The shared end of the latency-vs-knob plots: log latency with plain ticks, labels, save.
    The x scale follows the swept values: symlog for a knob from 0 over several units (Zipf
    exponent 0..8: a linear axis crowds the values near 0 into one tick label), log for one
    swept over decades, linear otherwise."""
    xs = sorted({float(v) for line in ax.get_lines() for v in line.get_xdata() if np.isfinite(v)})
    if xs and xs[0] == 0 and xs[-1] >= 4:
        ax.set_xscale("symlog", linthresh=1.0)
    elif xs and xs[0] > 0 and xs[-1] / xs[0] >= 20:  # a knob swept over decades (Dirichlet concentration)
        ax.set_xscale("log")
    if 1 < len(xs) <= 12 and all(x == float(f"{x:.3g}") for x in xs):  # a few round values: a tick at each
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(xs))
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.2)
    if len(ax.get_legend_handles_labels()[0]) > 8:  # many backends: beside the axes, off the data
        fig.set_size_inches(11, 5)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        ax.legend(fontsize=7)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_predicted_vs_measured(df: pd.DataFrame, path: Path, *, title: str, hue: str | None = None,
                               levels: Sequence[str] = ("L0", "L2", "L3")) -> None:
    fig, axes = plt.subplots(1, len(levels), figsize=(4.2 * len(levels), 4.2), squeeze=False)
    lo = min(df["measured_s"].min(), *(df[f"pred_{lv}_s"][df[f"pred_{lv}_s"] > 0].min() for lv in levels)) * 0.7
    hi = max(df["measured_s"].max(), *(df[f"pred_{lv}_s"].max() for lv in levels)) * 1.4
    for ax, lv in zip(axes[0], levels):
        groups = df.groupby(hue) if hue else [("all", df)]
        for name, g in groups:
            pred = g[f"pred_{lv}_s"].clip(lower=lo)
            ax.errorbar(g["measured_s"] * 1e3, pred * 1e3, xerr=g["measured_iqr_s"] * 1e3 / 2, fmt="o", ms=4,
                        label=str(name), alpha=0.8)
        ax.plot([lo * 1e3, hi * 1e3], [lo * 1e3, hi * 1e3], "k--", lw=1)
        ax.fill_between([lo * 1e3, hi * 1e3], [lo * 0.9e3, hi * 0.9e3], [lo * 1.1e3, hi * 1.1e3], color="grey", alpha=0.15,
                        label="±10%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # 1-2-5 ticks as plain numbers: readable on narrow ranges
            _plain_log_ticks(axis)
        ax.set_xlim(lo * 1e3, hi * 1e3)
        ax.set_ylim(lo * 1e3, hi * 1e3)
        med = df[f"ape_{lv}_pct"].median()
        ax.set_title(f"{lv}: median APE {med:.1f}%", fontsize=10)
        ax.set_xlabel("measured [ms]")
        ax.set_ylabel("predicted [ms]")
        ax.grid(True, which="both", alpha=0.2)
    axes[0][0].legend(fontsize=7)
    scoring = {"held-out": "held out: models refitted without these layers' kernels",
               "replay": "replay: the layers' own kernels timed beside them",
               "lookup": "lookup: profiled kernels by their measurement"}.get(str(df.attrs.get("scoring")))
    fig.suptitle(title + (f"\n({scoring})" if scoring else ""), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
