"""The manifest of committed results: one row per run folder, ``results/MANIFEST.csv``.

    python scripts/manifest.py                      # walks results/<machine>/<run>/, writes results/MANIFEST.csv
    python scripts/manifest.py --aggregate results/cpu_epyc/noise_floor_runs.csv results/cpu_epyc/moe_v*
    python scripts/manifest.py --explode results/cpu_epyc/noise_floor_runs.csv /tmp/runs   # back to run folders

``results/`` keeps one canonical run per experiment and machine (iteration runs stay in git
history); the manifest says where each came from. Columns:

- ``machine``, ``run``: the folder ``results/<machine>/<run>/``;
- ``experiment``: ``summary.json``'s ``experiment``;
- ``command``: the Hydra overrides of ``.hydra/overrides.yaml`` as a ``python -m sim`` line
  when the folder has one (the previous manifest's command where it contains that line and
  says more, e.g. "in a fresh clone, after make test"), else the command the previous
  manifest recorded, else ``python -m sim experiment=NAME`` from the summary;
- ``commit``: the code commit the run measured: ``details.run.commit`` (written by every
  experiment since ``experiments.run_provenance``; ``-dirty`` appended where the code differed
  from it), else a summary's ``commit`` or ``details.commit``, else the previous manifest;
- ``profile_fingerprint``: ``details.model_profile``, else the summary's ``device``;
- ``date``: when the run finished, ``details.run.finished_at``; for older runs the previous
  manifest's date, else when git last changed the run's ``summary.json`` (else the folder): ``git log -1 --format=%cI -- <path>``,
  so dropping ``.hydra`` copies or renaming nothing else moves it; outside git, the newest
  file's modification time;
- ``scoring``: ``details.scoring`` (``held-out``, ``replay``, ``lookup``); runs from before
  held-out scoring: ``replay (pre-held-out)`` when ``details.paired`` exists, else ``lookup``;
- ``median_L3_ape_pct``, ``p90_L3_ape_pct``, ``max_L3_ape_pct``: the summary's top-level L3
  errors (empty for predict-only runs);
- ``quoted``: the files of the folder that README.md or docs/*.md name (``(folder)`` where
  they name the folder itself).

Values the folder cannot give (a command or commit of a run whose ``.hydra`` was dropped, the
scoring and errors of a folder without a summary, such as a fit report) are kept from the
previous manifest, so hand-filled cells survive a rerun; ``quoted`` is always recomputed.

``--aggregate OUT RUN...`` gathers the per-point columns that ``scripts/noise_floor.py``
reads from several runs' ``results.csv`` into one CSV with a ``run`` column (the inputs of
the committed noise floors, whose run folders live in git history only); ``--explode CSV DIR``
writes them back as ``DIR/<run>/results.csv`` for ``noise_floor.py DIR/*``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

COLUMNS = ["machine", "run", "experiment", "command", "commit", "profile_fingerprint", "date", "scoring",
           "median_L3_ape_pct", "p90_L3_ape_pct", "max_L3_ape_pct", "quoted"]
#: columns kept from the previous manifest when the folder itself cannot give them (empty)
KEPT_FROM_PREVIOUS = ("experiment", "command", "commit", "profile_fingerprint", "scoring",
                      "median_L3_ape_pct", "p90_L3_ape_pct", "max_L3_ape_pct")
#: the per-point columns of a results.csv that the noise floors read (plus the run and the experiment)
NOISE_COLUMNS = ["label", "param", "value", "backend", "measured_s", "measured_iqr_s", "round_cv", "rounds_timed",
                 "pred_L0_s", "pred_L2_s", "pred_L3_s", "ape_L3_pct"]
DOC_GLOBS = ("README.md", "docs/*.md")


def read_overrides(run_dir: Path) -> list[str] | None:
    """The Hydra overrides of a run (``.hydra/overrides.yaml``: a YAML list of strings), or None."""
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    items = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("- "):
            value = line[2:].strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            items.append(value)
    return items


def command_from_overrides(overrides: list[str]) -> str:
    """``python -m sim`` with the run's overrides (``progress=false`` dropped: it changes no number)."""
    kept = [o for o in overrides if o != "progress=false"]
    return " ".join(["python -m sim", *kept])


def git_date(path: Path) -> str:
    """When git last changed ``path`` (ISO 8601), else the newest file's mtime, else ''."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%cI", "--", path.name], cwd=path.parent,
                             capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        out = ""
    if out:
        return out
    mtimes = [p.stat().st_mtime for p in files]
    if not mtimes:
        return ""
    return dt.datetime.fromtimestamp(max(mtimes), tz=dt.timezone.utc).isoformat(timespec="seconds")


def scoring_of(summary: dict[str, Any]) -> str:
    details = summary.get("details") or {}
    if details.get("scoring"):
        return str(details["scoring"])
    if "median_ape_pct" not in summary:  # no summary, or not an experiment's (a script's own)
        return ""
    return "replay (pre-held-out)" if "paired" in details else "lookup"


def commit_of(summary: dict[str, Any]) -> str:
    """``details.run.commit`` (``-dirty`` where the code differed), else an older summary's commit, else ''."""
    details = summary.get("details") or {}
    run = details.get("run") or {}
    if run.get("commit"):
        return str(run["commit"]) + ("-dirty" if run.get("dirty") else "")
    return str(summary.get("commit") or details.get("commit") or "")


def _l3(summary: dict[str, Any], key: str) -> str:
    value = (summary.get(key) or {}).get("L3")
    return "" if value is None else f"{float(value):.2f}"


