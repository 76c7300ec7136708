"""experiment=placement: place a mix of workloads on devices by FLOPs, roofline, fitted model
and measured latencies, then run every placement for real and compare the makespans.

1. The mix (``placement_mix``: MoE layers at several routing concentrations and batch
   sizes, GNN layers on graphs of different skew, skinny and balanced dense MLPs) is
   built once; each workload's trace, memory and factory come from
   ``sim.place.placement_workloads`` (an entry's ``_target_`` must be one of its builders,
   ``MIX_BUILDERS``). ``validate`` checks every key before anything is measured:
   ``placement.levels`` (a single level may be given as a string), ``repeats``, the
   solver settings, each device's name, threads, distinct cores and memory_bytes
   (a positive integer or null).
2. Every device (``placement.device_sets[placement.variant]``: CPU "devices" of a thread
   count, pinned to cores) is calibrated on first use for its fingerprint (threads are part
   of it) and every workload is measured on it, pinned, in interleaved rounds, from cold
   caches (``evaluate_workloads``): per workload and device, L0-L3 predicted and measured.
   Predictions are held out (``experiments.workloads.heldout_for``: each profile's models
   refitted once without any kernel of the mix), and the levels place by those models; the
   profile lookup (profiled kernels by their measurement) is scored beside them.
3. ``sim.place.placement.place`` by each level in ``placement.levels`` and by the oracle (the
   measured latencies): predicted makespan, realised makespan (the placement's makespan
   under the measured latencies) and regret against the oracle's realised makespan.
   Where the devices run together (pairwise disjoint cores), each 1-thread device's level
   predictions are multiplied per kernel by the co-location factors of its profile
   (``costmodel.colocation``: measured alone, beside a twin and beside a memory-streaming
   neighbour on another core), at the pressure of the workload pool (the neighbour's memory
   traffic, ``sim.place.placement.pool_pressure``: which workloads the neighbour runs is what
   is being decided); ``placement.colocation``: ``profile``, the default, uses them where
   measured, ``off`` ignores them. The oracle's measured latencies were taken alone and stay
   as they are.
4. ``sim.place.executor.run_placements`` runs each distinct placement for real (one pinned worker
   process per device, started together; devices whose cores overlap run alone, one after
   the other): the measured makespan and its regret against the oracle's.

Outputs: results.csv (one row per workload, device and level), workloads.csv (per workload
and device: FLOPs, memory, L0-L3 predictions, measured), summary.json (common schema over
the workload-device rows, plus ``details.placement``), gantt_<level>.png (both devices'
timelines, predicted beside measured), makespan.png.
"""

from __future__ import annotations

import gc
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from costmodel.measure.ceilings import device_memory_bytes  # noqa: E402
from costmodel.model.predictor import LEVELS, CostModel  # noqa: E402
from costmodel.measure.runtime import Runtime  # noqa: E402
from experiments.common import (  # noqa: E402
    calibration_options, check_common, config_dict, console, output_dir, print_summary, print_table, summary,
)
from experiments.workloads import ape_summary, evaluate_workloads, heldout_for  # noqa: E402
from sim.predict.calibration import calibrated_model, drift_references  # noqa: E402
from sim.predict.heldout import trace_kernels  # noqa: E402
from sim.place.executor import check_cores, device_context, devices_can_run_together, run_placements  # noqa: E402
from sim.place.placement import (  # noqa: E402
    SOLVERS, Device, Placement, PlacementError, PlacementWorkload, check_inputs, contended_makespan,
    contention_inputs, place, pool_pressure,
)
from sim.place.placement_workloads import calibration_suite  # noqa: E402
from sim.workloads.workload import Workload  # noqa: E402

ORACLE = "oracle"
#: ``placement.colocation``: profile (the devices' profiles' co-location factors where measured) | off
COLOCATION_MODES = ("profile", "off")


#: builders ``placement_mix`` may name as ``_target_`` (each returns a ``sim.place.placement.PlacementWorkload``)
MIX_BUILDERS = tuple(f"sim.place.placement_workloads.{b}" for b in ("moe_workload", "gnn_workload", "mlp_workload"))


