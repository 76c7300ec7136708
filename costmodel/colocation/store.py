"""``colocation.json`` in a device profile folder, and the factors read from it.

The file holds the latest measurement (``current``) and every earlier one (``history``,
oldest first): a re-measurement moves the current entry into the history, never drops it.
It is written under the profile's lock, through a temp file and ``os.replace``
(``costmodel.store.profile.atomic_write_json``), so a reader sees the old or the new file.

An entry (``costmodel.colocation.measure``) records when and where it was measured: the
placement (``cores``: rank r pinned to ``cores[r]``, rank 0 measured, the others its twins;
``world_size``; its ``id``, e.g. ``cores0-1-w2``), the device fingerprint id, the timing, the
machine load before and after, and per family the kernels measured (descriptor key, bytes,
profiled median, alone and beside medians and IQRs per round, the ratio) and the family's
factor = median over its kernels of median(beside) / median(alone).

``load_colocation(profile)`` returns ``ColocationFactors`` (or None when nothing was
measured): ``.factor(family, bytes_moved)`` multiplies a prediction for a kernel of that
family running while its twins run on the other cores. With the kernel's bytes it is the
measured kernels' ratios interpolated in log2 bytes (piecewise linear, held at the smallest
and largest measured kernel beyond them): a kernel inside the caches barely notices its
twin, a kernel streaming from memory shares the bandwidth (EPYC VM: gather 1.00x at 200 B,
1.10x at 2 MB; scatter 1.24x at 2 MB; a partitioned GNN layer of 128 MB per rank 1.24x).
Without bytes, or for a family with one measured size, it is the family's median ratio. A
family that was not measured gets 1.0, with a warning the first time and a line in
``describe()``.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

log = logging.getLogger(__name__)

FILE = "colocation.json"
SCHEMA = 1


class ColocationError(ValueError):
    """A co-location request or file that cannot be used as asked."""


def placement_id(cores: tuple[int, ...]) -> str:
    return "cores" + "-".join(str(c) for c in cores) + f"-w{len(cores)}"


@dataclass
class ColocationFactors:
    """Per-family slow-down of a kernel that runs while its twins run on the other cores."""

    factors: dict[str, float]  # family -> median ratio beside / alone
    placement: dict[str, Any]  # cores, world_size, id
    measured_at: str
    source: str  # the file it was read from ("" when built by hand)
    kernels: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # family -> per-kernel records
    unmeasured: set[str] = field(default_factory=set)  # families asked for that had no factor

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any], source: str = "") -> "ColocationFactors":
        fams = entry.get("families") or {}
        return cls(factors={f: float(v["factor"]) for f, v in fams.items()}, placement=dict(entry.get("placement") or {}),
                   measured_at=str(entry.get("measured_at", "")), source=source,
                   kernels={f: list(v.get("kernels") or []) for f, v in fams.items()})

    @classmethod
    def constant(cls, factors: Mapping[str, float], *, placement: Mapping[str, Any] | None = None) -> "ColocationFactors":
        """Factors given by hand (tests, what-ifs)."""
        for f, v in factors.items():
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
                raise ColocationError(f"colocation factor of family {f!r} must be a number > 0, got {v!r}")
        return cls(factors={f: float(v) for f, v in factors.items()}, placement=dict(placement or {}),
                   measured_at="", source="given")

    def factor(self, family: str, bytes_moved: float | None = None) -> float:
        """The factor of a ``family`` kernel moving ``bytes_moved`` bytes: its measured kernels'
        ratios interpolated in log2 bytes (held flat beyond them), the family's median without
        bytes or with one measured size; 1.0 (no slow-down) for a family not measured, said once."""
        if family in self.factors:
            curve = self._curve(family)
            if bytes_moved is None or curve is None:
                return self.factors[family]
            xs, ys = curve
            return float(np.interp(math.log2(1.0 + max(float(bytes_moved), 0.0)), xs, ys))
        if family not in self.unmeasured:
            self.unmeasured.add(family)
            log.warning("colocation: family %r was not measured (%s); its kernels are predicted as alone (factor 1.0)",
                        family, self.source or "factors given by hand")
        return 1.0

    def _curve(self, family: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(log2(1 + bytes), ratio) of the family's measured kernels by bytes, ratios of kernels of
        equal bytes averaged; None with fewer than two sizes."""
        by_bytes: dict[float, list[float]] = {}
        for k in self.kernels.get(family, []):
            b, r = k.get("bytes_moved"), k.get("ratio")
            if isinstance(b, (int, float)) and isinstance(r, (int, float)) and r > 0 and b >= 0:
                by_bytes.setdefault(math.log2(1.0 + float(b)), []).append(float(r))
        if len(by_bytes) < 2:
            return None
        xs = np.array(sorted(by_bytes))
        return xs, np.array([float(np.mean(by_bytes[x])) for x in xs])

    def describe(self) -> str:
        where = self.placement.get("id", "?")
        head = f"co-location factors ({where}, measured {self.measured_at or 'n/a'}, {self.source or 'given'}):"
        parts = []
        for f, v in sorted(self.factors.items()):
            curve = self._curve(f)
            if curve is None:
                parts.append(f"{f} {v:.2f}x")
            else:
                lo, hi = (float(np.exp2(x) - 1) for x in (curve[0][0], curve[0][-1]))
                parts.append(f"{f} {curve[1][0]:.2f}x at {_size(lo)} .. {curve[1][-1]:.2f}x at {_size(hi)}")
        text = head + " " + (", ".join(parts) if parts else "none")
        if self.unmeasured:
            text += f"; not measured (1.0): {', '.join(sorted(self.unmeasured))}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"factors": dict(sorted(self.factors.items())), "placement": self.placement,
                "measured_at": self.measured_at, "source": self.source, "unmeasured": sorted(self.unmeasured)}


