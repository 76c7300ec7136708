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
   under it), and (``stream``) the family's most streaming kernel beyond the private cache
   (most bytes per profiled second), so the curve has a memory-bound point;
3. launches W gloo processes with the project's launcher (``run_workers``), each pinned
   to its core (``costmodel.colocation.rank``): rank 0 times each kernel alone, while the
   twins run the same kernel back to back, and (``stream``, the default) while the others
   run the stream neighbour (``rank.StreamNeighbour``: a copy through 256 MiB buffers),
   ``rounds`` times each, the order rotating; it first times the stream neighbour alone
   (its bytes per second);
4. stores per kernel ratio = median(beside) / median(alone) and stream_ratio =
   median(beside the stream) / median(alone) (medians over rounds of the per-round medians,
   as ``DeviceProfile.kernels`` combines rounds), per family the median of its kernels'
   ratios, and the stream neighbour's rate and this core's private (L2) cache size, in
   ``colocation.json`` (``costmodel.colocation.store``);
5. checks the pressure model on the twins: a twin is a neighbour of known pressure (the
   kernel's own, ``ColocationFactors.pressure_of``), so the model's twin ratio,
   1 + (stream_ratio - 1) x pressure, is compared with the twin ratio measured
   (``model_check`` in the entry: median and largest absolute difference).

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
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch.multiprocessing as mp

from costmodel.collectives.workers import run_workers, usable_cores
from costmodel.colocation.store import ColocationError, ColocationFactors, placement_id, save_entry
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
#: a core's private cache where sysfs does not say (the EPYC and Intel VMs' L2 is 1-2 MiB)
DEFAULT_PRIVATE_CACHE_BYTES = float(2**20)


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
                 families: Sequence[str] | None = None,
                 private_cache_bytes: float | None = None) -> dict[str, list[tuple[Any, dict[str, Any]]]]:
    """Per family: (descriptor, its profile row) of ``per_family`` kernels spanning its bytes, and
    with ``private_cache_bytes`` the one moving the most bytes per profiled second among those
    larger than that cache, if not already chosen (the family's most memory-bound kernel, the
    high-traffic end of its curve)."""
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
        streaming = [x for x in fast if private_cache_bytes is not None and x[1]["bytes_moved"] >= private_cache_bytes
                     and x[1]["median_s"] > 0]
        if streaming:
            top = max(streaming, key=lambda x: x[1]["bytes_moved"] / x[1]["median_s"])
            if all(top[1]["key"] != r["key"] for _, r in out[fam]):
                out[fam].append(top)
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


def private_cache_bytes(core: int) -> tuple[float, str]:
    """Bytes of ``core``'s largest private cache (the L2 here; sysfs ``shared_cpu_list`` names only
    that core) and where the figure came from; ``DEFAULT_PRIVATE_CACHE_BYTES`` when sysfs has none."""
    base = Path(f"/sys/devices/system/cpu/cpu{int(core)}/cache")
    best = 0.0
    for index in sorted(base.glob("index*")) if base.is_dir() else []:
        try:
            kind = (index / "type").read_text().strip()
            shared = (index / "shared_cpu_list").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction" or shared != str(int(core)):
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        value = float(size[:-1]) * units[size[-1]] if size[-1:] in units else float(size)
        best = max(best, value)
    if best > 0:
        return best, f"{base} (largest cache private to core {core})"
    return DEFAULT_PRIVATE_CACHE_BYTES, f"no private cache in {base}: assumed {DEFAULT_PRIVATE_CACHE_BYTES / 2**20:.0f} MiB"


