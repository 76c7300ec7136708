"""experiment=gnn_partition: one GNN layer across W ranks (graph partitioning), predicted and measured.

For every point of ``gnn_degree``'s degree-skew sweep (the same graph configs) and every
partitioner (``partition.partitioners``: random, metis), the plan
(``sim.distributed.graph_partition``) gives each rank's local graph and the halo bytes of
its all-to-all; ``sim.distributed.gnn_partition_predict`` predicts each rank's timeline
(send gather, halo all-to-all with its wait, the local GNN layer) at L0-L3, and the real
layer (``sim.distributed.gnn_partition_layer``, W gloo processes, one thread each, pinned)
is timed phase by phase: per repeat the slowest rank's step, per rank each phase's median.

Scoring (docs/method.md, docs/gnn_partition.md): the headline is **held out**: the ranks'
kernels predicted by models refitted without any kernel of this run's traces
(``sim.predict.heldout.fit_heldout``); the halo all-to-all by the collective model of
``costmodel.collectives`` (its own profile: a grid of message sizes, not this run's
messages; measured once per host and world size when missing). ``details.profile_lookup``
is the profile as loaded. No replay (``calibration.paired`` applies to single-device layers).
The ranks run one thread each, so this experiment's profile is this device's one-thread
profile (``threads: 1`` in its config).

Outputs: results.csv (one row per point x partitioner x backend), summary.json in the
common schema plus ``details.partition`` (per point: each rank's predicted and measured
timeline, straggler predicted vs measured, skew share; METIS's gain over random, measured
and predicted), partition_timelines.png and predicted_vs_measured.png.

``measure=false``: a predict-only what-if at ``partition.whatif_world_size`` ranks (kernel
model as fitted; the collective model of that world size if profiled, else a
latency-bandwidth model with the W=2 profile's alpha and beta): it says that it extrapolates.
"""

from __future__ import annotations

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
from experiments.common import (  # noqa: E402
    add_errors, calibration_options, check_common, check_measure_keys, config_dict, console, output_dir,
    plot_predicted_vs_measured, predict_only_summary, print_table, summary, write_outputs,
)
from experiments.distributed_common import (  # noqa: E402
    check_link, collective_backend, colocation_details, finish_timelines, label_timeline_axis, link_constraints,
    gain_summary, missing_link_message, print_gains, print_straggler_and_summary, rank_colocation, round_columns,
    stated_link_model, straggler_summary, timeline_grid, usable_cores, variant_gains,
)
from experiments.gnn_degree import CONSTRAINTS as GNN_CONSTRAINTS  # noqa: E402
from experiments.gnn_degree import gnn_configs, graph_sweep, make_graphs, runnable_configs  # noqa: E402
from experiments.workloads import ape_summary, heldout_for  # noqa: E402
from sim.predict.calibration import calibrated_model, fitted_model, gnn_suite  # noqa: E402
from sim.predict.heldout import trace_kernels  # noqa: E402
from sim.distributed.gnn_partition_predict import PredictedStep, predict_partition_step, rank_traces  # noqa: E402
from sim.distributed.graph_partition import (  # noqa: E402
    METIS_INSTALL, PARTITIONERS, PartitionPlan, check_partitioner, plan_graph_partition,
)
from sim.workloads.gnn_layer import GNNConfig  # noqa: E402
from sim.workloads.graphs import degree_stats  # noqa: E402
from sim.workloads.memory import check_fits_device, combine, gnn_need  # noqa: E402

#: this experiment can predict without measuring (``measure=false``: the what-if at larger W)
MEASURES = "optional"
BACKEND = "gloo"
MAX_REPEATS = 200
#: phases drawn in the timeline plot (the halo's wait for the last rank is hatched in the prediction)
PHASE_COLOURS = {"send": "C0", "halo": "C1", "layer": "C2"}
#: ``partition.collective_suite: quick``: the all-to-all alone at 5 sizes (tiny runs, tests);
#: ``full``: conf/suite/collectives.yaml as it is (every op, about a minute at W=2)
QUICK_SUITE = {"ops": ["all_to_all"], "all_to_all": {"peer_share": [0.5, 1.0]},
               "sizes": {"min_bytes": 256, "max_bytes": 4194304, "count": 5},
               "timing": {"warmup": 2, "min_repeats": 5, "max_repeats": 15, "budget_s": 0.1},
               "step": {"repeats": 15}, "timeout_s": 300}
