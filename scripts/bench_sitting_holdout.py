"""Predict a later sitting from earlier ones: do the refresh scales of older rows help?

    python scripts/bench_sitting_holdout.py PROFILE [--last 5] [--min-kernels 40] [--out DIR]
                                            [--references 1,3,8,16 [--draws 200] [--pick nearest|random]]

A profile is written over many sittings, and a shared VM runs each at its own speed. Every
refresh re-measures a few kernels and scales the older rows of their family (or sitting) by
the ratio it found (``costmodel.measure.freshness.refresh_scale``), so that a model fitted on
all rows predicts the machine as it runs *now*. Whether that works is a question about the
future, and the profile can answer it for its own past. For each of the last ``--last``
sittings holding at least ``--min-kernels`` kernels (a sitting: rows measured with no gap of
``EPOCH_GAP_S``, the refresh's own ``measurement_epochs``, cut again at every refresh recorded
during it: what a later row could know), this script:

- fits L3 (``costmodel.model.models.FittedCostModel``) on the rows measured *before* that
  sitting, minus the sitting's own kernels, twice: on the rows **as measured**, and **scaled**
  by the refresh records written before the sitting (paired runs' records ignored, as the
  held-out scoring ignores them; ``sim.predict.heldout``);
- predicts the sitting's kernels (their medians over rounds, as measured then) with each.

Per sitting and family: kernels, median APE, and the median of predicted / measured (the
sign APE hides). The summary pools every predicted kernel and, per sitting, takes the median.

``--references K,...`` also asks how many reference kernels a held-out run needs to read the
machine's phase (``sim.predict.heldout_drift``, which times ``REFERENCES_PER_FAMILY`` of them).
In every (sitting, family) with at least the largest K + ``MIN_SCORED`` kernels (the same
groups for every K), ``--draws`` times: K of its kernels are the references and their median
measured / predicted (the scaled fit) is the family's drift; the scored kernels are read with
and without it. ``--pick nearest`` (default) picks them as a run does: a kernel drawn at random
stands for a layer's heaviest, its near twins (within sqrt(2) in bytes and FLOPs) are scored,
the K nearest kernels outside that neighbourhood are the references. ``--pick random``: K
kernels drawn at random, the rest scored. Per K it reports the scored kernels' median APE,
the error of their median ratio (the bias a layer of such kernels inherits) and the share of
draws the correction improved.

Reads the profile, measures nothing. Writes ``sitting_holdout.csv`` (per sitting and family),
``kernels.csv`` (per kernel) and ``summary.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from costmodel.measure.freshness import measurement_epochs
from costmodel.model.models import ExtrapolationWarning, ape_pct, make_levels
from costmodel.store.profile import DeviceProfile, combine_rounds
from sim.predict.heldout import IGNORED_REFRESH_POLICIES, MIN_HELDOUT_ROWS
from sim.predict.heldout_drift import MIN_DISTANCE_LOG2

VARIANTS = ("as_measured", "scaled")
#: a (sitting, family) is scored for K references when it holds at least K + this many kernels
MIN_SCORED = 8
#: how the references of a draw are picked (``reference_trials``)
PICKS = ("random", "nearest")


def segments(measured_at: pd.Series, provenance: list[dict[str, Any]]) -> pd.Series:
    """Per row, its segment: its sitting (``measurement_epochs``) cut again at every refresh
    recorded during it, so rows measured after a refresh are predicted with what it knew,
    as an experiment's layers are after its freshness check. Named by its first row's time
    ("" for rows without one)."""
    at = measured_at.astype(str)
    epoch = pd.Series(measurement_epochs(measured_at), index=measured_at.index)
    times = sorted(str(e["refresh"].get("at", "")) for e in provenance if e.get("refresh"))
    after = pd.Series(np.searchsorted(np.array(times, dtype=object), at.to_numpy(dtype=object), side="right"),
                      index=measured_at.index)
    known = epoch != ""
    first = at[known].groupby([epoch[known], after[known]]).transform("min")
    return first.reindex(measured_at.index).fillna("")


def refresh_records_before(provenance: list[dict[str, Any]], start: str) -> list[dict[str, Any]]:
    """Provenance entries whose refresh was recorded before ``start``, paired runs' left out."""
    kept = []
    for entry in provenance:
        rec = entry.get("refresh")
        if rec is None or rec.get("policy") in IGNORED_REFRESH_POLICIES:
            continue
        if str(rec.get("at", "")) < start:
            kept.append(entry)
    return kept


