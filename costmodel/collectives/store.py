"""Collective profiles: measured collectives stored beside the host's device profile.

One folder per (device fingerprint, backend, world size, placement)::

    <profile_root>/<device fingerprint id>/collectives/<backend>-w<W>-<placement>/
        fingerprint.json    the device fingerprint plus backend, world size, placement,
                            threads per rank, transport; ``id`` hashes all of it
        measurements.csv    one row per (collective, timing protocol, rank, run): the message,
                            the bytes the rank moved (spec.py's formulas), its median/mean/IQR
                            seconds, and the same of the max over ranks per repeat
        .lock               taken around every write

Placement is ``cores<a>-<b>...`` (rank r pinned to the r-th listed core) or ``unpinned``.
Appending reads the file inside the lock, concatenates, and replaces the file atomically
(``costmodel.store.profile.atomic_write_csv``): every run's rows are kept (a rerun adds rows with a
new ``run_id``; nothing already measured is lost), two writers never lose each other's rows.
A folder whose fingerprint differs from the one asked for is refused, never mixed.

``protocol`` (``warm`` or ``step``, ``costmodel.collectives.suite``), ``mean_s`` and
``max_over_ranks_mean_s`` came later: rows written before them read as ``warm`` rows without
a mean.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from costmodel.measure.device import Fingerprint, ProfileMismatchError
from costmodel.store.profile import atomic_write_csv, atomic_write_json

try:  # the filelock package where installed, else the project's flock helper
    from filelock import FileLock, Timeout as _LockTimeout

    def _locked(path: Path, timeout_s: float = 120.0):
        return FileLock(str(path), timeout=timeout_s)
except ImportError:  # pragma: no cover - filelock is installed here
    from costmodel.store.locks import file_lock

    def _locked(path: Path, timeout_s: float = 120.0):
        return file_lock(path, timeout_s=timeout_s, what="writing a collective profile")

MEASUREMENTS = "measurements.csv"
FINGERPRINT = "fingerprint.json"
LOCK = ".lock"
SUBDIR = "collectives"
COLUMNS = ("run_id", "measured_at", "suite", "key", "op", "pattern", "world_size", "backend", "dtype", "rank",
           "nominal_bytes", "message_bytes", "send_matrix", "bytes_sent", "bytes_recv", "bytes_moved", "bytes_home",
           "max_rank_bytes_moved", "warmup", "repeats", "median_s", "iqr_s", "min_s", "rel_iqr", "noisy",
           "max_over_ranks_median_s", "max_over_ranks_iqr_s", "protocol", "mean_s", "max_over_ranks_mean_s")
#: columns a file written before them lacks, and what its rows read as
LATER_COLUMNS = {"protocol": "warm", "mean_s": float("nan"), "max_over_ranks_mean_s": float("nan")}
NUMERIC = ("world_size", "rank", "nominal_bytes", "message_bytes", "bytes_sent", "bytes_recv", "bytes_moved",
           "bytes_home", "max_rank_bytes_moved", "warmup", "repeats", "median_s", "iqr_s", "min_s", "rel_iqr",
           "max_over_ranks_median_s", "max_over_ranks_iqr_s")


class CollectiveProfileError(RuntimeError):
    """A collective profile that is missing, unreadable, or belongs to another setup."""


def placement_name(cores: tuple[int, ...] | None, keep_awake: bool = False) -> str:
    """``cores0-1`` (rank r on core r), ``cores0-1-awake`` when the cores were kept awake
    (``costmodel.collectives.awake``: a different machine state, so a different profile), or
    ``unpinned``."""
    if cores is None:
        return "unpinned"
    return "cores" + "-".join(str(c) for c in cores) + ("-awake" if keep_awake else "")


def collective_fingerprint(device: Fingerprint, *, backend: str, world_size: int, placement: str) -> dict[str, Any]:
    body = {"device": device.to_dict(), "backend": backend, "world_size": int(world_size), "placement": placement,
            "threads_per_rank": 1, "transport": "tcp 127.0.0.1 (one host)"}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:10]
    return {**body, "id": f"{backend}-w{world_size}-{placement}-{digest}"}


def folder_for(profile_root: str | Path, device: Fingerprint, *, backend: str, world_size: int,
               placement: str) -> Path:
    return Path(profile_root) / device.id / SUBDIR / f"{backend}-w{world_size}-{placement}"


@dataclass
class CollectiveProfile:
    path: Path
    fingerprint: dict[str, Any]

    @classmethod
    def open(cls, profile_root: str | Path, device: Fingerprint, *, backend: str, world_size: int,
             placement: str, create: bool = True) -> "CollectiveProfile":
        fp = collective_fingerprint(device, backend=backend, world_size=world_size, placement=placement)
        path = folder_for(profile_root, device, backend=backend, world_size=world_size, placement=placement)
        fp_file = path / FINGERPRINT
        if fp_file.is_file():
            stored = json.loads(fp_file.read_text())
            if stored.get("id") != fp["id"]:
                diff = {k: (stored.get(k), fp[k]) for k in fp if stored.get(k) != fp[k]}
                raise ProfileMismatchError(f"collective profile {path} belongs to another setup "
                                           f"(stored vs this host: {diff}); it is never mixed with this one")
        elif create:
            atomic_write_json(fp_file, fp)
        else:
            raise CollectiveProfileError(f"no collective profile at {path}")
        return cls(path=path, fingerprint=fp)

    @classmethod
    def load(cls, path: str | Path) -> "CollectiveProfile":
        path = Path(path)
        fp_file = path / FINGERPRINT
        if not fp_file.is_file():
            raise CollectiveProfileError(f"{path} holds no {FINGERPRINT}: not a collective profile")
        return cls(path=path, fingerprint=json.loads(fp_file.read_text()))

    def measurements(self) -> pd.DataFrame:
        f = self.path / MEASUREMENTS
        if not f.is_file():
            return pd.DataFrame(columns=list(COLUMNS))
        # run ids are 12 hex digits: read as text, or an all-digit id (1 run in ~290) reads as an integer
        frame = pd.read_csv(f, keep_default_na=False, na_values=[""], dtype={"run_id": str})
        for c, default in LATER_COLUMNS.items():
            frame[c] = frame[c] if c in frame.columns else default
        frame["protocol"] = frame["protocol"].fillna("warm")
        for c in ("mean_s", "max_over_ranks_mean_s"):
            frame[c] = pd.to_numeric(frame[c], errors="coerce")
        missing = [c for c in COLUMNS if c not in frame.columns]
        if missing:
            raise CollectiveProfileError(f"{f} lacks column(s) {missing}")
        for c in NUMERIC:
            frame[c] = pd.to_numeric(frame[c], errors="coerce")
        bad = frame[list(NUMERIC)].isna().any(axis=1) | (frame["median_s"] <= 0)
        if bad.any():
            frame = frame[~bad]  # a cut-short row is left out, never fitted
        return frame.reset_index(drop=True)

    def append(self, rows: Iterable[dict[str, Any]]) -> int:
        """Add rows, keeping every row already stored; returns the rows now in the file."""
        new = pd.DataFrame(list(rows), columns=list(COLUMNS))
        self.path.mkdir(parents=True, exist_ok=True)
        with _locked(self.path / LOCK):
            f = self.path / MEASUREMENTS
            old = pd.read_csv(f, dtype=str, keep_default_na=False) if f.is_file() else None
            frame = new.astype(str) if old is None else pd.concat([old, new.astype(str)], ignore_index=True)
            atomic_write_csv(f, frame)
        return len(frame)
