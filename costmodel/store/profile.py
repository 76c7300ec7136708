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
        rejected.csv        rows of measurements.csv that failed validation, as found
        .lock               taken by writers (empty when nobody writes)

Concurrent and interrupted writers. Every change is a read-merge-write under an exclusive
``flock`` on ``.lock`` (``costmodel.store.locks.file_lock``): the writer re-reads the file inside
the lock, merges on the primary key ((key, round) for measurements, key for skipped
kernels; ceilings.json changes through ``update_ceilings``, one read-modify-write under
the lock), and replaces the file atomically (temp file + ``os.replace``). So two processes
writing one profile at once (two terminals, two multirun jobs on a shared file system)
lose no row and duplicate none, a killed writer leaves the last complete file, and readers
never lock (they see the old or the new file, never half of one). A rerun resumes by
skipping (kernel, round) pairs already measured. The CSV stays the store because it is
committed to git as evidence and read by people; SQLite would add little here (its own
documentation warns that its locking is unreliable on many network file systems).

Reading validates every row (``costmodel.store.profile_rows``): a row that fails (a file cut
mid-row, a number cut short, a value out of range, contradicting timing statistics, a
descriptor that does not build) is left out with a warning naming file:line and why, so
nothing is fitted on it and the next bench measures that (key, round) again. Reading never
changes a file's bytes. Opening a profile checks the fingerprint: a profile from one device
is never mixed into, or used for, another.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from costmodel.families.descriptor import KernelSpec, from_record
from costmodel.measure.device import Fingerprint, ProfileMismatchError
from costmodel.measure.freshness import refresh_scale, refreshes
from costmodel.model.features import roofline_time_s
from costmodel.store.locks import file_lock
from costmodel.store.profile_rows import RejectedRow, RowFileError, read_rows

log = logging.getLogger(__name__)

MEASUREMENTS = "measurements.csv"
SKIPPED = "skipped.csv"
CEILINGS = "ceilings.json"
FINGERPRINT = "fingerprint.json"
PROVENANCE = "provenance.json"
REJECTED = "rejected.csv"
LOCK = ".lock"
#: files written only under the profile lock: a temp file of theirs found under the lock
#: was left by a killed writer
LOCKED_FILES = (MEASUREMENTS, SKIPPED, CEILINGS, PROVENANCE, REJECTED)
WARN_ROWS = 10  # rejected rows named one by one; the rest are counted


class ProfileError(RuntimeError):
    """A profile is missing, empty or corrupted."""