def _size(n_bytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes:.0f} B"


def _folder(profile: Any) -> Path:
    return Path(getattr(profile, "path", profile))


def read_file(profile: Any) -> dict[str, Any] | None:
    """The parsed colocation.json of a profile (a ``DeviceProfile`` or its folder), or None."""
    path = _folder(profile) / FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ColocationError(f"{path} cannot be read ({err}); remove it and measure again "
                              "(python -m costmodel.colocation measure)") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or "current" not in data:
        raise ColocationError(f"{path} is not a co-location file of schema {SCHEMA}; remove it and measure again")
    return data


def save_entry(profile: Any, entry: dict[str, Any]) -> Path:
    """Make ``entry`` current, the previous current the newest of the history (under the profile lock)."""
    from costmodel.store.locks import file_lock
    from costmodel.store.profile import LOCK, atomic_write_json

    folder = _folder(profile)
    folder.mkdir(parents=True, exist_ok=True)
    with file_lock(folder / LOCK, what="writing colocation.json"):
        data = read_file(folder) or {"schema": SCHEMA, "current": None, "history": []}
        if data.get("current"):
            data["history"] = [*data.get("history", []), data["current"]]
        data["current"] = entry
        atomic_write_json(folder / FILE, data)
    return folder / FILE


def load_colocation(profile: Any, *, cores: tuple[int, ...] | None = None) -> ColocationFactors | None:
    """The latest measured factors of ``profile`` (a ``DeviceProfile`` or its folder), for the
    placement ``cores`` when given (the newest entry of that placement, current or in the
    history), or None when there is none."""
    data = read_file(profile)
    if data is None or not data.get("current"):
        return None
    source = str(_folder(profile) / FILE)
    entries = [data["current"], *reversed(data.get("history", []))]
    if cores is not None:
        want = placement_id(tuple(int(c) for c in cores))
        entries = [e for e in entries if (e.get("placement") or {}).get("id") == want]
        if not entries:
            return None
    return ColocationFactors.from_entry(entries[0], source)
