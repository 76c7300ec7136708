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

**Bytes, not a kernel's own traffic.** Reading the twin factor at a kernel's own memory traffic
(its bytes beyond the private cache per second alone, over the stream neighbour's rate) instead
of its bytes was tried on GEMM loops the measurement never saw
(``scripts/bench_colocation_pressure.py``, which keeps that reading, EPYC VM, two runs): median
|factor - measured ratio| 0.047 and 0.055 by bytes, 0.058 and 0.088 by own traffic (it put an
EP rank's m=4 expert GEMMs at 1.14x where they measured 1.06-1.08x), so the factor stays on
bytes. What changed is the measurement: besides the kernels spanning its bytes, each family's
most streaming kernel is measured too (``measure.pick_kernels``). That gave the GEMM curve a
memory-bound point (a 17 MB GEMV, 1.15x) where it had only a compute-bound 5 MB GEMM (1.01x)
and a 68 MB one (1.13x), and moved the factor at an expert GEMM's 8.4 MB from 1.03x to 1.07x
(measured 1.06-1.08x).

**Beside different work** (``.factor(family, bytes_moved, pressure=P)``). A twin runs the same
kernel; a device of ``experiment=placement`` runs beside *other* work, and what slows a
kernel is how hard its neighbour loads the shared cache and memory, not what it computes: a
cache-resident GEMM is 1.0x beside its twin and 1.1-1.2x beside a copy that streams memory
(EPYC VM). Entries measured with the stream neighbour (``stream_neighbour`` in the entry)
keep each kernel's ``stream_ratio``, beside the heaviest traffic one core makes. A
neighbour's *pressure* P in [0, 1] is its traffic beyond its private cache as a share of
the stream neighbour's rate (``pressure_of``: bytes moved by its kernels larger than the
core's private cache, over its busy seconds, over the stream's bytes per second alone), and
the factor is 1 + (stream_ratio - 1) x P, the stream ratio interpolated in log2 bytes as
above: linear between alone (P = 0) and the stream (P = 1). (Bubble-Up's sensitivity to a
memory "bubble" and a neighbour's pressure, Mars et al., MICRO 2011, with the sensitivity
curve reduced to its two ends.) The form is checked on the twins
each time it is measured (a twin is a neighbour of the kernel's own pressure:
``measure.model_check``). Entries without the stream (older files) have no pressure model:
``pressure`` is then ignored and the twin's ratio used, and ``has_stream`` is False.
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
    #: the stream neighbour's bytes per second alone (None: measured without it, no pressure model)
    stream_bytes_per_s: float | None = None
    #: bytes of the measured core's private cache: a kernel moving fewer loads only its own core
    private_cache_bytes: float | None = None

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any], source: str = "") -> "ColocationFactors":
        fams = entry.get("families") or {}
        neighbour = entry.get("stream_neighbour") or {}
        rate, cache = neighbour.get("alone_bytes_per_s"), neighbour.get("private_cache_bytes")
        return cls(factors={f: float(v["factor"]) for f, v in fams.items()}, placement=dict(entry.get("placement") or {}),
                   measured_at=str(entry.get("measured_at", "")), source=source,
                   kernels={f: list(v.get("kernels") or []) for f, v in fams.items()},
                   stream_bytes_per_s=float(rate) if isinstance(rate, (int, float)) and rate > 0 else None,
                   private_cache_bytes=float(cache) if isinstance(cache, (int, float)) and cache > 0 else None)

    @property
    def has_stream(self) -> bool:
        """Measured beside the stream neighbour too: ``pressure`` means something."""
        return self.stream_bytes_per_s is not None and self.private_cache_bytes is not None

    def pressure_of(self, bytes_moved: Any, busy_s: float) -> float | None:
        """A neighbour's pressure in [0, 1]: the bytes moved by its kernels larger than the private
        cache (``bytes_moved``: one entry per kernel call), per second of its ``busy_s``, as a share
        of the stream neighbour's bytes per second alone; None without the stream measurement."""
        if not self.has_stream:
            return None
        if not (isinstance(busy_s, (int, float)) and busy_s >= 0):
            raise ColocationError(f"busy_s must be seconds >= 0, got {busy_s!r}")
        b = np.asarray(list(bytes_moved), dtype=np.float64)
        if b.size and np.any(b < 0):
            raise ColocationError("bytes_moved must be >= 0 per kernel")
        if busy_s == 0:
            return 0.0
        streamed = float(b[b >= self.private_cache_bytes].sum())
        return float(min(1.0, streamed / float(busy_s) / self.stream_bytes_per_s))

    @classmethod
    def constant(cls, factors: Mapping[str, float], *, placement: Mapping[str, Any] | None = None) -> "ColocationFactors":
        """Factors given by hand (tests, what-ifs)."""
        for f, v in factors.items():
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
                raise ColocationError(f"colocation factor of family {f!r} must be a number > 0, got {v!r}")
        return cls(factors={f: float(v) for f, v in factors.items()}, placement=dict(placement or {}),
                   measured_at="", source="given")

    def factor(self, family: str, bytes_moved: float | None = None, pressure: float | None = None) -> float:
        """The factor of a ``family`` kernel moving ``bytes_moved`` bytes: beside its twin, its
        measured kernels' ratios interpolated in log2 bytes (held flat beyond them), the family's
        median without bytes or with one measured size; beside a neighbour of ``pressure`` P
        (``pressure_of``; with the stream measured), 1 + (stream ratio - 1) x P, the stream
        ratios interpolated the same way. 1.0 (no slow-down) for a family not measured, said once."""
        if pressure is not None and not (isinstance(pressure, (int, float)) and 0.0 <= pressure <= 1.0):
            raise ColocationError(f"pressure must be a number in [0, 1], got {pressure!r}")
        if family in self.factors:
            key = "stream_ratio" if pressure is not None and self.has_stream else "ratio"
            curve = self._curve(family, key)
            if key == "stream_ratio":
                if curve is None:
                    stream = self.stream_median(family)
                    if stream is None:
                        return self.factors[family]  # the family was measured without the stream
                else:
                    stream = self._at(curve, bytes_moved)
                return 1.0 + (stream - 1.0) * float(pressure)
            if bytes_moved is None or curve is None:
                return self.factors[family]
            return self._at(curve, bytes_moved)
        if family not in self.unmeasured:
            self.unmeasured.add(family)
            log.warning("colocation: family %r was not measured (%s); its kernels are predicted as alone (factor 1.0)",
                        family, self.source or "factors given by hand")
        return 1.0

    def stream_median(self, family: str) -> float | None:
        """The median ratio beside the stream neighbour over the family's measured kernels; None
        where the family was measured without the stream."""
        ratios = [float(k["stream_ratio"]) for k in self.kernels.get(family, [])
                  if isinstance(k.get("stream_ratio"), (int, float))]
        return float(np.median(ratios)) if ratios else None

    @staticmethod
    def _at(curve: tuple[np.ndarray, np.ndarray], bytes_moved: float | None) -> float:
        """``curve`` at ``bytes_moved`` (log2 bytes, held flat beyond its ends); its median without bytes."""
        xs, ys = curve
        if bytes_moved is None:
            return float(np.median(ys))
        return float(np.interp(math.log2(1.0 + max(float(bytes_moved), 0.0)), xs, ys))

    def _curve(self, family: str, key: str = "ratio") -> tuple[np.ndarray, np.ndarray] | None:
        """(log2(1 + bytes), ``key``) of the family's measured kernels by bytes, values of kernels
        of equal bytes averaged; None with fewer than two sizes."""
        by_bytes: dict[float, list[float]] = {}
        for k in self.kernels.get(family, []):
            b, r = k.get("bytes_moved"), k.get(key)
            if isinstance(b, (int, float)) and isinstance(r, (int, float)) and r > 0 and b >= 0:
                by_bytes.setdefault(math.log2(1.0 + float(b)), []).append(float(r))
        if len(by_bytes) < 2:
            return None
        xs = np.array(sorted(by_bytes))
        return xs, np.array([float(np.mean(by_bytes[x])) for x in xs])

    def kernel_pressure(self, record: Mapping[str, Any]) -> float | None:
        """A measured kernel's own pressure (``pressure_of`` its bytes in its median seconds alone)."""
        b, t = record.get("bytes_moved"), record.get("alone_median_s")
        if not (self.has_stream and isinstance(b, (int, float)) and isinstance(t, (int, float)) and b >= 0 and t > 0):
            return None
        return self.pressure_of([float(b)], float(t))

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
        text = head + " beside the twin: " + (", ".join(parts) if parts else "none")
        if self.has_stream:
            streamed = []
            for f in sorted(self.factors):
                curve = self._curve(f, "stream_ratio")
                if curve is not None:
                    streamed.append(f"{f} {curve[1].min():.2f}-{curve[1].max():.2f}x")
            text += (f"; beside the stream neighbour ({self.stream_bytes_per_s / 1e9:.1f} GB/s alone; private cache "
                     f"{_size(self.private_cache_bytes)}): " + (", ".join(streamed) or "none"))
        if self.unmeasured:
            text += f"; not measured (1.0): {', '.join(sorted(self.unmeasured))}"
        return text

    def to_dict(self) -> dict[str, Any]:
        out = {"factors": dict(sorted(self.factors.items())), "placement": self.placement,
               "measured_at": self.measured_at, "source": self.source, "unmeasured": sorted(self.unmeasured)}
        if self.has_stream:
            medians = {f: self.stream_median(f) for f in sorted(self.kernels)}
            out["stream_factors"] = {f: m for f, m in medians.items() if m is not None}
            out["stream_bytes_per_s"] = self.stream_bytes_per_s
            out["private_cache_bytes"] = self.private_cache_bytes
        return out


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