def predict_sitting(raw: pd.DataFrame, start: str, provenance: list[dict[str, Any]],
                    ceilings: dict[str, Any], *, min_rows: int = MIN_HELDOUT_ROWS) -> pd.DataFrame:
    """Each kernel of the segment starting at ``start`` (``segments``, in ``raw["sitting"]``):
    measured, and L3 fitted on the rows measured before it (its own kernels left out) as
    measured and scaled by the refresh records before it; families with fewer than
    ``min_rows`` earlier kernels are left out."""
    mine = raw["sitting"] == start
    target, _ = combine_rounds(raw[mine].drop(columns="sitting"), [], ceilings)
    when = raw["measured_at"].astype(str)
    earlier = raw[(raw["sitting"] != "") & (when < start) & ~raw["key"].isin(set(target["key"]))
                  ].drop(columns="sitting")
    tables = {"as_measured": combine_rounds(earlier, [], ceilings)[0],
              "scaled": combine_rounds(earlier, refresh_records_before(provenance, start), ceilings)[0]}
    counts = tables["as_measured"]["family"].value_counts()
    families = sorted(f for f in target["family"].unique() if counts.get(f, 0) >= min_rows)
    target = target[target["family"].isin(families)].reset_index(drop=True)
    out = target[["key", "family", "bytes_moved", "flops", "median_s"]].rename(columns={"median_s": "measured_s"})
    for name, table in tables.items():
        table = table[table["family"].isin(families)].reset_index(drop=True)
        model = make_levels(ceilings)["L3"].fit(table, table["median_s"].to_numpy(dtype=np.float64))
        out[f"{name}_s"] = model.predict(target)
    return out


def summarize(per_kernel: pd.DataFrame) -> pd.DataFrame:
    """Per sitting and family: kernels, median APE and median predicted / measured per variant."""
    rows = []
    for (start, family), g in per_kernel.groupby(["sitting", "family"]):
        row: dict[str, Any] = {"sitting": start, "family": family, "kernels": len(g)}
        for v in VARIANTS:
            row[f"{v}_median_ape_pct"] = float(np.median(ape_pct(g[f"{v}_s"], g["measured_s"])))
            row[f"{v}_median_ratio"] = float(np.median(g[f"{v}_s"] / g["measured_s"]))
        rows.append(row)
    return pd.DataFrame(rows)


def reference_trials(per_kernel: pd.DataFrame, ks: list[int], draws: int, seed: int = 0,
                     pick: str = "random") -> pd.DataFrame:
    """Per (sitting, family, K, draw), on the groups holding at least max(``ks``) + ``MIN_SCORED``
    kernels: the median APE and the median predicted / measured of the scored kernels,
    uncorrected and times the references' drift (their median measured / predicted), the
    ``scaled`` fit's predictions throughout.

    ``pick="random"``: K kernels drawn at random are the references, the rest are scored.
    ``pick="nearest"`` (as a run picks them, ``sim.predict.heldout_drift.choose_references``): a
    kernel drawn at random stands for a layer's heaviest; the kernels within
    ``MIN_DISTANCE_LOG2`` octaves of it in both bytes moved and FLOPs are scored, and the K
    kernels nearest to it among those at least that far from every scored one are the
    references (a draw without K such kernels is skipped)."""
    if pick not in PICKS:
        raise ValueError(f"pick must be one of {list(PICKS)}, got {pick!r}")
    rng = np.random.default_rng(seed)
    rows = []
    for (start, family), g in per_kernel.groupby(["sitting", "family"]):
        ratio = (g["scaled_s"] / g["measured_s"]).to_numpy(dtype=np.float64)
        if not ks or len(ratio) < max(ks) + MIN_SCORED:
            continue  # every count is scored on the same groups
        if pick == "nearest":
            lb = np.log2(np.maximum(g["bytes_moved"].to_numpy(dtype=np.float64), 1.0))
            lf = np.log2(np.maximum(g["flops"].to_numpy(dtype=np.float64), 1.0))
        for d in range(draws):
            if pick == "nearest":
                t = int(rng.integers(len(ratio)))
                scored = np.maximum(np.abs(lb - lb[t]), np.abs(lf - lf[t])) < MIN_DISTANCE_LOG2
                gap = np.maximum(np.abs(lb[:, None] - lb[scored][None, :]),
                                 np.abs(lf[:, None] - lf[scored][None, :])).min(axis=1)
                candidates = np.flatnonzero(gap >= MIN_DISTANCE_LOG2)
                order = candidates[np.argsort(np.hypot(lb[candidates] - lb[t], lf[candidates] - lf[t]), kind="stable")]
            for k in ks:
                if pick == "nearest":
                    if len(order) < k:
                        continue
                    refs, rest = order[:k], ratio[scored]
                else:
                    chosen = np.zeros(len(ratio), dtype=bool)
                    chosen[rng.choice(len(ratio), size=k, replace=False)] = True
                    refs, rest = np.flatnonzero(chosen), ratio[~chosen]
                drift = float(np.median(1.0 / ratio[refs]))
                rows.append({"sitting": start, "family": family, "kernels": len(ratio), "references": k, "draw": d,
                             "scored": len(rest), "drift": drift,
                             "uncorrected_median_ape_pct": float(np.median(np.abs(rest - 1.0)) * 100),
                             "corrected_median_ape_pct": float(np.median(np.abs(rest * drift - 1.0)) * 100),
                             "uncorrected_bias_pct": float(abs(np.median(rest) - 1.0) * 100),
                             "corrected_bias_pct": float(abs(np.median(rest) * drift - 1.0) * 100)})
    return pd.DataFrame(rows)