#: the halo exchange follows an eviction, a barrier and the send gather: the collectives as a step makes them
PROTOCOL = "step"
SUITE_FILE = Path(__file__).resolve().parents[1] / "conf" / "suite" / "collectives.yaml"


def _world_size_ok(value: Any, cfg: Mapping[str, Any]) -> bool:
    """Measured: one pinned core per rank, at most the node count (measure=false: anything)."""
    return cfg.get("measure", True) is False or (is_int(value) and 2 <= value <= min(usable_cores(), cfg["gnn"]["num_nodes"]))


def _world_size_words(cfg: Mapping[str, Any]) -> str:
    cores, nodes = usable_cores(), cfg["gnn"]["num_nodes"]
    return (f"an integer in [2, {min(cores, nodes)}] (one pinned core per rank: this process may use {cores} cores; "
            f"at most gnn.num_nodes={nodes}; measure=false predicts any partition.whatif_world_size)")


#: gnn_partition's fields: the GNN layer's (``experiments.gnn_degree.CONSTRAINTS``) and the
#: ``partition`` block's (the partitioners, metis needing pymetis, are checked by ``check_partition``)
CONSTRAINTS: dict[str, Any] = {
    **GNN_CONSTRAINTS,
    "partition.world_size": Rule(_world_size_ok, _world_size_words),
    "partition.whatif_world_size": at_most("gnn.num_nodes", low=2, words="an integer in"),
    "partition.collective_suite": Options(["full", "quick"]),
    "partition.warmup": Interval(int, 0, 50),
    "partition.repeats": Interval(int, 3, MAX_REPEATS),
    "partition.rounds": Interval(int, 1, 20),
    "partition.timeout_s": Interval(int, 10, 3600),
    "partition.colocation": Options(list(COLOCATION_MODES)),
    "partition.keep_awake": Options([True, False]),
    **link_constraints("partition"),
}


def check_partition(cfg: Mapping[str, Any], num_nodes: int, measuring: bool) -> dict[str, Any]:
    """The ``partition`` block (its fields checked by ``CONSTRAINTS``) with the partitioners
    checked (metis: pymetis importable) and its defaults filled in."""
    part = cfg.get("partition") or {}
    names = part.get("partitioners", list(PARTITIONERS))
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, (list, tuple)) or not names:
        raise ValueError(f"partition.partitioners must list at least one of {list(PARTITIONERS)}, got {names!r}")
    for i, p in enumerate(names):
        try:
            check_partitioner(p)
        except ValueError:
            raise ValueError(f"partition.partitioners[{i}] must be one of {list(PARTITIONERS)}, got {p!r}") from None
    if "metis" in names:
        try:
            import pymetis  # noqa: F401, PLC0415
        except ImportError as err:
            raise ValueError(f"partition.partitioners: 'metis' needs pymetis, which is not importable here ({err}); "
                             f"install it with `{METIS_INSTALL}` or drop metis from the list") from None
    W, whatif = part.get("world_size", 2), part.get("whatif_world_size", 8)
    return {"world_size": W if measuring else whatif, "partitioners": list(dict.fromkeys(names)),
            "warmup": part.get("warmup", 2), "repeats": part.get("repeats", 10), "rounds": part.get("rounds", 3),
            "timeout_s": part.get("timeout_s", 600), "collective_suite": part.get("collective_suite", "full"),
            "colocation": part.get("colocation", "measure"), "keep_awake": part.get("keep_awake", True),
            "link": check_link(part, "partition", measuring)}


def validate(cfg: Any) -> tuple[list[GNNConfig], dict[str, Any], tuple[int, dict[str, bool], list[tuple[Any, Any]]]]:
    """Every check that needs no measuring: base keys, layer configs (feature widths >= 1),
    the graph sweep, the partition block (partitioners, world size against nodes and cores),
    memory. Returns the configs and the partition block."""
    cfg = config_dict(cfg)
    device = check_common(cfg, CONSTRAINTS)
    measuring = check_measure_keys(cfg)
    if device.type != "cpu":
        raise ValueError(f"experiment=gnn_partition runs its ranks as gloo processes on CPU; device must be cpu, "
                         f"got {device}")
    configs = gnn_configs(cfg, str(cfg["dtype"]))
    num_edges, options, sweep = graphs = graph_sweep(cfg)
    part = check_partition(cfg, configs[0].num_nodes, measuring)
    if measuring:  # each rank holds a layer per case, at most the whole graph each
        edges = num_edges * (2 if options.get("undirected") else 1)
        cases = len(sweep) * len(part["partitioners"])
        check_fits_device(combine([gnn_need(c, num_edges=edges, graphs=cases) for c in configs * (part["world_size"] + 1)]),
                          device, what=f"the partitioned GNN layers of gnn_partition ({part['world_size']} ranks)",
                          knobs=["gnn.num_nodes", "gnn.num_edges", "gnn.in_features", "graph.sweep.values",
                                 "partition.partitioners", "partition.world_size"])
    return configs, part, graphs


