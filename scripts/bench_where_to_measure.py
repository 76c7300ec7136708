"""Which kernels to measure next: committee spread against random and spread-over-bytes picks.

An experiment's held-out prediction rests on the kernels measured near its own
(``heldout_neighbour`` rows, chosen by ``sim.predict.heldout.neighbour_suite``). This
benchmark asks whether choosing them by where the L3 forms disagree
(``costmodel.model.committee``) predicts the experiment's kernels better than choosing
them at random or spread evenly over bytes moved (the rule for half of today's budget), at
the same budget, on kernels the profile already measured (no timing; every figure held
out).

For each experiment suite of the profile: the *test* is the suite's own kernels (rows tagged
``calibration``, ``paired`` or ``design``), the *pool* is its measured neighbours, the
*base* is the rest of the profile (both left out), restricted to the test's families. For
each budget (kernels per family, taken from the pool) and strategy, L3 is refitted on base
plus the picks and predicts the test kernels: median APE and p90 against their profiled
seconds, and the time-weighted ratio (sum predicted / sum profiled). ``none`` (base only)
and ``all`` (the whole pool) bound it; ``random`` is a median over ``--seeds`` draws. It also
reports whether the spread flags the errors: the Spearman correlation, over the test
kernels, between the committee's spread and the base-only L3's APE.

    python scripts/bench_where_to_measure.py profiles/cpu-amd-epyc-t2-float32-ad7428cec8 \
        --out results/cpu_epyc/where_to_measure

About 1-2 min per suite on the EPYC VM (one L3 fit per strategy, seed and budget).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel.model.committee import Committee, pick_by_spread  # noqa: E402
from costmodel.model.models import FittedCostModel  # noqa: E402
from costmodel.store.profile import DeviceProfile  # noqa: E402
from sim.predict.heldout import IGNORED_REFRESH_POLICIES, OWN_TAGS, evenly_spaced_ranks  # noqa: E402

#: the tag of the kernels an experiment measures near its own (the pool picks come from)
POOL_TAG = "heldout_neighbour"
STRATEGIES = ("random", "bytes", "committee")


def split(table: pd.DataFrame, suite: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(base, pool, test) for ``suite``: its own kernels, its neighbours, and the rest of the
    profile in the test's families."""
    of_suite = table["suite"].astype(str) == suite
    tags = table["tag"].astype(str)
    test = table[of_suite & tags.isin(OWN_TAGS)]
    pool = table[of_suite & (tags == POOL_TAG) & ~table["key"].isin(test["key"])]
    families = set(test["family"])
    base = table[~table["key"].isin(set(test["key"]) | set(pool["key"])) & table["family"].isin(families)]
    pool = pool[pool["family"].isin(families)]
    return base.reset_index(drop=True), pool.reset_index(drop=True), test.reset_index(drop=True)