def build_workloads(cfg: Mapping[str, Any]) -> list[PlacementWorkload]:
    """Instantiate every entry of ``placement_mix`` (name -> builder config), validated: only
    the builders of ``MIX_BUILDERS``, each result a ``PlacementWorkload``."""
    from hydra.utils import instantiate

    mix = cfg.get("placement_mix") or {}
    if not isinstance(mix, Mapping) or not mix:
        raise PlacementError("placement_mix must list at least one workload (name: {_target_: ..., ...}), got "
                             f"{mix!r}")
    out = []
    for i, (name, spec) in enumerate(mix.items()):
        if not isinstance(spec, Mapping):
            raise PlacementError(f"placement_mix.{name} must be a mapping {{_target_: builder, its arguments}}, "
                                 f"got {spec!r}")
        target = spec.get("_target_")
        if target not in MIX_BUILDERS:
            raise PlacementError(f"placement_mix.{name}._target_ must be one of {list(MIX_BUILDERS)}, got {target!r}")
        nested = [k for k, v in spec.items() if k != "_target_" and (isinstance(v, Mapping) or k.startswith("_"))]
        if nested:
            raise PlacementError(f"placement_mix.{name}: {nested} are not arguments of {target} (plain values only; "
                                 "no nested configs or Hydra keys such as _args_ or _partial_)")
        try:
            w = instantiate(spec, name=str(name), dtype=str(cfg["dtype"]), seed=int(cfg.get("seed", 0)) + i)
        except Exception as err:  # Hydra wraps the builder's ValueError
            cause = err.__cause__ or err
            raise PlacementError(f"placement_mix.{name}: {cause}") from None
        if not isinstance(w, PlacementWorkload):
            raise PlacementError(f"placement_mix.{name}: {target} returned a {type(w).__name__}, not a PlacementWorkload")
        out.append(w)
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def device_settings(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chosen device set, validated: name, threads, cores, memory."""
    p = cfg["placement"]
    variant = p["variant"]
    sets = p["device_sets"]
    if not isinstance(sets, Mapping) or not sets:
        raise PlacementError(f"placement.device_sets must map variant names to lists of devices, got {sets!r}")
    if not isinstance(variant, str) or variant not in sets:
        raise PlacementError(f"placement.variant must be one of {sorted(sets)}, got {variant!r}")
    devices = sets[variant] or []
    key = f"placement.device_sets.{variant}"
    if isinstance(devices, (str, Mapping)) or not isinstance(devices, Sequence):
        raise PlacementError(f"{key} must be a list of devices ({{name, threads, cores, memory_bytes}}), got {devices!r}")
    if not devices:
        raise PlacementError(f"{key} lists no devices")
    allowed = {"name", "threads", "cores", "memory_bytes"}
    out = []
    for j, d in enumerate(devices):
        where = f"{key}[{j}]"
        if not isinstance(d, Mapping):
            raise PlacementError(f"{where} must be a mapping {{name, threads, cores, memory_bytes}}, got {d!r}")
        unknown = sorted(set(d) - allowed)
        if unknown:
            raise PlacementError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        name, threads, cores, memory = d.get("name"), d.get("threads"), d.get("cores"), d.get("memory_bytes")
        if not isinstance(name, str) or not name:
            raise PlacementError(f"{where}.name must be a non-empty string, got {name!r}")
        if not _is_int(threads) or threads < 1:
            raise PlacementError(f"{where}.threads (device {name!r}) must be a positive integer, got {threads!r}")
        if memory is not None and (not _is_int(memory) or memory < 1):
            raise PlacementError(f"{where}.memory_bytes (device {name!r}) must be a positive integer of bytes, or null "
                                 f"for an equal share of the host's memory, got {memory!r}")
        if cores is not None:
            if isinstance(cores, (str, Mapping)) or not isinstance(cores, Sequence) or not cores \
                    or not all(_is_int(c) and c >= 0 for c in cores):
                raise PlacementError(f"{where}.cores (device {name!r}) must be a non-empty list of core ids (integers "
                                     f">= 0), or null for unpinned, got {cores!r}")
            cores = tuple(cores)
            if len(set(cores)) != len(cores):
                raise PlacementError(f"{where}.cores (device {name!r}) must be distinct, got {list(cores)}")
            check_cores(name, cores)
            if len(cores) < threads:
                raise PlacementError(f"device {name!r}: {threads} threads on {len(cores)} cores would contend; "
                                     "give at least as many cores as threads")
        out.append({"name": name, "threads": threads, "cores": cores, "memory_bytes": memory})
    names = [d["name"] for d in out]
    if len(set(names)) != len(names):
        raise PlacementError(f"device names must be unique, got {names}")
    return out


#: ``tied_placements`` enumerates every assignment up to this many (devices ** workloads)
MAX_ENUMERATED = 2**18


def colocated_devices(devices: Sequence[Device], rt: Runtime, mode: str, together: bool
                      ) -> tuple[list[Device], dict[str, Any]]:
    """The devices with the co-location factors of their profiles attached where they run
    together: 1-thread devices on one core each, factors measured for that core first
    (``costmodel.colocation.load_colocation``), else for any placement of the profile."""
    from dataclasses import replace  # noqa: PLC0415

    from costmodel.colocation import load_colocation  # noqa: PLC0415

    out: dict[str, Any] = {"mode": mode, "applied": {}}
    if mode == "off" or not together or len(devices) < 2:
        why = "placement.colocation=off" if mode == "off" else "the devices do not run together"
        out["how"] = f"not applied ({why}): level predictions as measured alone"
        return list(devices), out
    result, notes = [], []
    for d in devices:
        if d.threads != 1 or d.cores is None or len(d.cores) != 1:
            notes.append(f"{d.name}: not applied ({d.threads} thread(s) on cores {d.cores}; factors are measured "
                         "for 1-thread ranks on one core each)")
            result.append(d)
            continue
        folder = rt.profile_root / d.fingerprint.id
        others = tuple(c for o in devices if o is not d for c in (o.cores or ()))
        found = load_colocation(folder, cores=(*d.cores, *others)) or load_colocation(folder)
        if found is None:
            notes.append(f"{d.name}: no co-location factors in {folder} (python -m costmodel.colocation measure "
                         f"threads=1); predicted as alone")
            result.append(d)
            continue
        out["applied"][d.name] = found.to_dict()
        notes.append(f"{d.name}: {found.describe()}")
        result.append(replace(d, colocation=found))
    out["how"] = "; ".join(notes)
    return result, out


def tied_placements(cost_s: np.ndarray, measured_s: np.ndarray, *, rel_tol: float = 1e-9) -> dict[str, Any] | None:
    """Every placement that is optimal under ``cost_s`` (all ties, by enumeration), and the
    range of their realised regret under ``measured_s`` against the best realised makespan:
    whether a level's regret is its own or the solver's choice among equally good answers.
    None when there are more than ``MAX_ENUMERATED`` assignments."""
    n, m = cost_s.shape
    if m**n > MAX_ENUMERATED:
        return None
    choice = np.array(np.meshgrid(*[np.arange(m)] * n, indexing="ij")).reshape(n, -1).T  # [m^n, n]
    rows = np.arange(n)

    def spans(cost: np.ndarray) -> np.ndarray:
        per = cost[rows, choice]  # [m^n, n]: each workload's time on its device
        return np.stack([(per * (choice == d)).sum(axis=1) for d in range(m)], axis=1).max(axis=1)

    predicted, realised = spans(cost_s), spans(measured_s)
    best = predicted.min()
    tied = predicted <= best * (1 + rel_tol) + 1e-15
    regret = 100 * (realised[tied] / realised.min() - 1)
    return {"placements": int(tied.sum()), "regret_pct_min": float(regret.min()),
            "regret_pct_max": float(regret.max()), "regret_pct_median": float(np.median(regret))}


def _memory(setting: Mapping[str, Any], n_devices: int, device: Any) -> int:
    """A device's memory: as configured, else its share of the host's (CPU devices share it)."""
    if setting["memory_bytes"] is not None:
        return int(setting["memory_bytes"])
    total = device_memory_bytes(device)
    return total // n_devices if device.type == "cpu" else total


def placement_levels(value: Any) -> list[str]:
    """``placement.levels``: a list of cost-model levels; a single string is one level
    (``placement.levels=L3`` means ["L3"], not its letters)."""
    levels = [value] if isinstance(value, str) else value
    if isinstance(levels, Mapping) or not isinstance(levels, Sequence) or not levels \
            or any(not isinstance(lv, str) or lv not in LEVELS for lv in levels):
        raise PlacementError(f"placement.levels must list levels from {list(LEVELS)} (or name one), got {value!r}")
    if len(set(levels)) != len(levels):
        raise PlacementError(f"placement.levels must not repeat a level, got {list(levels)}")
    return list(levels)


def validate(cfg: Any) -> tuple[list[dict[str, Any]], list[PlacementWorkload], dict[str, int]]:
    """Every key, every workload and every memory limit checked, nothing measured or set:
    (device settings, workloads, memory per device)."""
    cfg = config_dict(cfg)
    device = check_common(cfg)
    p = cfg.get("placement")
    optional = {"colocation"}
    allowed = {"variant", "device_sets", "levels", "solver", "exact_max_binaries", "time_limit_s", "repeats", *optional}
    if not isinstance(p, Mapping):
        raise PlacementError(f"placement must be a mapping with keys {sorted(allowed)}, got {p!r}")
    unknown, missing = sorted(set(p) - allowed), sorted(allowed - optional - set(p))
    if unknown or missing:
        raise PlacementError("placement: " + (f"unknown key(s) {unknown}" if unknown else f"missing key(s) {missing}")
                             + f"; allowed: {sorted(allowed)}")
    levels = placement_levels(p["levels"])
    if p.get("colocation", "profile") not in COLOCATION_MODES:
        raise PlacementError(f"placement.colocation must be one of {list(COLOCATION_MODES)}, got {p['colocation']!r}")
    repeats = p["repeats"]
    if not _is_int(repeats) or repeats < 1:
        raise PlacementError(f"placement.repeats must be a positive integer, got {repeats!r}")
    if not isinstance(p["solver"], str) or p["solver"] not in SOLVERS:
        raise PlacementError(f"placement.solver must be one of {list(SOLVERS)}, got {p['solver']!r}")
    if not _is_int(p["exact_max_binaries"]) or p["exact_max_binaries"] < 0:
        raise PlacementError(f"placement.exact_max_binaries must be an integer >= 0, got {p['exact_max_binaries']!r}")
    limit = p["time_limit_s"]
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0:
        raise PlacementError(f"placement.time_limit_s must be a finite number of seconds > 0, got {limit!r}")
    settings = device_settings(cfg)
    workloads = build_workloads(cfg)
    memory = {s["name"]: _memory(s, len(settings), device) for s in settings}
    biggest = max(memory.values())
    for w in workloads:  # place() checks this too; here it is said before any calibration
        if w.memory_bytes > biggest:
            raise PlacementError(f"workload {w.name!r} needs {w.memory_bytes / 2**20:,.1f} MiB, more than any device's "
                                 f"memory (largest: {biggest / 2**20:,.1f} MiB)")
    need, have = sum(w.memory_bytes for w in workloads), sum(memory.values())
    if need > have:
        raise PlacementError(f"the workloads need {need / 2**20:,.1f} MiB together, more than the devices' "
                             f"{have / 2**20:,.1f} MiB")
    return settings, workloads, memory


def scored_attrs(per_device: pd.DataFrame, frames: Sequence[pd.DataFrame], heldouts: Mapping[str, Any], *,
                 rounds: int) -> dict[str, Any]:
    """The scorings of the workload-device table (``pd.concat`` keeps no attrs of frames that differ):
    held out (the headline), the profile lookup beside it (L3 by measurement where profiled, L0-L2
    as held out), and per profile its held-out fit."""
    lookup = per_device.assign(pred_L3_s=per_device["pred_lookup_L3_s"], ape_L3_pct=per_device["ape_lookup_L3_pct"])
    return {"rounds": rounds, "scoring": "held-out", "profile_lookup": ape_summary(lookup),
            "heldout": {**next(iter(frames)).attrs["heldout"],
                        "per_profile": {fp: h.to_dict() for fp, h in heldouts.items()}}}


def run(cfg: Any, out_dir: str | Path | None = None, *, plan: Any = None) -> dict[str, Any]:
    """``plan``: what ``validate(cfg)`` returned (the entry point's one check), else validated here."""
    cfg = config_dict(cfg)
    settings, workloads, memory = validate(cfg) if plan is None else plan  # everything checked before any work
    p = cfg["placement"]
    levels, repeats = placement_levels(p["levels"]), p["repeats"]
    progress = bool(cfg.get("progress", True))
    rt0 = Runtime.from_cfg(cfg, checked=True)
    out = output_dir(cfg, out_dir)
    suite = calibration_suite(workloads)

    # --- calibrate and measure every device, pinned, with its own thread count
    runnable = [Workload(w.name, w.trace, w.factory.build(rt0.device), {"workload": w.name, **w.columns})
                for w in workloads]
    traces = [w.trace for w in workloads]
    models: dict[str, CostModel] = {}
    heldouts: dict[str, Any] = {}  # per profile: models refitted without any kernel of the mix (the headline)
    devices: list[Device] = []
    frames, drifts = [], {}
    for s in settings:
        with device_context(s["cores"], s["threads"]):
            rt = Runtime.from_cfg({**cfg, "threads": s["threads"]}, checked=True)
            fp = rt.fingerprint.id
            if fp not in models:
                console.print(f"device {s['name']}: {s['threads']} thread(s) on cores {s['cores']}, profile {fp}")
                models[fp] = calibrated_model(rt, suite, suite_name="placement", progress=progress,
                                              heldout=trace_kernels(traces), **calibration_options(cfg))
                heldouts[fp] = heldout_for(rt, models[fp], traces, what="placement")
            model = models[fp]
            df = evaluate_workloads(model, runnable, device=rt.device, timing=rt.timing, heldout=heldouts[fp],
                                    references=drift_references(rt, suite), progress=progress,
                                    description=f"measure workloads on {s['name']}",
                                    peak_flops_per_s=model.ceilings["peak_flops_per_s"])
        drifts[s["name"]] = df.attrs.get("profile_drift") or {}
        frames.append(df.assign(device=s["name"], threads=s["threads"], memory_bytes=[w.memory_bytes for w in workloads]))
        # every level places by the held-out models: a placement is a prediction about work not yet run
        devices.append(Device(s["name"], heldouts[fp].model, memory[s["name"]], s["cores"]))
    del runnable
    gc.collect()
    per_device = pd.concat(frames, ignore_index=True)
    per_device.attrs = scored_attrs(per_device, frames, heldouts, rounds=rt0.timing.rounds)

    # --- place by every level and by the measured latencies
    measured = per_device.pivot(index="label", columns="device", values="measured_s").loc[
        [w.name for w in workloads], [d.name for d in devices]].to_numpy()
    index_w = {w.name: i for i, w in enumerate(workloads)}
    index_d = {d.name: k for k, d in enumerate(devices)}

    def oracle(w: PlacementWorkload, d: Device) -> float:
        return float(measured[index_w[w.name], index_d[d.name]])

    oracle.__name__ = ORACLE
    together = devices_can_run_together(devices)
    devices, colocation = colocated_devices(devices, rt0, p.get("colocation", "profile"), together)
    colocation["neighbour_pressure"] = {d.name: {lv: pool_pressure(workloads, d, lv) for lv in levels if lv in LEVELS}
                                        for d in devices if d.colocation is not None}
    console.print(f"co-location: {colocation['how']}")
    for name, by_level in colocation["neighbour_pressure"].items():
        if any(v is not None for v in by_level.values()):
            console.print(f"co-location: {name}'s neighbour, the workload pool on average, loads memory at "
                          + ", ".join(f"{v:.2f}" for lv, v in by_level.items() if v is not None)
                          + f" ({', '.join(lv for lv, v in by_level.items() if v is not None)}) of the stream "
                          "neighbour's rate (0: each kernel as alone, 1: as beside the stream)")
        else:
            console.print(f"co-location: {name}'s factors were measured without the stream neighbour: each kernel "
                          "as beside its twin (python -m costmodel.colocation measure threads=1 measures both)")
    check_inputs(workloads, devices, oracle)
    solver_args = {"solver": p["solver"], "exact_max_binaries": int(p["exact_max_binaries"]),
                   "time_limit_s": float(p["time_limit_s"])}
    placements: dict[str, Placement] = {lv: place(workloads, devices, lv, **solver_args) for lv in levels}
    placements[ORACLE] = place(workloads, devices, oracle, **solver_args)

    # --- run every distinct placement for real
    if not together:
        console.print("[yellow]the devices' cores overlap: each device runs its share alone, one after the other, and "
                      "a placement's measured makespan is the largest of their wall times (no contention between them)[/]")
    runs = run_placements(list(placements.values()), workloads, devices, repeats=repeats,
                          allocator=str(cfg.get("allocator", "steady")), evict_bytes=rt0.timing.cpu_evict_bytes,
                          progress=progress)

    rows, table = [], []
    realised_oracle = placements[ORACLE].makespan_under(measured)
    measured_oracle = runs[placements[ORACLE].key()].measured_makespan_s
    results: dict[str, dict[str, Any]] = {}
    # per level and device: each workload's alone seconds, sensitivity and pressure (placement-independent)
    inputs = {lv: [contention_inputs(workloads, d, lv) for d in devices] for lv in levels if lv in LEVELS}
    for name, pl in placements.items():
        run_ = runs[pl.key()]
        realised = pl.makespan_under(measured)
        # contention in time: each device slowed by what the other runs at that moment (the oracle: its measured
        # latencies alone, slowed by L3's sensitivities and pressures: the contention model on its own)
        contended = (contended_makespan(pl, devices, name, workloads, inputs=inputs[name]) if name in LEVELS else
                     contended_makespan(pl, devices, "L3", workloads, alone_s=measured, inputs=inputs["L3"])
                     if "L3" in inputs else None)
        results[name] = {
            "predicted_contended_makespan_s": contended[0] if contended else None,
            "predicted_contended_vs_measured_pct": (100 * (contended[0] / run_.measured_makespan_s - 1)
                                                    if contended else None),
            "predicted_makespan_s": pl.makespan_s,
            "realised_makespan_s": realised,
            "measured_makespan_s": run_.measured_makespan_s,
            "regret_pct": 100 * (realised / realised_oracle - 1),
            "measured_regret_pct": 100 * (run_.measured_makespan_s / measured_oracle - 1),
            "predicted_vs_measured_pct": 100 * (pl.makespan_s / run_.measured_makespan_s - 1),
            # > 1: the real run was slower than its workloads measured alone (devices sharing memory bandwidth and
            # cache when they run together); < 1: faster (back to back, a workload finds some of its data cached)
            "measured_over_realised": run_.measured_makespan_s / realised,
            "measured_makespan_iqr_s": float(np.subtract(*np.percentile(run_.makespans_s, [75, 25]))),
            "solver": pl.solver, "optimal": pl.optimal, "gap_pct": pl.gap_pct, "solver_note": pl.note,
            "same_placement_as_oracle": pl.key() == placements[ORACLE].key(),
            "assignment": pl.assignment(),
            "flops_per_device": {d.name: float(sum(w.flops for w, k in zip(workloads, pl.device_of) if k == j))
                                 for j, d in enumerate(devices)},
            "realised_load_per_device_s": dict(zip(pl.devices, pl.loads_s(measured).tolist())),
            "tied_placements": tied_placements(pl.cost_s, measured),
        }
        table.append({"level": name, **{k: v for k, v in results[name].items() if not isinstance(v, dict)}})
        measured_tl = run_.timeline().set_index("workload")
        for i, w in enumerate(workloads):
            for k, d in enumerate(devices):
                here = pl.device_of[i] == k
                rows.append({"workload": w.name, **w.columns, "device": d.name, "level": name,
                             "predicted_s": pl.cost_s[i, k], "measured_s": measured[i, k],
                             "ape_pct": 100 * abs(pl.cost_s[i, k] / measured[i, k] - 1), "placed_here": here,
                             "flops": w.flops, "memory_bytes": w.memory_bytes,
                             "run_start_s": measured_tl.loc[w.name, "start_s"] if here else np.nan,
                             "run_end_s": measured_tl.loc[w.name, "end_s"] if here else np.nan})
    results_df = pd.DataFrame(rows)

    drift_values = [d["now_over_profile_median"] for d in drifts.values() if d]
    details = {
        "placement": results,
        "concurrent": together,
        "colocation": colocation,
        "run_note": ("devices ran together, each pinned to its own cores" if together else
                     "the devices' cores overlap: each device ran its share alone and the makespan is the largest "
                     "of their wall times"),
        "variant": p["variant"],
        "devices": [{"name": d.name, "threads": d.threads, "cores": d.cores, "memory_bytes": d.memory_bytes,
                     "profile": d.fingerprint.id} for d in devices],
        "workloads": len(workloads), "repeats": repeats,
        "total_flops": float(sum(w.flops for w in workloads)),
        "profile_drift_per_device": drifts,
    }
    if drift_values:
        details["profile_drift"] = {"now_over_profile_median": float(np.median(drift_values)),
                                    "now_over_profile_iqr": float(max(d["now_over_profile_iqr"] for d in drifts.values() if d)),
                                    "kernels": int(sum(d["kernels"] for d in drifts.values() if d))}
    desc = "; ".join(f"{d.name}: {d.fingerprint.describe()}, cores {list(d.cores) if d.cores else 'any'}" for d in devices)
    summ = summary("placement", desc, per_device, details=details)

    results_df.to_csv(out / "results.csv", index=False)
    per_device.to_csv(out / "workloads.csv", index=False)
    import json

    from experiments.common import _json_default

    (out / "summary.json").write_text(json.dumps(summ, indent=2, default=_json_default) + "\n")
    for name, pl in placements.items():
        plot_gantt(pl, runs[pl.key()], out / f"gantt_{name}.png", measured=measured)
    plot_makespans(results, out / "makespan.png", together=together)

    print_table(per_device, {"label": "", "device": "", "flops": ".2e", "measured_s": "ms", "pred_L0_s": "ms",
                             "pred_L2_s": "ms", "pred_L3_s": "ms", "ape_L3_pct": ".1f"},
                title="workloads: measured and predicted latency per device (ms)")
    print_table(pd.DataFrame(table), {"level": "", "solver": "", "predicted_makespan_s": "ms",
                                      "realised_makespan_s": "ms", "measured_makespan_s": "ms", "regret_pct": ".1f",
                                      "measured_regret_pct": ".1f", "predicted_vs_measured_pct": ".1f",
                                      "predicted_contended_makespan_s": "ms", "predicted_contended_vs_measured_pct": ".1f"},
                title="placement makespans (ms) and regret vs the oracle (%)")
    console.print(details["run_note"])
    if any(r["predicted_contended_makespan_s"] is not None for r in results.values()):
        console.print("predicted_contended: each device slowed moment by moment by what the other runs then (its "
                      "workloads' sensitivity to a streaming neighbour x the neighbour's pressure); the oracle's row: "
                      "its measured latencies alone, slowed so (the contention model on its own)")
    for name, r in results.items():
        ties = r["tied_placements"]
        if ties and ties["placements"] > 1:
            console.print(f"{name}: {ties['placements']} placements tie under its predictions; their realised regret "
                          f"ranges {ties['regret_pct_min']:.1f}% to {ties['regret_pct_max']:.1f}% "
                          f"(median {ties['regret_pct_median']:.1f}%)")
    print_summary(summ)
    console.print(f"outputs in {out}")
    return summ


def plot_gantt(pl: Placement, run_: Any, path: Path, *, measured: np.ndarray) -> None:
    """Both devices' timelines: predicted (the placement's own costs; its own time axis, since
    L0 predicts a fraction of the real time), realised (the measured per-workload latencies
    back to back) and measured (the real run, median of repeats) on one axis."""
    names = list(pl.workloads)
    colours = {w: plt.cm.tab20(i % 20) for i, w in enumerate(names)}
    panels = [(f"predicted by {pl.predictor}", pl.timeline()), ("realised: measured latencies", pl.timeline(measured)),
              ("measured: real run, median of repeats", run_.timeline())]
    shared = max(float(t["end_s"].max()) if not t.empty else 0.0 for _, t in panels[1:]) * 1e3 * 1.05
    fig, axes = plt.subplots(1, 3, figsize=(16, 1.4 + 0.9 * len(pl.devices)), sharey=True)
    for j, (ax, (title, tl)) in enumerate(zip(axes, panels)):
        end = float(tl["end_s"].max()) * 1e3 if not tl.empty else 0.0
        horizon = max(end * 1.05, 1e-6) if j == 0 else shared
        for k, dev in enumerate(pl.devices):
            for _, b in tl[tl["device"] == dev].iterrows():
                width = (b["end_s"] - b["start_s"]) * 1e3
                ax.barh(k, width, left=b["start_s"] * 1e3, color=colours[b["workload"]], edgecolor="black", lw=0.5)
                if width > horizon * 0.07:
                    ax.text((b["start_s"] * 1e3 + width / 2), k, b["workload"], ha="center", va="center", fontsize=5.5,
                            rotation=90, clip_on=True)
        ax.axvline(end, color="red", ls="--", lw=1)
        ax.set_title(f"{title}\nmakespan {end:.2f} ms", fontsize=9)
        ax.set_xlim(0, horizon)
        ax.set_xlabel("time [ms]")
        ax.set_yticks(range(len(pl.devices)), pl.devices)
        ax.grid(True, axis="x", alpha=0.2)
    fig.suptitle(f"placement by {pl.predictor} ({pl.solver})", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[w]) for w in names]
    fig.legend(handles, names, loc="lower center", ncol=min(6, len(names)), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_makespans(results: Mapping[str, Mapping[str, Any]], path: Path, *, together: bool) -> None:
    names = list(results)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for j, (key, label) in enumerate((("predicted_makespan_s", "predicted"), ("realised_makespan_s", "realised (measured latencies)"),
                                      ("measured_makespan_s", "measured (real run)"))):
        ax.bar(x + (j - 1) * 0.27, [results[n][key] * 1e3 for n in names], 0.27, label=label)
    top = max(max(r[k] for k in ("predicted_makespan_s", "realised_makespan_s", "measured_makespan_s")) for r in results.values())
    for i, n in enumerate(names):
        r = results[n]
        height = max(r["predicted_makespan_s"], r["realised_makespan_s"], r["measured_makespan_s"])
        ax.text(i, (height + 0.02 * top) * 1e3, f"regret vs oracle\nrealised {r['regret_pct']:.0f}%\n"
                f"measured {r['measured_regret_pct']:.0f}%", ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, top * 1.3e3)
    ax.set_xticks(x, names)
    ax.set_ylabel("makespan [ms]")
    ax.set_title("makespan by placement" + ("" if together else " (devices run one after the other)"))
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
