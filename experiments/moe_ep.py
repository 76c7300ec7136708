"""experiment=moe_ep: one MoE layer across W ranks (expert parallelism), predicted and measured.

For every point of ``moe_skew``'s routing-concentration sweep (the same routing configs) and
every expert placement (``ep.placements``: contiguous, round_robin, load_aware), the plan
(``sim.distributed.ep_plan``) gives each rank's kernels and the bytes of its all-to-alls;
``sim.distributed.ep_predict`` predicts each rank's timeline (router, dispatch, experts,
combine, weighted sum; the bulk-synchronous wait rule at each all-to-all) at L0-L3, and the
real layer (``sim.distributed.ep_layer``, W gloo processes, one thread each, pinned) is timed
with its phase marks: per repeat the slowest rank's step (``step_timing.time_step``), per
rank the median of each phase.

Scoring (docs/method.md): the headline is **held out**: the local kernels predicted by models
refitted without any kernel of this run's traces (``sim.predict.heldout.fit_heldout``); the
all-to-alls by the collective model of ``costmodel.collectives`` (its own profile, a grid of
message sizes; the run's messages are not in it) or, while no collective profile exists, by a
latency-bandwidth fit to a grid of uniform all-to-alls timed in the same launch
(``sim.distributed.ep_collectives``). ``details.profile_lookup`` is the profile as loaded.
``details.replay`` is the rank replay: each rank's kernels timed inside the ranks after their
steps, composed by the same timeline (a composition check; ``calibration.paired`` applies to
single-device layers).
``details.heldout_drift_scaled`` is the drift side score: the held-out models' L3 times each
family's drift (``sim.predict.heldout_drift``), read off reference kernels that are none of this
run's, timed inside the ranks side by side at the end of every round and read net of their own
co-location factor (``rank_drift``); each layer kernel's own factor is put back, as in the headline.

Co-location (``ep.colocation``): the W ranks share this host's cache and memory bandwidth,
the profile was measured with one process alone; each rank's kernel predictions are
multiplied by their family's measured factor (``costmodel.colocation``: the profile's
colocation.json for the ranks' cores, ``profile`` measuring it first when missing,
``measure`` anew, ``off`` none). The headline is scored with them; ``details.colocation``
holds the factors and the held-out L3 error without them.

Outputs: results.csv (one row per point x placement x backend), summary.json in the common
schema plus ``details.ep`` (per point: per-rank timelines predicted and measured, straggler,
skew share, the load-aware placement's gain over contiguous; ``phase_over_measured``: each local
phase's L3 predicted / measured seconds over points and ranks, held out and rank replay, which
says where a step's error sits), ep_timelines.png and
predicted_vs_measured.png.

``measure=false``: a predict-only what-if at ``ep.whatif_world_size`` ranks (default 8),
kernel model as fitted, collectives from a collective profile of that size if there is one,
else a latency-bandwidth model fitted to the W=2 one; it says that it extrapolates.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from costmodel.model.predictor import LEVELS  # noqa: E402
from costmodel.measure.runtime import Runtime  # noqa: E402
from costmodel.cli.config_schema import Interval, Options, Rule, at_most, is_int  # noqa: E402
from costmodel.colocation.apply import MODES as COLOCATION_MODES  # noqa: E402
from costmodel.measure.timing import TimingConfig  # noqa: E402
from experiments.common import (  # noqa: E402
    add_errors, calibration_options, check_common, check_measure_keys, config_dict, console, output_dir,
    plot_predicted_vs_measured, predict_only_summary, print_table, ratio_summary, ratio_words, summary, write_outputs,
)
from experiments.distributed_common import (  # noqa: E402
    check_link, collective_backend, colocation_details, finish_timelines, label_timeline_axis, link_constraints,
    gain_summary, missing_link_message, print_gains, print_straggler_and_summary, rank_colocation, round_columns,
    stated_link_model, straggler_summary, timeline_grid, usable_cores, variant_gains,
)
from experiments.moe_skew import CONSTRAINTS as MOE_CONSTRAINTS  # noqa: E402
from experiments.moe_skew import moe_configs, routing_generators  # noqa: E402
from experiments.workloads import ape_summary, heldout_for  # noqa: E402
from sim.predict.calibration import calibrated_model, fitted_model, moe_suite  # noqa: E402
from sim.predict.heldout import trace_kernels  # noqa: E402
from sim.distributed.ep_collectives import (  # noqa: E402
    collective_model_for, fit_grid, load_fallback, save_fallback, whatif_from,
)
from sim.distributed.ep_plan import EPPlan, plan_expert_parallel  # noqa: E402
from sim.distributed.ep_predict import (  # noqa: E402
    PHASES, EPStepPrediction, RankTimeline, cost_model_kernel_times, ep_traces, predict_ep_step,
    rank_replay_kernel_times,
)
from sim.distributed.expert_placement import PLACEMENTS, ExpertPlacement  # noqa: E402
from sim.workloads.memory import check_fits_device, combine, moe_need  # noqa: E402
from sim.workloads.moe_layer import MoEConfig, backend_unavailable_reason  # noqa: E402
from sim.workloads.routing import route  # noqa: E402
from costmodel.model.cold_start import cold_start_per_kind_s, recold_curve  # noqa: E402
from costmodel.model.composition import per_call_s  # noqa: E402

#: this experiment can predict without measuring (``measure=false``: the what-if at larger W)
MEASURES = "optional"
BACKEND = "gloo"
#: where the all-to-all model comes from (``ep.collectives``)
COLLECTIVE_SOURCES = ("profile", "in_run")
MAX_REPEATS = 200
#: uniform all-to-all sizes (bytes per peer) of the in-launch latency-bandwidth fit
A2A_GRID = (256, 2048, 16384, 131072, 1048576, 4194304)
#: phases drawn in the timeline plot, one colour each (measured dispatch includes its waits)
PHASE_COLOURS = {"router": "C0", "dispatch": "C1", "experts": "C2", "combine": "C3", "weighted_sum": "C4"}
#: a rank's local phases and the measured segment that times each (the all-to-alls are left out of
#: the per-phase ratios: a rank's measured all-to-all holds its wait for the others)
LOCAL_PHASE_SEGMENTS = {"router": "router", "dispatch": "dispatch_prep", "experts": "experts",
                        "weighted_sum": "weighted_sum"}
#: measured phases shorter than this are not compared (a rank with nothing to do in them)
MIN_PHASE_S = 1e-6


#: moe_ep's fields: the MoE layer's (``experiments.moe_skew.CONSTRAINTS``) and the ``ep``
#: block's; placements and the cores a measured world size needs are derived by ``check_ep``
CONSTRAINTS: dict[str, Any] = {
    **MOE_CONSTRAINTS,
    "ep.world_size": Rule(lambda v, cfg: cfg.get("measure", True) is False or (is_int(v) and 2 <= v <= cfg["moe"]["num_experts"]),
                          lambda cfg: f"an integer in [2, {cfg['moe']['num_experts']}]"),
    "ep.whatif_world_size": at_most("moe.num_experts", low=2, words="an integer in"),
    "ep.capacity_factor": [Interval(float, 0, None, closed="neither", words="a number > 0 (such as 1.25)"), None],
    "ep.warmup": Interval(int, 0, 50),
    "ep.repeats": Interval(int, 3, MAX_REPEATS),
    "ep.rounds": Interval(int, 1, 20),
    "ep.timeout_s": Interval(int, 10, 3600),
    "ep.collectives": Options(list(COLLECTIVE_SOURCES)),
    "ep.colocation": Options(list(COLOCATION_MODES)),
    "ep.keep_awake": Options([True, False]),
    **link_constraints("ep"),
}


def _placements(value: Any, num_experts: int, world_size: int) -> list[str | ExpertPlacement]:
    """``ep.placements``: names from PLACEMENTS, or {slots: [[experts of rank 0], ...]} (a hand-built placement)."""
    if isinstance(value, (str, dict)):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"ep.placements must list at least one of {list(PLACEMENTS)} (or {{slots: [[...], ...]}}), "
                         f"got {value!r}")
    out: list[str | ExpertPlacement] = []
    for i, p in enumerate(value):
        if isinstance(p, dict):
            slots = p.get("slots")
            if not isinstance(slots, (list, tuple)) or len(slots) != world_size \
                    or not all(isinstance(r, (list, tuple)) for r in slots):
                raise ValueError(f"ep.placements[{i}].slots must list the experts of each of the ep.world_size="
                                 f"{world_size} ranks, got {slots!r}")
            experts = np.array([e for r in slots for e in r], dtype=np.int64)
            ranks = np.array([r for r, es in enumerate(slots) for _ in es], dtype=np.int64)
            try:
                out.append(ExpertPlacement("custom", num_experts, world_size, experts, ranks))
            except ValueError as err:
                raise ValueError(f"ep.placements[{i}]: {err}") from None
        elif p in PLACEMENTS:
            out.append(p)
        else:
            raise ValueError(f"ep.placements[{i}] must be one of {list(PLACEMENTS)} (or {{slots: [[...], ...]}}), "
                             f"got {p!r}")
    return out


def check_ep(cfg: Mapping[str, Any], base: MoEConfig, measuring: bool) -> dict[str, Any]:
    """The ``ep`` block (its fields checked by ``CONSTRAINTS``) with what is derived: a measured
    world size against the cores (one pinned core per rank), the placements; defaults filled in."""
    ep = cfg.get("ep") or {}
    E = base.num_experts
    W = int(ep.get("world_size", 2))
    if measuring:
        cores = usable_cores()
        if W > cores:
            raise ValueError(f"ep.world_size={W} cannot be placed here: one pinned core per rank and this process "
                             f"may use {cores} cores; allowed [2, {min(cores, E)}] (measure=false predicts any "
                             f"ep.whatif_world_size)")
    whatif = ep.get("whatif_world_size", 8)
    ranks = W if measuring else whatif
    placements = _placements(ep.get("placements", list(PLACEMENTS)), E, ranks)
    for p in placements:
        if p == "contiguous" and E % ranks:
            raise ValueError(f"ep.placements: 'contiguous' needs moe.num_experts={E} divisible by "
                             f"{'ep.world_size' if measuring else 'ep.whatif_world_size'}={ranks}")
    capacity = ep.get("capacity_factor")
    return {"world_size": ranks, "placements": placements,
            "capacity_factor": None if capacity is None else float(capacity),
            "warmup": ep.get("warmup", 2), "repeats": ep.get("repeats", 6), "rounds": ep.get("rounds", 3),
            "timeout_s": ep.get("timeout_s", 600),
            "collectives": ep.get("collectives", "profile"), "colocation": ep.get("colocation", "measure"),
            "keep_awake": ep.get("keep_awake", True), "link": check_link(ep, "ep", measuring)}


def validate(cfg: Any) -> tuple[list[MoEConfig], list[tuple[Any, Any]], float | None, dict[str, Any]]:
    """Every check that needs no measuring: base keys, layer configs, routing sweep, the ep
    block (world size against experts and cores, placements), memory."""
    cfg = config_dict(cfg)
    device = check_common(cfg, CONSTRAINTS)
    measuring = check_measure_keys(cfg)
    if device.type != "cpu":
        raise ValueError(f"experiment=moe_ep runs its ranks as gloo processes on CPU; device must be cpu, got {device}")
    configs = moe_configs(cfg, str(cfg["dtype"]))
    generators = routing_generators(cfg)
    capacity = cfg["routing"].get("capacity_factor")
    capacity = None if capacity is None else float(capacity)
    ep = check_ep(cfg, configs[0], measuring)
    if measuring:  # each rank builds the whole reference layer once, then its slots
        check_fits_device(combine([moe_need(c) for c in configs] * (ep["world_size"] + 1)), device,
                          what=f"the EP layers of moe_ep ({ep['world_size']} ranks)",
                          knobs=["moe.d_model", "moe.d_ff", "moe.num_experts", "moe.tokens", "ep.world_size"])
    return configs, generators, capacity, ep


def _plan_points(cfg: Mapping[str, Any], rt: Runtime, configs: Sequence[MoEConfig], generators: Sequence[tuple[Any, Any]],
                 capacity: float | None, ep: Mapping[str, Any]) -> list[dict[str, Any]]:
    base = configs[0]
    points = []
    for i, (value, gen) in enumerate(generators):
        routing = route(gen, tokens=base.tokens, num_experts=base.num_experts, top_k=base.top_k,
                        seed=rt.seed + i, capacity_factor=capacity)
        for p in ep["placements"]:
            name = p if isinstance(p, str) else p.kind
            for c in configs:
                plan = plan_expert_parallel(c, routing, world_size=ep["world_size"], placement=p,
                                            capacity_factor=ep["capacity_factor"])
                points.append({"point": i, "value": value, "generator": type(gen).__name__, "placement": name,
                               "backend": c.backend, "cfg": c, "routing": routing, "plan": plan})
    return points


def _collectives(rt: Runtime, W: int, measuring: bool, source: str = "profile",
                 keep_awake: bool = True) -> tuple[Any, str]:
    """The all-to-all model: ``ep.collectives=profile`` the collective profile of the ranks'
    core state (``ep.keep_awake``; measured first when missing and measuring, ~1 min at W=2);
    ``in_run`` (or no collectives package) None, and the run fits a latency-bandwidth model to a
    grid timed in its own launch."""
    if source == "in_run" and measuring:
        return None, "ep.collectives=in_run: a latency-bandwidth all-to-all fitted to a grid timed in this launch"
    cm, how = collective_model_for(W, BACKEND, rt.profile_root, measure_if_missing=measuring, keep_awake=keep_awake)
    if cm is not None:
        return cm, how
    if measuring:
        return None, how + "; fitting a latency-bandwidth all-to-all to a grid timed in this launch"
    fallback = load_fallback(rt.open_profile(create=False).path, W, BACKEND)
    if fallback is None:
        raise ValueError(f"measure=false needs an all-to-all model for {BACKEND} W={W}: {how}, and no in-run fit "
                         f"was saved yet; run experiment=moe_ep once with measure=true")
    return fallback, "latency-bandwidth fit saved by an earlier measuring run (sim.distributed.ep_collectives)"


def run(cfg: Any, out_dir: str | Path | None = None, *, plan: Any = None) -> dict[str, Any]:
    """``plan``: what ``validate(cfg)`` returned (the entry point's one check), else validated here."""
    cfg = config_dict(cfg)
    configs, generators, capacity, ep = validate(cfg) if plan is None else plan
    rt = Runtime.from_cfg(cfg, checked=True)
    unavailable = {c.backend: r for c in configs if (r := backend_unavailable_reason(c, rt.device))}
    configs = [c for c in configs if c.backend not in unavailable]
    if not configs:
        raise ValueError(f"no requested MoE backend can run here: {unavailable}")
    measuring = check_measure_keys(cfg)
    whatif = None if measuring else _whatif_models(cfg, rt, ep)  # before planning: a missing link fails first
    out = output_dir(cfg, out_dir)
    progress = bool(cfg.get("progress", True))
    points = _plan_points(cfg, rt, configs, generators, capacity, ep)
    traces = [t for pt in points for t in ep_traces(pt["cfg"], pt["plan"])]
    details: dict[str, Any] = {
        "layer": {k: cfg["moe"][k] for k in ("tokens", "d_model", "d_ff", "num_experts", "top_k", "expert")},
        "routing": cfg["routing"]["generator"].get("_target_"), "sweep_param": cfg["routing"]["sweep"]["param"],
        "capacity_factor": capacity, "ep_capacity_factor": ep["capacity_factor"], "world_size": ep["world_size"],
        "placements": sorted({pt["placement"] for pt in points}), "backends": [c.backend for c in configs],
        "collective_backend": BACKEND,
    }
    if whatif is not None:
        return _predict_only(rt, points, details, out, ep, *whatif)

    shard_cfgs = [MoEConfig(**{**c.__dict__, "tokens": math.ceil(c.tokens / ep["world_size"])}) for c in configs]
    suite = moe_suite(list(configs) + shard_cfgs)
    model = calibrated_model(rt, suite, suite_name="moe", progress=progress, heldout=trace_kernels(traces), **calibration_options(cfg))
    heldout = heldout_for(rt, model, traces, what="moe_ep", runners=False)
    cm, cm_how = _collectives(rt, ep["world_size"], measuring=True, source=ep["collectives"],
                              keep_awake=ep["keep_awake"])
    console.print(f"all-to-all model: {cm_how}")
    colo, colo_how = rank_colocation(rt, ep["world_size"], ep["colocation"], field="ep.colocation", measuring=True,
                                     what="moe_ep", progress=progress)
    console.print(f"co-location: {colo_how}" + (f"\n  {colo.describe()}" if colo is not None else ""))

    from sim.distributed.ep_layer import MEASURED_SEGMENTS, run_ep_phases  # noqa: PLC0415

    x = torch.randn(configs[0].tokens, configs[0].d_model, generator=torch.Generator().manual_seed(rt.seed)).numpy()
    evict = int(rt.timing.cpu_evict_bytes) if rt.timing.cold_cache else 0
    console.print(f"timing {len(points)} EP steps on {ep['world_size']} gloo processes: {ep['rounds']} rounds x "
                  f"({ep['warmup']} warm-up + {ep['repeats']} repeats) each{', caches evicted before each step' if evict else ''}")
    measured = run_ep_phases([(pt["cfg"], pt["plan"], pt["routing"]) for pt in points], x,
                             world_size=ep["world_size"], seed=rt.seed, warmup=ep["warmup"], repeats=ep["repeats"],
                             rounds=ep["rounds"],
                             evict_bytes=evict, a2a_sizes=A2A_GRID if cm is None else (),
                             timeout_s=float(ep["timeout_s"]), allocator=str(cfg.get("allocator", "steady")),
                             replay=dataclasses.asdict(replay_timing(rt.timing)), keep_awake=ep["keep_awake"],
                             references=[r.spec for r in heldout.references])
    console.print(f"ranks: {measured['note']}")
    heldout.drift = rank_drift(heldout.references, measured["reference_s"], colocation=colo)
    if cm is None:
        cm = fit_grid(measured["a2a"], ep["world_size"])
        save_fallback(rt.open_profile().path, cm, BACKEND)
        cm_how += (f": alpha {cm.alpha_s * 1e6:.1f} us, beta {cm.beta_bytes_per_s / 1e9:.2f} GB/s over "
                   f"{len(measured['a2a'])} sizes")
        details["collective_grid"] = [{"bytes_per_peer": b, "seconds": s} for b, s in measured["a2a"]]
    details["collective_model"] = {"how": cm_how, **(cm.to_dict() if hasattr(cm, "to_dict") else {"fingerprint": getattr(cm, "fingerprint", None)})}
    details["ranks"] = measured["note"]

    held_times, lookup_times = cost_model_kernel_times(heldout.model), cost_model_kernel_times(model)
    # the side score: held out, each kernel's L3 times its family's drift read off the references
    # timed inside the ranks side by side, net of their own co-location factor (put back per kernel)
    drift_times = (cost_model_kernel_times(heldout.model, l3_factor=heldout.drift.factor)
                   if heldout.drift.references else None)
    per_kind_s = cold_start_per_kind_s(model, "L3")
    rows, per_point = [], []
    phase_pairs: dict[str, list[tuple[RankTimeline, Mapping[str, float]]]] = {"heldout": [], "replay": []}
    for pt, meas in zip(points, measured["cases"]):
        held = predict_ep_step(pt["cfg"], pt["plan"], held_times, cm, colocation=colo)
        lookup = predict_ep_step(pt["cfg"], pt["plan"], lookup_times, cm, colocation=colo)
        # rank replay: each rank's kernels as timed inside the ranks (beside each other, so no
        # co-location factor on top), composed by the same timeline: a composition check
        replay = predict_ep_step(pt["cfg"], pt["plan"],
                                 rank_replay_kernel_times(meas["kernel_s"], lookup_times, per_kind_s=per_kind_s,
                                                          recold=recold_curve(model, "L3"),
                                                          per_call_s=per_call_s(model, "L3")), cm)
        row, point = _score_point(pt, held, lookup, meas, MEASURED_SEGMENTS)
        for r, rank in enumerate(point["measured"]["ranks"]):
            phase_pairs["heldout"].append((held.timelines["L3"][r], rank["segments_median_s"]))
            phase_pairs["replay"].append((replay.timelines["L3"][r], rank["segments_median_s"]))
        row["pred_replay_L3_s"] = replay.step_s("L3")
        if drift_times is not None:
            row["pred_heldout_drift_L3_s"] = predict_ep_step(pt["cfg"], pt["plan"], drift_times, cm,
                                                             colocation=colo).step_s("L3")
        for r, tl in enumerate(replay.timelines["L3"]):
            row[f"pred_replay_rank{r}_busy_L3_s"] = tl.busy_s
            row[f"kernels_in_rank{r}_over_profile"] = _in_rank_over_profile(meas["kernel_s"][r], model)
        if colo is not None:  # the same held-out prediction as if each rank ran alone
            alone = predict_ep_step(pt["cfg"], pt["plan"], held_times, cm)
            row["pred_alone_L3_s"] = alone.step_s("L3")
        rows.append(row)
        per_point.append(point)
    df = pd.DataFrame(rows)
    details["colocation"] = colocation_details(df, colo, colo_how, ep["colocation"])
    lookup_df = add_errors(df[["backend", "measured_s"]].assign(
        **{f"pred_{lv}_s": df[f"pred_lookup_{lv}_s"] for lv in LEVELS}))
    df = add_errors(df)
    df["pred_lookup_L3_s"] = lookup_df["pred_L3_s"]
    df["ape_lookup_L3_pct"] = lookup_df["ape_L3_pct"]
    replay_df = add_errors(df[["backend", "measured_s"]].assign(
        **{f"pred_{lv}_s": df["pred_replay_L3_s"] if lv == "L3" else df[f"pred_lookup_{lv}_s"] for lv in LEVELS}))
    df["ape_replay_L3_pct"] = replay_df["ape_L3_pct"]
    if drift_times is not None:
        drift_df = add_errors(df[["backend", "measured_s"]].assign(
            **{f"pred_{lv}_s": df["pred_heldout_drift_L3_s"] if lv == "L3" else df[f"pred_{lv}_s"] for lv in LEVELS}))
        df["ape_heldout_drift_L3_pct"] = drift_df["ape_L3_pct"]
        df.attrs["heldout_drift_scaled"] = ape_summary(drift_df)
    details["replay"] = {
        **ape_summary(replay_df),
        "what": "each rank's kernels timed inside the rank processes, side by side, after its steps "
                "(profile runners and cold operands, short timing), summed per phase plus the per-kernel "
                "cold-call overhead and composed by the same timeline and collective model: a composition "
                "check, not a prediction",
        "kernels_in_rank_over_profile": {f"rank{r}": float(df[f"kernels_in_rank{r}_over_profile"].median())
                                         for r in range(ep["world_size"])},
    }
    df.attrs.update({"scoring": "held-out", "heldout": heldout.to_dict(), "profile_lookup": ape_summary(lookup_df),
                     "rounds": ep["rounds"], "freshness": dict(getattr(model, "freshness", {}) or {})})
    gains = variant_gains(df, "placement", "load_aware", "contiguous")
    details["ep"] = {"points": per_point, "placement_gains": gains, "placement_gain_summary": gain_summary(gains),
                     "straggler": straggler_summary(df, STRAGGLER_RULE),
                     "phase_over_measured": {
                         "what": "L3 predicted compute seconds / measured seconds per local phase, over every point "
                                 "and rank (median, 10th-90th percentile): held out, and the rank replay",
                         **{k: phase_ratios(v) for k, v in phase_pairs.items()}},
                     "wait_rule": "bulk-synchronous: an all-to-all ends on rank r at max over ranks of the entry "
                                  "time + rank r's collective seconds (sim/distributed/ep_predict.py)"}
    summ = summary("moe_ep", rt.fingerprint.describe(), df, details=details)
    write_outputs(out, df, summ)
    _plot_timelines(per_point, out / "ep_timelines.png", scoring="held out, L3", measured=True)
    plot_predicted_vs_measured(df, out / "predicted_vs_measured.png",
                               title=f"EP MoE step on {ep['world_size']} gloo ranks: predicted vs measured slowest rank",
                               hue="placement")
    print_table(df, {"value": "", "placement": "", "backend": "", "plan_skew_share": ".2f", "measured_s": "ms",
                     "measured_iqr_s": "ms", "pred_L0_s": "ms", "pred_L2_s": "ms", "pred_L3_s": "ms",
                     "ape_L3_pct": ".1f", "straggler_pred": "", "straggler_measured": "", "straggler_clear": "",
                     "skew_share_L3": ".2f"},
                title=f"EP MoE step on {ep['world_size']} ranks vs {cfg['routing']['sweep']['param']} (ms; held out)")
    print_gains(gains, details["ep"]["placement_gain_summary"], what="load_aware's gain over contiguous",
                title="load_aware over contiguous: 1 - step(load_aware) / step(contiguous)")
    rr = details["replay"]
    console.print(f"rank replay (kernels timed inside the ranks, composed: a composition check): L3 median "
                  f"{rr['median_ape_pct']['L3']:.1f}%, p90 {rr['p90_ape_pct']['L3']:.1f}%; in-rank kernels / profile: "
                  + ", ".join(f"{r} {v:.2f}x" for r, v in rr["kernels_in_rank_over_profile"].items()))
    phases = details["ep"]["phase_over_measured"]
    console.print(f"L3 / measured per phase, median (10th-90th percentile) over points and ranks: held out "
                  f"{ratio_words(phases['heldout'])}; rank replay {ratio_words(phases['replay'])}")
    return print_straggler_and_summary(details["ep"]["straggler"], summ, out)


def rank_drift(references: Sequence[Any], per_rank_s: Sequence[Sequence[float]], colocation: Any = None) -> Any:
    """The held-out drift (``sim.predict.heldout_drift.family_drift``) of ``references`` as the ranks
    timed them side by side (``per_rank_s``: per rank, each reference's median over the rounds),
    read at each reference's median over the ranks divided by its own co-location factor
    (``colocation.factor(family, bytes)``; None: as timed), so the drift is the machine's phase
    and the co-location of each layer kernel is put back by its own factor; announced.

    Not the references as timed: they are mostly compute-bound GEMMs (1.02-1.03x beside a twin)
    while the ranks' expert GEMMs stream their weights (1.1-1.2x). Read as timed, the drift stood
    in for both: the side score read 14.6% against a 10.3% headline and 18.6% against 24.2%, where
    net of co-location it would have read about 9.6% and 16.1% (EPYC VM, 2026-12-07)."""
    from sim.predict.heldout_drift import family_drift  # noqa: PLC0415

    timed = [list(r) for r in per_rank_s if len(r)]
    if any(len(r) != len(references) for r in timed):
        raise ValueError(f"{len(references)} references but the ranks timed {[len(r) for r in timed]}")
    now = np.median(np.asarray(timed), axis=0) if timed else np.zeros(0)
    if colocation is not None and len(now):
        now = now / np.array([colocation.factor(r.family, float(r.spec.bytes_moved())) for r in references])
    drift = family_drift(references, now.tolist())
    console.print(drift.describe() + " (timed inside the ranks side by side"
                  + (", each net of its co-location factor)" if colocation is not None else ")"))
    return drift


def phase_ratios(pairs: Sequence[tuple[RankTimeline, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """Predicted compute seconds / measured seconds of each local phase (``LOCAL_PHASE_SEGMENTS``)
    over every (point, rank) pair of a predicted timeline and its measured segment medians: the
    median, 10th and 90th percentile, and how many pairs. Says which phase a step's error sits in
    (below 1 the prediction is short). A measured phase under ``MIN_PHASE_S`` is skipped."""
    ratios: dict[str, list[float]] = {p: [] for p in LOCAL_PHASE_SEGMENTS}
    for timeline, segments in pairs:
        for phase, segment in LOCAL_PHASE_SEGMENTS.items():
            if segments[segment] >= MIN_PHASE_S:
                ratios[phase].append(timeline.compute_s[phase] / segments[segment])
    return {p: ratio_summary(v, count_key="rank_points") for p, v in ratios.items() if v}


def _measured_timeline(phase_s: np.ndarray, segments: Sequence[str]) -> dict[str, Any]:
    """One rank's measured phases: medians over repeats, laid end to end."""
    med = dict(zip(segments, np.median(phase_s, axis=0)))
    iqr = dict(zip(segments, np.subtract(*np.percentile(phase_s, [75, 25], axis=0))))
    durations = {"router": med["router"], "dispatch": med["dispatch_prep"] + med["dispatch_a2a"],
                 "experts": med["experts"], "combine": med["combine"], "weighted_sum": med["weighted_sum"]}
    t, phases = 0.0, {}
    for p in PHASES:
        phases[p] = {"start_s": t, "end_s": t + float(durations[p])}
        t += float(durations[p])
    compute = phase_s[:, [segments.index(s) for s in ("router", "dispatch_prep", "experts", "weighted_sum")]].sum(axis=1)
    q1, q3 = np.percentile(compute, [25, 75])
    return {"phases": phases, "segments_median_s": {k: float(v) for k, v in med.items()},
            "segments_iqr_s": {k: float(v) for k, v in iqr.items()}, "end_s": t,
            "compute_s": float(np.median(compute)), "compute_iqr_s": float(q3 - q1)}


def _score_point(pt: Mapping[str, Any], held: EPStepPrediction, lookup: EPStepPrediction, meas: Mapping[str, Any],
                 segments: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    step = meas["step"]
    rounds = list(meas.get("round_medians_s") or [])
    ranks = [_measured_timeline(p, list(segments)) for p in meas["phase_s"]]
    compute = [r["compute_s"] for r in ranks]
    noise = math.sqrt(sum(r["compute_iqr_s"] ** 2 for r in ranks))
    gap = max(compute) - min(compute)
    plan: EPPlan = pt["plan"]
    row = {"point": pt["point"], "value": pt["value"], "generator": pt["generator"], "placement": pt["placement"],
           "backend": pt["backend"], **pt["routing"].metrics(), "plan_skew_share": plan.skew_share,
           "slots": plan.placement.num_slots, "dropped": plan.dropped,
           "offrank_bytes": float(plan.actual.send_bytes.sum()),
           "measured_s": float(step.median_s), "measured_iqr_s": float(step.iqr_s),
           "round_cv": float(np.std(rounds, ddof=1) / np.mean(rounds)) if len(rounds) > 1 else 0.0,
           **round_columns(rounds),
           "noisy": bool(step.noisy),
           **{f"pred_{lv}_s": held.step_s(lv) for lv in LEVELS},
           **{f"pred_lookup_{lv}_s": lookup.step_s(lv) for lv in LEVELS},
           "straggler_pred": held.straggler("L3"), "straggler_measured": int(np.argmax(compute)),
           "straggler_clear": bool(gap > noise), "rank_gap_s": gap, "rank_noise_s": noise,
           "skew_share_L3": held.skew_share("L3"), "skew_share_L2": held.skew_share("L2"),
           "balanced_pred_L3_s": held.balanced_step_s["L3"]}
    for r, rank in enumerate(ranks):
        row[f"measured_rank{r}_compute_s"] = rank["compute_s"]
        row[f"pred_rank{r}_busy_L3_s"] = held.timelines["L3"][r].busy_s
    point = {k: row[k] for k in ("point", "value", "placement", "backend", "measured_s", "measured_iqr_s",
                                 "straggler_pred", "straggler_measured", "straggler_clear", "skew_share_L3",
                                 "plan_skew_share")}
    point["predicted"] = {lv: v for lv, v in held.to_dict().items() if lv in ("L0", "L2", "L3")}
    point["measured"] = {"step_s": float(step.median_s), "ranks": ranks}
    point["rank_rows"] = plan.rank_rows.tolist()
    if held.collective_extrapolating:
        point["collective_extrapolating"] = held.collective_extrapolating
    return row, point


def replay_timing(timing: TimingConfig) -> TimingConfig:
    """The timing of the in-rank kernel replay: the profile's cold operands, a shorter budget
    per kernel (0.05 s, no retries) so a few hundred kernels cost about a minute."""
    return dataclasses.replace(timing, min_run_time_s=min(timing.min_run_time_s, 0.05), retries=0)


def _in_rank_over_profile(kernel_s: Mapping[str, float], model: Any) -> float:
    """Median over a rank's kernels of in-rank seconds / the profile's measurement (kernels
    the profile holds)."""
    profiled = getattr(model, "measured_s", {}) or {}
    ratios = [kernel_s[k] / profiled[k] for k in kernel_s if profiled.get(k)]
    return float(np.median(ratios)) if ratios else float("nan")


STRAGGLER_RULE = ("predicted: the rank with the most busy seconds (L3 held out); measured: the rank with the most "
                  "compute seconds outside the all-to-alls (median over repeats); counted where the ranks' compute "
                  "differs by more than sqrt(IQR_0^2 + IQR_1^2)")


# ----------------------------------------------------------------------------- plots


def _plot_timelines(points: Sequence[Mapping[str, Any]], path: Path, *, scoring: str, measured: bool) -> None:
    """Per placement (rows) at the least and the most concentrated routing (columns): each
    rank's phases as horizontal bars, the prediction (waits hatched) beside the measurement."""
    placements, cols, fig, axes = timeline_grid(points, "placement", lambda rows: 1.2 + 1.6 * rows)
    for i, placement in enumerate(placements):
        for j, value in enumerate(cols):
            ax = axes[i][j]
            pt = next(p for p in points if p["placement"] == placement and p["value"] == value)
            pred = pt["predicted"]["L3"]["ranks"]
            labels, y = [], 0
            for r, rank in enumerate(pred):
                bars = [("predicted", rank, True)]
                if measured:
                    bars.insert(0, ("measured", pt["measured"]["ranks"][r]["phases"], False))
                for name, phases, is_pred in bars:
                    for p in PHASES:
                        s, e = phases[p]["start_s"] * 1e3, phases[p]["end_s"] * 1e3
                        if is_pred and phases[p]["wait_s"] > 0:  # the wait first, hatched
                            w = phases[p]["wait_s"] * 1e3
                            ws = s + phases[p]["compute_s"] * 1e3
                            ax.barh(y, w, left=ws, color="white", edgecolor=PHASE_COLOURS[p], hatch="///", height=0.7)
                            ax.barh(y, e - ws - w, left=ws + w, color=PHASE_COLOURS[p], height=0.7)
                            ax.barh(y, ws - s, left=s, color=PHASE_COLOURS[p], height=0.7)
                        else:
                            ax.barh(y, e - s, left=s, color=PHASE_COLOURS[p], height=0.7,
                                    alpha=1.0 if is_pred else 0.55)
                    labels.append(f"rank {r} {name}")
                    y += 1
                y += 0.4
            step = f"measured {pt['measured']['step_s'] * 1e3:.2f} ms, " if measured else ""
            label_timeline_axis(ax, [k + 0.4 * (k // (2 if measured else 1)) for k in range(len(labels))], labels,
                                f"{placement}, routing {value}: {step}predicted "
                                f"{pt['predicted']['L3']['step_s'] * 1e3:.2f} ms")
    handles = [matplotlib.patches.Patch(color=c, label=p) for p, c in PHASE_COLOURS.items()]
    what = ("measured bars (pale: medians per phase; dispatch and combine include their waits) above predicted "
            if measured else "predicted only (measure=false), ")
    finish_timelines(fig, handles, wait_label="wait (predicted)", path=path, rect=(0, 0.05, 1, 1),
                     title=f"EP MoE step per rank: {what}({scoring})")


# ----------------------------------------------------------------------------- measure=false


def _whatif_models(cfg: Mapping[str, Any], rt: Runtime, ep: Mapping[str, Any]) -> tuple[Any, Any, str]:
    """measure=false: the kernel model as fitted (``profile.id``: another device's) and the
    all-to-all of that device's backend at the what-if's W, with how it was found: a stated
    link (``ep.link``), else for gloo the collective profile of W or the W=2 one extrapolated.
    This host's gloo collectives say nothing about GPUs: a GPU profile needs a stated link."""
    W = ep["world_size"]
    model = fitted_model(rt, profile_id=cfg["profile"].get("id"))
    backend = collective_backend(model.fingerprint)  # the predicted device's: NCCL for a GPU profile
    if ep["link"] is not None:
        return (model, *stated_link_model(ep["link"], W, backend, "ep"))
    if backend != BACKEND:
        raise ValueError(missing_link_message(model.fingerprint, backend, W, "ep"))
    cm, how = collective_model_for(W, backend, rt.profile_root, keep_awake=ep["keep_awake"])
    if cm is None:
        base, base_how = _collectives(rt, 2, measuring=False, keep_awake=ep["keep_awake"])
        cm = whatif_from(base, W)
        how = f"{base_how}; latency-bandwidth with its W=2 alpha and beta, extrapolated to W={W}"
    return model, cm, how


def _predict_only(rt: Runtime, points: list[dict[str, Any]], details: dict[str, Any], out: Path,
                  ep: Mapping[str, Any], model: Any, cm: Any, how: str) -> dict[str, Any]:
    W = details["world_size"]
    details = {**details, "collective_backend": collective_backend(model.fingerprint)}
    times = cost_model_kernel_times(model)
    colo, colo_how = rank_colocation(rt, ep["world_size"], ep["colocation"], field="ep.colocation", measuring=False,
                                     what="moe_ep", profile=rt.profile_root / model.fingerprint.id)
    console.print(f"co-location: {colo_how}" + (f"\n  {colo.describe()}" if colo is not None else ""))
    rows, per_point = [], []
    for pt in points:
        pred = predict_ep_step(pt["cfg"], pt["plan"], times, cm, colocation=colo)
        rows.append({"point": pt["point"], "value": pt["value"], "placement": pt["placement"], "backend": pt["backend"],
                     **pt["routing"].metrics(), "plan_skew_share": pt["plan"].skew_share,
                     **{f"pred_{lv}_s": pred.step_s(lv) for lv in LEVELS},
                     "straggler_pred": pred.straggler("L3"), "skew_share_L3": pred.skew_share("L3"),
                     "extrapolating": pred.collective_extrapolating or ""})
        per_point.append({"point": pt["point"], "value": pt["value"], "placement": pt["placement"],
                          "backend": pt["backend"],
                          "predicted": {lv: v for lv, v in pred.to_dict().items() if lv in ("L0", "L2", "L3")},
                          "collective_extrapolating": pred.collective_extrapolating})
    df = pd.DataFrame(rows)
    note = (f"predict-only what-if at W={W}: the all-to-all is {how}" if ep["link"] is not None
            else f"predict-only what-if at W={W}: the all-to-all model extrapolates ({how})")
    console.print(f"[yellow]{note}[/]")
    details = {**details, "extrapolates": note, "colocation": {"mode": ep["colocation"], "how": colo_how,
                                                               "applied": colo is not None,
                                                               **(colo.to_dict() if colo is not None else {})},
               "collective_model": {"how": how, **(cm.to_dict() if hasattr(cm, "to_dict") else {})},
               "ep": {"points": per_point, "placement_gains": variant_gains(df, "placement", "load_aware", "contiguous", levels=("L3",))},
               "predictions": df[["value", "placement", "backend", *(f"pred_{lv}_s" for lv in LEVELS)]].to_dict("records")}
    summ = predict_only_summary("moe_ep", model.fingerprint.describe(), df, details=details)
    write_outputs(out, df, summ)
    _plot_timelines(per_point, out / "ep_timelines.png", scoring=f"L3 as fitted, W={W}, extrapolated", measured=False)
    print_table(df, {"value": "", "placement": "", "backend": "", "plan_skew_share": ".2f", "pred_L0_s": "ms",
                     "pred_L2_s": "ms", "pred_L3_s": "ms", "straggler_pred": "", "skew_share_L3": ".2f"},
                title=f"EP MoE step predicted at W={W} on {model.fingerprint.device_name} (ms; measure=false: nothing "
                      f"measured, collectives {'stated' if ep['link'] is not None else 'extrapolated'})")
    console.print(f"outputs in {out}")
    return summ