def _kernel_entry(spec: Any, row: dict[str, Any], result: dict[str, Any], twins: list[dict[str, Any]]) -> dict[str, Any]:
    alone, beside = result["alone"], result["beside"]
    a, b = _median_of_rounds(alone), _median_of_rounds(beside)
    streamed = {}
    if result.get("stream"):
        c = _median_of_rounds(result["stream"])
        streamed = {"stream_median_s": c, "stream_ratio": c / a,
                    "stream_round_ratios": [x["median_s"] / y["median_s"] for x, y in zip(result["stream"], alone)],
                    "stream_round_medians_s": [x["median_s"] for x in result["stream"]]}
    return {**streamed,
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
                       progress: bool = True, stream: bool = True) -> dict[str, Any]:
    """Measure every family of ``profile`` (a ``DeviceProfile``) alone, beside its twins and
    (``stream``) beside the stream neighbour on ``cores``; append the entry to the profile's
    colocation.json and return it."""
    placed = check_cores(cores)
    fp = profile.fingerprint
    if fp.device_kind != "cpu" or fp.threads != 1:
        raise ColocationError(f"the co-location measurement runs one 1-thread rank per core on CPU; profile "
                              f"{profile.path} is {fp.device_kind} with threads={fp.threads} (use the threads=1 profile)")
    timing = timing or DEFAULT_TIMING
    cache_bytes, cache_source = private_cache_bytes(placed[0])
    picked = pick_kernels(profile, per_family=per_family, max_call_s=max_call_s, families=families,
                          private_cache_bytes=cache_bytes if stream else None)
    items = [(fam, spec, row) for fam, chosen in picked.items() for spec, row in chosen]
    W = len(placed)
    per_round = timing.per_round()
    timing_fields = {k: getattr(per_round, k) for k in ("min_run_time_s", "min_runs", "max_rel_iqr", "retries")}
    stop = mp.get_context("spawn").Event()
    if progress:
        print(f"colocation: {len(items)} kernels of {len(picked)} families, rank 0 on core {placed[0]} measured alone "
              f"and beside {W - 1} twin(s){' and the stream neighbour' if stream else ''} on cores {list(placed[1:])}, "
              f"{timing.rounds} rounds each", flush=True)
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
                                             progress, stream),
                          timeout_s=timeout_s, placement="require", world_size_field="colocation world_size")
    wall = time.monotonic() - start
    measured, twins = run.results[0]["items"], [r["items"] for r in run.results[1:]]
    families_out: dict[str, Any] = {}
    for i, (fam, spec, row) in enumerate(items):
        k = _kernel_entry(spec, row, measured[i], [t for tw in twins for t in tw[i]["twin"]])
        families_out.setdefault(fam, {"kernels": []})["kernels"].append(k)
    for fam, v in families_out.items():
        v["factor"] = float(statistics.median(k["ratio"] for k in v["kernels"]))
        v["alone_median_s"] = float(statistics.median(k["alone_median_s"] for k in v["kernels"]))
        v["beside_median_s"] = float(statistics.median(k["beside_median_s"] for k in v["kernels"]))
        if stream:
            v["stream_factor"] = float(statistics.median(k["stream_ratio"] for k in v["kernels"]))
    neighbour = None
    if stream:
        alone_rate = run.results[0]["stream_alone"]
        beside_rates = [t["bytes_per_s"] for tw in twins for item in tw for t in item["stream_twin"]]
        neighbour = {"what": "a copy through two 256 MiB float32 buffers, 8 MiB per call (costmodel.colocation.rank."
                             "StreamNeighbour)",
                     "buffer_bytes": alone_rate["buffer_bytes"], "bytes_per_call": alone_rate["bytes_per_call"],
                     "alone_bytes_per_s": alone_rate["bytes_per_s"], "alone_iqr_s": alone_rate["iqr_s"],
                     "beside_kernels_bytes_per_s_median": float(statistics.median(beside_rates)) if beside_rates else None,
                     "private_cache_bytes": cache_bytes, "private_cache_source": cache_source}
    entry = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": fp.id,
        "placement": {"id": placement_id(placed), "cores": list(placed), "world_size": W, "measured_rank_core": placed[0],
                      "twin_cores": list(placed[1:]), "threads_per_rank": 1, "launcher": run.note},
        "timing": {**timing_fields, "rounds": int(timing.rounds), "cold": fp.cache == "cold", "allocator": fp.allocator},
        "per_family": per_family, "max_call_s": max_call_s, "wall_s": round(wall, 2),
        "loadavg_before": load_before, "loadavg_after": _loadavg(),
        "rule": "ratio = median(beside) / median(alone) per kernel (medians of the round medians); family factor = "
                "median of its kernels' ratios; stream_ratio and stream_factor the same beside the stream neighbour",
        "families": families_out,
    }
    if neighbour is not None:
        entry["stream_neighbour"] = neighbour
        entry["model_check"] = model_check(entry)
    path = save_entry(profile, entry)
    if progress:
        print(f"colocation: {len(items)} kernels in {wall:.1f} s -> {path}", flush=True)
        for fam, v in sorted(families_out.items()):
            print(f"  {fam:12s} factor {v['factor']:.2f}x  (alone {v['alone_median_s'] * 1e6:,.1f} us, beside "
                  f"{v['beside_median_s'] * 1e6:,.1f} us; kernel ratios "
                  f"{', '.join('%.2f' % k['ratio'] for k in v['kernels'])}"
                  + (f"; beside the stream {', '.join('%.2f' % k['stream_ratio'] for k in v['kernels'])}" if stream else "")
                  + ")", flush=True)
        if neighbour is not None:
            check = entry["model_check"]
            big = check["beyond_private_cache"]
            print(f"  stream neighbour alone: {neighbour['alone_bytes_per_s'] / 1e9:.1f} GB/s; private cache "
                  f"{neighbour['private_cache_bytes'] / 2**20:.2f} MiB; twin ratios from the pressure model vs measured: "
                  f"median |difference| {check['median_abs_diff']:.3f}, largest {check['max_abs_diff']:.3f} over "
                  f"{check['kernels']} kernels (guessing 1.0: {check['median_abs_diff_unity']:.3f}; the stream ratio: "
                  f"{check['median_abs_diff_stream']:.3f})", flush=True)
            if big["kernels"]:
                print(f"  of which {big['kernels']} move more than the private cache: model {big['median_abs_diff']:.3f} "
                      f"(largest {big['max_abs_diff']:.3f}), 1.0 {big['median_abs_diff_unity']:.3f}, stream ratio "
                      f"{big['median_abs_diff_stream']:.3f}", flush=True)
    return entry


