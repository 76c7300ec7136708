"""The predicted step of a partitioned GNN layer, per rank: halo exchange plus aggregation.

A rank's step (``sim.distributed.gnn_partition_layer`` runs exactly this) has three phases:

1. ``send``: a ``gather`` of the own rows other ranks need (the halo send buffer);
2. ``halo``: one ``all_to_all_single`` with uneven splits (``PartitionPlan.halo_send_bytes``);
3. ``layer``: the project's GNN layer (``sim.workloads.gnn_layer``: transform GEMM, the registered
   aggregation backend's kernels, ReLU) on the rank's local graph: its own nodes and its
   halo nodes as rows, its own nodes' in-edges as edges (``local_config`` / ``rank_trace``).

Predicted per rank and level: ``send`` and ``layer`` are the kernels' sum from the project's
``CostModel`` (``sim.predict.simulator.predict_trace``), ``halo`` is the collective model's
``predict_all_to_all_s`` on the plan's [W, W] halo bytes. An all-to-all cannot finish on a
rank before every peer has joined it, so the halo phase of every rank starts at the latest
``send`` end (the wait is part of the measured halo phase too):

    halo_start = max_r send_r;  halo_end_r = halo_start + a2a_r;  end_r = halo_end_r + layer_r
    step = max_r end_r   (the slowest rank: the straggler)

Levels: L0 (FLOPs / peak), L2 (roofline) and L3 (fitted) for the kernels; the collective
model has its own levels (``cm.levels``, ("L2", "L3")): a kernel level it lacks (L0) takes
its first (the latency-bandwidth model), so L0's error is the kernels' FLOPs view, not a
missing exchange. The ``balanced`` step is the same prediction with every rank at the
ranks' mean kernel time and the mean off-rank halo bytes between every pair of ranks (the
same totals spread evenly): ``PredictedStep.skew_share`` = 1 - balanced / step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np
import torch

from costmodel.families.descriptor import KernelSpec
from costmodel.families.gather import GatherSpec
from sim.distributed.graph_partition import PartitionPlan, balanced_send_bytes
from sim.workloads.backends.gnn import gnn_backend
from sim.workloads.gnn_layer import GNNConfig, GraphPlan, gnn_trace

PHASES = ("send", "halo", "layer")
LEVELS = ("L0", "L2", "L3")


def check_plan_for_layer(cfg: GNNConfig, plan: PartitionPlan) -> None:
    """The plan must be of the layer's graph size, exchange its input rows, in its dtype."""
    if plan.num_nodes != cfg.num_nodes:
        raise ValueError(f"the plan is for {plan.num_nodes} nodes, the layer has gnn.num_nodes={cfg.num_nodes}")
    if plan.feature_width != cfg.in_features or plan.dtype != cfg.dtype:
        raise ValueError(f"the plan exchanges rows of {plan.feature_width} {plan.dtype}; the layer's input rows are "
                         f"gnn.in_features={cfg.in_features} {cfg.dtype}")


def local_config(cfg: GNNConfig, plan: PartitionPlan, rank: int) -> GNNConfig:
    """The layer config of rank ``rank``: the single-device config over its local rows
    (own nodes and halo nodes); weights depend only on the feature widths and the seed."""
    return replace(cfg, num_nodes=int(plan.local_nodes(rank).size))


def local_graph_plan(cfg: GNNConfig, plan: PartitionPlan, edge_index: Any, rank: int) -> GraphPlan | None:
    """The facts of rank ``rank``'s local graph the trace needs (``GraphPlan``); None when the
    rank owns no node with an in-edge (it aggregates nothing)."""
    local = torch.from_numpy(np.ascontiguousarray(plan.local_edge_index(edge_index, rank)))
    if local.shape[1] == 0:
        return None
    return GraphPlan.from_edge_index(local, int(plan.local_nodes(rank).size),
                                     sorted_by_dst=cfg.edge_order == "dst_sorted")


