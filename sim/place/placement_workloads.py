"""The project's own layers as placement workloads: MoE, GNN and dense MLP.

Each builder (a Hydra ``_target_`` in ``conf/placement_mix/``) draws the layer's routing
or graph once, from its seed, and returns a ``sim.place.placement.PlacementWorkload``: the layer's kernel
trace, its memory footprint, and a picklable factory holding the config and the drawn
routing or graph (numpy arrays), which builds the real module and its input on a device
inside whatever process runs it. ``calibration_suite`` gives the kernels a profile needs
to predict a set of workloads: a layer factory names its own suite (as the sweep
experiments do), any other workload (e.g. a captured module trace) gets one around its
trace.

Memory footprint (an estimate, conservative): the bytes the workload keeps resident
(weights, input, routing or graph indices) plus its largest kernel's ideal traffic
(``bytes_moved``: every operand and result once), which bounds what is live at its peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from costmodel.families.descriptor import DTYPE_BYTES, INDEX_BYTES, KernelSpec
from sim.workloads.backends import gnn_backend
from sim.predict.calibration import TaggedSpecs, gemm_suite, gnn_suite, moe_suite, small_op_suite
from sim.workloads.gnn_layer import GNNConfig, GNNLayer, GraphPlan, gnn_trace
from sim.workloads.graphs import degree_stats, rmat
from sim.workloads.mlp_layer import MLP, MLPConfig, mlp_trace
from sim.workloads.moe_layer import DispatchPlan, MoEConfig, MoELayer, moe_trace
from sim.place.placement import PlacementWorkload
from sim.workloads.routing import Routing, ZipfRouting, route


def footprint_bytes(resident_bytes: float, trace: Sequence[KernelSpec]) -> int:
    """Resident bytes plus the largest kernel's ideal traffic (see the module docstring)."""
    return int(resident_bytes + max(s.bytes_moved() for s in trace))


def _input(rows: int, cols: int, dtype: str, device: torch.device, seed: int) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).to(device, getattr(torch, dtype))


@dataclass(frozen=True)
class MoEFactory:
    cfg: MoEConfig
    routing: Routing
    seed: int

    def build(self, device: torch.device) -> Callable[[], Any]:
        layer = MoELayer(self.cfg, device=device, seed=self.seed)
        x, routing = _input(self.cfg.tokens, self.cfg.d_model, self.cfg.dtype, device, self.seed), self.routing
        return lambda: layer(x, routing)

    def calibration_suite(self) -> TaggedSpecs:
        return moe_suite([self.cfg])


@dataclass(frozen=True)
class GNNFactory:
    cfg: GNNConfig
    edge_index: np.ndarray  # [2, E] int64
    cv_range: tuple[float, float]  # the graph's degree CVs (in, out): the calibration grid covers them
    seed: int

    def build(self, device: torch.device) -> Callable[[], Any]:
        layer = GNNLayer(self.cfg, device=device, seed=self.seed)
        layer.set_graph(torch.from_numpy(self.edge_index))
        x = _input(self.cfg.num_nodes, self.cfg.in_features, self.cfg.dtype, device, self.seed)
        return lambda: layer(x)

    def calibration_suite(self) -> TaggedSpecs:
        return gnn_suite([self.cfg], num_edges=int(self.edge_index.shape[1]), cv_range=self.cv_range, points=4)


@dataclass(frozen=True)
class MLPFactory:
    cfg: MLPConfig
    seed: int

    def build(self, device: torch.device) -> Callable[[], Any]:
        module = MLP(self.cfg, device=device, seed=self.seed)
        x = _input(self.cfg.batch, self.cfg.d_model, self.cfg.dtype, device, self.seed)
        return lambda: module(x)

    def calibration_suite(self) -> TaggedSpecs:
        trace = mlp_trace(self.cfg)
        return gemm_suite([k for k in trace if k.family == "gemm"], points=6) + small_op_suite(trace)


def moe_workload(name: str, *, tokens: int, d_model: int, d_ff: int, num_experts: int, top_k: int,
                 zipf_exponent: float = 0.0, backend: str = "loop", expert: str = "swiglu", dtype: str = "float32",
                 seed: int = 0) -> PlacementWorkload:
    """A MoE layer under Zipf routing of ``zipf_exponent`` (0 uniform, larger concentrates)."""
    cfg = MoEConfig(tokens=tokens, d_model=d_model, d_ff=d_ff, num_experts=num_experts, top_k=top_k, expert=expert,
                    backend=backend, dtype=dtype)
    routing = route(ZipfRouting(float(zipf_exponent)), tokens=tokens, num_experts=num_experts, top_k=top_k, seed=seed)
    plan = DispatchPlan.from_routing(routing)
    trace = moe_trace(cfg, plan)
    el = DTYPE_BYTES[dtype]
    projections = 3 if expert == "swiglu" else 2
    resident = el * (d_model * num_experts + projections * num_experts * d_model * d_ff + tokens * d_model)
    resident += routing.expert_ids.size * (INDEX_BYTES + 4)
    metrics = routing.metrics()
    return PlacementWorkload(name, tuple(trace), memory_bytes=footprint_bytes(resident, trace),
                             factory=MoEFactory(cfg, routing, seed), columns={
        "kind": "moe", "shape": f"T{tokens} D{d_model} F{d_ff} E{num_experts} k{top_k} {backend}",
        "skew": f"zipf {zipf_exponent:g}: max/mean {metrics['max_over_mean']:.2f}, {int(metrics['experts_used'])} experts hit",
    })


