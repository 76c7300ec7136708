"""experiment=moe_design: which MoE expert backend is fastest where, predicted for a whole grid.

Predicts, without running anything, every configuration of a grid (tokens x d_model x
experts x top_k x routing generator and concentration x backend, ``design.*``): one routing
drawn per (tokens, experts, top_k, routing), one ``DispatchPlan`` and trace per layer, and
every distinct kernel of all traces predicted once as one kernel table
(``sim.predict.simulator.predict_traces``). With ``measure=false`` the cost model is the device's
fitted model as it is: the grid's shapes are not calibrated (L3 extrapolates;
``details.profile_coverage`` says how much of the grid lies inside what the profile
measured). With ``measure=true`` the ``design.anchor`` layer's kernels are calibrated where
the profile lacks them, and then ``design.calibrate_kernels`` of the grid's own distinct
kernels, spread over each family's predicted range, are measured and the models refit.

Pairs with ``top_k > num_experts`` are left out of the grid (a note says how many); a
``design.top_k`` value larger than every ``design.num_experts`` value is refused before any
work (it would add no design point). Every ``design.*`` and ``sample.*`` key is checked by
``validate`` (``check_design``), which a ``-m`` sweep runs on every job before the first.

The decision table, per region (``design.regions``, e.g. tokens x experts): the fastest
backend by L3 (the one fastest at most of the region's design points, with that share),
its median predicted margin over the next backend, and the share of points where L0
(FLOPs / peak) would have chosen differently (L0 sees the same useful FLOPs for every
backend, so it mostly cannot tell them apart: ties are broken in ``design.backends`` order).

With ``measure=true``, ``sample.points`` design points (half nearest the L3 decision
boundary, half stratified over regions; only points small enough to time, ``sample.*``) are
timed for real on every backend (``measure_interleaved``, backends interleaved per point),
and ``details.decisions`` scores the decisions: ``sampled``, ``separable`` (points whose two
fastest measured backends differ by more than the noise: both IQRs and ``sample.noise_pct``
of the faster, in every one of ``sample.passes`` passes over the sample, which all find the
same fastest backend), ``agree_pct`` (predicted-fastest = measured-fastest, over separable
points) and ``mean_loss_pct`` (latency lost by following the prediction where it disagrees);
``reproducible`` counts the points whose fastest backend every pass agrees on,
``single_pass`` scores each pass alone, as if it had been the only one, and ``committed`` /
``near_ties`` score separately the separable points where L3's predicted margin is at least
``sample.noise_pct`` (L3 calls a winner) and those where it is not (L3 calls a tie; half the
sample is drawn nearest the decision boundary, so many are).

Why passes: on the development VM a second pass over one 30-point sample 15 minutes later found
another fastest backend at 12 of the 30 points, 3 of them among the 8 that the first pass
alone called separable (gaps of 6-11%, each beyond that pass's IQRs): a decision that
flips within a quarter of an hour is not one the measurement can score.

Outputs: results.csv (one row per configuration), decisions_<rows>_x_<cols>.csv and .png
per region pair, sample.csv (measured points), summary.json (the common schema; errors
over the measured sample, null with ``measure=false``).
"""

from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402

from costmodel.cli.config_schema import Interval, Options, Rule, check  # noqa: E402
from costmodel.measure.bench import make_progress  # noqa: E402
from costmodel.model.predictor import LEVELS, CostModel  # noqa: E402
from costmodel.measure.runtime import Runtime  # noqa: E402
from experiments.common import (  # noqa: E402
    add_errors, calibration_options, check_common, check_measure_keys, config_dict, console, instantiate_sweep, measure_interleaved, output_dir, predict_only_summary, print_summary,
    print_table, summary, write_outputs,
)
from experiments.workloads import heldout_for, scored_tables  # noqa: E402
from sim.predict.heldout import trace_kernels  # noqa: E402
from sim.predict.calibration import calibrated_model, fitted_model, grid_sample_suite, moe_suite  # noqa: E402
from sim.workloads.moe_layer import EXPERT_KINDS, MOE_BACKENDS, DispatchPlan, MoEConfig, MoELayer, backend_unavailable_reason, moe_trace  # noqa: E402
from sim.workloads.routing import route  # noqa: E402
from sim.predict.simulator import TraceBatch, predict_traces  # noqa: E402

log = logging.getLogger(__name__)

#: columns a decision region may be drawn over
REGION_COLUMNS = ("tokens", "d_model", "num_experts", "top_k", "routing", "generator")
#: L0 predictions within this relative distance of the best count as a tie (L0 cannot choose)
L0_TIE_REL = 1e-3
#: this experiment can predict without measuring (``measure=false``)
MEASURES = "optional"
GRID_AXES = ("tokens", "d_model", "num_experts", "top_k")
#: grid kernels predicted slower than this are not calibrated on (each is timed ~9 times)
GRID_KERNEL_MAX_S = 0.05
#: sample.passes at most (each pass times every backend of every sampled point)
MAX_PASSES = 5


# ----------------------------------------------------------------------------- validation


def _items(value: Any) -> list:
    """A config list as a list (a single value is one item, a string is not its letters)."""
    if isinstance(value, (str, bytes, int, float)) or value is None:
        return [value]
    try:
        return list(value)
    except TypeError:
        return [value]


