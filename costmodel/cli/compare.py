"""`python -m costmodel compare PROFILE_A PROFILE_B [--json OUT]`: run-to-run stability.

For the kernels both profiles measured, the relative difference of their medians
|a - b| / mean(a, b): its median and p90 over all kernels, over kernels slower than 1 ms,
and per family. Two bench runs of the same suite on the same machine give the noise floor
that every accuracy number in this project has to be read against.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from costmodel.store.profile import DeviceProfile


def stability(a: pd.DataFrame, b: pd.DataFrame, *, slow_s: float = 1e-3) -> dict[str, Any]:
    """Median/p90 relative difference between two kernel tables on their common keys."""
    joined = a[["key", "family", "median_s"]].merge(b[["key", "median_s"]], on="key", suffixes=("_a", "_b"))
    if joined.empty:
        raise ValueError("the two profiles have no kernel in common")
    rel = (joined["median_s_a"] - joined["median_s_b"]).abs() / ((joined["median_s_a"] + joined["median_s_b"]) / 2)
    joined = joined.assign(rel_diff=rel)
    slow = joined[(joined["median_s_a"] + joined["median_s_b"]) / 2 > slow_s]

    def stats(frame: pd.DataFrame) -> dict[str, Any]:
        if frame.empty:
            return {"n": 0, "median_rel_diff_pct": None, "p90_rel_diff_pct": None}
        return {"n": int(len(frame)), "median_rel_diff_pct": float(100 * frame["rel_diff"].median()),
                "p90_rel_diff_pct": float(100 * np.percentile(frame["rel_diff"], 90))}

    return {
        "all": stats(joined),
        f"slower_than_{slow_s * 1e3:g}ms": stats(slow),
        "per_family": {f: stats(g) for f, g in joined.groupby("family")},
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m costmodel compare", description=__doc__.splitlines()[0])
    parser.add_argument("profile_a", type=Path)
    parser.add_argument("profile_b", type=Path)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    a, b = DeviceProfile.load(args.profile_a), DeviceProfile.load(args.profile_b)
    if a.fingerprint != b.fingerprint:
        Console().print(f"[yellow]the profiles have different fingerprints: {a.fingerprint.differences(b.fingerprint)}[/]")
    result = stability(a.kernels(), b.kernels())
    table = Table(title=f"run-to-run difference of kernel medians: {args.profile_a.name} vs {args.profile_b.name}")
    for col in ("kernels", "n", "median |diff| %", "p90 |diff| %"):
        table.add_column(col, justify="right")
    rows = [(k, v) for k, v in result.items() if k != "per_family"] + list(result["per_family"].items())
    for name, s in rows:
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        table.add_row(name, str(s["n"]), fmt(s["median_rel_diff_pct"]), fmt(s["p90_rel_diff_pct"]))
    Console(width=120).print(table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