def gnn_workload(name: str, *, num_nodes: int, num_edges: int, width: int, rmat_a: float, backend: str = "index_add",
                 kind: str = "gcn", dtype: str = "float32", seed: int = 0) -> PlacementWorkload:
    """A GCN/SAGE layer of ``width`` features on an R-MAT graph (a = 0.25 uniform .. 0.9 very skewed)."""
    cfg = GNNConfig(num_nodes=num_nodes, in_features=width, out_features=width, kind=kind, backend=backend, dtype=dtype)
    if not 0.25 <= rmat_a < 1:
        raise ValueError(f"rmat_a must be in [0.25, 1), got {rmat_a!r}")
    if not isinstance(num_edges, int) or num_edges < 1:
        raise ValueError(f"num_edges must be a positive integer, got {num_edges!r}")
    edge_index = rmat(num_nodes, num_edges, a=float(rmat_a), b=None, c=None, d=None, seed=seed)
    plan = GraphPlan.from_edge_index(edge_index, num_nodes, sorted_by_dst=cfg.edge_order == "dst_sorted")
    trace = gnn_trace(cfg, plan)
    stats = degree_stats(edge_index, num_nodes)
    el = DTYPE_BYTES[dtype]
    resident = el * (num_nodes * width + width * width * (2 if kind == "sage" else 1) + num_edges) + 2 * num_edges * INDEX_BYTES
    resident += gnn_backend(backend).graph_bytes(num_nodes, num_edges, dtype)  # e.g. the CSR adjacency
    cvs = (min(stats["degree_cv"], stats["out_degree_cv"]), max(stats["degree_cv"], stats["out_degree_cv"]))
    return PlacementWorkload(name, tuple(trace), memory_bytes=footprint_bytes(resident, trace),
                             factory=GNNFactory(cfg, edge_index.numpy().copy(), cvs, seed), columns={
                        "kind": "gnn", "shape": f"N{num_nodes} E{num_edges} W{width} {kind} {backend}",
                        "skew": f"rmat a {rmat_a:g}: in-degree CV {stats['degree_cv']:.2f}",
                    })


def mlp_workload(name: str, *, batch: int, d_model: int, d_hidden: int, dtype: str = "float32", seed: int = 0) -> PlacementWorkload:
    """A dense two-layer MLP [batch, d_model] -> d_hidden -> d_model."""
    cfg = MLPConfig(batch=batch, d_model=d_model, d_hidden=d_hidden, dtype=dtype)
    trace = mlp_trace(cfg)
    resident = DTYPE_BYTES[dtype] * (2 * d_model * d_hidden + batch * d_model)
    return PlacementWorkload(name, tuple(trace), memory_bytes=footprint_bytes(resident, trace),
                             factory=MLPFactory(cfg, seed), columns={
        "kind": "mlp", "shape": f"B{batch} D{d_model} H{d_hidden}", "skew": "",
    })


@dataclass(frozen=True)
class ImportedFactory:
    """Any runnable given by import path: ``target(device=device, **kwargs)`` must return a
    zero-argument callable (e.g. a function that builds a module and its input and returns
    ``lambda: module(x)``). The way to run a captured module trace on a placement worker."""

    target: str  # "package.module.function"
    kwargs: tuple[tuple[str, Any], ...] = ()

    def build(self, device: torch.device) -> Callable[[], Any]:
        from hydra.utils import get_method

        fn = get_method(self.target)(device=device, **dict(self.kwargs))
        if not callable(fn):
            raise TypeError(f"{self.target}(device=...) must return a callable, got {type(fn).__name__}")
        return fn


def trace_workload(name: str, trace: Sequence[KernelSpec], factory: Any, *, resident_bytes: int = 0,
                   columns: dict[str, Any] | None = None) -> PlacementWorkload:
    """A workload from any trace (a captured module's descriptors) and a factory that runs it
    (``ImportedFactory`` or any picklable object with ``build(device)``)."""
    trace = tuple(trace)
    return PlacementWorkload(name, trace, memory_bytes=footprint_bytes(resident_bytes, trace) if trace else int(resident_bytes),
                             factory=factory, columns=columns or {"kind": "trace", "shape": f"{len(trace)} kernels", "skew": ""})


def trace_suite(trace: Sequence[KernelSpec]) -> TaggedSpecs:
    """Calibration kernels for any trace (e.g. a captured module's): GEMMs around its GEMM
    shapes, elementwise ops around its sizes, and its other kernels as they are."""
    gemms = [k for k in trace if k.family == "gemm"]
    rest = [("calibration", k) for k in trace if k.family not in ("gemm", "elementwise")]
    return (gemm_suite(gemms) if gemms else []) + small_op_suite(trace) + rest


def calibration_suite(workloads: Sequence[PlacementWorkload]) -> TaggedSpecs:
    """The kernels a profile needs to predict ``workloads``, each once."""
    out: TaggedSpecs = []
    for w in workloads:
        own = getattr(w.factory, "calibration_suite", None)
        out += own() if callable(own) else trace_suite(w.trace)
    seen: dict[str, tuple[str, KernelSpec]] = {}
    for tag, spec in out:
        seen.setdefault(spec.key(), (tag, spec))
    return list(seen.values())