def _positive_ints(design: Mapping[str, Any], key: str) -> list[int]:
    values = _items(design[key])
    if not values or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in values):
        raise ValueError(f"design.{key} must be a non-empty list of positive integers (>= 1), got {values!r}")
    return values


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer (>= 1), got {value!r}")
    return value


_CAPACITY = Interval(float, 0, None, closed="neither")
#: moe_design's scalar fields (beside the shared ones, ``experiments.common.COMMON_CONSTRAINTS``);
#: the grid axes, top_k against num_experts, backends, routings, regions and the anchor are
#: derived by ``check_design``
CONSTRAINTS: dict[str, Any] = {
    "design.ffn_mult": Interval(int, 1, None),
    "design.expert": Options(list(EXPERT_KINDS)),
    "design.capacity_factor": Rule(lambda v, cfg: v is None or _CAPACITY.accepts(v, cfg),
                                   "a finite number > 0 (such as 1.25) or null for no capacity limit"),
    "design.calibrate_kernels": Interval(int, 0, None, words="an integer >= 0 (0 = none)"),
    "sample.points": Interval(int, 1, None),
    "sample.max_weight_bytes": Interval(float, 0, None, closed="neither", words="> 0"),
    "sample.max_predicted_s": Interval(float, 0, None, closed="neither", words="> 0"),
    "sample.noise_pct": Interval(float, 0, 100, closed="left", words="in [0, 100)"),
    "sample.passes": Interval(int, 1, MAX_PASSES),
}


def check_top_k(top_k: Sequence[int], num_experts: Sequence[int]) -> int:
    """Every ``design.top_k`` value must fit at least one ``design.num_experts`` value (a k
    larger than every E is refused: it adds no design point, most likely a typo); pairs with
    k > E where k fits another E are left out of the grid. Returns how many pairs are left out."""
    too_big = [k for k in top_k if k > max(num_experts)]
    if too_big:
        raise ValueError(f"design.top_k={too_big if len(too_big) > 1 else too_big[0]} exceeds every design.num_experts "
                         f"({list(num_experts)}); top_k must be in [1, max(design.num_experts)={max(num_experts)}]")
    return sum(1 for k in top_k for e in num_experts if k > e)


def check_regions(value: Any) -> list[list[str]]:
    """``design.regions``: distinct pairs of two different columns among ``REGION_COLUMNS``."""
    regions = []
    for r in _items(value):
        r = [r] if isinstance(r, str) else list(r) if isinstance(r, Sequence) else [r]
        if len(r) != 2 or any(c not in REGION_COLUMNS for c in r):
            raise ValueError(f"design.regions entries must be pairs of {list(REGION_COLUMNS)}, got {r!r}")
        if r[0] == r[1]:
            raise ValueError(f"design.regions entry {r!r} names {r[0]!r} twice; a region is a pair of two different "
                             f"columns among {list(REGION_COLUMNS)}")
        if r in regions:
            raise ValueError(f"design.regions lists {r!r} twice; each pair of columns may appear once")
        regions.append(r)
    if not regions:
        raise ValueError("design.regions must list at least one pair of columns")
    return regions


def check_anchor(value: Any) -> dict[str, int]:
    """``design.anchor``: the layer calibrated with measure=true, {tokens, d_model, num_experts, top_k}."""
    keys = ("tokens", "d_model", "num_experts", "top_k")
    if not isinstance(value, Mapping) or set(value) != set(keys):
        raise ValueError(f"design.anchor must be a mapping with exactly the keys {list(keys)}, got {value!r}")
    anchor = {k: _positive_int(value[k], f"design.anchor.{k}") for k in keys}
    if anchor["top_k"] > anchor["num_experts"]:
        raise ValueError(f"design.anchor.top_k must be in [1, design.anchor.num_experts={anchor['num_experts']}], "
                         f"got {anchor['top_k']}")
    return anchor


def check_design(cfg: Mapping[str, Any], *, checked: bool = False) -> dict[str, Any]:
    """The design spec: ``CONSTRAINTS`` checked (unless ``checked``: ``validate`` checks them with
    the shared ones in one pass) and what is derived from them validated (clear errors naming
    the ``design.*`` or ``sample.*`` key) before any work."""
    if not checked:
        check(cfg, CONSTRAINTS)
    d = cfg["design"]
    axes = {k: _positive_ints(d, k) for k in GRID_AXES}
    skipped_pairs = check_top_k(axes["top_k"], axes["num_experts"])
    mult, expert = d["ffn_mult"], d["expert"]
    backends = _items(d["backends"])
    bad = [b for b in backends if b not in MOE_BACKENDS]
    if not backends or bad or len(set(backends)) != len(backends):
        raise ValueError(f"design.backends must list distinct backends among {list(MOE_BACKENDS)}, got {backends!r}")
    capacity = None if d.get("capacity_factor") is None else float(d["capacity_factor"])
    if not d["routings"]:
        raise ValueError("design.routings must list at least one routing generator")
    routings = []  # (label, generator name, param, value, generator)
    for i, section in enumerate(d["routings"]):
        name = str(section["generator"].get("_target_", "?")).rsplit(".", 1)[-1].replace("Routing", "").lower()
        param = section["sweep"]["param"]
        for value, gen in instantiate_sweep(section, f"design.routings[{i}]"):
            label = name if param is None else f"{name} {param}={value:g}"
            routings.append((label, name, param, value, gen))
    regions = check_regions(d["regions"])
    anchor = check_anchor(d["anchor"])
    calibrate = d.get("calibrate_kernels", 0)
    return {**axes, "calibrate_kernels": calibrate, "ffn_mult": mult, "backends": backends, "capacity_factor": capacity,
            "routings": routings, "regions": regions, "expert": str(expert), "anchor": anchor,
            "skipped_pairs": skipped_pairs}