def layer_trace(cfg: GNNConfig, plan: PartitionPlan, edge_index: Any, rank: int) -> list[KernelSpec]:
    """The single-device trace of rank ``rank``'s local config and graph; a rank without
    in-edges runs its layer's transform and activation only (the aggregation kernels of a
    one-edge graph left out: what-if plans at larger W can leave a METIS part edgeless)."""
    local = local_config(cfg, plan, rank)
    graph = local_graph_plan(cfg, plan, edge_index, rank)
    if graph is not None:
        return gnn_trace(local, graph)
    one = GraphPlan(local.num_nodes, 1, 0.0, 0.0, True, True)
    aggregate = set(gnn_backend(cfg.backend).aggregate_trace(local, one))
    return [s for s in gnn_trace(local, one) if s not in aggregate]


def send_trace(cfg: GNNConfig, plan: PartitionPlan, rank: int) -> list[KernelSpec]:
    """The gather of rank ``rank``'s halo send buffer ([] when it sends nothing)."""
    index = plan.send_index(rank)
    own = int(plan.actual.nodes[rank])
    if index.size == 0 or own == 0:
        return []
    counts = np.bincount(index, minlength=own).astype(np.float64)
    cv = round(float(counts.std() / counts.mean()), 3) if counts.mean() > 0 else 0.0
    return [GatherSpec(int(index.size), cfg.in_features, own, cv, bool(np.all(index[1:] >= index[:-1])), cfg.dtype)]


def rank_traces(cfg: GNNConfig, plan: PartitionPlan, edge_index: Any, rank: int) -> dict[str, list[KernelSpec]]:
    """The kernels rank ``rank`` runs per phase (``send`` and ``layer``; ``halo`` is the collective)."""
    check_plan_for_layer(cfg, plan)
    return {"send": send_trace(cfg, plan, rank), "layer": layer_trace(cfg, plan, edge_index, rank)}


@dataclass
class PredictedStep:
    """One plan's predicted step at one level, per rank."""

    level: str
    send_s: np.ndarray  # [W]
    halo_s: np.ndarray  # [W] the all-to-all itself (collective model)
    wait_s: np.ndarray  # [W] waiting in the all-to-all for the last rank to join
    layer_s: np.ndarray  # [W]
    balanced_step_s: float | None = None
    collective_note: str | None = None  # the collective model's extrapolation warning, if any
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def end_s(self) -> np.ndarray:
        return self.send_s + self.wait_s + self.halo_s + self.layer_s

    @property
    def step_s(self) -> float:
        return float(self.end_s.max())

    @property
    def straggler(self) -> int:
        return int(np.argmax(self.end_s))

    @property
    def skew_share(self) -> float | None:
        """Share of the predicted step beyond the balanced partition's step."""
        if self.balanced_step_s is None or self.step_s <= 0:
            return None
        return max(0.0, 1.0 - self.balanced_step_s / self.step_s)

    def timeline(self) -> list[list[tuple[str, float, float]]]:
        """Per rank: (phase, start_s, duration_s) for send, wait, halo, layer."""
        out = []
        for r in range(self.send_s.size):
            t, spans = 0.0, []
            for name, dur in (("send", self.send_s[r]), ("wait", self.wait_s[r]), ("halo", self.halo_s[r]),
                              ("layer", self.layer_s[r])):
                spans.append((name, t, float(dur)))
                t += float(dur)
            out.append(spans)
        return out


def collective_level(cm: Any, level: str) -> str:
    """The collective model's level for a kernel level (its first where it lacks ``level``)."""
    levels = tuple(getattr(cm, "levels", ("L2", "L3")))
    return level if level in levels else levels[0]


def compose_step(level: str, send_s: np.ndarray, halo_s: np.ndarray, layer_s: np.ndarray,
                 alone: tuple[np.ndarray, np.ndarray] | None = None) -> PredictedStep:
    """The step of ranks whose phases take these times: the all-to-all starts on every rank
    at the latest send end (the module docstring's rule). ``alone``: the (send, layer) seconds
    of each rank measured alone, where ``send_s`` and ``layer_s`` are co-located: each local
    phase then lasts as ``costmodel.colocation.overlapped_seconds`` says (slowed only while
    another rank is busy too)."""
    send_s, halo_s, layer_s = (np.asarray(a, dtype=np.float64) for a in (send_s, halo_s, layer_s))
    if alone is not None:
        from costmodel.colocation import overlapped_seconds  # noqa: PLC0415

        send_s = overlapped_seconds(alone[0], send_s)
        layer_start = send_s.max() + halo_s
        layer_s = overlapped_seconds(alone[1], layer_s, layer_start)
    wait = send_s.max() - send_s
    return PredictedStep(level, send_s, halo_s, wait, layer_s)


