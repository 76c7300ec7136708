"""Reading a profile's measurements.csv row by row: every row checked, a bad one skipped
with its file, line and reason, never fitted on.

A row is rejected when

- it has more or fewer fields than the header (a file cut mid-row, two rows run together);
- a required cell is empty (``key``, ``round``, ``family``, ``median_s``) or a numeric cell
  is not a number (``round`` reading ``zero``, ``1.0418e-`` cut after the exponent sign);
- a number is out of its range (``median_s`` > 0, ``round`` an integer >= 0, ``runs`` >= 1...);
- its timing statistics contradict each other. Both come from the same per-block times,
  so two identities must hold: ``rel_iqr == iqr_s / median_s`` (its definition in
  ``costmodel.measure.timing.Measurement``), and ``median_s <= 2 * mean_s``, because at least half of
  n positive samples are >= their median, so their sum is >= n/2 * median. A median cut
  from ``1.0418e-05`` to ``1.0418`` (or any digit lost) breaks one of them;
- its descriptor fields do not build a descriptor (``costmodel.families.descriptor.from_record``, which
  checks each family's own ranges), or build one whose key is not the row's ``key``;
- an earlier row has the same (key, round): the last one is kept, as writers always did.

A rejected (key, round) is absent from the table, so the next bench measures it again and
its next write replaces it (the rejected text is kept in ``rejected.csv``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from costmodel.families import registered
from costmodel.families.descriptor import from_record, optional_fields

REQUIRED = ("key", "round", "family", "median_s")
#: numeric columns of a measurement row: (lowest allowed, lowest is allowed itself, integer)
NUMERIC_RANGES: dict[str, tuple[float, bool, bool]] = {
    "round": (0, True, True),
    "median_s": (0, False, False),
    "iqr_s": (0, True, False),
    "mean_s": (0, False, False),
    "cv": (0, True, False),
    "rel_iqr": (0, True, False),
    "runs": (1, True, True),
    "number_per_run": (1, True, True),
    "attempts": (1, True, True),
    "threads": (1, True, True),
    "flops": (0, True, False),
    "bytes_moved": (0, True, False),
}
INTEGER_COLUMNS = tuple(c for c, (_, _, integer) in NUMERIC_RANGES.items() if integer)
REL_TOL = 1e-6  # two decimal renderings of one float agree far better than this


class RowFileError(ValueError):
    """The file as a whole cannot be read (no header, not text, missing columns)."""


@dataclass(frozen=True)
class RejectedRow:
    """A row left out of the table: where it is, why, and its text as found."""

    file: str
    line: int
    reason: str
    key: str | None
    text: str

    def describe(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


def _descriptor_numeric_columns() -> set[str]:
    names: set[str] = set()
    for cls in (f.spec for f in registered()):
        names |= {f.name for f in dataclasses.fields(cls) if f.type in ("int", "float", "float | None")}
    return names


def _records(file: Path, text: str) -> tuple[list[str], list[tuple[int, list[str], str]]]:
    """(header, [(line, fields, raw text)]) of a CSV text; blank lines are left out."""
    lines = io.StringIO(text, newline="").readlines()
    reader = csv.reader(lines)
    out: list[tuple[int, list[str], str]] = []
    try:
        header = next(reader, None)
        if header is None:
            return [], []
        while True:
            start = reader.line_num
            try:
                fields = next(reader)
            except StopIteration:
                break
            if fields:
                out.append((start + 1, fields, "".join(lines[start:reader.line_num]).rstrip("\r\n")))
    except csv.Error as err:
        raise RowFileError(f"{file}:{reader.line_num}: cannot be read as CSV: {err}") from None
    return header, out


def read_rows(file: Path) -> tuple[pd.DataFrame, list[RejectedRow]]:
    """The valid rows of a measurements CSV (types as pandas reads them) and the rejected ones."""
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise RowFileError(f"{file} is not UTF-8 text (byte {err.start}): {err.reason}") from None
    header, records = _records(file, text)
    if not header:
        return pd.DataFrame(), []
    if len(set(header)) != len(header) or any(not h for h in header):
        raise RowFileError(f"{file}:1: the header has empty or repeated column names: {header}")
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise RowFileError(f"{file}:1: missing columns {missing} (a measurements table needs {list(REQUIRED)})")

    rejected: list[RejectedRow] = []
    good: list[tuple[int, list[str], str]] = []
    for line, fields, raw in records:
        if len(fields) != len(header):
            rejected.append(RejectedRow(str(file), line, f"has {len(fields)} fields where the header has "
                                        f"{len(header)} (the row was cut short or two rows ran together)",
                                        fields[0] if fields else None, raw))
        else:
            good.append((line, fields, raw))
    if not good:
        return pd.DataFrame(columns=header), rejected
    if rejected:  # rebuild a CSV of the good rows so pandas infers the types it always did
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(fields for _, fields, _ in good)
        frame = pd.read_csv(io.StringIO(buf.getvalue()))
    else:
        frame = pd.read_csv(io.StringIO(text))
    if len(frame) != len(good):  # pandas and csv disagree on record boundaries: trust csv
        frame = pd.DataFrame([fields for _, fields, _ in good], columns=header).replace("", np.nan)
    lines = np.array([line for line, _, _ in good])
    reasons = _row_problems(frame)
    bad = reasons.notna().to_numpy()
    for i in np.flatnonzero(bad):
        line, fields, raw = good[i]
        rejected.append(RejectedRow(str(file), int(line), str(reasons.iloc[i]), str(frame["key"].iloc[i]), raw))
    frame = frame[~bad].reset_index(drop=True)
    lines = lines[~bad]
    dup = frame.duplicated(["key", "round"], keep="last").to_numpy()
    if dup.any():
        last_line = {k: ln for k, ln in zip(zip(frame["key"], frame["round"]), lines)}
        for i in np.flatnonzero(dup):
            pair = (frame["key"].iloc[i], frame["round"].iloc[i])
            rejected.append(RejectedRow(str(file), int(lines[i]), f"duplicate of line {last_line[pair]} (same key and "
                                        f"round {pair[1]}); the later row is kept", str(pair[0]), _raw_text(good, lines[i])))
        frame = frame[~dup].reset_index(drop=True)
    for col in INTEGER_COLUMNS:
        if col in frame and frame[col].notna().all() and frame[col].dtype != np.int64:
            frame[col] = frame[col].astype(np.int64)
    rejected.sort(key=lambda r: r.line)
    return frame, rejected


def _raw_text(good: list[tuple[int, list[str], str]], line: int) -> str:
    return next(raw for ln, _, raw in good if ln == line)


def _first_problem(reasons: pd.Series, mask: Any, message: Any) -> None:
    """Record ``message`` for rows in ``mask`` that have no reason yet; ``message`` is text or
    a function returning per-row text (only called when some row fails)."""
    mask = pd.Series(mask, index=reasons.index).fillna(False).astype(bool) & reasons.isna()
    if mask.any():
        text = message() if callable(message) else message
        reasons[mask] = text[mask] if isinstance(text, pd.Series) else text


def _row_problems(frame: pd.DataFrame) -> pd.Series:
    """Per row: why it is rejected (None when it is valid). Coerces numeric columns in place."""
    reasons = pd.Series([None] * len(frame), index=frame.index, dtype=object)
    for col in REQUIRED:
        _first_problem(reasons, frame[col].isna(), f"{col} is empty")
    numeric = [c for c in frame.columns if c in NUMERIC_RANGES or c in _descriptor_numeric_columns()]
    for col in numeric:
        if not pd.api.types.is_numeric_dtype(frame[col]) or pd.api.types.is_bool_dtype(frame[col]):
            raw = frame[col]
            coerced = pd.to_numeric(raw.astype(object).where(raw.notna(), None), errors="coerce")
            _first_problem(reasons, coerced.isna() & raw.notna(),
                           lambda raw=raw, col=col: col + "=" + raw.astype(str).map(repr) + " is not a number")
            frame[col] = coerced
    for col, (low, inclusive, integer) in NUMERIC_RANGES.items():
        if col not in frame:
            continue
        v = frame[col].astype(float)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(v) & ((v >= low) if inclusive else (v > low))
            if integer:
                ok &= np.isfinite(v) & (v == np.round(v))
        allowed = f"{'an integer' if integer else 'a finite number'} {'>=' if inclusive else '>'} {low}"
        _first_problem(reasons, v.notna() & ~ok,
                       lambda v=v, col=col, allowed=allowed: col + "=" + v.astype(str) + f" is out of range (must be {allowed})")
    if {"rel_iqr", "iqr_s", "median_s"} <= set(frame.columns):
        ratio = frame["iqr_s"] / frame["median_s"]
        off = (frame["rel_iqr"] - ratio).abs() > REL_TOL * np.maximum(frame["rel_iqr"].abs(), ratio.abs()) + 1e-300
        _first_problem(reasons, off & frame["rel_iqr"].notna() & frame["iqr_s"].notna(),
                       lambda: "rel_iqr=" + frame["rel_iqr"].astype(str) + " is not iqr_s / median_s = "
                       + ratio.astype(str) + " (a timing value was damaged)")
    if {"mean_s", "median_s"} <= set(frame.columns):
        over = frame["median_s"] > 2 * frame["mean_s"] * (1 + REL_TOL)
        _first_problem(reasons, over & frame["mean_s"].notna(),
                       lambda: "median_s=" + frame["median_s"].astype(str) + " exceeds twice mean_s="
                       + frame["mean_s"].astype(str) + " (impossible for positive times: a value was damaged)")
    if "noisy" in frame and not pd.api.types.is_bool_dtype(frame["noisy"]):
        text = frame["noisy"].astype(str).str.strip().str.lower()
        _first_problem(reasons, frame["noisy"].notna() & ~text.isin(["true", "false", "1", "0", "1.0", "0.0"]),
                       lambda: "noisy=" + frame["noisy"].astype(str).map(repr) + " is not True or False")
        frame["noisy"] = text.isin(["true", "1", "1.0"])
    _check_descriptors(frame, reasons)
    return reasons


def _check_descriptors(frame: pd.DataFrame, reasons: pd.Series) -> None:
    """A row's descriptor fields must build a descriptor whose key is the row's key; each
    distinct (key, fields) combination is checked once (a kernel's rounds share it)."""
    names = {"key", "family"}
    for cls in (f.spec for f in registered()):
        names |= {f.name for f in dataclasses.fields(cls)}
    cols = [c for c in frame.columns if c in names]
    pending = reasons.isna().to_numpy()
    if not pending.any():
        return
    sub = frame.loc[pending, cols]
    ident = pd.util.hash_pandas_object(sub, index=False).to_numpy()
    _, first = np.unique(ident, return_index=True)
    problems = {ident[i]: _descriptor_problem(rec) for i, rec in zip(first, sub.iloc[first].to_dict("records"))}
    found = [problems[h] for h in ident]
    for i, problem in zip(sub.index, found):
        if problem is not None:
            reasons[i] = problem


def _descriptor_problem(rec: dict[str, Any]) -> str | None:
    family = rec["family"]
    specs = {f.name: f.spec for f in registered()}
    cls = specs.get(str(family))
    if cls is None:
        return f"family={family!r} is not a kernel family (known: {sorted(specs)})"
    optional = optional_fields(cls)
    for f in dataclasses.fields(cls):
        if f.name in optional:  # may be absent or empty: unset (costmodel.families.descriptor.OPTIONAL_TYPES)
            continue
        if f.name not in rec:
            return f"family {family!r} needs column {f.name!r}, which the file lacks"
        value = rec[f.name]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return f"{f.name} is empty (a {family} descriptor field)"
    try:
        spec = from_record(rec)
    except (ValueError, TypeError, OverflowError) as err:
        return f"descriptor fields are invalid: {str(err).splitlines()[0]}"
    if spec.key() != rec["key"]:
        return f"key {rec['key']!r} is not the key of the row's own descriptor fields ({spec.key()!r})"
    return None
