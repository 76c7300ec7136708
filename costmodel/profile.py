"""Device profile: the one hand-off between measuring and predicting.

A profile is a folder per device fingerprint under a root (config ``profile.root``)::

    <root>/<fingerprint id>/
        fingerprint.json    what machine and software the numbers belong to
        measurements.csv    tidy: one row per kernel and round (descriptor fields, FLOPs,
                            bytes, median/IQR/CV seconds, repeats, noisy flag, suite, time);
                            ``kernels()`` combines a kernel's rounds into one row
        ceilings.json       measured peak FLOP/s, memory bandwidth, per-call overhead
        skipped.csv         kernels not measured (e.g. too large for memory) and why
        provenance.json     every bench run that wrote here (command, config, versions), and
                            every freshness refresh (when, why, the per-family drift:
                            older rows of a refreshed family are scaled by it in fits)

Every file is written atomically (temp file + ``os.replace``), so an interrupted run
leaves the last complete table; a rerun resumes by skipping (kernel, round) pairs already
measured, never duplicating a row. Opening a profile checks the fingerprint: a profile from one
device is never mixed into, or used for, another.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from costmodel.device import Fingerprint, ProfileMismatchError
from costmodel.freshness import refresh_scale, refreshes
from costmodel.kernels import KernelSpec, from_record

MEASUREMENTS = "measurements.csv"
SKIPPED = "skipped.csv"
CEILINGS = "ceilings.json"
FINGERPRINT = "fingerprint.json"
PROVENANCE = "provenance.json"


class ProfileError(RuntimeError):
    """A profile is missing, empty or corrupted."""


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_write_csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write_text(path, frame.to_csv(index=False))


@dataclass
class DeviceProfile:
    """A profile folder opened for one fingerprint."""

    path: Path
    fingerprint: Fingerprint

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, root: str | Path, fp: Fingerprint, *, create: bool = True) -> "DeviceProfile":
        """The profile of ``fp`` under ``root``; refuses a folder holding another fingerprint."""
        path = Path(root) / fp.id
        fp_file = path / FINGERPRINT
        if fp_file.exists():
            stored = _read_fingerprint(fp_file)
            if stored != fp:
                raise ProfileMismatchError(
                    f"profile at {path} belongs to another fingerprint: {fp.differences(stored)}"
                )
        elif create:
            atomic_write_json(fp_file, fp.to_dict())
        else:
            raise ProfileError(
                f"no profile for this device at {path}; run `python -m costmodel bench` first "
                f"(device: {fp.describe()})"
            )
        return cls(path=path, fingerprint=fp)

    @classmethod
    def load(cls, path: str | Path, expected: Fingerprint | None = None) -> "DeviceProfile":
        """Open an existing profile folder; with ``expected``, refuse another device's."""
        path = Path(path)
        fp_file = path / FINGERPRINT
        if not fp_file.exists():
            raise ProfileError(f"{path} is not a device profile (no {FINGERPRINT})")
        stored = _read_fingerprint(fp_file)
        if expected is not None and stored != expected:
            raise ProfileMismatchError(
                f"profile at {path} was measured on another device or software stack; "
                f"differences (profile, this process): {stored.differences(expected)}"
            )
        return cls(path=path, fingerprint=stored)

    # ------------------------------------------------------------------ measurements
    def measurements(self) -> pd.DataFrame:
        """Every measured row: one per kernel and round (empty frame when none yet)."""
        file = self.path / MEASUREMENTS
        if not file.exists():
            return pd.DataFrame()
        try:
            frame = pd.read_csv(file)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
            raise ProfileError(f"{file} is corrupted: {err}") from None
        missing = {"key", "round", "family", "median_s"} - set(frame.columns)
        if missing:
            raise ProfileError(f"{file} is corrupted: missing columns {sorted(missing)}")
        if frame["median_s"].isna().any() or (frame["median_s"] <= 0).any():
            raise ProfileError(f"{file} is corrupted: median_s must be a positive number in every row")
        return frame

    def kernels(self) -> pd.DataFrame:
        """One row per kernel: its rounds combined (the table cost models are fitted on).

        ``median_s`` is the median of the round medians (rounds were measured in separate
        passes over the suite, so slow drift of a shared machine is averaged out),
        ``round_cv`` the coefficient of variation of the round medians (run-to-run noise),
        ``iqr_s`` the median within-round IQR, ``noisy`` whether any round was flagged.
        """
        return self._kernels_and_specs()[0]

    def _kernels_and_specs(self) -> tuple[pd.DataFrame, list[KernelSpec]]:
        raw = self.measurements()
        if raw.empty:
            return raw, []
        # rows of a family refreshed since they were measured follow the machine (freshness.py)
        scale = refresh_scale(raw, self.provenance())
        if (scale != 1.0).any():
            raw = raw.assign(median_s=raw["median_s"] * scale, refresh_scale=scale)
            if "iqr_s" in raw:
                raw["iqr_s"] = raw["iqr_s"] * scale
        g = raw.groupby("key", sort=False)
        first = g.first()
        first["median_s"] = g["median_s"].median()
        first["iqr_s"] = g["iqr_s"].median()
        first["rounds"] = g.size()
        first["round_cv"] = (g["median_s"].std(ddof=1) / g["median_s"].mean()).fillna(0.0)
        first["noisy"] = g["noisy"].any()
        first["rel_iqr"] = first["iqr_s"] / first["median_s"]
        table = first.reset_index().drop(columns=["round"])
        # FLOPs and bytes follow the descriptors' current formulas, not the ones in force
        # when a row was measured (the stored columns are a record of that time)
        specs = [from_record(r) for r in table.to_dict("records")]
        table["flops"] = [s.flops() for s in specs]
        table["bytes_moved"] = [s.bytes_moved() for s in specs]
        return table, specs

    def measured_rounds(self) -> set[tuple[str, int]]:
        """(key, round) pairs already in the profile."""
        frame = self.measurements()
        return set(zip(frame["key"], frame["round"].astype(int))) if len(frame) else set()

    def measured_keys(self) -> set[str]:
        frame = self.measurements()
        return set(frame["key"]) if len(frame) else set()

    def append_measurements(self, rows: Iterable[dict[str, Any]], *, replace: bool = False) -> int:
        """Add rows atomically; a (key, round) already present is kept (or replaced)."""
        new = pd.DataFrame(list(rows))
        if new.empty:
            return 0
        old = self.measurements()
        if len(old):
            ids_old = old["key"] + "#" + old["round"].astype(str)
            ids_new = new["key"] + "#" + new["round"].astype(str)
            if replace:
                old = old[~ids_old.isin(ids_new)]
            else:
                new = new[~ids_new.isin(ids_old)]
            frame = pd.concat([old, new], ignore_index=True)
        else:
            frame = new
        frame = frame.drop_duplicates(["key", "round"], keep="last")
        atomic_write_csv(self.path / MEASUREMENTS, frame)
        return len(new)

    def specs(self) -> list[KernelSpec]:
        """One descriptor per measured kernel, in ``kernels()`` order."""
        return self._kernels_and_specs()[1]

    # ------------------------------------------------------------------ skipped
    def skipped(self) -> pd.DataFrame:
        file = self.path / SKIPPED
        return pd.read_csv(file) if file.exists() else pd.DataFrame(columns=["key", "family", "reason"])

    def record_skipped(self, rows: Iterable[dict[str, Any]]) -> None:
        new = pd.DataFrame(list(rows))
        if new.empty:
            return
        frame = pd.concat([self.skipped(), new], ignore_index=True).drop_duplicates("key", keep="last")
        atomic_write_csv(self.path / SKIPPED, frame)

    # ------------------------------------------------------------------ ceilings
    def ceilings(self) -> dict[str, Any] | None:
        file = self.path / CEILINGS
        if not file.exists():
            return None
        try:
            return json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ProfileError(f"{file} is corrupted: {err}") from None

    def write_ceilings(self, ceilings: dict[str, Any]) -> None:
        atomic_write_json(self.path / CEILINGS, ceilings)

    # ------------------------------------------------------------------ provenance
    def provenance(self) -> list[dict[str, Any]]:
        """Every run that wrote here, oldest first ([] when none)."""
        file = self.path / PROVENANCE
        if not file.exists():
            return []
        try:
            runs = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ProfileError(f"{file} is corrupted: {err}") from None
        return runs if isinstance(runs, list) else []

    def add_provenance(self, entry: dict[str, Any]) -> None:
        file = self.path / PROVENANCE
        runs = json.loads(file.read_text(encoding="utf-8")) if file.exists() else []
        runs.append({"written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **entry})
        atomic_write_json(file, runs)

    def content_hash(self) -> str:
        """Hash of the measurements, ceilings and refresh records: a fitted model records
        which data it saw."""
        h = hashlib.sha256()
        for name in (MEASUREMENTS, CEILINGS):
            file = self.path / name
            if file.exists():
                h.update(file.read_bytes())
        records = refreshes(self.provenance())
        if records:  # profiles never refreshed keep the hash they always had
            h.update(json.dumps(records, sort_keys=True).encode())
        return h.hexdigest()[:16]


def _read_fingerprint(file: Path) -> Fingerprint:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        data.pop("id", None)
        return Fingerprint(**data)
    except (json.JSONDecodeError, TypeError) as err:
        raise ProfileError(f"{file} is corrupted: {err}") from None