def _umask() -> int:
    """This process's umask, read without changing it where Linux allows."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``path`` via a temp file and ``os.replace``: readers see the old or the new file.

    The file gets the mode a plain ``open`` would give (0666 less the umask), not
    ``mkstemp``'s 0600, so a profile stays readable by the group as before.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_write_csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write_text(path, frame.to_csv(index=False))


def check_profile_root(root: Path, *, setting: str = "profile.root") -> None:
    """A clear error when the profile root is not a folder (a file, or under one)."""
    for parent in (root, *root.parents):
        if parent.exists():
            if not parent.is_dir():
                raise ProfileError(f"{setting}={root} cannot be a folder: {parent} is a file; set {setting} to "
                                   "a folder (it is created if missing)")
            return


@dataclass
class DeviceProfile:
    """A profile folder opened for one fingerprint."""

    path: Path
    fingerprint: Fingerprint
    #: the last parse of measurements.csv: (file identity, valid rows, rejected rows)
    _parsed: tuple[tuple[int, int, int], pd.DataFrame, list[RejectedRow]] | None = field(
        default=None, repr=False, compare=False)

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, root: str | Path, fp: Fingerprint, *, create: bool = True) -> "DeviceProfile":
        """The profile of ``fp`` under ``root``; refuses a folder holding another fingerprint."""
        check_profile_root(Path(root))
        path = Path(root) / fp.id
        fp_file = path / FINGERPRINT
        if fp_file.exists():
            stored = _read_fingerprint(fp_file)
            if stored != fp:
                raise ProfileMismatchError(
                    f"profile at {path} belongs to another fingerprint: {fp.differences(stored)}"
                )
        elif create:
            profile = cls(path=path, fingerprint=fp)
            profile.require_writable("create this device's profile", setting=f"profile.root={root}")
            with profile.locked("creating the profile"):
                if not fp_file.exists():
                    atomic_write_json(fp_file, fp.to_dict())
            return cls.open(root, fp, create=False)
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

    # ------------------------------------------------------------------ writing safely
    def require_writable(self, why: str, *, setting: str | None = None) -> None:
        """Raise a clear ``ProfileError`` now, before long work, if this profile cannot be written."""
        where = setting or f"profile folder {self.path}"
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".write-check.", suffix=".tmp")
            os.close(fd)
            os.unlink(tmp)
        except OSError as err:
            raise ProfileError(
                f"cannot {why}: {where} is not writable ({err.strerror or err}: {err.filename or self.path}); "
                "set profile.root to a folder you can write, or copy the profile there"
            ) from None

    @contextmanager
    def locked(self, what: str = "writing the profile") -> Iterator[None]:
        """Exclusive lock on this profile's files (for a read-merge-write); removes temp files
        that killed writers left behind."""
        self.path.mkdir(parents=True, exist_ok=True)
        with file_lock(self.path / LOCK, what=what):
            for name in LOCKED_FILES:
                for stale in self.path.glob(f".{name}.*.tmp"):
                    stale.unlink(missing_ok=True)
            yield

    # ------------------------------------------------------------------ measurements
    def measurements(self) -> pd.DataFrame:
        """Every valid measured row: one per kernel and round (empty frame when none yet).

        Rows that fail validation are left out with a warning naming file:line and why
        (``rejected()`` lists them); a file that cannot be read at all is a ``ProfileError``.
        """
        return self._read()[0].copy()

    def rejected(self) -> list[RejectedRow]:
        """Rows of measurements.csv left out by the last read, with file, line and reason."""
        return list(self._read()[1])

    def _read(self, *, fresh: bool = False) -> tuple[pd.DataFrame, list[RejectedRow]]:
        """Parsed measurements, reused while the file is unchanged (``fresh``: parse anyway)."""
        file = self.path / MEASUREMENTS
        try:
            st = file.stat()
        except FileNotFoundError:
            return pd.DataFrame(), []
        ident = (st.st_ino, st.st_size, st.st_mtime_ns)
        if not fresh and self._parsed is not None and self._parsed[0] == ident:
            return self._parsed[1], self._parsed[2]
        try:
            frame, rejected = read_rows(file)
        except RowFileError as err:
            raise ProfileError(f"{err}; the profile cannot be used until the file is fixed or removed") from None
        if rejected:
            for r in rejected[:WARN_ROWS]:
                log.warning("%s; row skipped (that kernel and round will be measured again by the next bench)",
                            r.describe())
            if len(rejected) > WARN_ROWS:
                log.warning("%s: %d more rows skipped for the same kinds of reasons", file, len(rejected) - WARN_ROWS)
        self._parsed = (ident, frame, rejected)
        return frame, rejected

    def kernels(self, *, ignore_refresh_policies: tuple[str, ...] = ()) -> pd.DataFrame:
        """One row per kernel: its rounds combined (the table cost models are fitted on).

        ``median_s`` is the median of the round medians (rounds were measured in separate
        passes over the suite, so slow drift of a shared machine is averaged out),
        ``round_cv`` the coefficient of variation of the round medians (run-to-run noise),
        ``iqr_s`` the median within-round IQR, ``noisy`` whether any round was flagged.
        Refresh records whose ``policy`` is in ``ignore_refresh_policies`` scale nothing
        (held-out scoring ignores the ``paired`` ones: their drift was read off an
        experiment's own kernels, ``sim.predict.heldout``).
        """
        return self._kernels_and_specs(ignore_refresh_policies)[0]

    def _kernels_and_specs(self, ignore_refresh_policies: tuple[str, ...] = ()
                           ) -> tuple[pd.DataFrame, list[KernelSpec]]:
        provenance = self.provenance()
        if ignore_refresh_policies:
            provenance = [e for e in provenance
                          if (e.get("refresh") or {}).get("policy") not in ignore_refresh_policies]
        return combine_rounds(self.measurements(), provenance, self.ceilings())

    def measured_rounds(self) -> set[tuple[str, int]]:
        """(key, round) pairs already in the profile (valid rows only)."""
        frame = self._read()[0]
        return set(zip(frame["key"], frame["round"].astype(int))) if len(frame) else set()

    def measured_keys(self) -> set[str]:
        frame = self._read()[0]
        return set(frame["key"]) if len(frame) else set()

    def append_measurements(self, rows: Iterable[dict[str, Any]], *, replace: bool | str = False) -> int:
        """Merge rows into measurements.csv under the profile lock; returns how many were added.

        A (key, round) already present is kept (or, with ``replace``, replaced; with
        ``replace="key"`` every older row of a written kernel goes, so a re-measurement with
        fewer rounds than the last leaves none of the old rounds behind). The file is
        re-read inside the lock, so rows another process wrote meanwhile are kept; rows that
        fail validation are dropped from it and kept in rejected.csv.
        """
        if replace not in (False, True, "key"):
            raise ValueError(f"replace must be False, True or 'key', got {replace!r}")
        new = pd.DataFrame(list(rows))
        if new.empty:
            return 0
        new = new.drop_duplicates(["key", "round"], keep="last")
        with self.locked("adding measurements"):
            old, rejected = self._read(fresh=True)  # never a stale cache: another writer may have been here
            if len(old):
                ids_old = old["key"] + "#" + old["round"].astype(int).astype(str)
                ids_new = new["key"] + "#" + new["round"].astype(int).astype(str)
                if replace == "key":
                    old = old[~old["key"].isin(new["key"])]
                elif replace:
                    old = old[~ids_old.isin(ids_new)]
                else:
                    new = new[~ids_new.isin(ids_old)]
                frame = pd.concat([old, new], ignore_index=True) if len(new) else old
            else:
                frame = new
            if len(new) or rejected:
                if rejected:
                    self._keep_rejected(rejected)
                atomic_write_csv(self.path / MEASUREMENTS, frame)
        return len(new)

    def drop_measurements(self, keys: Iterable[str], *, measured_before: str) -> int:
        """Remove, under the profile lock, the rows of ``keys`` measured before ``measured_before``
        (``%Y-%m-%dT%H:%M:%S``, as rows are stamped): what a re-measurement by a corrected runner
        replaces (``scripts/bench_runner_layout.py``). Returns how many rows went. A key none of
        whose rows is newer keeps its rows: a kernel is never left unmeasured."""
        keys = set(keys)
        with self.locked("dropping replaced measurements"):
            frame, _ = self._read(fresh=True)
            if frame.empty:
                return 0
            when = frame["measured_at"].astype(str)
            newer = set(frame.loc[frame["key"].isin(keys) & (when >= measured_before), "key"])
            drop = frame["key"].isin(newer) & (when < measured_before)
            if drop.any():
                atomic_write_csv(self.path / MEASUREMENTS, frame[~drop])
            return int(drop.sum())

    def _keep_rejected(self, rejected: list[RejectedRow]) -> None:
        """Append rows dropped from measurements.csv to rejected.csv (under the lock)."""
        file = self.path / REJECTED
        old = _read_csv(file, required=("line", "reason", "text")) if file.exists() else pd.DataFrame()
        now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        new = pd.DataFrame([{"rejected_at": now, "file": MEASUREMENTS, "line": r.line, "key": r.key,
                             "reason": r.reason, "text": r.text} for r in rejected])
        atomic_write_csv(file, pd.concat([old, new], ignore_index=True))
        log.warning("%d invalid rows moved from %s to %s", len(rejected), self.path / MEASUREMENTS, file)

    def specs(self) -> list[KernelSpec]:
        """One descriptor per measured kernel, in ``kernels()`` order."""
        return self._kernels_and_specs()[1]

    # ------------------------------------------------------------------ skipped
    def skipped(self) -> pd.DataFrame:
        file = self.path / SKIPPED
        if not file.exists():
            return pd.DataFrame(columns=["key", "family", "reason"])
        return _read_csv(file, required=("key", "reason"))

    def record_skipped(self, rows: Iterable[dict[str, Any]]) -> None:
        """Merge skipped kernels (by key, the latest reason wins) under the profile lock."""
        new = pd.DataFrame(list(rows))
        if new.empty:
            return
        with self.locked("recording skipped kernels"):
            frame = pd.concat([self.skipped(), new], ignore_index=True).drop_duplicates("key", keep="last")
            atomic_write_csv(self.path / SKIPPED, frame)

    # ------------------------------------------------------------------ ceilings
    def ceilings(self) -> dict[str, Any] | None:
        file = self.path / CEILINGS
        if not file.exists():
            return None
        try:
            return json.loads(file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ProfileError(f"{file} is corrupted: {err}") from None

    def write_ceilings(self, ceilings: dict[str, Any], *, replace: bool = True) -> dict[str, Any]:
        """Store ceilings under the profile lock and return what the profile now holds: with
        ``replace=False`` ceilings another process stored first are kept (and returned)."""
        with self.locked("writing ceilings"):
            if not replace:
                stored = self.ceilings()
                if stored is not None:
                    return stored
            atomic_write_json(self.path / CEILINGS, ceilings)
            return ceilings

    def update_ceilings(self, change: Callable[[dict[str, Any]], dict[str, Any]], what: str = "updating ceilings"
                        ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Read-modify-write of ceilings.json under one hold of the profile lock, so a value
        another process stored between a read and a write is never lost: ``change`` gets
        the stored ceilings (``{}`` when none) and returns the new ones. Returns (before,
        after)."""
        with self.locked(what):
            before = self.ceilings() or {}
            after = change(dict(before))
            atomic_write_json(self.path / CEILINGS, after)
            return before, after

    # ------------------------------------------------------------------ provenance
    def provenance(self) -> list[dict[str, Any]]:
        file = self.path / PROVENANCE
        if not file.exists():
            return []
        try:
            runs = json.loads(file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ProfileError(f"{file} is corrupted: {err}") from None
        if not isinstance(runs, list):
            raise ProfileError(f"{file} is corrupted: expected a list of runs, found {type(runs).__name__}")
        return runs

    def add_provenance(self, entry: dict[str, Any]) -> None:
        """Append one run's record under the profile lock (a corrupted file is set aside, not lost)."""
        file = self.path / PROVENANCE
        with self.locked("adding provenance"):
            try:
                runs = self.provenance()
            except ProfileError as err:
                aside = file.with_name(f"{PROVENANCE}.corrupted-{time.strftime('%Y%m%dT%H%M%S')}")
                os.replace(file, aside)
                log.warning("%s; moved it to %s and started a new one", err, aside)
                runs = []
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


def _read_csv(file: Path, *, required: tuple[str, ...]) -> pd.DataFrame:
    try:
        frame = pd.read_csv(file)
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise ProfileError(f"{file} is corrupted: {err}") from None
    except pd.errors.EmptyDataError:
        return pd.DataFrame(columns=list(required))
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ProfileError(f"{file} is corrupted: missing columns {missing}")
    return frame


def _read_fingerprint(file: Path) -> Fingerprint:
    """The stored fingerprint, its fields checked and its id recomputed: a file whose id
    its fields do not give is refused (``InconsistentFingerprintError``), a malformed one
    is a ``ProfileError``."""
    try:
        return Fingerprint.from_stored(json.loads(file.read_text(encoding="utf-8")), source=str(file))
    except (ValueError, TypeError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ProfileError(f"{file} is corrupted: {err}") from None


def combine_rounds(raw: pd.DataFrame, provenance: Sequence[Mapping[str, Any]], ceilings: dict[str, Any] | None
                   ) -> tuple[pd.DataFrame, list[KernelSpec]]:
    """Measured rows (one per kernel and round) to one row per kernel, each row first scaled
    by the refresh records of ``provenance`` (``refresh_scale``, bounded by the roofline of
    ``ceilings``); with the descriptors. ``DeviceProfile.kernels`` is this on the whole profile."""
    if raw.empty:
        return raw, []
    # rows of a family refreshed since they were measured follow the machine (freshness.py)
    scale = roofline_bounded(raw, refresh_scale(raw, provenance), ceilings)
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


def roofline_bounded(raw: pd.DataFrame, scale: np.ndarray, ceilings: dict[str, Any] | None) -> np.ndarray:
    """Refresh scales, bounded so that no scaled row runs faster than its roofline time
    (``max(FLOPs / peak, bytes / bandwidth) + overhead``, ``roofline_time_s``) when the row
    as measured respected it. A sitting no refresh ever re-measured gets the product of every
    later refresh's ratio for its family and latency regime, each a median over a few
    re-measured kernels on a VM that changes speed: on the EPYC profile 20 such products took
    `hf_moe`'s 2 GB index_select rows from 58 ms as measured to 11 ms, 180 GB/s against a
    39 GB/s copy ceiling. Rows that beat the roofline as measured (cache-resident kernels)
    are left to their scales; without ceilings nothing is bounded."""
    if not ceilings or not len(raw) or not {"flops", "bytes_moved"} <= set(raw.columns):
        return scale
    measured = raw["median_s"].to_numpy(dtype=np.float64)
    roof = roofline_time_s(raw["flops"].to_numpy(dtype=np.float64), raw["bytes_moved"].to_numpy(dtype=np.float64),
                           ceilings)
    floor = np.where(measured >= roof, roof / measured, 0.0)
    return np.maximum(scale, floor)