# ----------------------------------------------------------------------------- cases


def _plan_points(configs: Sequence[GNNConfig], graphs: Sequence[tuple[Any, torch.Tensor]], part: Mapping[str, Any],
                 seed: int) -> list[dict[str, Any]]:
    base = configs[0]
    points = []
    for i, (value, ei) in enumerate(graphs):
        stats = degree_stats(ei, base.num_nodes)
        for p in part["partitioners"]:
            plan = plan_graph_partition(ei, base.num_nodes, world_size=part["world_size"], partitioner=p,
                                        feature_width=base.in_features, dtype=base.dtype, seed=seed)
            for c in configs:
                traces = [rank_traces(c, plan, ei, r) for r in range(plan.world_size)]
                points.append({"point": i, "value": value, "partitioner": p, "backend": c.backend, "cfg": c,
                               "edge_index": ei, "plan": plan, "traces": traces, "stats": stats})
    return points


def partition_suite(points: Sequence[Mapping[str, Any]], cv_range: tuple[float, float]) -> list[tuple[str, Any]]:
    """Calibration kernels near the ranks' local layers: ``gnn_suite`` (each layer's trace over
    a grid of degree CVs) at the smallest, median and largest local graph per backend (local
    rows, edges), four CVs each (0 and three across the run's range). The held-out fit leaves out any kernel
    of the run's traces."""
    out: dict[str, tuple[str, Any]] = {}
    by_backend: dict[str, list[tuple[int, int, GNNConfig]]] = {}
    for pt in points:
        plan: PartitionPlan = pt["plan"]
        for r in range(plan.world_size):
            rows = int(plan.local_nodes(r).size)
            by_backend.setdefault(pt["backend"], []).append((int(plan.actual.edges[r]), rows, pt["cfg"]))
    for sizes in by_backend.values():
        sizes = sorted(s for s in sizes if s[0] > 0)
        for e, rows, cfg in {sizes[0], sizes[len(sizes) // 2], sizes[-1]}:
            local = GNNConfig(**{**cfg.__dict__, "num_nodes": rows})
            for tag, s in gnn_suite([local], num_edges=e, cv_range=cv_range, points=3):
                out.setdefault(s.key(), (tag, s))
    return list(out.values())


# ----------------------------------------------------------------------------- collectives


def _collectives(rt: Runtime, W: int, *, measuring: bool, suite: str, keep_awake: bool = True) -> tuple[Any, str]:
    """The collective model for W ranks of gloo on this host, their cores kept awake or not
    (``partition.keep_awake``): its profile (measured first when missing and ``measuring``), or
    (measure=false) a latency-bandwidth what-if with the W=2 profile's all-to-all alpha and beta."""
    from costmodel.collectives import (  # noqa: PLC0415
        CollectiveProfileError, bench_collectives, load_collective_model, load_step_model, make_latency_bandwidth_model,
    )

    root = rt.profile_root
    try:
        cm = load_collective_model(world_size=W, backend=BACKEND, profile_root=root, measure_if_missing=False,
                                   protocol=PROTOCOL, keep_awake=keep_awake)
        return cm, f"collective profile {cm.describe_source()}, {PROTOCOL} protocol"
    except CollectiveProfileError as err:
        if not measuring:
            try:
                cm, how = load_step_model(W, BACKEND, root, keep_awake=keep_awake)
                return cm, f"collective profile {cm.describe_source()}, {how}"
            except CollectiveProfileError:
                pass
            try:
                base = load_collective_model(world_size=2, backend=BACKEND, profile_root=root, measure_if_missing=False,
                                             keep_awake=keep_awake)
            except CollectiveProfileError:
                raise ValueError(f"measure=false at partition.whatif_world_size={W} needs a collective profile: {err}; "
                                 "none for world_size=2 either (run experiment=gnn_partition once with measure=true)"
                                 ) from None
            a2a = base.l2["all_to_all"]
            cm = make_latency_bandwidth_model(float(a2a.alpha_s_), float(a2a.beta_bytes_per_s_), W, backend=BACKEND)
            return cm, (f"no collective profile for W={W}: latency-bandwidth what-if with the W=2 profile's all-to-all "
                        f"alpha {a2a.alpha_s_ * 1e6:.1f} us, beta {a2a.beta_bytes_per_s_ / 1e9:.2f} GB/s "
                        f"({base.describe_source()})")
    if suite == "full":
        spec: Any = str(SUITE_FILE)
    else:
        spec = QUICK_SUITE
    console.print(f"no collective profile with {PROTOCOL}-protocol rows for {BACKEND} W={W} here: measuring the "
                  f"{suite} collectives suite first")
    bench_collectives(W, spec, profile_root=root, backend=BACKEND, progress=bool(True), keep_awake=keep_awake)
    cm = load_collective_model(world_size=W, backend=BACKEND, profile_root=root, measure_if_missing=False,
                               protocol=PROTOCOL, keep_awake=keep_awake)
    return cm, f"collective profile {cm.describe_source()} (measured by this run, {suite} suite), {PROTOCOL} protocol"


# ----------------------------------------------------------------------------- run


def run(cfg: Any, out_dir: str | Path | None = None, *, plan: Any = None) -> dict[str, Any]:
    """``plan``: what ``validate(cfg)`` returned (the entry point's one check), else validated here."""
    cfg = config_dict(cfg)
    configs, part, sweep = validate(cfg) if plan is None else plan
    rt = Runtime.from_cfg(cfg, checked=True)
    configs, unavailable = runnable_configs(configs)
    measuring = check_measure_keys(cfg)
    whatif = None if measuring else _whatif_models(cfg, rt, part)  # before planning: a missing link fails first
    out = output_dir(cfg, out_dir)
    progress = bool(cfg.get("progress", True))
    W = part["world_size"]
    graphs = make_graphs(cfg, rt.seed, sweep)
    console.print(f"planning {len(graphs)} graphs x {len(part['partitioners'])} partitioners on W={W} ranks")
    points = _plan_points(configs, graphs, part, rt.seed)
    traces = [t for pt in points for rank in pt["traces"] for t in rank.values() if t]
    g = cfg["gnn"]
    details: dict[str, Any] = {
        "layer": {k: g[k] for k in ("num_nodes", "num_edges", "in_features", "out_features", "kind", "aggregation",
                                    "edge_order")},
        "graph": cfg["graph"]["generator"]["_target_"], "sweep_param": cfg["graph"]["sweep"]["param"],
        "world_size": W, "partitioners": part["partitioners"], "backends": [c.backend for c in configs],
        "unavailable_backends": unavailable, "collective_backend": BACKEND, "threads_per_rank": 1,
    }
    if whatif is not None:
        return _predict_only(rt, points, details, out, part, *whatif)
    edgeless = [(pt["partitioner"], pt["value"], r) for pt in points for r in range(W) if pt["plan"].actual.edges[r] == 0]
    if edgeless:
        p, v, r = edgeless[0]
        raise ValueError(f"partition.partitioners: {p!r} leaves rank {r} without any in-edge at graph "
                         f"{cfg['graph']['sweep']['param']}={v} ({len(edgeless)} such case(s)): the real layer needs at "
                         "least one in-edge per rank; drop that partitioner or sweep value, or use fewer ranks "
                         "(measure=false predicts such plans)")

    cvs = [pt["stats"][k] for pt in points for k in ("degree_cv", "out_degree_cv")]
    suite = partition_suite(points, (min(cvs), max(cvs)))
    model = calibrated_model(rt, suite, suite_name="gnn", progress=progress, heldout=trace_kernels(traces),
                             **calibration_options(cfg))
    heldout = heldout_for(rt, model, traces, what="gnn_partition", runners=False)
    cm, cm_how = _collectives(rt, W, measuring=True, suite=part["collective_suite"], keep_awake=part["keep_awake"])
    console.print(f"all-to-all model: {cm_how}")
    colo, colo_how = rank_colocation(rt, W, part["colocation"], field="partition.colocation", measuring=True,
                                     what="gnn_partition", progress=progress)
    console.print(f"co-location: {colo_how}" + (f"\n  {colo.describe()}" if colo is not None else ""))

    from sim.distributed.gnn_partition_layer import run_partition_forward  # noqa: PLC0415

    base = configs[0]
    x = torch.randn(base.num_nodes, base.in_features, generator=torch.Generator().manual_seed(rt.seed)).numpy()
    cold = bool(rt.timing.cold_cache)
    console.print(f"timing {len(points)} partitioned steps on {W} gloo processes: {part['rounds']} rounds x "
                  f"({part['warmup']} warm-up + {part['repeats']} repeats) each"
                  f"{', caches evicted before each step' if cold else ''}")
    measured = run_partition_forward([(pt["cfg"], pt["plan"], pt["edge_index"]) for pt in points], x, world_size=W,
                                     seed=rt.seed, repeats=part["repeats"], warmup=part["warmup"],
                                     rounds=part["rounds"], cold=cold, allocator=str(cfg.get("allocator", "steady")),
                                     timeout_s=float(part["timeout_s"]), keep_awake=part["keep_awake"])
    console.print(f"ranks: {measured['note']}")
    details["ranks"] = measured["note"]
    details["collective_model"] = {"how": cm_how, "levels": list(getattr(cm, "levels", ()))}

    rows, per_point = [], []
    for pt, timed in zip(points, measured["timed"]):
        held = predict_partition_step(heldout.model, cm, pt["cfg"], pt["plan"], pt["edge_index"], levels=LEVELS,
                                      traces=pt["traces"], colocation=colo)
        lookup = predict_partition_step(model, cm, pt["cfg"], pt["plan"], pt["edge_index"], levels=LEVELS,
                                        traces=pt["traces"], balanced=False, colocation=colo)
        row, point = _score_point(pt, held, lookup, timed)
        if colo is not None:
            row["pred_alone_L3_s"] = held["L3"].extra["alone_step_s"]
        rows.append(row)
        per_point.append(point)
    df = pd.DataFrame(rows)
    lookup_df = add_errors(df[["backend", "measured_s"]].assign(
        **{f"pred_{lv}_s": df[f"pred_lookup_{lv}_s"] for lv in LEVELS}))
    df = add_errors(df)
    df["ape_lookup_L3_pct"] = lookup_df["ape_L3_pct"]
    details["colocation"] = colocation_details(df, colo, colo_how, part["colocation"])
    df.attrs.update({"scoring": "held-out", "heldout": heldout.to_dict(), "profile_lookup": ape_summary(lookup_df),
                     "rounds": part["rounds"], "freshness": dict(getattr(model, "freshness", {}) or {})})
    gains = variant_gains(df, "partitioner", "metis", "random")
    details["partition"] = {
        "points": per_point, "metis_gain_over_random": gains, "metis_gain_summary": gain_summary(gains),
        "straggler": straggler_summary(df, STRAGGLER_RULE),
        "wait_rule": "the halo all-to-all starts on every rank at the latest send end "
                     "(sim/distributed/gnn_partition_predict.py)",
        "levels": "kernels at L0-L3 (CostModel); the halo at the collective model's level of the same name, its first "
                  "(L2, latency-bandwidth) where it has none (L0, L1)"}
    summ = summary("gnn_partition", rt.fingerprint.describe(), df, details=details)
    write_outputs(out, df, summ)
    _plot_timelines(per_point, out / "partition_timelines.png", scoring="held out, L3", measured=True)
    plot_predicted_vs_measured(df, out / "predicted_vs_measured.png",
                               title=f"partitioned GNN step on {W} gloo ranks: predicted vs measured slowest rank",
                               hue="partitioner")
    param = cfg["graph"]["sweep"]["param"]
    print_table(df, {"value": "", "partitioner": "", "backend": "", "edge_cut_share": ".2f", "plan_skew_share": ".2f",
                     "measured_s": "ms", "measured_iqr_s": "ms", "pred_L0_s": "ms", "pred_L2_s": "ms", "pred_L3_s": "ms",
                     "ape_L3_pct": ".1f", "straggler_pred": "", "straggler_measured": "", "straggler_clear": ""},
                title=f"partitioned GNN step on {W} ranks vs graph {param} (ms; held out)")
    print_gains(gains, details["partition"]["metis_gain_summary"], what="METIS's gain over random",
                title="METIS over random: 1 - step(metis) / step(random)")
    return print_straggler_and_summary(details["partition"]["straggler"], summ, out)


def _measured_rank(phases: np.ndarray) -> dict[str, Any]:
    """One rank's measured phases ([repeats, 3] over every round): medians laid end to end."""
    med = np.median(phases, axis=0)
    q1, q3 = np.percentile(phases, [25, 75], axis=0)
    t, spans = 0.0, {}
    for name, d in zip(PHASE_COLOURS, med):
        spans[name] = {"start_s": t, "duration_s": float(d)}
        t += float(d)
    compute = phases[:, 0] + phases[:, 2]
    c1, c3 = np.percentile(compute, [25, 75])
    return {"phases": spans, "iqr_s": dict(zip(PHASE_COLOURS, (q3 - q1).tolist())), "end_s": t,
            "compute_s": float(np.median(compute)), "compute_iqr_s": float(c3 - c1)}


def _predicted_ranks(step: PredictedStep) -> list[dict[str, Any]]:
    return [{"phases": {name: {"start_s": s, "duration_s": d} for name, s, d in spans},
             "end_s": float(step.end_s[r]), "compute_s": float(step.send_s[r] + step.layer_s[r])}
            for r, spans in enumerate(step.timeline())]


def _score_point(pt: Mapping[str, Any], held: dict[str, PredictedStep], lookup: dict[str, PredictedStep],
                 timed: Sequence[Sequence[Mapping[str, Any]]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One results row and its ``details.partition.points`` entry. ``timed``: [round][rank]."""
    W = len(timed[0])
    steps = np.concatenate([np.asarray(rd[0]["step"].times_s) for rd in timed])
    round_medians = [float(np.median(rd[0]["step"].times_s)) for rd in timed]
    phases = [np.concatenate([rd[r]["phases_s"] for rd in timed]) for r in range(W)]
    ranks = [_measured_rank(p) for p in phases]
    compute = [r["compute_s"] for r in ranks]
    noise = math.sqrt(sum(r["compute_iqr_s"] ** 2 for r in ranks))
    gap = max(compute) - min(compute)
    q1, q3 = np.percentile(steps, [25, 75])
    plan: PartitionPlan = pt["plan"]
    l3 = held["L3"]
    pred_compute = l3.send_s + l3.layer_s
    row = {"point": pt["point"], "value": pt["value"], "partitioner": pt["partitioner"], "backend": pt["backend"],
           "degree_cv": pt["stats"]["degree_cv"], "max_over_mean": pt["stats"]["max_over_mean"],
           "edge_cut_share": plan.edge_cut_share, "plan_skew_share": plan.skew_share,
           "halo_bytes": float(plan.halo_send_bytes.sum()),
           "measured_s": float(np.median(steps)), "measured_iqr_s": float(q3 - q1),
           "round_cv": float(np.std(round_medians, ddof=1) / np.mean(round_medians)) if len(round_medians) > 1 else 0.0,
           **round_columns(round_medians),
           "noisy": bool(any(rd[0]["step"].noisy for rd in timed)),
           **{f"pred_{lv}_s": held[lv].step_s for lv in LEVELS},
           **{f"pred_lookup_{lv}_s": lookup[lv].step_s for lv in LEVELS},
           "straggler_pred": int(np.argmax(pred_compute)), "straggler_measured": int(np.argmax(compute)),
           "straggler_clear": bool(gap > noise), "rank_gap_s": gap, "rank_noise_s": noise,
           "skew_share_L3": l3.skew_share, "balanced_pred_L3_s": l3.balanced_step_s,
           "collective_extrapolating": l3.collective_note or ""}
    for r in range(W):
        row[f"rank{r}_edges"] = int(plan.actual.edges[r])
        row[f"rank{r}_halo_rows"] = int(plan.actual.halo_rows[r])
        for i, name in enumerate(PHASE_COLOURS):
            row[f"measured_rank{r}_{name}_s"] = ranks[r]["phases"][name]["duration_s"]
        row[f"pred_rank{r}_send_L3_s"] = float(l3.send_s[r])
        row[f"pred_rank{r}_halo_L3_s"] = float(l3.halo_s[r] + l3.wait_s[r])
        row[f"pred_rank{r}_layer_L3_s"] = float(l3.layer_s[r])
    point = {k: row[k] for k in ("point", "value", "partitioner", "backend", "measured_s", "measured_iqr_s",
                                 "straggler_pred", "straggler_measured", "straggler_clear", "skew_share_L3",
                                 "plan_skew_share", "edge_cut_share")}
    point["plan"] = plan.to_dict()
    point["predicted"] = {lv: {"step_s": held[lv].step_s, "straggler": held[lv].straggler,
                               "skew_share": held[lv].skew_share, "ranks": _predicted_ranks(held[lv])}
                          for lv in ("L0", "L2", "L3")}
    point["measured"] = {"step_s": row["measured_s"], "step_iqr_s": row["measured_iqr_s"], "ranks": ranks}
    if l3.collective_note:
        point["collective_extrapolating"] = l3.collective_note
    return row, point


STRAGGLER_RULE = ("predicted: the rank with the most kernel seconds (send + layer, L3 held out); measured: the rank "
                  "with the most seconds outside the all-to-all (median over repeats); counted where the ranks "
                  "differ by more than sqrt(IQR_0^2 + IQR_1^2)")


# ----------------------------------------------------------------------------- plot


def _plot_timelines(points: Sequence[Mapping[str, Any]], path: Path, *, scoring: str, measured: bool) -> None:
    """Per partitioner (rows) at the least and the most skewed graph (columns): each rank's
    phases as horizontal bars, measured (pale) above predicted (waits hatched)."""
    backend = points[0]["backend"]
    ranks = len(points[0]["predicted"]["L3"]["ranks"])
    partitioners, cols, fig, axes = timeline_grid(points, "partitioner", lambda rows: 1.4 + 0.55 * 2 * rows * ranks)
    for i, partitioner in enumerate(partitioners):
        for j, value in enumerate(cols):
            ax = axes[i][j]
            pt = next(p for p in points if p["partitioner"] == partitioner and p["value"] == value
                      and p["backend"] == backend)
            pred = pt["predicted"]["L3"]["ranks"]
            labels, ticks, y = [], [], 0.0
            for r, rank in enumerate(pred):
                bars = [("predicted", rank["phases"], True)]
                if measured:
                    bars.insert(0, ("measured", pt["measured"]["ranks"][r]["phases"], False))
                for name, phases, is_pred in bars:
                    for ph, colour in PHASE_COLOURS.items():
                        if is_pred and ph == "halo" and phases["wait"]["duration_s"] > 0:
                            w = phases["wait"]
                            ax.barh(y, w["duration_s"] * 1e3, left=w["start_s"] * 1e3, color="white", edgecolor=colour,
                                    hatch="///", height=0.7)
                        s = phases[ph]
                        ax.barh(y, s["duration_s"] * 1e3, left=s["start_s"] * 1e3, color=colour, height=0.7,
                                alpha=1.0 if is_pred else 0.5)
                    labels.append(f"rank {r} {name}")
                    ticks.append(y)
                    y += 1
                y += 0.4
            plan = pt["plan"]
            step = f"measured {pt['measured']['step_s'] * 1e3:.2f} ms, " if measured else ""
            edges = plan["rank_edges"]
            edges = edges if len(edges) <= 4 else f"{min(edges)}..{max(edges)}"
            label_timeline_axis(ax, ticks, labels, f"{partitioner}, graph {value} (edges per rank {edges}, cut "
                                f"{100 * plan['edge_cut_share']:.0f}%):\n{step}predicted "
                                f"{pt['predicted']['L3']['step_s'] * 1e3:.2f} ms")
    handles = [matplotlib.patches.Patch(color=c, label={"send": "send (gather)", "halo": "halo all-to-all",
                                                         "layer": "GNN layer (local)"}[p])
               for p, c in PHASE_COLOURS.items()]
    what = ("measured (pale: median per phase; the halo includes its wait) above predicted " if measured
            else "predicted only (measure=false), ")
    finish_timelines(fig, handles, wait_label="wait for the last rank (predicted)", path=path, rect=(0, 0.06, 1, 0.95),
                     title=f"partitioned GNN step per rank, backend {backend}: {what}({scoring})")


# ----------------------------------------------------------------------------- measure=false


def _whatif_models(cfg: Mapping[str, Any], rt: Runtime, part: Mapping[str, Any]) -> tuple[Any, Any, str]:
    """measure=false: the kernel model as fitted (``profile.id``: another device's) and the
    collectives of that device's backend at the what-if's W, with how they were found: a
    stated link (``partition.link``), else for gloo ``_collectives``. This host's gloo
    collectives say nothing about GPUs: a GPU profile needs a stated link."""
    W = part["world_size"]
    model = fitted_model(rt, profile_id=cfg["profile"].get("id"))
    backend = collective_backend(model.fingerprint)  # the predicted device's: NCCL for a GPU profile
    if part["link"] is not None:
        return (model, *stated_link_model(part["link"], W, backend, "partition"))
    if backend != BACKEND:
        raise ValueError(missing_link_message(model.fingerprint, backend, W, "partition"))
    return (model, *_collectives(rt, W, measuring=False, suite=part["collective_suite"], keep_awake=part["keep_awake"]))


def _predict_only(rt: Runtime, points: list[dict[str, Any]], details: dict[str, Any], out: Path,
                  part: Mapping[str, Any], model: Any, cm: Any, how: str) -> dict[str, Any]:
    W = part["world_size"]
    details = {**details, "collective_backend": collective_backend(model.fingerprint)}
    colo, colo_how = rank_colocation(rt, W, part["colocation"], field="partition.colocation", measuring=False,
                                     what="gnn_partition", profile=rt.profile_root / model.fingerprint.id)
    rows, per_point = [], []
    for pt in points:
        pred = predict_partition_step(model, cm, pt["cfg"], pt["plan"], pt["edge_index"], levels=LEVELS,
                                      traces=pt["traces"], colocation=colo)
        plan: PartitionPlan = pt["plan"]
        l3 = pred["L3"]
        rows.append({"point": pt["point"], "value": pt["value"], "partitioner": pt["partitioner"],
                     "backend": pt["backend"], "degree_cv": pt["stats"]["degree_cv"],
                     "edge_cut_share": plan.edge_cut_share, "plan_skew_share": plan.skew_share,
                     **{f"pred_{lv}_s": pred[lv].step_s for lv in LEVELS},
                     "straggler_pred": int(np.argmax(l3.send_s + l3.layer_s)), "skew_share_L3": l3.skew_share,
                     "extrapolating": l3.collective_note or ""})
        per_point.append({"point": pt["point"], "value": pt["value"], "partitioner": pt["partitioner"],
                          "backend": pt["backend"], "plan": plan.to_dict(),
                          "predicted": {lv: {"step_s": pred[lv].step_s, "straggler": pred[lv].straggler,
                                             "skew_share": pred[lv].skew_share, "ranks": _predicted_ranks(pred[lv])}
                                        for lv in ("L0", "L2", "L3")},
                          "collective_extrapolating": l3.collective_note})
    df = pd.DataFrame(rows)
    note = (f"predict-only what-if at W={W}: nothing measured; the halo all-to-all is {how}" if part["link"] is not None
            else f"predict-only what-if at W={W}: nothing measured; the halo all-to-all extrapolates beyond what was "
                 f"measured ({how})")
    console.print(f"[yellow]{note}[/]")
    details = {**details, "extrapolates": note, "collective_model": {"how": how},
               "colocation": {"mode": part["colocation"], "how": colo_how, "applied": colo is not None},
               "partition": {"points": per_point, "metis_gain_over_random": variant_gains(df, "partitioner", "metis", "random")},
               "predictions": df[["value", "partitioner", "backend", *(f"pred_{lv}_s" for lv in LEVELS)]].to_dict("records")}
    summ = predict_only_summary("gnn_partition", model.fingerprint.describe(), df, details=details)
    write_outputs(out, df, summ)
    _plot_timelines(per_point, out / "partition_timelines.png", scoring=f"L3 as fitted, W={W}, extrapolated",
                    measured=False)
    print_table(df, {"value": "", "partitioner": "", "backend": "", "edge_cut_share": ".2f", "plan_skew_share": ".2f",
                     "pred_L0_s": "ms", "pred_L2_s": "ms", "pred_L3_s": "ms", "straggler_pred": "",
                     "skew_share_L3": ".2f"},
                title=f"partitioned GNN step predicted at W={W} on {model.fingerprint.device_name} (ms; measure=false: "
                      f"nothing measured, collectives {'stated' if part['link'] is not None else 'extrapolated'})")
    console.print(f"outputs in {out}")
    return summ
