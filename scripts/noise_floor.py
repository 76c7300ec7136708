"""How well could any model score against these measurements? The noise floor of committed runs.

    python scripts/noise_floor.py results/cpu_epyc/moe_v* --max-limit 15 --median-limit 5

For each run directory (its ``results.csv``, rows of one experiment's sweep), two floors:

- **within the run** (``costmodel.evaluation``): each point's measurement noise is the
  spread of its round medians (``round_cv``, ``rounds_timed``); a *perfect* model's APE
  at that point is then |N(0, sigma)|, and its largest APE over the run has a known
  distribution. Reported: its median and 10-90% range, and the probability that a perfect
  model's max stays within ``--max-limit``; and the share of L3's errors beyond twice their
  point's noise (4.55% for a perfect model).
- **across runs** (no normal assumption): an oracle that knows every point's median over
  the *other* runs of the same command, and this run's own drift per backend (the median
  of measured / that reference over the backend's points, fitted in-sample, which flatters
  it). Its errors are what run-to-run reproducibility leaves to any predictor; its share of
  points beyond twice the within-run noise shows how much that noise understates it.

Beside them, what L3 scored in the run. The last line: over the runs, how many a perfect
model would be expected to pass at ``--max-limit`` and ``--median-limit``, and the
chance of passing three runs in a row at the within-run rate.
Writes ``noise_floor.csv`` to ``--out`` when given.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from costmodel.evaluation import beyond_noise, max_ape_within_prob, noise_floor_max_ape_pct, \
    noise_floor_median_ape_pct, point_sigma
from costmodel.models import ape_pct

POINT_KEY = ["label", "param", "value"]
OLD_RUN_ROUNDS = 3  # runs from before ``rounds_timed`` existed timed every point in 3 rounds


def load_runs(dirs: list[Path]) -> dict[str, pd.DataFrame]:
    """Each run's results.csv, indexed by point; a missing file or column is named."""
    runs = {}
    for d in dirs:
        path = d / "results.csv"
        if not path.is_file():
            raise SystemExit(f"{path}: no results.csv (give run directories of `python -m sim experiment=...`)")
        df = pd.read_csv(path)
        missing = [c for c in (*POINT_KEY, "measured_s", "pred_L3_s", "round_cv") if c not in df]
        if missing:
            raise SystemExit(f"{path}: missing column(s) {', '.join(missing)}")
        runs[d.name] = df.set_index(POINT_KEY)
    return runs


def within_run_floor(df: pd.DataFrame, max_limit_pct: float) -> dict[str, float]:
    """The perfect model's median-APE floor and the distribution of its max APE in this run,
    and the share of L3's errors beyond twice their point's noise."""
    sigma = point_sigma(df, OLD_RUN_ROUNDS)
    error = (df["pred_L3_s"] / df["measured_s"] - 1).to_numpy()
    return {"L3_share_beyond_2_sigma": beyond_noise(error, sigma)["share_beyond_2_sigma"],
            "floor_median_pct": noise_floor_median_ape_pct(sigma),
            "floor_max_p10_pct": noise_floor_max_ape_pct(sigma, 0.1),
            "floor_max_median_pct": noise_floor_max_ape_pct(sigma, 0.5),
            "floor_max_p90_pct": noise_floor_max_ape_pct(sigma, 0.9),
            "p_perfect_max_within": max_ape_within_prob(sigma, max_limit_pct)}


def cross_run_oracle(runs: dict[str, pd.DataFrame], name: str, points: pd.Index) -> pd.Series:
    """APE (%) of the oracle for run ``name``: other runs' median per point, times this
    run's in-sample drift per backend (label)."""
    measured = runs[name].loc[points, "measured_s"]
    others = pd.concat([r.loc[points, "measured_s"] for n, r in runs.items() if n != name], axis=1)
    reference = others.median(axis=1)
    drift = (measured / reference).groupby(level="label").transform("median")
    return pd.Series(ape_pct(reference * drift, measured), index=points)


def floor_table(runs: dict[str, pd.DataFrame], max_limit_pct: float) -> pd.DataFrame:
    common = None
    for df in runs.values():
        common = df.index if common is None else common.intersection(df.index)
    rows = []
    for name, df in runs.items():
        l3 = pd.Series(ape_pct(df["pred_L3_s"], df["measured_s"]), index=df.index)
        row = {"run": name, "points": len(df), "L3_median_pct": l3.median(), "L3_max_pct": l3.max(),
               **within_run_floor(df, max_limit_pct)}
        if len(runs) >= 3 and len(common):
            oracle = cross_run_oracle(runs, name, common)
            sigma = point_sigma(df.loc[common], OLD_RUN_ROUNDS)
            row.update(oracle_points=len(common), oracle_median_pct=oracle.median(), oracle_max_pct=oracle.max(),
                       oracle_share_beyond_2_sigma=beyond_noise(oracle.to_numpy() / 100, sigma)["share_beyond_2_sigma"],
                       L3_max_on_common_pct=l3.loc[common].max())
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories holding results.csv")
    ap.add_argument("--max-limit", type=float, default=15.0, help="max APE target, %% (default 15)")
    ap.add_argument("--median-limit", type=float, default=5.0, help="median APE target, %% (default 5)")
    ap.add_argument("--out", type=Path, help="folder for noise_floor.csv")
    args = ap.parse_args()
    if args.max_limit <= 0 or args.median_limit <= 0:
        raise SystemExit(f"--max-limit and --median-limit must be > 0, got {args.max_limit}, {args.median_limit}")
    table = floor_table(load_runs(args.runs), args.max_limit)

    console = Console()
    t = Table(title=f"noise floor of {len(table)} runs (APE %; a perfect model against these measurements)")
    cols = {"run": None, "points": None, "L3_median_pct": ".1f", "floor_median_pct": ".1f", "L3_max_pct": ".1f",
            "floor_max_median_pct": ".1f", "floor_max_p10_pct": ".1f", "floor_max_p90_pct": ".1f",
            "p_perfect_max_within": ".2f", "L3_share_beyond_2_sigma": ".0%", "oracle_median_pct": ".1f", "oracle_max_pct": ".1f",
            "oracle_share_beyond_2_sigma": ".0%"}
    cols = {c: f for c, f in cols.items() if c in table}
    for c in cols:
        t.add_column(c.replace("_pct", " %").replace("_", " "), justify="right")
    for _, r in table.iterrows():
        t.add_row(*(str(r[c]) if f is None else format(r[c], f) for c, f in cols.items()))
    console.print(t)
    p = table["p_perfect_max_within"]
    console.print(f"a perfect model would meet max <= {args.max_limit:g}% in {p.sum():.1f} of {len(table)} runs "
                  f"(within-run noise; L3 met it in {(table['L3_max_pct'] <= args.max_limit).sum()}); "
                  f"three in a row at the mean rate: {p.mean() ** 3:.2f}")
    if "oracle_max_pct" in table:
        console.print(f"the cross-run oracle met max <= {args.max_limit:g}% in "
                      f"{(table['oracle_max_pct'] <= args.max_limit).sum()} of {len(table)} runs and median <= "
                      f"{args.median_limit:g}% in {(table['oracle_median_pct'] <= args.median_limit).sum()}; L3 met "
                      f"the median in {(table['L3_median_pct'] <= args.median_limit).sum()}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "noise_floor.csv", index=False)
        console.print(f"wrote {args.out / 'noise_floor.csv'}")


if __name__ == "__main__":
    main()