def trace_seconds(model: Any, trace: Sequence[KernelSpec], levels: Sequence[str]) -> dict[str, float]:
    """Predicted seconds of ``trace`` per level (0 for an empty trace)."""
    from sim.predict.simulator import predict_trace  # noqa: PLC0415

    if not trace:
        return {lv: 0.0 for lv in levels}
    pred = predict_trace(model, list(trace), levels, quiet=True)
    return {lv: float(pred[lv].sum()) for lv in levels}


def predict_partition_step(model: Any, collective_model: Any, cfg: GNNConfig, plan: PartitionPlan, edge_index: Any,
                           *, levels: Sequence[str] = LEVELS, traces: Sequence[dict[str, list[KernelSpec]]] | None = None,
                           balanced: bool = True, colocation: Any = None) -> dict[str, PredictedStep]:
    """Every level's ``PredictedStep`` of ``cfg`` on ``plan``: kernels by ``model`` (a
    ``CostModel``: ``predict`` per level), the halo by ``collective_model``
    (``predict_all_to_all_s(send_bytes [W, W], level=...) -> [W]``); ``traces`` (per rank,
    ``rank_traces``) when already built; ``colocation`` (``costmodel.colocation``'s factors, or
    None: as measured alone): every kernel's seconds times its family's factor at its bytes
    while another rank runs beside it (``overlapped_seconds``: a rank whose twin has finished
    runs alone; the halo is not scaled, it was measured between the processes)."""
    from costmodel.colocation import colocated_trace_seconds  # noqa: PLC0415

    W = plan.world_size
    traces = list(traces) if traces is not None else [rank_traces(cfg, plan, edge_index, r) for r in range(W)]
    alone = [{ph: trace_seconds(model, t[ph], levels) for ph in ("send", "layer")} for t in traces]
    per_rank = alone if colocation is None else [
        {ph: colocated_trace_seconds(t[ph], lambda tr: trace_seconds(model, tr, levels), colocation)
         for ph in ("send", "layer")} for t in traces]
    note = collective_model.extrapolating(plan.halo_send_bytes) if hasattr(collective_model, "extrapolating") else None
    out = {}
    for lv in levels:
        halo = np.asarray(collective_model.predict_all_to_all_s(plan.halo_send_bytes, level=collective_level(collective_model, lv)),
                          dtype=np.float64)
        step = compose_step(lv, [p["send"][lv] for p in per_rank], halo, [p["layer"][lv] for p in per_rank],
                            alone=None if colocation is None else ([p["send"][lv] for p in alone],
                                                                   [p["layer"][lv] for p in alone]))
        if colocation is not None:  # the same step with every rank as if alone (details.colocation compares)
            step.extra["alone_step_s"] = compose_step(lv, [p["send"][lv] for p in alone], halo,
                                                      [p["layer"][lv] for p in alone]).step_s
        step.collective_note = note
        out[lv] = step
    if balanced and W > 1:
        for lv, b in _balanced_steps(model, collective_model, cfg, plan, per_rank, levels).items():
            out[lv].balanced_step_s = b
    elif balanced:
        for lv in levels:
            out[lv].balanced_step_s = out[lv].step_s
    return out


def _balanced_steps(model: Any, collective_model: Any, cfg: GNNConfig, plan: PartitionPlan,
                    per_rank: Sequence[dict[str, dict[str, float]]], levels: Sequence[str]) -> dict[str, float]:
    """The step of a perfectly balanced partition of the same totals: every rank's kernels
    at the ranks' mean predicted time (kernel time is close to linear in rows and edges at
    these sizes), the halo exchange the mean off-rank bytes between every pair of ranks."""
    bal_bytes = balanced_send_bytes(plan)
    out = {}
    for lv in levels:
        halo = np.asarray(collective_model.predict_all_to_all_s(bal_bytes, level=collective_level(collective_model, lv)),
                          dtype=np.float64)
        compute = np.mean([p["send"][lv] + p["layer"][lv] for p in per_rank])
        out[lv] = float(compute + halo.max())
    return out