# ----------------------------------------------------------------------------- grid


def build_grid(spec: Mapping[str, Any], dtype: str, seed: int) -> tuple[pd.DataFrame, list, dict]:
    """One row per configuration (design point x backend) with its routing metrics, the
    traces in row order, and the routing of every (tokens, experts, top_k, routing) key."""
    rows: list[dict[str, Any]] = []
    traces: list = []
    routings: dict[tuple, Any] = {}
    point = 0
    shape_axes = itertools.product(spec["tokens"], spec["num_experts"], spec["top_k"], enumerate(spec["routings"]))
    for t, e, k, (ri, (label, name, param, value, gen)) in shape_axes:
        if k > e:
            continue
        key = (t, e, k, ri)
        routing = route(gen, tokens=t, num_experts=e, top_k=k, seed=seed + len(routings),
                        capacity_factor=spec["capacity_factor"])
        routings[key] = routing
        plan = DispatchPlan.from_routing(routing)
        metrics = routing.metrics()
        for d in spec["d_model"]:
            for b in spec["backends"]:
                c = MoEConfig(tokens=t, d_model=d, d_ff=spec["ffn_mult"] * d, num_experts=e, top_k=k,
                              expert=spec["expert"], backend=b, dtype=dtype)
                traces.append(moe_trace(c, plan))
                rows.append({"point": point, "tokens": t, "d_model": d, "d_ff": c.d_ff, "num_experts": e, "top_k": k,
                             "routing": label, "generator": name, "param": param, "value": value, "routing_key": ri,
                             **metrics, "backend": b, "model_flops": c.useful_flops(plan.assignments)})
            point += 1
    return pd.DataFrame(rows), traces, routings


def point_decisions(df: pd.DataFrame, backends: Sequence[str]) -> pd.DataFrame:
    """Per design point: L3's fastest backend, the next one and its margin, and L0's choice
    (ties within ``L0_TIE_REL`` broken in ``backends`` order, flagged ``l0_tie``)."""
    wide = {lv: df.pivot(index="point", columns="backend", values=f"pred_{lv}_s")[list(backends)] for lv in ("L0", "L3")}
    l3 = wide["L3"].to_numpy()
    rank = np.argsort(l3, axis=1, kind="stable")
    best, second = l3[np.arange(len(l3)), rank[:, 0]], (l3[np.arange(len(l3)), rank[:, 1]] if l3.shape[1] > 1 else np.nan)
    l0 = wide["L0"].to_numpy()
    l0_best = l0.min(axis=1, keepdims=True)
    tied = np.abs(l0 / l0_best - 1) <= L0_TIE_REL
    l0_choice = tied.argmax(axis=1)  # first backend (in configured order) within the tie of the minimum
    names = np.array(backends)
    out = pd.DataFrame({
        "point": wide["L3"].index, "fastest_L3": names[rank[:, 0]],
        "next_L3": names[rank[:, 1]] if l3.shape[1] > 1 else None,
        "margin_L3_pct": 100 * (second / best - 1), "fastest_L0": names[l0_choice], "l0_tie": tied.sum(axis=1) > 1,
    })
    out["l0_differs"] = out["fastest_L0"] != out["fastest_L3"]
    return out


def region_table(points: pd.DataFrame, rows: str, cols: str) -> pd.DataFrame:
    """Per region (rows x cols): fastest backend by L3 (most often fastest), the share of
    points where it is, the median margin over the next backend there, and how often L0
    would have chosen differently (and how often L0 could not tell the backends apart)."""
    def one(g: pd.DataFrame) -> pd.Series:
        counts = g["fastest_L3"].value_counts()
        winner = counts.index[0]
        won = g[g["fastest_L3"] == winner]
        return pd.Series({
            "points": len(g), "fastest_L3": winner, "fastest_share_pct": 100 * counts.iloc[0] / len(g),
            "median_margin_pct": float(won["margin_L3_pct"].median()),
            "l0_differs_pct": 100 * float(g["l0_differs"].mean()), "l0_tie_pct": 100 * float(g["l0_tie"].mean()),
        })

    return points.groupby([rows, cols], sort=False).apply(one, include_groups=False).reset_index()


