"""The collectives suite: a yaml (``conf/suite/collectives.yaml``) -> the specs to measure.

Sizes: ``sizes.count`` per-rank message sizes log-spaced from ``sizes.min_bytes`` to
``sizes.max_bytes`` (rounded to whole elements, and to multiples of W elements where the op
splits n into W chunks). Every op in ``ops`` at every size; all_to_all once per pattern:

- ``peer_share: p``: each rank sends n in all, a share p of it to its peers (split evenly
  over the W-1 of them) and 1-p to itself (a local copy); p = (W-1)/W is the uniform split;
- ``skew: k``: rank 0 sends k*n, every other rank n, at the uniform split (skewed senders).

Two timing protocols (``costmodel.collectives.rank``): ``warm``, calls back to back after a
barrier (NCCL-tests' and the profile's protocol since the start), and, with a ``step``
section, ``step``: each call as a layer's step makes it, after a cache eviction, a barrier
and ``lead_s`` of local GEMMs (an expert-parallel step's router and dispatch prep before its
first all-to-all). A gloo call after local work pays wake-up delays of a few milliseconds on
a share of calls that warm back-to-back calls rarely see (``scripts/bench_a2a_protocol.py``);
the step rows keep the mean, the statistic that adds up inside a step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from costmodel.collectives.spec import CollectiveSpec, CollectiveSpecError, DTYPE_BYTES, OPS

MAX_ITEMS = 2000  # a suite larger than this is a typo, not a plan
TIMING_LIMITS = {"warmup": (0, 100), "min_repeats": (3, 10000), "max_repeats": (3, 10000),
                 "budget_s": (0.0, 60.0)}
STEP_LIMITS = {"repeats": (3, 1000), "evict_bytes": (0, 2 ** 34), "lead_s": (0.0, 0.1)}
PROTOCOLS = ("warm", "step")


@dataclass(frozen=True)
class CollectiveSuite:
    name: str
    specs: tuple[CollectiveSpec, ...]
    timing: dict[str, float]  # warmup, min_repeats, max_repeats, budget_s (per item)
    timeout_s: float
    step: dict[str, float] | None = None  # repeats, evict_bytes, lead_s: the step protocol (None: warm only)


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise CollectiveSpecError(msg)


def _check_numbers(values: dict[str, Any], limits: dict[str, tuple[float, float]], where: str,
                   real: tuple[str, ...] = ()) -> None:
    """Each field of ``limits`` in ``values`` a number in its [lo, hi], whole unless named in ``real``."""
    for name, (lo, hi) in limits.items():
        v = values[name]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi
        if name not in real:
            ok = ok and float(v).is_integer()
        _require(ok, f"{where}.{name} must be {'a number' if name in real else 'an integer'} in [{lo}, {hi}], "
                     f"got {v!r}")


def _timing(raw: dict[str, Any], source: str) -> dict[str, float]:
    t = {"warmup": 3, "min_repeats": 7, "max_repeats": 41, "budget_s": 0.3, **(raw or {})}
    _check_numbers(t, TIMING_LIMITS, f"{source}: timing", real=("budget_s",))
    _require(t["min_repeats"] <= t["max_repeats"],
             f"{source}: timing.min_repeats ({t['min_repeats']}) must be <= timing.max_repeats ({t['max_repeats']})")
    unknown = set(t) - set(TIMING_LIMITS)
    _require(not unknown, f"{source}: unknown timing field(s) {sorted(unknown)}; allowed: {list(TIMING_LIMITS)}")
    return t


def _step(raw: Any, source: str) -> dict[str, float] | None:
    """The ``step`` section: repeats (integer), evict_bytes (integer), lead_s; None or absent: no step rows."""
    if raw is None:
        return None
    _require(isinstance(raw, dict), f"{source}: step must be a mapping of {list(STEP_LIMITS)} or null, got {raw!r}")
    unknown = set(raw) - set(STEP_LIMITS)
    _require(not unknown, f"{source}: unknown step field(s) {sorted(unknown)}; allowed: {list(STEP_LIMITS)}")
    t = {"repeats": 21, "evict_bytes": 128 * 2 ** 20, "lead_s": 3e-4, **raw}
    _check_numbers(t, STEP_LIMITS, f"{source}: step", real=("lead_s",))
    return t


def log_sizes(min_bytes: float, max_bytes: float, count: int, multiple: int) -> list[int]:
    """``count`` log-spaced sizes, each rounded to a positive multiple of ``multiple`` bytes."""
    raw = np.geomspace(min_bytes, max_bytes, count) if count > 1 else np.array([min_bytes])
    return [int(max(multiple, round(x / multiple) * multiple)) for x in raw]


def a2a_matrix(n: int, world_size: int, element: int, *, peer_share: float, sender_scale=None) -> np.ndarray:
    """Send matrix in bytes (whole elements): rank s sends scale_s*n, ``peer_share`` of it to peers."""
    w = world_size
    scale = np.ones(w) if sender_scale is None else np.asarray(sender_scale, dtype=float)
    m = np.zeros((w, w))
    for s in range(w):
        total = scale[s] * n
        if w == 1:
            m[s, s] = total
            continue
        off = total * peer_share / (w - 1)
        m[s, :] = off
        m[s, s] = total * (1 - peer_share)
    return np.round(m / element) * element


def load_suite(path: str | Path | dict, world_size: int, *, backend: str = "gloo") -> CollectiveSuite:
    """The suite's specs for ``world_size`` ranks (a path to a yaml, or its parsed dict)."""
    if isinstance(path, dict):
        raw, source = path, "suite"
    else:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"collectives suite {p} does not exist (the default is conf/suite/collectives.yaml)")
        raw, source = yaml.safe_load(p.read_text()) or {}, str(p)
    _require(isinstance(raw, dict), f"{source}: a suite must be a mapping")
    dtype = raw.get("dtype", "float32")
    _require(dtype in DTYPE_BYTES, f"{source}: dtype must be one of {list(DTYPE_BYTES)}, got {dtype!r}")
    es = DTYPE_BYTES[dtype]
    sizes = raw.get("sizes") or {}
    lo, hi, count = sizes.get("min_bytes", 256), sizes.get("max_bytes", 16 * 2 ** 20), sizes.get("count", 9)
    _require(isinstance(count, int) and 1 <= count <= 100, f"{source}: sizes.count must be an integer in [1, 100], "
                                                            f"got {count!r}")
    _require(isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and es <= lo <= hi <= 2 ** 34,
             f"{source}: sizes.min_bytes and sizes.max_bytes must satisfy {es} <= min_bytes <= max_bytes <= 2**34, "
             f"got {lo!r}, {hi!r}")
    ops = raw.get("ops", list(OPS))
    _require(isinstance(ops, list) and all(o in OPS for o in ops), f"{source}: ops must be a list of {list(OPS)}, "
                                                                    f"got {ops!r}")
    a2a = raw.get("all_to_all") or {}
    shares = a2a.get("peer_share", [(world_size - 1) / max(world_size, 1)])
    skews = a2a.get("skew", [])
    for p in shares:
        _require(isinstance(p, (int, float)) and 0 <= p <= 1, f"{source}: all_to_all.peer_share values must be in "
                                                                f"[0, 1], got {p!r}")
    for k in skews:
        _require(isinstance(k, (int, float)) and 1 <= k <= 1000, f"{source}: all_to_all.skew values must be in "
                                                                   f"[1, 1000], got {k!r}")
    specs: list[CollectiveSpec] = []
    uniform = (world_size - 1) / world_size if world_size > 1 else 0.0
    for op in ops:
        mult = es * (world_size if op in ("all_gather", "reduce_scatter", "all_to_all") else 1)
        for n in log_sizes(lo, hi, count, mult):
            if op != "all_to_all":
                specs.append(CollectiveSpec(op, world_size, backend, dtype, message_bytes=n, pattern="",
                                            nominal_bytes=n))
                continue
            for p in shares:
                m = a2a_matrix(n, world_size, es, peer_share=p)
                specs.append(CollectiveSpec(op, world_size, backend, dtype, send_bytes=m, pattern=f"peer{p:g}",
                                            nominal_bytes=n))
            for k in skews:
                scale = np.ones(world_size)
                scale[0] = k
                m = a2a_matrix(n, world_size, es, peer_share=uniform, sender_scale=scale)
                specs.append(CollectiveSpec(op, world_size, backend, dtype, send_bytes=m, pattern=f"skew{k:g}",
                                            nominal_bytes=n))
    _require(0 < len(specs) <= MAX_ITEMS, f"{source}: the suite has {len(specs)} collectives; allowed 1..{MAX_ITEMS}")
    timeout = raw.get("timeout_s", 600)
    _require(isinstance(timeout, (int, float)) and 0 < timeout <= 3600,
             f"{source}: timeout_s must be in (0, 3600], got {timeout!r}")
    return CollectiveSuite(name=str(raw.get("name", Path(str(path)).stem if not isinstance(path, dict) else "suite")),
                           specs=tuple(specs), timing=_timing(raw.get("timing") or {}, source),
                           timeout_s=float(timeout), step=_step(raw.get("step"), source))


def to_item(spec: CollectiveSpec) -> dict[str, Any]:
    """The plain dict a rank gets (no costmodel imports needed on its side)."""
    es = DTYPE_BYTES[spec.dtype]
    item: dict[str, Any] = {"op": spec.op, "dtype": spec.dtype, "pattern": spec.pattern,
                            "nominal_bytes": spec.nominal_bytes}
    if spec.op == "all_to_all":
        item["send_elems"] = (spec.matrix / es).astype(np.int64).tolist()
    else:
        item["numel"] = int(spec.message_bytes // es)
    return item
