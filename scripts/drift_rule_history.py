"""Does correcting held-out predictions by reference-kernel drift help? Scored on every committed run.

    python scripts/drift_rule_history.py [--out DIR]

A measuring experiment also times a few *reference kernels* (profiled, none of its own) in the
same rounds as its layers, and scales its held-out L3 by their drift, measured now over the
held-out model's prediction of them (``sim.predict.heldout_drift``). The result is kept as a
side score (``pred_heldout_drift_L3_s`` in ``results.csv``), not the headline. This script reads
every version of every canonical run that git history holds
(``results/<machine>/<experiment>/``, for the experiments with that side score), keeps the runs
scored with the current rule (the held-out model's L3 of each reference, not its profiled row),
and scores a shrunk correction on each:

    predicted(w) = held-out L3 x (drift-scaled L3 / held-out L3) ** w

``w = 0`` is the headline, ``w = 1`` the side score. Between them the per-point factor is shrunk
in log space. This is exact at 0 and 1. Between them it is an approximation: the experiment
shrinks each family's factor, and a point mixing families is shrunk here as one.

Printed per run: the median APE at each weight, the references' drift over the run (median of
the per-point factors) and the drift the layers showed (median of measured / held-out L3).
Runs are also split by how many references per family the run timed (``per_family``, read
off the rule: 3 until 2026-12-07, 16 since). Also printed: their correlation over runs, and
the weight that least-squares would pick (true log drift on reference log drift, through the
origin), left out one run at a time. Reads git and the committed files only; measures
nothing. Writes ``drift_rule_history.csv`` to ``--out``.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from costmodel.model.models import ape_pct
from experiments.committed_versions import committed_versions, version_at

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ("moe_skew", "gnn_degree", "hf_moe", "pyg_conv", "moe_ep")
MACHINES = ("cpu", "cpu_epyc")
WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: the drift rule being scored: the references read against the held-out model, not their rows
RULE_MARK = "held-out regression's L3 of the reference"


def references_per_family(rule: str) -> int | None:
    """The references per family a run's drift rule names ("up to N reference kernels"), else None."""
    found = re.search(r"up to (\d+) reference kernels", rule)
    return int(found.group(1)) if found else None


def score_weights(df: pd.DataFrame, weights: tuple[float, ...] = WEIGHTS) -> dict[str, float]:
    """Median APE (%) of held-out L3 x factor ** w per weight, for one run's points
    (``pred_L3_s``, ``pred_heldout_drift_L3_s``, ``measured_s``); and the run's two drifts."""
    df = df[df["measured_s"].notna() & (df["measured_s"] > 0) & (df["pred_L3_s"] > 0)
            & (df["pred_heldout_drift_L3_s"] > 0)]
    if df.empty:
        raise ValueError("no point with a measurement and both predictions")
    factor = df["pred_heldout_drift_L3_s"] / df["pred_L3_s"]
    out = {"points": len(df), "reference_drift": float(np.median(factor)),
           "layer_drift": float(np.median(df["measured_s"] / df["pred_L3_s"]))}
    for w in weights:
        out[f"median_ape_w{w:g}"] = float(np.median(ape_pct(df["pred_L3_s"] * factor ** w, df["measured_s"])))
    return out


def committed_runs() -> pd.DataFrame:
    """One row per committed version of a canonical run scored with the current drift rule."""
    rows = []
    for machine in MACHINES:
        for experiment in EXPERIMENTS:
            folder = ROOT / "results" / machine / experiment
            try:
                versions = committed_versions(folder / "summary.json")
            except LookupError as err:
                raise SystemExit(f"drift_rule_history.py: error: {err}") from None
            for commit, text in versions:
                points = version_at(folder / "results.csv", commit)
                try:
                    summary, table = json.loads(text), pd.read_csv(io.StringIO(points or ""))
                except (json.JSONDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError):
                    continue  # a version without both files, or not parseable: not a run
                drift = summary.get("details", {}).get("heldout", {}).get("drift", {})
                if RULE_MARK not in drift.get("rule", "") or "pred_heldout_drift_L3_s" not in table:
                    continue
                rows.append({"machine": machine, "experiment": experiment, "commit": commit,
                             "references": drift.get("references"),
                             "per_family": references_per_family(drift.get("rule", "")), **score_weights(table)})
    if not rows:
        raise SystemExit("drift_rule_history.py: error: no committed run scored with the current drift rule "
                         f"under results/{{{','.join(MACHINES)}}}/{{{','.join(EXPERIMENTS)}}} (a shallow clone? "
                         "run `git fetch --unshallow`)")
    return pd.DataFrame(rows)


def shrink_weight(reference_drift: np.ndarray, layer_drift: np.ndarray) -> float:
    """Least-squares weight of log layer drift on log reference drift, through the origin."""
    x, y = np.log(reference_drift), np.log(layer_drift)
    return float((x * y).sum() / (x * x).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="folder for drift_rule_history.csv")
    args = ap.parse_args()
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out} is a file; give a folder (created if missing)")
    runs = committed_runs()
    console = Console()
    t = Table(title="held-out L3 median APE % by drift weight w (0: headline, 1: the drift side score)")
    for col in ("run", "points", "ref drift", "layer drift", *(f"w={w:g}" for w in WEIGHTS)):
        t.add_column(col, justify="right")
    for _, r in runs.iterrows():
        t.add_row(f"{r.machine}/{r.experiment}@{r.commit}", str(r.points), f"{r.reference_drift:.3f}",
                  f"{r.layer_drift:.3f}", *(f"{r[f'median_ape_w{w:g}']:.1f}" for w in WEIGHTS))
    console.print(t)
    cols = [f"median_ape_w{w:g}" for w in WEIGHTS]
    console.print("over runs, median / mean / max of the runs' median APE: " + "; ".join(
        f"w={w:g} {runs[c].median():.1f} / {runs[c].mean():.1f} / {runs[c].max():.1f}" for w, c in zip(WEIGHTS, cols)))
    console.print("runs better than the headline (w=0): " + ", ".join(
        f"w={w:g} {(runs[c] < runs[cols[0]]).sum()} of {len(runs)}" for w, c in zip(WEIGHTS[1:], cols[1:])))
    for per_family, g in runs.groupby(runs["per_family"].fillna(0).astype(int)):
        console.print(f"runs with {per_family or '?'} references per family ({len(g)}): median of the runs' median APE "
                      + ", ".join(f"w={w:g} {g[c].median():.1f}" for w, c in zip(WEIGHTS, cols))
                      + f"; w=1 better than w=0 in {(g[cols[-1]] < g[cols[0]]).sum()} of {len(g)}", highlight=False)
    x, y = runs["reference_drift"].to_numpy(), runs["layer_drift"].to_numpy()
    loro = [shrink_weight(np.delete(x, i), np.delete(y, i)) for i in range(len(runs))]
    console.print(f"reference drift against the layers' drift over runs: correlation of logs "
                  f"{np.corrcoef(np.log(x), np.log(y))[0, 1]:.2f}; least-squares weight {shrink_weight(x, y):.2f} "
                  f"({min(loro):.2f}-{max(loro):.2f} leaving one run out); layers' drift median {np.median(y):.3f}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        runs.to_csv(args.out / "drift_rule_history.csv", index=False)
        console.print(f"wrote {args.out / 'drift_rule_history.csv'}")


if __name__ == "__main__":
    sys.exit(main())
