"""Kernel-level held-out accuracy per experiment: leave one experiment's kernels out, predict them.

For every experiment suite a profile holds (the ``suite`` an experiment's calibration writes:
``moe``, ``gnn``, ``hf_moe``, ``pyg_conv``, ...), L0-L3 are refitted on the profile without
that suite's own kernels (rows tagged ``calibration``, ``paired`` or ``design``: the kernels of
its layers; its measured neighbours, ``heldout_neighbour``, and the profile kernels a refresh
re-measured under its name, ``refresh_anchor``, stay in, as in an experiment's held-out fit:
``sim.predict.heldout``) and each left-out kernel is predicted
from its descriptor, no lookup. Per (suite, kernel kind) it reports how many kernels, the
median L3 and L2 prediction over the profiled time, the time-weighted ratio (sum of
predictions / sum of profiled times: what a layer that runs each kernel once would see) and
the median APE. It measures nothing; it reads the profile and fits, about 30 s per suite on
the EPYC VM.

This is the kernel half of an experiment's held-out error, separated from the machine's phase
(the profiled times are the reference, not a run's) and from composition. A kernel measured
first by another suite is not left out with this one (a profile row keeps the suite that
measured it first), so the folds are slightly kinder than the experiments' own.

    python scripts/heldout_by_suite.py profiles/cpu-amd-epyc-t2-float32-ad7428cec8
    python scripts/heldout_by_suite.py PROFILE --suites hf_moe moe --out results/cpu_epyc/heldout_by_suite
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel.families.descriptor import from_record  # noqa: E402
from costmodel.model.cold_start import kernel_kind  # noqa: E402
from costmodel.model.models import FittedCostModel, make_levels  # noqa: E402
from costmodel.store.profile import DeviceProfile  # noqa: E402
from sim.predict.heldout import IGNORED_REFRESH_POLICIES, MIN_HELDOUT_ROWS, OWN_TAGS, family_shortfall, heldout_table  # noqa: E402

#: suites written by the bench (training data for every fold), never left out
BENCH_SUITES = ("full", "quick", "tiny", "small_ops", "load_cost_model")
LEVELS = ("L2", "L3")


def fold(profile: DeviceProfile, table: pd.DataFrame, suite: str, ceilings: dict, cv_folds: int,
         tags: tuple[str, ...] = OWN_TAGS, l3_variants: dict[str, dict] | None = None) -> pd.DataFrame:
    """The kernels of ``suite``'s layers (its rows tagged ``tags``), predicted by models fitted
    without them (the training table is ``heldout_table``'s: the experiments' own exclusion rule).
    A family left with fewer than ``MIN_HELDOUT_ROWS`` rows cannot be predicted held out: its
    kernels are left out of the fold and named on the console, as an experiment's ``HeldOutError``
    names them. ``l3_variants`` (name -> ``FittedCostModel`` keyword arguments) adds a
    ``pred_<name>_s`` column per variant, each fitted on the same rows."""
    test = table[(table["suite"] == suite) & table["tag"].astype(str).isin(tags)].reset_index(drop=True)
    train, _ = heldout_table(profile, set(test["key"]))
    short = family_shortfall(train, test["family"].astype(str))
    if short:
        print(f"  {suite}: not predictable held out, fewer than {MIN_HELDOUT_ROWS} kernels left of "
              + ", ".join(f"{f} ({n} left, {int((test['family'] == f).sum())} of {suite}'s skipped)"
                          for f, n in short.items()), flush=True)
        test = test[~test["family"].isin(list(short))].reset_index(drop=True)
    y = train["median_s"].to_numpy(dtype=np.float64)
    levels = {lv: m.fit(train, y) for lv, m in make_levels(ceilings, cv_folds=cv_folds).items() if lv in LEVELS}
    out = pd.DataFrame({"suite": suite, "key": test["key"], "family": test["family"],
                        "kind": [kernel_kind(from_record(r)) for r in test.to_dict("records")],
                        "profiled_s": test["median_s"].to_numpy(dtype=np.float64)})
    for lv, model in levels.items():
        out[f"pred_{lv}_s"] = np.asarray(model.predict(test), dtype=np.float64)
    families = test["family"].astype(str).tolist()
    for name, kwargs in (l3_variants or {}).items():
        # a variant with the default settings is the L3 just fitted: not fitted twice
        model = FittedCostModel(ceilings=ceilings, cv_folds=cv_folds, **kwargs).fit(train, y) if kwargs else levels["L3"]
        out[f"pred_{name}_s"] = out["pred_L3_s"] if not kwargs else np.asarray(model.predict(test), dtype=np.float64)
        chosen = [model.chosen_.get(f, "") for f in families]
        # the grouped-CV errors behind the choice: the chosen form's and the best single form's
        cv = [model.cv_median_ape_pct_.get(f, {}) for f in families]
        out[f"form_{name}"] = chosen
        out[f"cv_{name}_chosen_pct"] = [c.get(form, np.nan) for c, form in zip(cv, chosen)]
        out[f"cv_{name}_best_single_pct"] = [min((v for n, v in c.items() if not n.startswith("avg:")), default=np.nan)
                                             for c in cv]
    return out


def summarise(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (suite, kind) and per suite: n, median ratio and APE, time-weighted ratio."""
    def stats(g: pd.DataFrame) -> pd.Series:
        out = {"kernels": len(g), "profiled_ms": 1e3 * g["profiled_s"].sum()}
        for lv in LEVELS:
            ratio = g[f"pred_{lv}_s"] / g["profiled_s"]
            out[f"{lv}_median_ratio"] = float(ratio.median())
            out[f"{lv}_weighted_ratio"] = float(g[f"pred_{lv}_s"].sum() / g["profiled_s"].sum())
            out[f"{lv}_median_ape_pct"] = float((100 * (ratio - 1).abs()).median())
        return pd.Series(out)

    per_kind = rows.groupby(["suite", "kind"]).apply(stats, include_groups=False).reset_index()
    per_suite = rows.groupby("suite").apply(stats, include_groups=False).reset_index().assign(kind="(all)")
    return pd.concat([per_suite, per_kind], ignore_index=True).sort_values(["suite", "profiled_ms"],
                                                                           ascending=[True, False])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", type=Path, help="a profile folder (read only)")
    ap.add_argument("--suites", nargs="*", help="experiment suites to leave out (default: every non-bench suite)")
    ap.add_argument("--tags", nargs="+", default=list(OWN_TAGS),
                    help="the rows of a suite to leave out and predict (default: its own kernels, "
                         f"{' '.join(OWN_TAGS)}; heldout_neighbour: its measured neighbours instead)")
    ap.add_argument("--cv-folds", type=int, default=4, help="L3's form-selection folds (default 4)")
    ap.add_argument("--min-share-pct", type=float, default=1.0,
                    help="print kinds with at least this share of their suite's profiled time (default 1)")
    ap.add_argument("--out", type=Path, help="write heldout_by_suite.csv, kernels.csv and summary.json here")
    args = ap.parse_args(argv)

    profile = DeviceProfile.load(args.profile)
    table = profile.kernels(ignore_refresh_policies=IGNORED_REFRESH_POLICIES)
    ceilings = dict(profile.ceilings() or {})
    present = sorted(set(table["suite"].astype(str)) - set(BENCH_SUITES))
    suites = args.suites or present
    unknown = sorted(set(suites) - set(present))
    if unknown:
        ap.error(f"--suites: {unknown} not in {args.profile.name}; its experiment suites are {present}")
    if not ceilings:
        ap.error(f"{args.profile} has no ceilings.json: run `python -m costmodel bench` on its device first")

    tagged = table[table["tag"].astype(str).isin(args.tags)]
    empty = sorted(set(suites) - set(tagged["suite"].astype(str)))
    if empty:
        ap.error(f"--tags {' '.join(args.tags)}: suites {empty} have no such rows in {args.profile.name}")
    rows = []
    for i, suite in enumerate(suites, 1):
        start = time.perf_counter()
        rows.append(fold(profile, table, suite, ceilings, args.cv_folds, tuple(args.tags)))
        print(f"[{i}/{len(suites)}] {suite}: {len(rows[-1])} kernels left out, fitted on "
              f"{len(table) - len(rows[-1])} in {time.perf_counter() - start:.0f} s", flush=True)
    kernels = pd.concat(rows, ignore_index=True)
    summary = summarise(kernels)

    share = 100 * summary["profiled_ms"] / summary.groupby("suite")["profiled_ms"].transform("max")
    shown = summary[(summary["kind"] == "(all)") | (share >= args.min_share_pct)]
    cols = ["suite", "kind", "kernels", "profiled_ms", "L3_median_ratio", "L3_weighted_ratio", "L3_median_ape_pct",
            "L2_median_ratio", "L2_median_ape_pct"]
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(f"\nheld out per experiment suite, {args.profile.name} (ratio = predicted / profiled; "
              f"weighted = sums; kinds with >= {args.min_share_pct:g}% of their suite's time)")
        print(shown[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        summary.to_csv(args.out / "heldout_by_suite.csv", index=False)
        kernels.to_csv(args.out / "kernels.csv", index=False)
        (args.out / "summary.json").write_text(json.dumps({
            "profile": args.profile.name, "suites": suites, "scoring": "held-out (leave one experiment suite out)",
            "tags": args.tags,
            "per_suite": summary[summary["kind"] == "(all)"].drop(columns="kind").to_dict("records")}, indent=2))
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