def pick_random(pool: pd.DataFrame, budget: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    out: list[int] = []
    for _, idx in pool.groupby("family").indices.items():
        out += rng.choice(idx, size=min(budget, len(idx)), replace=False).tolist()
    return sorted(out)


def pick_bytes(pool: pd.DataFrame, budget: int) -> list[int]:
    """Evenly spaced ranks of bytes moved, per family (``neighbour_suite``'s rule for the part
    of its budget not given to the heaviest kernels)."""
    out: list[int] = []
    for _, idx in pool.groupby("family").indices.items():
        order = idx[np.argsort(pool["bytes_moved"].to_numpy(float)[idx], kind="stable")]
        out += order[evenly_spaced_ranks(len(order), budget)].tolist()
    return sorted(out)


def score(base: pd.DataFrame, picks: pd.DataFrame, test: pd.DataFrame, ceilings: dict, cv_folds: int) -> dict:
    """L3 fitted on ``base`` plus ``picks``, scored on ``test`` against its profiled seconds."""
    train = pd.concat([base, picks], ignore_index=True)
    model = FittedCostModel(ceilings=ceilings, cv_folds=cv_folds).fit(train, train["median_s"].to_numpy(float))
    predicted = np.asarray(model.predict(test), dtype=float)
    measured = test["median_s"].to_numpy(float)
    ape = 100 * np.abs(predicted / measured - 1)
    return {"median_ape_pct": float(np.median(ape)), "p90_ape_pct": float(np.percentile(ape, 90)),
            "weighted_ratio": float(predicted.sum() / measured.sum()), "picked": int(len(picks)),
            "ape": ape}


def run_suite(table: pd.DataFrame, suite: str, budgets: list[int], seeds: int, ceilings: dict,
              cv_folds: int, log) -> tuple[list[dict], dict]:
    base, pool, test = split(table, suite)
    rows: list[dict] = []

    def add(strategy: str, budget: int, seed: int | None, picks: list[int]) -> dict:
        s = score(base, pool.iloc[picks], test, ceilings, cv_folds)
        rows.append({"suite": suite, "strategy": strategy, "budget_per_family": budget, "seed": seed,
                     **{k: v for k, v in s.items() if k != "ape"}})
        return s

    start = time.perf_counter()
    committee = Committee(ceilings).fit(base)
    none = add("none", 0, None, [])
    spread = committee.spread(test)
    finite = np.isfinite(spread)
    rho = spearmanr(spread[finite], none["ape"][finite]).statistic if finite.sum() > 2 else float("nan")
    add("all", int(pool.groupby("family").size().max()) if len(pool) else 0, None, list(range(len(pool))))
    for budget in budgets:
        for seed in range(seeds):
            add("random", budget, seed, pick_random(pool, budget, seed))
        add("bytes", budget, None, pick_bytes(pool, budget))
        add("committee", budget, None, pick_by_spread(committee, pool, budget))
        log(f"  {suite}: budget {budget} per family done ({time.perf_counter() - start:.0f} s)")
    info = {"suite": suite, "test_kernels": int(len(test)), "pool_kernels": int(len(pool)),
            "base_kernels": int(len(base)), "families": sorted(set(test["family"])),
            "spread_vs_ape_spearman": float(rho), "seconds": round(time.perf_counter() - start, 1)}
    return rows, info


def summarise(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per suite, strategy and budget; random's figures are medians over its seeds."""
    metrics = ["median_ape_pct", "p90_ape_pct", "weighted_ratio", "picked"]
    out = rows.groupby(["suite", "strategy", "budget_per_family"], sort=False)[metrics].median().reset_index()
    return out.assign(seeds=rows.groupby(["suite", "strategy", "budget_per_family"], sort=False).size().to_numpy())


def plot(summary: pd.DataFrame, path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    suites = list(dict.fromkeys(summary["suite"]))
    fig, axes = plt.subplots(1, len(suites), figsize=(3.6 * len(suites), 3.4), squeeze=False)
    for ax, suite in zip(axes[0], suites):
        s = summary[summary["suite"] == suite]
        for strategy, marker in zip(STRATEGIES, "o^s"):
            t = s[s["strategy"] == strategy]
            ax.plot(t["budget_per_family"], t["median_ape_pct"], marker=marker, label=strategy)
        for bound, style in (("none", ":"), ("all", "--")):
            v = s.loc[s["strategy"] == bound, "median_ape_pct"]
            if len(v):
                ax.axhline(float(v.iloc[0]), color="grey", linestyle=style, label=f"{bound} of the pool")
        ax.set_title(suite)
        ax.set_xlabel("neighbours measured per family")
        ax.set_ylim(bottom=0)
    axes[0][0].set_ylabel("held-out L3 median APE (%)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("Which neighbours to measure: the suite's own kernels predicted held out, by how its measured "
                 "neighbours were picked (committee spread, random: median of the draws, spread over bytes)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", type=Path, help="a profile folder (read only)")
    ap.add_argument("--suites", nargs="*", help="experiment suites (default: every suite with own kernels and a pool)")
    ap.add_argument("--budgets", nargs="+", type=int, default=[4, 8], help="neighbours per family (default 4 8)")
    ap.add_argument("--seeds", type=int, default=5, help="random draws per budget (default 5)")
    ap.add_argument("--cv-folds", type=int, default=4, help="L3's form-selection folds (default 4)")
    ap.add_argument("--out", type=Path, help="write where_to_measure.csv, runs.csv, summary.json and a plot here")
    args = ap.parse_args(argv)
    if any(b < 1 for b in args.budgets):
        ap.error(f"--budgets: every budget must be >= 1 kernel per family, got {args.budgets}")
    if args.seeds < 1:
        ap.error(f"--seeds must be >= 1, got {args.seeds}")

    profile = DeviceProfile.load(args.profile)
    ceilings = dict(profile.ceilings() or {})
    if not ceilings:
        ap.error(f"{args.profile} has no ceilings.json: run `python -m costmodel bench` on its device first")
    table = profile.kernels(ignore_refresh_policies=IGNORED_REFRESH_POLICIES)
    tags = table["tag"].astype(str)
    with_test = set(table.loc[tags.isin(OWN_TAGS), "suite"].astype(str))
    with_pool = set(table.loc[tags == POOL_TAG, "suite"].astype(str))
    present = sorted(with_test & with_pool)
    suites = args.suites or present
    unknown = sorted(set(suites) - set(present))
    if unknown:
        ap.error(f"--suites: {unknown} have no own kernels and neighbours in {args.profile.name}; "
                 f"suites with both: {present}")

    rows, infos = [], []
    for i, suite in enumerate(suites, 1):
        print(f"[{i}/{len(suites)}] {suite}", flush=True)
        r, info = run_suite(table, suite, args.budgets, args.seeds, ceilings, args.cv_folds,
                            lambda m: print(m, flush=True))
        rows += r
        infos.append(info)
    runs = pd.DataFrame(rows)
    summary = summarise(runs)
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(f"\nheld-out L3 of each suite's kernels, {args.profile.name} (random: median of {args.seeds} draws)")
        print(summary.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        print("\nspread vs base-only APE (Spearman) per suite: "
              + ", ".join(f"{i['suite']} {i['spread_vs_ape_spearman']:.2f}" for i in infos))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        summary.to_csv(args.out / "where_to_measure.csv", index=False)
        runs.to_csv(args.out / "runs.csv", index=False)
        (args.out / "summary.json").write_text(json.dumps({
            "profile": args.profile.name, "scoring": "held-out (each suite's own kernels and neighbours left out; "
            "picks from its neighbours added back)", "budgets": args.budgets, "seeds": args.seeds,
            "suites": infos, "summary": summary.to_dict("records")}, indent=2))
        plot(summary, args.out / "where_to_measure.png")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