def coverage_summary(model: CostModel, table: pd.DataFrame, profile_rows: int, calibrated: int = 0) -> dict[str, Any]:
    """Whether the fitted profile covers the grid's kernels (L3's fitted feature ranges);
    ``calibrated``: how many of the grid's own kernels were measured before predicting."""
    per_family = model.levels["L3"].coverage(table)
    rows = sum(f["rows"] for f in per_family.values())
    inside = sum(f["rows"] * f["in_range_pct"] / 100 for f in per_family.values())
    return {
        "covered": all(f["in_range_pct"] >= 100 for f in per_family.values()),
        "distinct_kernels": rows, "in_range_pct": round(100 * inside / rows, 2) if rows else None,
        "profile_kernels": profile_rows,
        "note": (f"{calibrated} of the grid's kernels were measured first (design.calibrate_kernels); " if calibrated
                 else "the grid's shapes were not calibrated: ")
                + "outside the fitted ranges L3 extrapolates (log-efficiency clipped to the range it was fitted on)",
        "per_family": per_family,
    }


# ----------------------------------------------------------------------------- sample


def choose_sample(points: pd.DataFrame, n: int, seed: int) -> list[int]:
    """Up to ``n`` eligible design points: half nearest the L3 decision boundary (the
    smallest margin per region first, so they spread over regions), half drawn at random,
    round-robin over regions (stratified). ``points`` has point, region, margin_L3_pct,
    eligible."""
    cand = points[points["eligible"]]
    if n >= len(cand):
        return sorted(cand["point"].tolist())
    rng = np.random.default_rng(seed)
    by_margin = cand.sort_values(["margin_L3_pct", "point"])
    chosen = by_margin.drop_duplicates("region")["point"].tolist()[: n // 2]
    chosen += [p for p in by_margin["point"] if p not in chosen][: n // 2 - len(chosen)]
    rest = cand[~cand["point"].isin(chosen)]
    pools = {r: list(rng.permutation(g["point"].to_numpy())) for r, g in rest.groupby("region", sort=True)}
    regions = list(rng.permutation(sorted(pools)))
    while len(chosen) < n and any(pools.values()):
        for r in regions:
            if pools[r] and len(chosen) < n:
                chosen.append(int(pools[r].pop()))
    return sorted(int(p) for p in chosen)


def combine_passes(passes: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """One table from ``measure_sample``'s passes (same rows, same order): ``measured_s``
    the median of the passes' values, ``measured_iqr_s`` and ``round_cv`` the largest,
    ``rounds_timed`` summed, ``noisy`` if any pass was; each pass's ``measured_s`` and
    ``measured_iqr_s`` kept as ``measured_s_pass<i>`` / ``measured_iqr_s_pass<i>``, and
    ``pass_cv`` the CV of the passes' values (0 for one pass)."""
    values = np.column_stack([t["measured_s"].to_numpy() for t in passes])
    out = pd.DataFrame({
        "measured_s": np.median(values, axis=1),
        "measured_iqr_s": np.max([t["measured_iqr_s"].to_numpy() for t in passes], axis=0),
        "round_cv": np.max([t["round_cv"].to_numpy() for t in passes], axis=0),
        "rounds_timed": np.sum([t["rounds_timed"].to_numpy() for t in passes], axis=0),
        "noisy": np.any([t["noisy"].to_numpy(dtype=bool) for t in passes], axis=0),
        "pass_cv": values.std(axis=1, ddof=1) / values.mean(axis=1) if len(passes) > 1 else 0.0,
    }, index=passes[0].index)
    for i, t in enumerate(passes):
        out[f"measured_s_pass{i}"] = t["measured_s"].to_numpy()
        out[f"measured_iqr_s_pass{i}"] = t["measured_iqr_s"].to_numpy()
    return out


def _pass_columns(sample: pd.DataFrame) -> list[tuple[str, str]]:
    """(time, IQR) column pairs, one per pass over the sample (one pair without passes)."""
    n = sum(1 for c in sample.columns if c.startswith("measured_s_pass"))
    if not n:
        return [("measured_s", "measured_iqr_s")]
    return [(f"measured_s_pass{i}", f"measured_iqr_s_pass{i}") for i in range(n)]


def _fastest_and_gap(g: pd.DataFrame, time_col: str, iqr_col: str, noise_pct: float) -> tuple[str, str | None, float | None, bool]:
    """(fastest backend, next, gap % of the fastest, separable) of one point in one pass:
    separable when the gap exceeds both backends' IQRs and ``noise_pct`` % of the faster."""
    meas = g[time_col].sort_values(kind="stable")
    if len(meas) < 2:
        return meas.index[0], None, None, False
    t1, t2 = meas.iloc[0], meas.iloc[1]
    iqr = g[iqr_col]
    separable = bool(t2 - t1 > max(iqr[meas.index[0]], iqr[meas.index[1]], noise_pct / 100 * t1))
    return meas.index[0], meas.index[1], 100 * (t2 - t1) / t1, separable


def decision_scores(sample: pd.DataFrame, backends: Sequence[str], noise_pct: float) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Score the predicted choices on measured points: ``sample`` has one row per (point,
    backend) with measured_s, measured_iqr_s, pred_L0_s, pred_L3_s, and, when the sample
    was timed in several passes (``combine_passes``), each pass's time and IQR.

    In one pass a point is separable when the gap between its two fastest measured backends
    exceeds both their IQRs and ``noise_pct`` % of the faster; over several passes, when it
    is separable in every pass and every pass finds the same fastest backend
    (``reproducible``). ``agree_pct`` is the share of separable points where L3's fastest is
    the measured fastest; ``mean_loss_pct`` the mean latency lost (measured, % over the
    fastest) at the separable points where it is not (0 when it always agrees). The same
    for L0 (ties broken in ``backends`` order). ``single_pass`` scores each pass alone;
    ``committed`` and ``near_ties`` split the separable points by L3's own predicted margin
    (``margin_L3_pct`` at least ``noise_pct``, or below it: L3 calls it a tie)."""
    passes = _pass_columns(sample)
    per_point = []
    for p, g in sample.groupby("point", sort=True):
        g = g.set_index("backend").loc[[b for b in backends if b in set(g["backend"])]]
        each = [_fastest_and_gap(g, t, q, noise_pct) for t, q in passes]
        fastest, nxt, gap, _ = _fastest_and_gap(g, "measured_s", "measured_iqr_s", noise_pct)
        reproducible = len({e[0] for e in each}) == 1
        separable = reproducible and all(e[3] for e in each)
        t1 = g.loc[fastest, "measured_s"]
        l0 = g["pred_L0_s"]
        pred = {"L3": g["pred_L3_s"].idxmin(), "L0": l0.index[int(np.argmax(np.abs(l0 / l0.min() - 1) <= L0_TIE_REL))]}
        margin = float(g["margin_L3_pct"].iloc[0]) if "margin_L3_pct" in g else float("nan")
        per_point.append({
            "point": p, "measured_fastest": fastest, "measured_next": nxt, "measured_gap_pct": gap,
            "separable": separable, "reproducible": reproducible, "committed": bool(margin >= noise_pct),
            "fastest_per_pass": "|".join(e[0] for e in each),
            "gap_pct_per_pass": "|".join("" if e[2] is None else f"{e[2]:.1f}" for e in each),
            **{f"separable_pass{i}": e[3] for i, e in enumerate(each)},
            **{f"agree_pass{i}": pred["L3"] == e[0] for i, e in enumerate(each)},
            **{f"predicted_fastest_{lv}": b for lv, b in pred.items()},
            **{f"agree_{lv}": pred[lv] == fastest for lv in pred},
            **{f"loss_{lv}_pct": 100 * (g.loc[pred[lv], "measured_s"] / t1 - 1) for lv in pred},
        })
    pp = pd.DataFrame(per_point)
    sep = pp[pp["separable"]] if len(pp) else pp
    scores: dict[str, Any] = {"sampled": int(len(pp)), "separable": int(len(sep)), "noise_pct": noise_pct,
                              "passes": len(passes), "reproducible": int(pp["reproducible"].sum()) if len(pp) else 0}
    if len(passes) > 1:
        scores["single_pass"] = [
            {"separable": int(pp[f"separable_pass{i}"].sum()),
             "agree_pct": round(100 * float(pp.loc[pp[f"separable_pass{i}"], f"agree_pass{i}"].mean()), 2)
             if pp[f"separable_pass{i}"].any() else None}
            for i in range(len(passes))]
    for lv, suffix in (("L3", ""), ("L0", "_L0")):
        scores[f"agree_pct{suffix}"], scores[f"mean_loss_pct{suffix}"] = _agreement(sep, lv)
    scores["disagreements"] = int((~sep["agree_L3"]).sum()) if len(sep) else 0
    # the same over the separable points where L3 itself calls a winner (its predicted margin
    # over the next backend at least noise_pct), and over the near-ties where it does not
    for name, part in (("committed", sep[sep["committed"]] if len(sep) else sep),
                       ("near_ties", sep[~sep["committed"]] if len(sep) else sep)):
        agree, loss = _agreement(part, "L3")
        scores[name] = {"separable": int(len(part)), "agree_pct": agree, "mean_loss_pct": loss}
    return pp, scores


def _agreement(separable: pd.DataFrame, level: str) -> tuple[float | None, float | None]:
    """(agree %, mean loss % where it disagrees; 0 when it never does) of ``level``'s choices
    over separable points, rounded to 0.01; (None, None) without any point."""
    if not len(separable):
        return None, None
    agree = separable[f"agree_{level}"]
    wrong = separable.loc[~agree, f"loss_{level}_pct"]
    return round(100 * float(agree.mean()), 2), round(float(wrong.mean()), 2) if len(wrong) else 0.0


def measure_sample(sample_rows: pd.DataFrame, routings: Mapping[tuple, Any], rt: Runtime, progress: bool,
                   label: str = "") -> pd.DataFrame:
    """Time every backend of every sampled point (interleaved per point), one layer set at a time."""
    out = []
    bar = make_progress(progress)
    points = list(sample_rows.groupby("point", sort=True))
    with bar:
        task = bar.add_task(f"measure sampled design points{label}", total=len(points), current="")
        for p, g in points:
            first = g.iloc[0]
            routing = routings[(int(first["tokens"]), int(first["num_experts"]), int(first["top_k"]), int(first["routing_key"]))]
            cfgs = [MoEConfig(tokens=int(r["tokens"]), d_model=int(r["d_model"]), d_ff=int(r["d_ff"]),
                              num_experts=int(r["num_experts"]), top_k=int(r["top_k"]), expert=str(r["expert"]),
                              backend=str(r["backend"]), dtype=rt.dtype) for _, r in g.iterrows()]
            x = torch.randn(cfgs[0].tokens, cfgs[0].d_model, generator=torch.Generator().manual_seed(rt.seed)).to(
                rt.device, getattr(torch, rt.dtype))
            layers = [MoELayer(c, device=rt.device, seed=rt.seed) for c in cfgs]
            bar.update(task, current=f"T={cfgs[0].tokens} D={cfgs[0].d_model} E={cfgs[0].num_experts} "
                                      f"k={cfgs[0].top_k} {first['routing']}")
            timed = measure_interleaved([lambda layer=layer, x=x, r=routing: layer(x, r) for layer in layers], device=rt.device,
                                        timing=rt.timing, description=f"point {p}", progress=False)
            for (idx, _), t in zip(g.iterrows(), timed):
                out.append({"row": idx, **{k: v for k, v in t.items() if k != "rounds"}})
            del layers, x
            bar.advance(task)
    return pd.DataFrame(out).set_index("row")


# ----------------------------------------------------------------------------- run


def validate(cfg: Any) -> dict[str, Any]:
    """Every key checked, nothing built or measured (also run on every job of a -m sweep)."""
    cfg = config_dict(cfg)
    check_common(cfg, CONSTRAINTS)
    return check_design(cfg, checked=True)


def run(cfg: Any, out_dir: str | Path | None = None, *, plan: Any = None) -> dict[str, Any]:
    """``plan``: what ``validate(cfg)`` returned (the entry point's one check), else validated here."""
    cfg = config_dict(cfg)
    spec = validate(cfg) if plan is None else plan
    measuring = check_measure_keys(cfg)
    progress = bool(cfg.get("progress", True))
    rt = Runtime.from_cfg(cfg, checked=True)
    probe = [MoEConfig(tokens=1, d_model=d, d_ff=spec["ffn_mult"] * d, num_experts=1, top_k=1, expert=spec["expert"],
                       backend=b, dtype=rt.dtype) for b in spec["backends"] for d in spec["d_model"]]
    unavailable = {c.backend: r for c in probe if (r := backend_unavailable_reason(c, rt.device))}
    if measuring and unavailable:  # predictions are fine; the sample cannot time them
        raise ValueError(f"design.backends holds backends that cannot run here {unavailable}; drop them or set measure=false")
    anchor_cfgs = [MoEConfig(**spec["anchor"], d_ff=spec["ffn_mult"] * spec["anchor"]["d_model"],
                             expert=spec["expert"], backend=b, dtype=rt.dtype) for b in spec["backends"]]
    out = output_dir(cfg, out_dir)
    if spec["skipped_pairs"]:
        console.print(f"note: {spec['skipped_pairs']} (design.top_k, design.num_experts) pairs with top_k > num_experts "
                      "are left out of the grid (a token cannot pick more distinct experts than there are)")

    if measuring:
        model = calibrated_model(rt, moe_suite(anchor_cfgs), suite_name="moe", progress=progress,
                                 **calibration_options(cfg))
    else:
        model = fitted_model(rt, profile_id=cfg["profile"].get("id"))
    start = time.perf_counter()
    df, traces, routings = build_grid(spec, rt.dtype, rt.seed)
    built_s = time.perf_counter() - start
    batch = TraceBatch.from_traces(traces)
    del traces
    calibrated, calibrate_s = 0, time.perf_counter()
    if measuring and spec["calibrate_kernels"]:
        model, calibrated = _calibrate_on_grid(rt, model, batch, spec, cfg, anchor_cfgs, progress)
    calibrate_s = time.perf_counter() - calibrate_s
    pred = predict_traces(model, batch)
    df = pd.concat([df, pred], axis=1)
    df["expert"] = spec["expert"]
    predicted_s = time.perf_counter() - start - calibrate_s
    msg = (f"predicted {len(df):,} configurations ({df['point'].nunique():,} design points x {len(spec['backends'])} backends; "
           f"{len(batch.table):,} distinct of {len(batch.flat):,} kernels) in {predicted_s:.1f} s "
           f"(traces {built_s:.1f} s)")
    log.info(msg) if _hydra_logging() else console.print(msg)

    points = point_decisions(df, spec["backends"])
    keys = df.drop_duplicates("point").set_index("point")[["tokens", "d_model", "num_experts", "top_k", "routing", "generator"]]
    points = points.join(keys, on="point")
    df = df.merge(points[["point", "fastest_L3", "margin_L3_pct", "fastest_L0", "l0_differs"]], on="point", how="left")
    tables = {}
    for rows, cols in spec["regions"]:
        table = region_table(points, rows, cols)
        tables[f"{rows}_x_{cols}"] = table
        table.to_csv(out / f"decisions_{rows}_x_{cols}.csv", index=False)
        plot_decisions(table, rows, cols, spec["backends"], out / f"decisions_{rows}_x_{cols}.png")
    coverage = coverage_summary(model, batch.table, int(model.meta.get("n_rows", 0)), calibrated)
    first_rows, first_cols = spec["regions"][0]
    details: dict[str, Any] = {
        "grid_configs": int(len(df)), "design_points": int(df["point"].nunique()),
        "distinct_kernels": int(len(batch.table)), "kernels": int(len(batch.flat)),
        "predict_wall_s": round(predicted_s, 2), "calibrated_grid_kernels": calibrated,
        "calibrate_wall_s": round(calibrate_s, 1),
        "grid": {k: spec[k] for k in (*GRID_AXES, "ffn_mult", "backends", "expert", "capacity_factor")}
        | {"routings": [r[0] for r in spec["routings"]]},
        "fastest_share_L3_pct": {b: round(100 * float((points["fastest_L3"] == b).mean()), 2) for b in spec["backends"]},
        "l0_differs_pct": round(100 * float(points["l0_differs"].mean()), 2),
        "l0_tie_pct": round(100 * float(points["l0_tie"].mean()), 2),
        f"regions_{first_rows}_x_{first_cols}": tables[f"{first_rows}_x_{first_cols}"].to_dict("records"),
        "profile_coverage": coverage, "model_profile": str(model.fingerprint.id),
        "unavailable_backends_here": unavailable,
    }
    print_decisions(tables[f"{first_rows}_x_{first_cols}"], first_rows, first_cols)
    console.print(f"profile coverage: {coverage['in_range_pct']}% of the grid's {coverage['distinct_kernels']:,} distinct "
                  f"kernels lie inside the fitted ranges ({'covered' if coverage['covered'] else 'L3 extrapolates the rest'})")

    if not measuring:
        summ = predict_only_summary("moe_design", model.fingerprint.describe(), df, details=details)
        write_outputs(out, df, summ)
        console.print(f"outputs in {out}")
        return summ

    # --- the measured sample
    weight_bytes = df["num_experts"] * (3 if spec["expert"] == "swiglu" else 2) * df["d_model"] * df["d_ff"] * _elem_bytes(rt.dtype)
    slowest = df.groupby("point")["pred_L3_s"].max()
    region_of = points.set_index("point")[first_rows].astype(str) + " x " + points.set_index("point")[first_cols].astype(str)
    eligible = (weight_bytes.groupby(df["point"]).max() <= cfg["sample"]["max_weight_bytes"]) & (
        slowest <= cfg["sample"]["max_predicted_s"])
    candidates = points.assign(region=points["point"].map(region_of), eligible=points["point"].map(eligible))
    chosen = choose_sample(candidates, int(cfg["sample"]["points"]), rt.seed)
    if not chosen:
        raise ValueError("no design point is small enough to time (sample.max_weight_bytes, sample.max_predicted_s); "
                         "raise them or set measure=false")
    sample_rows = df[df["point"].isin(chosen)]
    # held out, as every measuring experiment: refitted once without any kernel of the sample
    sample_traces = [batch.trace(int(i)) for i in sample_rows.index]
    # neighbours of the sample's kernels where the profile holds too few others (nothing else)
    calibrated_model(rt, [], suite_name="moe_design", progress=progress, refresh="never",
                     heldout=trace_kernels(sample_traces))
    heldout = heldout_for(rt, model, sample_traces, what="moe_design's measured sample")
    n_passes = int(cfg["sample"].get("passes", 1))
    timed = combine_passes([measure_sample(sample_rows, routings, rt, progress,
                                           f" (pass {i + 1}/{n_passes})" if n_passes > 1 else "")
                            for i in range(n_passes)])
    lookup = add_errors(pd.concat([sample_rows, timed], axis=1))
    held_rows = sample_rows.copy()
    held_pred = predict_traces(heldout.model, sample_traces)
    for lv in LEVELS:
        held_rows[f"pred_{lv}_s"] = held_pred[f"pred_{lv}_s"].to_numpy()
    sample = scored_tables(lookup, None, add_errors(pd.concat([held_rows, timed], axis=1)), heldout)
    sample.attrs["rounds"] = rt.timing.rounds
    per_point, scores = decision_scores(sample, spec["backends"], float(cfg["sample"]["noise_pct"]))
    per_point = per_point.join(keys, on="point").merge(points[["point", "margin_L3_pct"]], on="point")
    sample.to_csv(out / "sample.csv", index=False)
    per_point.to_csv(out / "sample_decisions.csv", index=False)
    details["decisions"] = scores
    details["sample"] = {"eligible_points": int(eligible.sum()), **{k: cfg["sample"][k] for k in
                                                                    ("max_weight_bytes", "max_predicted_s")}}
    summ = summary("moe_design", rt.fingerprint.describe(), sample, details=details)
    write_outputs(out, df, summ)
    print_table(per_point, {"point": "", "tokens": "", "d_model": "", "num_experts": "", "top_k": "", "routing": "",
                            "margin_L3_pct": ".1f", "fastest_per_pass": "", "gap_pct_per_pass": "",
                            "predicted_fastest_L3": "", "separable": "", "loss_L3_pct": ".1f"},
                title="measured sample: predicted (L3) vs measured fastest backend")
    def agrees(part: Mapping[str, Any]) -> str:
        return f"{part['separable']} separable" + (f", L3 agrees at {part['agree_pct']}%" if part["separable"] else "")

    if scores["passes"] > 1:
        console.print(f"{scores['passes']} passes over the sample: {scores['reproducible']} of {scores['sampled']} points "
                      "found the same fastest backend in every pass; each pass alone: "
                      + "; ".join(agrees(x) for x in scores["single_pass"]))
    console.print(f"where L3's predicted margin is at least {scores['noise_pct']:g}%: {agrees(scores['committed'])}; "
                  f"where it calls a near-tie: {agrees(scores['near_ties'])}")
    console.print(f"decisions: {scores['sampled']} points sampled, {scores['separable']} separable; L3's choice agrees at "
                  f"{scores['agree_pct']}% of them (L0: {scores['agree_pct_L0']}%), mean loss where not "
                  f"{scores['mean_loss_pct']}%")
    print_summary(summ)
    console.print(f"outputs in {out}")
    return summ


def _calibrate_on_grid(rt: Runtime, model: CostModel, batch: TraceBatch, spec: Mapping[str, Any],
                       cfg: Mapping[str, Any], anchor_cfgs: Sequence[MoEConfig],
                       progress: bool) -> tuple[CostModel, int]:
    """measure=true: time ``design.calibrate_kernels`` of the grid's own distinct kernels,
    spread over each family's predicted range (``sim.predict.calibration.grid_sample_suite``), add
    them to the profile and refit, so the sweep interpolates between measured kernels."""
    specs = batch.specs
    predicted = model.predict_table(batch.table, ["L3"])["L3"].to_numpy()
    suite = grid_sample_suite(specs, predicted, count=int(spec["calibrate_kernels"]),
                              max_bytes=float(cfg["sample"]["max_weight_bytes"]), max_s=GRID_KERNEL_MAX_S)
    console.print(f"calibrating on the grid: {len(suite)} of its {len(specs):,} distinct kernels (design.calibrate_kernels)")
    model = calibrated_model(rt, moe_suite(anchor_cfgs) + suite, suite_name="moe_design", progress=progress,
                             refresh="never")  # checked a moment ago, with the anchor's kernels
    return model, len(suite)


def _hydra_logging() -> bool:
    """True inside a Hydra job, whose logging already shows on the console and goes to the run log."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.initialized()


def _elem_bytes(dtype: str) -> int:
    from costmodel.families.descriptor import DTYPE_BYTES

    return DTYPE_BYTES[dtype]


def print_decisions(table: pd.DataFrame, rows: str, cols: str) -> None:
    print_table(table, {rows: "", cols: "", "points": "", "fastest_L3": "", "fastest_share_pct": ".0f",
                        "median_margin_pct": ".1f", "l0_differs_pct": ".0f", "l0_tie_pct": ".0f"},
                title=f"decision table by {rows} x {cols}: fastest backend by L3 (share of points), its median margin "
                      "over the next (%), and where L0 would choose differently (% of points)")


def plot_decisions(table: pd.DataFrame, rows: str, cols: str, backends: Sequence[str], path: Path) -> None:
    """Two heatmaps over the region grid: L3's fastest backend (colour) with its median
    margin; and the share of points where L0 would have chosen differently."""
    row_vals = list(dict.fromkeys(table[rows]))
    col_vals = list(dict.fromkeys(table[cols]))
    code = {b: i for i, b in enumerate(backends)}
    winner = np.full((len(row_vals), len(col_vals)), np.nan)
    differs = np.full_like(winner, np.nan)
    labels = {}
    for _, r in table.iterrows():
        i, j = row_vals.index(r[rows]), col_vals.index(r[cols])
        winner[i, j] = code[r["fastest_L3"]]
        differs[i, j] = r["l0_differs_pct"]
        labels[i, j] = f"{r['fastest_L3']}\n+{r['median_margin_pct']:.0f}%"
    fig, axes = plt.subplots(1, 2, figsize=(min(16.0, max(9.0, 1.1 * len(col_vals) * 2 + 3)), 0.5 * len(row_vals) + 3.0))
    cmap = ListedColormap([f"C{i}" for i in range(len(backends))])
    axes[0].imshow(winner, cmap=cmap, vmin=-0.5, vmax=len(backends) - 0.5, aspect="auto")
    for (i, j), text in labels.items():
        axes[0].text(j, i, text, ha="center", va="center", fontsize=6)
    axes[0].set_title("fastest backend by L3 (median margin over the next)", fontsize=9)
    im = axes[1].imshow(differs, cmap="Reds", vmin=0, vmax=100, aspect="auto")
    for (i, j), v in np.ndenumerate(differs):
        if not np.isnan(v):
            axes[1].text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=6)
    axes[1].set_title("% of points where L0 (FLOPs / peak) would choose differently", fontsize=9)
    fig.colorbar(im, ax=axes[1], fraction=0.04)
    for ax in axes:
        ax.set_xticks(range(len(col_vals)), [str(v) for v in col_vals], rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(row_vals)), [str(v) for v in row_vals], fontsize=7)
        ax.set_xlabel(cols)
        ax.set_ylabel(rows)
    handles = [plt.Rectangle((0, 0), 1, 1, color=f"C{i}") for i in range(len(backends))]
    axes[0].legend(handles, backends, fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.25), ncol=len(backends))
    fig.suptitle("MoE design: which expert backend is fastest where (predicted)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
