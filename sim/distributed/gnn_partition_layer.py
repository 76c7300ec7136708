"""A real partitioned GNN layer: one rank's part, run on ``torch.distributed`` (gloo or NCCL).

Each rank owns the nodes a ``PartitionPlan`` (``sim.distributed.graph_partition``) gives it
and holds their input feature rows. One step (``PartitionedGNNLayer.forward``):

1. ``send``: ``gather`` (``index_select``) of the own rows other ranks need, grouped by
   destination rank;
2. ``halo``: one ``all_to_all_single`` with uneven ``input_split_sizes`` /
   ``output_split_sizes`` (known to every rank from the plan: a static partition needs no
   count exchange). The received rows land in place after the own rows of the rank's input
   buffer (``input_buffer``), in the plan's local order (halo grouped by owner);
3. ``layer``: the project's single-device layer (``sim.workloads.gnn_layer.GNNLayer`` with its
   registered aggregation backend, ``sim.workloads.backends.gnn``) on the rank's local graph: its own
   and halo nodes as rows, its own nodes' in-edges as edges; the own rows of its output are
   the rank's shard of the layer's output.

The local layer is built with the single-device config's widths and seed, so its weights
are the single-device layer's. GCN's symmetric norm 1/sqrt(d_out(src) d_in(dst)) needs the
*global* out-degree of each source (the local graph holds only the edges into this rank), so
the edge norms and the backend's per-graph state are rebuilt from the global degrees after
``set_graph``; in-degrees (mean, the norm's other half) are complete locally.

The local layer transforms every local row, halo rows included (as exchanging input
features implies: DistDGL's first layer), and aggregates into a square local graph whose
halo rows receive nothing; both are in the rank's trace (``gnn_partition_predict``).

``device``: where the rank's layer and buffers live, one GPU per process under NCCL
(``scripts/gnn_partition_torchrun.py --device cuda``); the CPU with gloo by default.

``partition_worker`` is the per-rank entry point for ``sim.distributed.launch.run_ep``:
outputs of every case and, with repeats, the per-phase times of every rank and the step's
slowest-rank time (``time_phases`` over ``step_timing.time_step``). ``run_partition_forward`` launches it and assembles the
full outputs.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from costmodel.families.gather import gather
from costmodel.measure.allocator import configure_allocator
from costmodel.measure.scope import kernel_scope
from costmodel.measure.timing import TimingConfig, evict_caches
from sim.distributed.gnn_partition_predict import PHASES, check_plan_for_layer, local_config
from sim.distributed.graph_partition import PartitionPlan
from sim.distributed.launch import run_ep
from sim.distributed.step_timing import MAX_REPEATS, MAX_WARMUP, MIN_REPEATS, time_step
from sim.workloads.gnn_layer import GNNConfig, GNNLayer


class PartitionedGNNLayer(nn.Module):
    """Rank ``rank``'s part of a partitioned GNN layer; inference only."""

    def __init__(self, cfg: GNNConfig, plan: PartitionPlan, edge_index: Any, *, rank: int, seed: int = 0,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        W = plan.world_size
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < W:
            raise ValueError(f"rank must be an integer in [0, partition.world_size={W}), got {rank!r}")
        check_plan_for_layer(cfg, plan)
        self.cfg, self.plan, self.rank = cfg, plan, rank
        self.own = int(plan.actual.nodes[rank])
        local_nodes = plan.local_nodes(rank)
        self.layer = GNNLayer(local_config(cfg, plan, rank), seed=seed, device=device)  # the single-device layer's weights
        local = plan.local_edge_index(edge_index, rank)
        if local.shape[1] == 0:
            raise ValueError(f"rank {rank} owns no node with an in-edge: the partitioned layer needs at least one "
                             "in-edge per rank; use fewer ranks or another partitioner")
        self.graph = self.layer.set_graph(torch.from_numpy(np.ascontiguousarray(local)))
        if cfg.scales_messages:
            self._global_norms(edge_index, local_nodes)
        self.send_index = torch.from_numpy(plan.send_index(rank)).to(self.layer.device)
        self.send_split = [int(v) for v in plan.halo_send_rows[rank]]  # rows this rank sends to each rank
        self.recv_split = [int(v) for v in plan.halo_send_rows[:, rank]]  # rows it receives from each rank

    def _global_norms(self, edge_index: Any, local_nodes: np.ndarray) -> None:
        """GCN's per-edge norm from the global out-degrees (``GNNLayer.set_graph``'s formula)."""
        ei = edge_index.numpy() if hasattr(edge_index, "numpy") else np.asarray(edge_index)
        out_deg = np.bincount(ei[0], minlength=self.plan.num_nodes).astype(np.float64)[local_nodes]
        in_deg = np.bincount(ei[1], minlength=self.plan.num_nodes).astype(np.float64)[local_nodes]
        layer = self.layer
        src, dst = layer.src.cpu().numpy(), layer.dst.cpu().numpy()
        norm = 1.0 / np.sqrt(np.maximum(out_deg[src], 1) * np.maximum(in_deg[dst], 1))
        dtype = getattr(torch, self.cfg.dtype)
        layer.edge_norm = torch.from_numpy(norm).to(layer.device, dtype).unsqueeze(1)
        layer.aggregation_state = layer.backend.prepare_graph(src, dst, norm, layer.cfg.num_nodes, dtype, layer.device)

    def input_buffer(self, x_own: torch.Tensor) -> torch.Tensor:
        """[local rows, F_in] buffer holding this rank's own input rows; the halo rows are
        written by each step's exchange."""
        cfg = self.cfg
        if x_own.shape != (self.own, cfg.in_features):
            raise ValueError(f"rank {self.rank} input must be [own nodes={self.own}, gnn.in_features="
                             f"{cfg.in_features}], got {list(x_own.shape)}")
        buf = torch.zeros(self.layer.cfg.num_nodes, cfg.in_features, dtype=getattr(torch, cfg.dtype),
                          device=self.layer.device)
        buf[: self.own] = x_own.to(buf.device)
        return buf

    def send(self, buf: torch.Tensor) -> torch.Tensor:
        with kernel_scope("gather"):
            return gather(buf[: self.own], self.send_index)

    def exchange(self, buf: torch.Tensor, sent: torch.Tensor) -> None:
        """The halo all-to-all: ``sent`` rows out, the halo rows of ``buf`` in (in place)."""
        dist.all_to_all_single(buf[self.own:], sent, output_split_sizes=self.recv_split,
                               input_split_sizes=self.send_split)

    @torch.no_grad()
    def forward(self, buf: torch.Tensor) -> torch.Tensor:
        """[own nodes, F_out]: this rank's rows of the layer's output."""
        self.exchange(buf, self.send(buf))
        return self.layer(buf)[: self.own]

    @torch.no_grad()
    def timed_step(self, buf: torch.Tensor) -> tuple[float, float, float]:
        """One step, returning the seconds of its send, halo and layer phases."""
        t0 = time.perf_counter()
        sent = self.send(buf)
        t1 = time.perf_counter()
        self.exchange(buf, sent)
        t2 = time.perf_counter()
        self.layer(buf)
        return t1 - t0, t2 - t1, time.perf_counter() - t2


def _check_repeats(warmup: object, repeats: object) -> None:
    if not isinstance(warmup, int) or isinstance(warmup, bool) or not 0 <= warmup <= MAX_WARMUP:
        raise ValueError(f"warmup must be an integer in [0, {MAX_WARMUP}], got {warmup!r}")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or not MIN_REPEATS <= repeats <= MAX_REPEATS:
        raise ValueError(f"repeats must be an integer in [{MIN_REPEATS}, {MAX_REPEATS}], got {repeats!r}")


def time_phases(layer: PartitionedGNNLayer, buf: torch.Tensor, *, warmup: int = 1, repeats: int = 5,
                cold: bool = True) -> dict[str, Any]:
    """``sim.distributed.step_timing.time_step`` (a barrier, the step, an ``all_reduce`` MAX:
    the slowest rank's step per repeat) over ``layer.timed_step``, which keeps this rank's
    seconds of each phase; ``cold``: the CPU caches evicted (untimed) before each step, as the
    profile's cold-cache kernels were timed. Returns this rank's phase seconds per timed
    repeat ([repeats, 3], ``PHASES`` order), the step's ``Measurement`` (the same on every
    rank) and ``cold``."""
    _check_repeats(warmup, repeats)
    if not dist.is_initialized():
        raise RuntimeError("time_phases runs inside a process group (sim.distributed.launch.run_ep)")
    timing = TimingConfig()
    phases: list[tuple[float, float, float]] = []
    before = (lambda: evict_caches(torch.device("cpu"), timing)) if cold else None
    step = time_step(lambda: phases.append(layer.timed_step(buf)), warmup=warmup, repeats=repeats, before=before)
    return {"phases_s": np.asarray(phases[warmup:], dtype=np.float64), "step": step, "cold": cold}


Case = tuple[GNNConfig, PartitionPlan, Any]  # (config, plan, edge index [2, E])


def partition_worker(rank: int, world_size: int, cases: Sequence[Case], x: np.ndarray, seed: int = 0,
                     repeats: int = 0, warmup: int = 1, rounds: int = 1, cold: bool = True,
                     allocator: str = "steady") -> dict[str, Any]:
    """One rank: its output shard of every case and, with ``repeats`` > 0, ``rounds`` passes
    over the cases each timing ``repeats`` steps of every case (``time_phases``), so slow
    drift of a shared machine spreads over the cases. ``allocator``: the host allocator mode
    (``costmodel.measure.allocator``; part of the profile's fingerprint), applied first: a spawned
    rank starts with glibc's default, whose fresh pages per large tensor made the big local
    layers 2.3x slower than the same layer in a process with the profile's ``steady`` mode."""
    configure_allocator(allocator)
    layers, bufs, outputs = [], [], []
    for i, (cfg, plan, edge_index) in enumerate(cases):
        if plan.world_size != world_size:
            raise ValueError(f"case {i}: plan is for partition.world_size={plan.world_size}, the run has {world_size}")
        layer = PartitionedGNNLayer(cfg, plan, edge_index, rank=rank, seed=seed)
        own = plan.own_nodes[rank]
        buf = layer.input_buffer(torch.from_numpy(np.ascontiguousarray(x[own])).to(getattr(torch, cfg.dtype)))
        outputs.append(layer(buf).numpy().copy())
        layers.append(layer)
        bufs.append(buf)
    timed: list[list[dict[str, Any]]] = [[] for _ in cases]
    if repeats:
        for r in range(rounds):
            order = range(len(cases)) if r % 2 == 0 else range(len(cases) - 1, -1, -1)
            for i in order:
                timed[i].append(time_phases(layers[i], bufs[i], warmup=warmup, repeats=repeats, cold=cold))
    return {"outputs": outputs, "timed": timed}


def run_partition_forward(cases: Sequence[Case], x: np.ndarray, *, world_size: int, seed: int = 0, repeats: int = 0,
                          warmup: int = 1, rounds: int = 1, cold: bool = True, allocator: str = "steady",
                          timeout_s: float = 120.0, keep_awake: bool = False) -> dict[str, Any]:
    """The partitioned layer on ``world_size`` gloo processes for each (config, plan, edge
    index) case, in one launch: full [N, F_out] outputs per case (each rank's rows put back
    at its nodes' ids), per case and round each rank's phase times and the step
    ``Measurement``, and the launcher's pinning note. ``keep_awake``: the ranks' cores kept
    from idling in a collective (``costmodel.collectives.awake``)."""
    for i, (cfg, plan, _) in enumerate(cases):
        if x.shape != (cfg.num_nodes, cfg.in_features):
            raise ValueError(f"case {i}: x must be [gnn.num_nodes={cfg.num_nodes}, gnn.in_features="
                             f"{cfg.in_features}], got {list(x.shape)}")
        check_plan_for_layer(cfg, plan)
    if repeats:
        _check_repeats(warmup, repeats)
    run = run_ep(world_size, partition_worker, (list(cases), x, seed, repeats, warmup, rounds, cold, allocator),
                 timeout_s=timeout_s, keep_awake=keep_awake)
    outputs = []
    for i, (cfg, plan, _) in enumerate(cases):
        full = np.zeros((cfg.num_nodes, cfg.out_features), dtype=run.results[0]["outputs"][i].dtype)
        for r, res in enumerate(run.results):
            full[plan.own_nodes[r]] = res["outputs"][i]
        outputs.append(full)
    timed = [[[res["timed"][i][k] for res in run.results] for k in range(len(run.results[0]["timed"][i]))]
             for i in range(len(cases))]  # [case][round][rank]
    return {"outputs": outputs, "timed": timed, "note": run.note}


__all__ = ["PHASES", "PartitionedGNNLayer", "partition_worker", "run_partition_forward", "time_phases"]
