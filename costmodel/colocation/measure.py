"""Measure each kernel family of a device profile alone and beside a twin; store the factors.

``measure_colocation(profile, cores=(0, 1))``:

1. checks the placement before any process starts: ``cores`` distinct core ids this
   process may run on, one per rank, world size = len(cores) in [2, usable cores]
   (``costmodel.collectives.workers.place_ranks``), and the profile measured with one
   thread (every rank runs one thread on its one core, as the expert-parallel ranks do);
2. picks, per family of the profile, ``per_family`` (2-4) profiled kernels spanning its
   size range by ``bytes_moved`` (smallest, largest, and those nearest to log-spaced bytes
   between, so a family of many small kernels and a few large ones is measured across its
   sizes, which is where the factor changes; kernels whose profiled median exceeds
   ``max_call_s`` are left out so the run stays bounded, the smallest kept where none is
   under it);
3. launches W gloo processes with the project's launcher (``run_workers``), each pinned
   to its core (``costmodel.colocation.rank``): rank 0 times each kernel alone and while
   the twins run the same kernel back to back, ``rounds`` times each, alternating;
4. stores per kernel ratio = median(beside) / median(alone) (medians over rounds of the
   per-round medians, as ``DeviceProfile.kernels`` combines rounds), and per family the
   median of its kernels' ratios, in ``colocation.json`` (``costmodel.colocation.store``).

Timing is the profile's: ``costmodel.measure.timing.measure`` with ``TimingConfig.per_round``
(warm-up, blocks, median, IQR, retried while noisy), cold operands when the profile's
fingerprint says ``cache=cold`` (``costmodel.measure.runners``), the profile's allocator mode; so
alone and beside compare like with like with the profile's rows (the entry also keeps
alone / profiled, the drift since the profile was measured).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import replace
from typing import Any, Sequence

import numpy as np
import torch.multiprocessing as mp

from costmodel.collectives.workers import run_workers, usable_cores
from costmodel.colocation.store import ColocationError, placement_id, save_entry
from costmodel.measure.timing import TimingConfig

log = logging.getLogger(__name__)

PER_FAMILY = (2, 4)  # allowed kernels per family
DEFAULT_PER_FAMILY = 4  # log-spaced by bytes, smallest to largest: where the factor changes
DEFAULT_MAX_CALL_S = 0.02  # profiled median above this: too slow to repeat within the budget
#: the measurement's timing: the project's defaults (conf/base.yaml) in 6 short rounds of each condition, so a
#: spell of other load on the machine hits a round or two, not a whole condition (on the busy 2-core VM, with 4
#: rounds, single rounds beside ran 2-5x slower while a test suite shared the cores; the median of 6 holds)
DEFAULT_TIMING = TimingConfig(rounds=6)
TWIN_MAX_S = 60.0  # a twin never runs longer than this beside one measurement
BUSY_LOAD = 0.5  # 1-minute load average above this before a run: warn that others share the cores


def check_cores(cores: object) -> tuple[int, ...]:
    """``cores``: distinct core ids this process may use, one per rank, 2 <= len <= usable cores."""
    usable = usable_cores()
    if isinstance(cores, (str, bytes)) or not isinstance(cores, Sequence) \
            or not all(isinstance(c, int) and not isinstance(c, bool) for c in cores):
        raise ColocationError(f"cores must be a tuple of distinct core ids, one per rank (rank 0 measured, the others "
                              f"its twins), each one of this process's cores {usable}; got {cores!r}")
    cores = tuple(int(c) for c in cores)
    if not 2 <= len(cores) <= len(usable):
        raise ColocationError(f"cores={list(cores)}: world_size={len(cores)} cannot be placed one rank per core; "
                              f"world_size (= len(cores)) must be in [2, {len(usable)}] on this machine (a measured "
                              f"rank and at least one twin, each on its own core of {usable})")
    bad = [c for c in cores if c not in usable]
    if bad or len(set(cores)) != len(cores):
        raise ColocationError(f"cores must be distinct core ids in {usable} (the cores this process may use), "
                              f"got {list(cores)}")
    return cores


def pick_kernels(profile: Any, *, per_family: int = DEFAULT_PER_FAMILY, max_call_s: float = DEFAULT_MAX_CALL_S,
                 families: Sequence[str] | None = None) -> dict[str, list[tuple[Any, dict[str, Any]]]]:
    """Per family: (descriptor, its profile row) of ``per_family`` kernels spanning its bytes."""
    if isinstance(per_family, bool) or not isinstance(per_family, int) or not PER_FAMILY[0] <= per_family <= PER_FAMILY[1]:
        raise ColocationError(f"per_family must be an integer in [{PER_FAMILY[0]}, {PER_FAMILY[1]}], got {per_family!r}")
    table, specs = profile._kernels_and_specs()
    if table.empty:
        raise ColocationError(f"profile {profile.path} holds no measured kernel; run `python -m costmodel bench` first")
    have = sorted(set(table["family"]))
    if families is not None:
        missing = [f for f in families if f not in have]
        if missing:
            raise ColocationError(f"families {missing} are not in profile {profile.path} (it holds {have})")
    out: dict[str, list[tuple[Any, dict[str, Any]]]] = {}
    for fam in (families or have):
        rows = [(s, r) for s, r in zip(specs, table.to_dict("records")) if r["family"] == fam]
        fast = [x for x in rows if x[1]["median_s"] <= max_call_s] or [min(rows, key=lambda x: x[1]["median_s"])]
        fast.sort(key=lambda x: (x[1]["bytes_moved"], x[1]["median_s"]))
        out[fam] = [fast[i] for i in log_spaced(np.array([x[1]["bytes_moved"] for x in fast], dtype=float), per_family)]
    return out


def log_spaced(sorted_bytes: np.ndarray, n: int) -> list[int]:
    """Indices of up to ``n`` distinct entries of ``sorted_bytes`` (ascending) nearest to ``n``
    log-spaced targets from the smallest to the largest (the ends always included)."""
    if len(sorted_bytes) == 0:
        return []
    logs = np.log2(1.0 + np.maximum(sorted_bytes, 0.0))
    chosen: list[int] = []
    for target in np.linspace(logs[0], logs[-1], min(n, len(logs))):
        order = np.argsort(np.abs(logs - target), kind="stable")
        pick = next((int(i) for i in order if int(i) not in chosen), None)
        if pick is not None:
            chosen.append(pick)
    return sorted(chosen)


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _median_of_rounds(records: list[dict[str, Any]], key: str = "median_s") -> float:
    return float(statistics.median(r[key] for r in records))


def _kernel_entry(spec: Any, row: dict[str, Any], result: dict[str, Any], twins: list[dict[str, Any]]) -> dict[str, Any]:
    alone, beside = result["alone"], result["beside"]
    a, b = _median_of_rounds(alone), _median_of_rounds(beside)
    return {
        "key": spec.key(), "label": spec.label(), "bytes_moved": float(spec.bytes_moved()), "flops": float(spec.flops()),
        "profiled_median_s": float(row["median_s"]),
        "alone_median_s": a, "beside_median_s": b, "ratio": b / a,
        "alone_over_profiled": a / float(row["median_s"]),
        "alone_iqr_s": _median_of_rounds(alone, "iqr_s"), "beside_iqr_s": _median_of_rounds(beside, "iqr_s"),
        "round_ratios": [x["median_s"] / y["median_s"] for x, y in zip(beside, alone)],
        "alone_round_medians_s": [x["median_s"] for x in alone], "beside_round_medians_s": [x["median_s"] for x in beside],
        "noisy": bool(any(x["noisy"] for x in alone + beside)),
        "twin_calls": [t["calls"] for t in twins], "twin_cut_short": bool(any(t["cut_short"] for t in twins)),
    }


def measure_colocation(profile: Any, cores: Sequence[int] = (0, 1), *, per_family: int = DEFAULT_PER_FAMILY,
                       families: Sequence[str] | None = None, timing: TimingConfig | None = None,
                       max_call_s: float = DEFAULT_MAX_CALL_S, timeout_s: float = 600.0, measure_lock: bool = True,
                       progress: bool = True) -> dict[str, Any]:
    """Measure every family of ``profile`` (a ``DeviceProfile``) alone and beside its twins on
    ``cores``; append the entry to the profile's colocation.json and return it."""
    placed = check_cores(cores)
    fp = profile.fingerprint
    if fp.device_kind != "cpu" or fp.threads != 1:
        raise ColocationError(f"the co-location measurement runs one 1-thread rank per core on CPU; profile "
                              f"{profile.path} is {fp.device_kind} with threads={fp.threads} (use the threads=1 profile)")
    timing = timing or DEFAULT_TIMING
    picked = pick_kernels(profile, per_family=per_family, max_call_s=max_call_s, families=families)
    items = [(fam, spec, row) for fam, chosen in picked.items() for spec, row in chosen]
    W = len(placed)
    per_round = timing.per_round()
    timing_fields = {k: getattr(per_round, k) for k in ("min_run_time_s", "min_runs", "max_rel_iqr", "retries")}
    stop = mp.get_context("spawn").Event()
    if progress:
        print(f"colocation: {len(items)} kernels of {len(picked)} families, rank 0 on core {placed[0]} measured alone "
              f"and beside {W - 1} twin(s) on cores {list(placed[1:])}, {timing.rounds} rounds each", flush=True)
    if measure_lock:
        from costmodel.store.locks import measuring
        ctx = measuring(f"colocation measurement on cores {list(placed)}")
    else:
        from contextlib import nullcontext
        ctx = nullcontext({})
    load_before = _loadavg()
    if load_before and load_before[0] > BUSY_LOAD:
        log.warning("colocation: load average %.2f before measuring: other processes share these cores and their "
                    "spells show up as noise in the ratios (rerun when uptime shows little else)", load_before[0])
        if progress:
            print(f"colocation: warning: load average {load_before[0]:.2f} before measuring; other processes on these "
                  "cores add noise to the ratios", flush=True)
    start = time.monotonic()
    from costmodel.colocation.rank import measure_pairs
    with ctx:
        run = run_workers(W, measure_pairs, ([s.to_record() for _, s, _ in items], list(placed), timing_fields,
                                             int(timing.rounds), fp.cache == "cold", fp.allocator, stop, TWIN_MAX_S,
                                             progress),
                          timeout_s=timeout_s, placement="require", world_size_field="colocation world_size")
    wall = time.monotonic() - start
    measured, twins = run.results[0], run.results[1:]
    families_out: dict[str, Any] = {}
    for i, (fam, spec, row) in enumerate(items):
        k = _kernel_entry(spec, row, measured[i], [t for tw in twins for t in tw[i]["twin"]])
        families_out.setdefault(fam, {"kernels": []})["kernels"].append(k)
    for fam, v in families_out.items():
        v["factor"] = float(statistics.median(k["ratio"] for k in v["kernels"]))
        v["alone_median_s"] = float(statistics.median(k["alone_median_s"] for k in v["kernels"]))
        v["beside_median_s"] = float(statistics.median(k["beside_median_s"] for k in v["kernels"]))
    entry = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": fp.id,
        "placement": {"id": placement_id(placed), "cores": list(placed), "world_size": W, "measured_rank_core": placed[0],
                      "twin_cores": list(placed[1:]), "threads_per_rank": 1, "launcher": run.note},
        "timing": {**timing_fields, "rounds": int(timing.rounds), "cold": fp.cache == "cold", "allocator": fp.allocator},
        "per_family": per_family, "max_call_s": max_call_s, "wall_s": round(wall, 2),
        "loadavg_before": load_before, "loadavg_after": _loadavg(),
        "rule": "ratio = median(beside) / median(alone) per kernel (medians of the round medians); family factor = "
                "median of its kernels' ratios",
        "families": families_out,
    }
    path = save_entry(profile, entry)
    if progress:
        print(f"colocation: {len(items)} kernels in {wall:.1f} s -> {path}", flush=True)
        for fam, v in sorted(families_out.items()):
            print(f"  {fam:12s} factor {v['factor']:.2f}x  (alone {v['alone_median_s'] * 1e6:,.1f} us, beside "
                  f"{v['beside_median_s'] * 1e6:,.1f} us; kernel ratios "
                  f"{', '.join('%.2f' % k['ratio'] for k in v['kernels'])})", flush=True)
    return entry


def quick_timing(timing: TimingConfig) -> TimingConfig:
    """An experiment's ``timing`` for the measurement: ``DEFAULT_TIMING``'s rounds where the
    experiment times with 3 or more (the defaults), else 2 (one per order of the conditions)."""
    return replace(timing, rounds=DEFAULT_TIMING.rounds if timing.rounds >= 3 else 2)