def summarize_references(trials: pd.DataFrame) -> pd.DataFrame:
    """Per K: (sitting, family) groups scored, draws, the median kernels scored per draw, the
    medians over groups and draws of each error, and the share of draws whose correction
    lowered the median APE and the bias."""
    rows = []
    for k, g in trials.groupby("references"):
        rows.append({"references": int(k), "groups": int(g.groupby(["sitting", "family"]).ngroups), "draws": len(g),
                     "scored_per_draw": float(g["scored"].median()),
                     **{c: float(g[c].median()) for c in ("uncorrected_median_ape_pct", "corrected_median_ape_pct",
                                                          "uncorrected_bias_pct", "corrected_bias_pct")},
                     "ape_improved_share": float((g["corrected_median_ape_pct"] < g["uncorrected_median_ape_pct"]).mean()),
                     "bias_improved_share": float((g["corrected_bias_pct"] < g["uncorrected_bias_pct"]).mean())})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profile", type=Path, help="a profile folder (profiles/<fingerprint>)")
    ap.add_argument("--last", type=int, default=5, help="how many of the latest large sittings to predict (default 5)")
    ap.add_argument("--min-kernels", type=int, default=40,
                    help="a sitting is predicted when it holds at least this many kernels (default 40)")
    ap.add_argument("--out", type=Path, help="folder for sitting_holdout.csv and summary.json")
    ap.add_argument("--references", default="",
                    help="comma-separated counts of reference kernels per family to score as a drift reading (e.g. 3,8,16,32)")
    ap.add_argument("--draws", type=int, default=200, help="random reference draws per sitting, family and count (default 200)")
    ap.add_argument("--pick", choices=PICKS, default="nearest",
                    help="references at random, or nearest to a drawn kernel as a run picks them (default nearest)")
    args = ap.parse_args(argv)
    try:
        ks = [int(x) for x in args.references.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--references must be comma-separated integers >= 1, got {args.references!r}")
    if any(k < 1 for k in ks):
        ap.error(f"--references must be comma-separated integers >= 1, got {args.references!r}")
    if args.draws < 1:
        ap.error(f"--draws must be an integer >= 1, got {args.draws}")
    for name, value in (("--last", args.last), ("--min-kernels", args.min_kernels)):
        if value < 1:
            ap.error(f"{name} must be an integer >= 1, got {value}")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out} is a file; give a folder (created if missing)")
    if not (args.profile / "measurements.csv").is_file():
        ap.error(f"{args.profile} holds no measurements.csv: give a profile folder such as profiles/<fingerprint>")
    # a later sitting's kernels often lie beyond the earlier rows' ranges: that is the question asked
    warnings.simplefilter("ignore", ExtrapolationWarning)
    profile = DeviceProfile.load(args.profile)
    raw = profile.measurements()
    provenance = profile.provenance()
    raw["sitting"] = segments(raw["measured_at"], provenance)
    size = raw[raw["sitting"] != ""].groupby("sitting")["key"].nunique()
    targets = sorted(size[size >= args.min_kernels].index)[-args.last:]
    if not targets:
        ap.error(f"no sitting of {args.profile.name} holds {args.min_kernels} kernels")
    ceilings = profile.ceilings() or {}
    console = Console()
    parts = []
    for i, start in enumerate(targets, 1):
        began = time.perf_counter()
        part = predict_sitting(raw, start, provenance, ceilings)
        parts.append(part.assign(sitting=start))
        console.print(f"sitting {i}/{len(targets)} {start}: {len(part)} kernels predicted from earlier rows "
                      f"({time.perf_counter() - began:.0f} s)", highlight=False)
    per_kernel = pd.concat(parts, ignore_index=True)
    table = summarize(per_kernel)
    t = Table(title=f"{args.profile.name}: each sitting predicted from the rows before it (L3, median APE % / "
                    "predicted over measured)")
    for c in ("sitting", "family", "kernels", "as measured", "scaled"):
        t.add_column(c, justify="right")
    for _, r in table.iterrows():
        t.add_row(r["sitting"][:16], r["family"], str(r["kernels"]),
                  *(f"{r[f'{v}_median_ape_pct']:.1f} / {r[f'{v}_median_ratio']:.2f}x" for v in VARIANTS))
    console.print(t)
    pooled = {v: {"median_ape_pct": float(np.median(ape_pct(per_kernel[f"{v}_s"], per_kernel["measured_s"]))),
                  "median_ratio": float(np.median(per_kernel[f"{v}_s"] / per_kernel["measured_s"])),
                  "per_sitting_median_ape_pct": {s: float(np.median(ape_pct(g[f"{v}_s"], g["measured_s"])))
                                                 for s, g in per_kernel.groupby("sitting")}}
              for v in VARIANTS}
    for v in VARIANTS:
        per = pooled[v]["per_sitting_median_ape_pct"]
        console.print(f"{v}: {len(per_kernel)} kernels, median APE {pooled[v]['median_ape_pct']:.1f}%, "
                      f"predicted / measured {pooled[v]['median_ratio']:.2f}x; per sitting "
                      + ", ".join(f"{x:.1f}" for x in per.values()), highlight=False)
    references = None
    if ks:
        refs = summarize_references(reference_trials(per_kernel, ks, args.draws, pick=args.pick))
        t = Table(title=f"the family's drift read off K references ({args.pick}) in the sitting, the others scored "
                        f"({args.draws} draws; medians over sittings, families and draws)")
        for c in ("K", "groups", "draws", "scored per draw", "median APE: none / corrected", "bias: none / corrected",
                  "draws better (APE / bias)"):
            t.add_column(c, justify="right")
        for _, r in refs.iterrows():
            t.add_row(str(int(r["references"])), str(int(r["groups"])), str(int(r["draws"])), f"{r['scored_per_draw']:.0f}",
                      f"{r['uncorrected_median_ape_pct']:.1f} / {r['corrected_median_ape_pct']:.1f}",
                      f"{r['uncorrected_bias_pct']:.1f} / {r['corrected_bias_pct']:.1f}",
                      f"{100 * r['ape_improved_share']:.0f}% / {100 * r['bias_improved_share']:.0f}%")
        console.print(t)
        references = {"draws": args.draws, "pick": args.pick, "min_scored": MIN_SCORED,
                      "by_count": refs.to_dict(orient="records"),
                      "what": "per (sitting, family), K kernels of the sitting (random, or nearest to a drawn kernel "
                              "outside its sqrt(2) neighbourhood, which is scored) read the family's drift (median "
                              "measured / predicted, scaled fit); the scored kernels with and without it"}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "sitting_holdout.csv", index=False)
        per_kernel.to_csv(args.out / "kernels.csv", index=False)
        (args.out / "summary.json").write_text(json.dumps(
            {"profile": args.profile.name, "sittings": targets, "kernels": len(per_kernel), "variants": pooled,
             **({"references": references} if references else {}),
             "what": "each sitting's kernels predicted by L3 fitted on earlier rows (its own kernels left out), "
                     "as measured or scaled by the refresh records before it"}, indent=1) + "\n")
        console.print(f"wrote {args.out / 'sitting_holdout.csv'}, kernels.csv and summary.json")


if __name__ == "__main__":
    sys.exit(main())
