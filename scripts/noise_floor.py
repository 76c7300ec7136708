"""How well could any model score against these measurements? The noise floor of committed runs.

    python scripts/noise_floor.py results/cpu_epyc/moe_v* --max-limit 15 --median-limit 5

For each run directory (its ``results.csv``, rows of one experiment's sweep; a run is
named by its path as given, so runs in folders of the same name stay apart), two floors:

- **within the run** (``costmodel.model.evaluation``): each point's measurement noise is the
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
- **phase-blind** (``blind_*``): the same oracle without this run's drift, each point
  predicted by the other runs' median alone. That is the best any *held-out* predictor can
  do when it cannot read the machine's speed phase during the run: it knows every layer's
  typical time exactly, and nothing of today's. A median target below its median APE is a
  target for the machine's phases, not for the model.

Beside them, what L3 scored in the run. The last line: over the runs, how many a perfect
model would be expected to pass at ``--max-limit`` and ``--median-limit``, and the
chance of passing three runs in a row at the within-run rate.
Writes ``noise_floor.csv`` to ``--out`` when given.

``--history results/cpu_epyc/moe_ep`` takes as runs every version of that folder's
``results.csv`` that git history holds (named ``moe_ep@<commit>``), so a canonical run's past
versions give its floors with no folder kept in the tree. A sweep without ``label`` and
``param`` columns (``moe_ep``, ``gnn_partition``) is keyed by its ``placement`` or
``partitioner`` and ``backend`` columns instead. Only the points every run shares are compared.
``--since 2026-12-04`` keeps the versions committed since then: versions measured by an older
method are not noise.

Bad input stops with one line ``noise_floor.py: error: ...`` and exit status 2 (as
argparse's own errors), before any floor is computed, naming the file, column and line: an
empty or header-only results.csv, a missing column, text or a value out of range
(measured_s and pred_L3_s finite and > 0, round_cv finite and >= 0, rounds_timed an
integer >= 1), a point repeated with other values; exact duplicate rows are dropped with a
note. ``--max-limit``, ``--median-limit`` and ``--p90-limit`` must be finite percentages > 0, and ``--out``
a folder (created if missing), not a file.
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from costmodel.model.evaluation import beyond_noise, max_ape_within_prob, noise_floor_max_ape_pct, \
    noise_floor_median_ape_pct, point_sigma
from costmodel.model.models import ape_pct
from experiments.committed_versions import committed_versions

POINT_KEY = ["label", "param", "value"]
#: columns that name a point's label in sweeps that have no ``label`` column, joined by "/"
LABEL_PARTS = ("placement", "partitioner", "backend")
OLD_RUN_ROUNDS = 3  # runs from before ``rounds_timed`` existed timed every point in 3 rounds


#: columns read as numbers, by their allowed range
POSITIVE = ("measured_s", "pred_L3_s")  # seconds: finite and > 0
NON_NEGATIVE = ("round_cv",)  # finite and >= 0


#: exit status of a refused input (argparse's, the shell's usage error)
USAGE_EXIT_CODE = 2


class BadInput(ValueError):
    """A run directory, results.csv or option that cannot be used; the message names it."""


def _fail(path: Path, message: str) -> BadInput:
    return BadInput(f"{path}: {message}")


def _show(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _check_numbers(path: Path, df: pd.DataFrame) -> pd.DataFrame:
    """The numeric columns as floats, each value in its range, else an error naming the
    file, the column and the row (line of the file: the header is line 1): ``BadInput``."""
    checks = [(c, "a finite number > 0", lambda x: np.isfinite(x) & (x > 0)) for c in POSITIVE]
    checks += [(c, "a finite number >= 0", lambda x: np.isfinite(x) & (x >= 0)) for c in NON_NEGATIVE]
    if "rounds_timed" in df:
        checks.append(("rounds_timed", "an integer >= 1",
                       lambda x: np.isfinite(x) & (x >= 1) & (np.mod(np.where(np.isfinite(x), x, 0), 1) == 0)))
    df = df.copy()
    for col, allowed, ok in checks:
        raw = df[col]
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
        bad = np.flatnonzero(~ok(values))
        if len(bad):
            shown = ", ".join(f"line {i + 2}: {_show(raw.iloc[i])}" for i in bad[:5])
            more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
            raise _fail(path, f"column {col} must be {allowed} in every row; {len(bad)} row(s) are not: {shown}{more}")
        df[col] = values
    return df


def read_run(path: Path) -> pd.DataFrame:
    """One results.csv, checked and indexed by point: numbers in range, exact duplicate rows
    dropped (with a note on stderr), a point repeated with other values refused (``BadInput``)."""
    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise _fail(path, "is empty (no header, no rows); give a run directory whose experiment finished") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as err:
        raise _fail(path, f"cannot be read as CSV: {err}") from None
    missing = [c for c in (*POINT_KEY, "measured_s", "pred_L3_s", "round_cv") if c not in df]
    if missing:
        raise _fail(path, f"missing column(s) {', '.join(missing)}")
    if df.empty:
        raise _fail(path, "has a header but no rows; give a run directory whose experiment finished")
    df = _check_numbers(path, df)
    duplicated = df.duplicated(keep="first")
    if duplicated.any():
        lines = [int(i) + 2 for i in np.flatnonzero(duplicated.to_numpy())]
        print(f"note: {path}: dropped {len(lines)} exact duplicate row(s) (lines {lines[:10]}"
              f"{' ...' if len(lines) > 10 else ''}); each point counts once", file=sys.stderr)
        df = df[~duplicated]
    again = df.duplicated(POINT_KEY, keep=False)
    if again.any():
        lines = [int(i) + 2 for i in np.flatnonzero(again.to_numpy())]
        raise _fail(path, f"the point ({', '.join(POINT_KEY)}) repeats with different values on lines {lines[:10]}; "
                          "one row per point")
    return df.set_index(POINT_KEY)


def history_runs(folder: Path, into: Path, since: str | None = None) -> list[Path]:
    """Every committed version of ``folder/results.csv`` (committed ``since`` a date, if given)
    written to ``into/<name>@<commit>/`` (newest first), a sweep without ``label`` / ``param``
    keyed by ``LABEL_PARTS``."""
    path = folder / "results.csv"
    try:
        versions = committed_versions(path, since=since)
    except LookupError as err:
        raise BadInput(f"--history {folder}: {err}") from None
    if not versions:
        raise BadInput(f"--history {folder}: git history holds no version of {path}"
                       + (f" committed since {since}" if since else ""))
    dirs = []
    for commit, text in versions:
        df = pd.read_csv(io.StringIO(text))
        if "label" not in df:
            parts = [c for c in LABEL_PARTS if c in df]
            if not parts:
                raise BadInput(f"--history {folder}@{commit}: results.csv has no label column nor any of "
                               f"{', '.join(LABEL_PARTS)} to name its points by")
            df.insert(0, "label", df[parts].astype(str).agg("/".join, axis=1))
        if "param" not in df:
            df.insert(1, "param", "value")
        run = into / f"{folder.name}@{commit}"
        run.mkdir(parents=True)
        df.to_csv(run / "results.csv", index=False)
        dirs.append(run)
    return dirs


def load_runs(dirs: list[Path]) -> dict[str, pd.DataFrame]:
    """Each run's results.csv, indexed by point and keyed by its directory's path as given
    (runs in folders of the same name stay apart); a missing or unusable file, column or
    value is named, and a directory given twice counts once (with a note)."""
    runs: dict[str, pd.DataFrame] = {}
    seen: dict[Path, str] = {}
    for d in dirs:
        path = d / "results.csv"
        if not path.is_file():
            raise _fail(path, "no results.csv (give run directories of `python -m sim experiment=...`)")
        real = path.resolve()
        if real in seen:
            print(f"note: {d} is the run {seen[real]} again; counted once", file=sys.stderr)
            continue
        seen[real] = str(d)
        runs[str(d)] = read_run(path)
    return runs


def check_limit(name: str, value: float) -> float:
    """A percentage limit: finite and > 0."""
    if not (math.isfinite(value) and value > 0):
        raise BadInput(f"{name} must be a finite percentage > 0, got {value:g}")
    return value


def check_out(out: Path | None) -> None:
    """``--out``: a folder (created if missing), not a file nor under one."""
    for parent in (out, *out.parents) if out is not None else ():
        if parent.exists():
            if not parent.is_dir():
                raise BadInput(f"--out {out} must be a folder (created if missing), but {parent} is a file")
            return


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


def cross_run_oracle(runs: dict[str, pd.DataFrame], name: str, points: pd.Index, *,
                     drift: bool = True) -> pd.Series:
    """APE (%) of the oracle for run ``name``: other runs' median per point, times this
    run's in-sample drift per backend (label); ``drift=False``: the median alone (phase-blind)."""
    measured = runs[name].loc[points, "measured_s"]
    others = pd.concat([r.loc[points, "measured_s"] for n, r in runs.items() if n != name], axis=1)
    reference = others.median(axis=1)
    if drift:
        reference = reference * (measured / reference).groupby(level="label").transform("median")
    return pd.Series(ape_pct(reference, measured), index=points)


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
            blind = cross_run_oracle(runs, name, common, drift=False)
            sigma = point_sigma(df.loc[common], OLD_RUN_ROUNDS)
            row.update(oracle_points=len(common), oracle_median_pct=oracle.median(), oracle_max_pct=oracle.max(),
                       oracle_share_beyond_2_sigma=beyond_noise(oracle.to_numpy() / 100, sigma)["share_beyond_2_sigma"],
                       blind_median_pct=blind.median(), blind_p90_pct=blind.quantile(0.9),
                       blind_max_pct=blind.max(), L3_max_on_common_pct=l3.loc[common].max())
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="*", type=Path, help="run directories holding results.csv")
    ap.add_argument("--history", type=Path, action="append", default=[],
                    help="a results folder whose committed versions are runs too (repeatable)")
    ap.add_argument("--since", default=None,
                    help="with --history: only versions committed since this date (git's --since), e.g. after "
                         "the method last changed")
    ap.add_argument("--max-limit", type=float, default=15.0, help="max APE target, %% (default 15)")
    ap.add_argument("--median-limit", type=float, default=5.0, help="median APE target, %% (default 5)")
    ap.add_argument("--p90-limit", type=float, default=None,
                    help="p90 APE target, %% (default none): also counts the phase-blind oracle's runs within it")
    ap.add_argument("--out", type=Path, help="folder for noise_floor.csv")
    args = ap.parse_args()
    try:
        check_limit("--max-limit", args.max_limit)
        check_limit("--median-limit", args.median_limit)
        if args.p90_limit is not None:
            check_limit("--p90-limit", args.p90_limit)
        check_out(args.out)
        with tempfile.TemporaryDirectory() as tmp:
            past = [d for i, folder in enumerate(args.history)
                    for d in history_runs(folder, Path(tmp) / str(i), args.since)]
            if not args.runs and not past:
                raise BadInput("no runs: give run directories or --history FOLDER")
            runs = load_runs([*args.runs, *past])
            # a past version is named <folder>@<commit>, not by the temporary folder it was written to
            shown = {str(d): d.name for d in past}
            runs = {shown.get(name, name): df for name, df in runs.items()}
    except BadInput as err:  # one line, not a traceback
        print(f"{ap.prog}: error: {err}", file=sys.stderr)
        sys.exit(USAGE_EXIT_CODE)
    table = floor_table(runs, args.max_limit)

    console = Console()
    t = Table(title=f"noise floor of {len(table)} runs (APE %; a perfect model against these measurements)")
    cols = {"run": None, "points": None, "L3_median_pct": ".1f", "floor_median_pct": ".1f", "L3_max_pct": ".1f",
            "floor_max_median_pct": ".1f", "floor_max_p10_pct": ".1f", "floor_max_p90_pct": ".1f",
            "p_perfect_max_within": ".2f", "L3_share_beyond_2_sigma": ".0%", "oracle_median_pct": ".1f", "oracle_max_pct": ".1f",
            "oracle_share_beyond_2_sigma": ".0%", "blind_median_pct": ".1f", "blind_max_pct": ".1f"}
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
        blind = table["blind_median_pct"] <= args.median_limit
        console.print(f"the phase-blind oracle (other runs' median, no drift of this run: the best a held-out "
                      f"predictor can do without reading the phase) met median <= {args.median_limit:g}% in "
                      f"{blind.sum()} of {len(table)} runs (median of its medians "
                      f"{table['blind_median_pct'].median():.1f}%) and max <= {args.max_limit:g}% in "
                      f"{(table['blind_max_pct'] <= args.max_limit).sum()}; three in a row at that rate: "
                      f"{blind.mean() ** 3:.2f}")
        if args.p90_limit is not None:
            both = blind & (table["blind_p90_pct"] <= args.p90_limit)
            console.print(f"  median <= {args.median_limit:g}% and p90 <= {args.p90_limit:g}% together: {both.sum()} "
                          f"of {len(table)} runs; three in a row at that rate: {both.mean() ** 3:.2f}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "noise_floor.csv", index=False)
        console.print(f"wrote {args.out / 'noise_floor.csv'}")


if __name__ == "__main__":
    main()