def quoted_files(root: Path, machine: str, run: str) -> str:
    """The files under results/<machine>/<run>/ that the docs link to, ';'-separated."""
    pattern = re.compile(rf"results/{re.escape(machine)}/{re.escape(run)}/([A-Za-z0-9_.\-/]*)")
    found: set[str] = set()
    for glob in DOC_GLOBS:
        for doc in sorted(root.glob(glob)):
            found.update(m.group(1).rstrip(".") or "(folder)" for m in pattern.finditer(doc.read_text(errors="replace")))
    return ";".join(sorted(found))


def read_previous(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    if not path.is_file():
        return {}
    with path.open(newline="") as fh:
        return {(r["machine"], r["run"]): r for r in csv.DictReader(fh)}


def manifest_rows(results: Path, previous: dict[tuple[str, str], dict[str, str]] | None = None,
                  repo_root: Path | None = None) -> list[dict[str, str]]:
    """One row per ``results/<machine>/<run>/`` folder, sorted by machine and run."""
    previous = previous or {}
    repo_root = repo_root or results.parent
    rows = []
    for machine_dir in sorted(p for p in results.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for run_dir in sorted(p for p in machine_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            summary_path = run_dir / "summary.json"
            summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
            details = summary.get("details") or {}
            old = previous.get((machine_dir.name, run_dir.name), {})
            overrides = read_overrides(run_dir)
            experiment = summary.get("experiment") or old.get("experiment", "")
            run = details.get("run") or {}
            if overrides is not None:
                command = command_from_overrides(overrides)
                if command in old.get("command", ""):
                    command = old["command"]  # the same command, with the context written beside it
            elif old.get("command"):
                command = old["command"]
            elif experiment:
                command = f"python -m sim experiment={experiment}"
            else:
                command = ""
            rows.append({
                "machine": machine_dir.name,
                "run": run_dir.name,
                "experiment": experiment,
                "command": command,
                "commit": commit_of(summary),
                "profile_fingerprint": str(details.get("model_profile") or summary.get("device") or ""),
                "date": run.get("finished_at") or old.get("date") or git_date(summary_path if summary_path.is_file() else run_dir),
                "scoring": scoring_of(summary),
                "median_L3_ape_pct": _l3(summary, "median_ape_pct"),
                "p90_L3_ape_pct": _l3(summary, "p90_ape_pct"),
                "max_L3_ape_pct": _l3(summary, "max_ape_pct"),
                "quoted": quoted_files(repo_root, machine_dir.name, run_dir.name),
            })
            rows[-1].update({c: old[c] for c in KEPT_FROM_PREVIOUS if not rows[-1][c] and old.get(c)})
    return rows


def write_csv(rows: Iterable[dict[str, Any]], path: Path, columns: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def write_manifest(results: Path, out: Path | None = None, repo_root: Path | None = None) -> list[dict[str, str]]:
    out = out or results / "MANIFEST.csv"
    rows = manifest_rows(results, read_previous(out), repo_root)
    write_csv(rows, out, COLUMNS)
    return rows


def aggregate(run_dirs: Iterable[Path], out: Path) -> int:
    """The noise-floor columns of each run's results.csv, in one CSV with ``experiment`` and ``run``."""
    rows = []
    for d in run_dirs:
        summary_path = d / "summary.json"
        experiment = json.loads(summary_path.read_text()).get("experiment", "") if summary_path.is_file() else ""
        with (d / "results.csv").open(newline="") as fh:
            for r in csv.DictReader(fh):
                rows.append({"experiment": experiment, "run": d.name, **{c: r.get(c, "") for c in NOISE_COLUMNS}})
    write_csv(rows, out, ["experiment", "run", *NOISE_COLUMNS])
    return len(rows)


def explode(aggregated: Path, out_dir: Path) -> list[Path]:
    """``aggregate``'s CSV back into ``out_dir/<run>/results.csv`` (for scripts/noise_floor.py).
    A column empty in every row of a run is one that run never had (older runs did not record
    ``rounds_timed``) and is left out of its file, as the run wrote it."""
    by_run: dict[str, list[dict[str, str]]] = {}
    with aggregated.open(newline="") as fh:
        for r in csv.DictReader(fh):
            by_run.setdefault(r["run"], []).append({c: r[c] for c in NOISE_COLUMNS})
    written = []
    for run, rows in by_run.items():
        path = out_dir / run / "results.csv"
        columns = [c for c in NOISE_COLUMNS if any(r[c] != "" for r in rows)]
        write_csv([{c: r[c] for c in columns} for r in rows], path, columns)
        written.append(path.parent)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--out", type=Path, default=None, help="default: <results>/MANIFEST.csv")
    parser.add_argument("--aggregate", nargs="+", metavar=("OUT", "RUN"), default=None)
    parser.add_argument("--explode", nargs=2, metavar=("CSV", "DIR"), default=None)
    args = parser.parse_args(argv)
    if args.aggregate:
        if len(args.aggregate) < 2:
            parser.error("--aggregate OUT RUN [RUN ...]")
        out, *runs = map(Path, args.aggregate)
        missing = [str(r) for r in runs if not (r / "results.csv").is_file()]
        if missing:
            parser.error(f"no results.csv in {', '.join(missing)}")
        print(f"{out}: {aggregate(runs, out)} rows from {len(runs)} runs")
        return 0
    if args.explode:
        dirs = explode(Path(args.explode[0]), Path(args.explode[1]))
        print(f"{len(dirs)} run folders under {args.explode[1]}")
        return 0
    if not args.results.is_dir():
        parser.error(f"{args.results} is not a folder")
    out = args.out or args.results / "MANIFEST.csv"
    rows = write_manifest(args.results, out, repo_root=args.results.resolve().parent)
    print(f"{out}: {len(rows)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