def model_check(entry: dict[str, Any]) -> dict[str, Any]:
    """The pressure model tried on the twins: each kernel's twin is a neighbour of the kernel's own
    pressure, so ``ColocationFactors.factor(family, bytes, pressure=own)`` should give the twin
    ratio measured. Per kernel: own pressure, modelled and measured twin ratio; overall: median
    and largest absolute difference, beside the difference of the no-model guess (1.0)."""
    factors = ColocationFactors.from_entry(entry)
    rows = []
    for fam, v in entry["families"].items():
        for k in v["kernels"]:
            own = factors.kernel_pressure(k)
            modelled = factors.factor(fam, k["bytes_moved"], pressure=own)
            k["pressure_own"], k["twin_ratio_modelled"] = own, modelled
            rows.append((abs(modelled - k["ratio"]), abs(1.0 - k["ratio"]), abs(k["stream_ratio"] - k["ratio"]),
                         k["bytes_moved"] >= factors.private_cache_bytes))

    def stats(subset: list[tuple[float, float, float, bool]]) -> dict[str, Any]:
        if not subset:
            return {"kernels": 0}
        return {"kernels": len(subset), "median_abs_diff": float(statistics.median(r[0] for r in subset)),
                "max_abs_diff": float(max(r[0] for r in subset)),
                "median_abs_diff_unity": float(statistics.median(r[1] for r in subset)),
                "median_abs_diff_stream": float(statistics.median(r[2] for r in subset))}

    return {"rule": "modelled twin ratio = 1 + (stream_ratio - 1) x the kernel's own pressure, against the twin ratio "
                    "measured; beside two guesses without the model: 1.0 (no slow-down) and the stream ratio "
                    "(every neighbour the worst)",
            **stats(rows), "beyond_private_cache": stats([r for r in rows if r[3]])}


def quick_timing(timing: TimingConfig) -> TimingConfig:
    """An experiment's ``timing`` for the measurement: ``DEFAULT_TIMING``'s rounds where the
    experiment times with 3 or more (the defaults), else 2 (one per order of the conditions)."""
    return replace(timing, rounds=DEFAULT_TIMING.rounds if timing.rounds >= 3 else 2)
