"""A real GNN layer (GCN- or SAGE-style) with selectable aggregation, and its kernel trace.

GCN-style (Kipf & Welling 2017, with the normalisation applied per edge):
    h = X W                       gemm [N, F_in] x [F_in, F_out]
    m = h[src]                    gather [E, F_out]
    m = m * norm_e                elementwise scale (sum aggregation: 1/sqrt(d_src d_dst))
    out = reduce_dst(m)           scatter into [N, F_out] (sum | mean | max)
    out = relu(out)               elementwise
SAGE-style (Hamilton, Ying & Leskovec 2017), aggregation on the input width:
    a = reduce_dst(X[src])        gather [E, F_in] + scatter
    out = relu(X W_self + a W_neigh)   two gemms, add, relu

Aggregation backends are registered objects in ``sim/workloads/backends/gnn.py``, named by
``gnn.backend``: ``index_add`` (``index_add_``, sum only), ``scatter_reduce``,
``torch_scatter`` (where installed) and ``sparse_csr``, which fuses gather, scaling and
sum/mean into one CSR sparse-dense matmul (``torch.sparse.mm``; no max).
``edge_order`` keeps the generator's order or sorts edges by destination first.

Graph preparation (sorting, degrees, norms, CSR) happens once per graph, outside the
forward pass and outside the trace, as a data loader would do it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from costmodel.families.descriptor import KernelSpec
from costmodel.families.elementwise import ElementwiseSpec, elementwise
from costmodel.families.gemm import GemmSpec, gemm
from costmodel.families.indices import pattern_of_counts
from costmodel.measure.scope import kernel_scope
from sim.workloads.backends.gnn import GNN_BACKENDS, gnn_backend  # noqa: F401 (GNN_BACKENDS re-exported)
from sim.workloads.graphs import check_edge_index

GNN_KINDS = ("gcn", "sage")
AGGREGATIONS = ("sum", "mean", "max")
EDGE_ORDERS = ("original", "dst_sorted")


@dataclass(frozen=True)
class GNNConfig:
    num_nodes: int = 65536  # N
    in_features: int = 64  # F_in
    out_features: int = 64  # F_out
    kind: str = "gcn"  # gcn | sage
    aggregation: str = "sum"  # sum | mean | max
    backend: str = "index_add"  # sim/workloads/backends/gnn.py: index_add | scatter_reduce | torch_scatter | sparse_csr
    edge_order: str = "original"  # original | dst_sorted
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("num_nodes", "in_features", "out_features"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"gnn.{name} must be a positive integer (>= 1), got {value!r}")
        for name, allowed in (("kind", GNN_KINDS), ("aggregation", AGGREGATIONS), ("edge_order", EDGE_ORDERS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"gnn.{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        # a ValueError naming gnn.backend and the registered backends, or gnn.aggregation and what it computes
        gnn_backend(self.backend).check_aggregation(self.aggregation)

    @property
    def scales_messages(self) -> bool:
        """GCN sums messages scaled by the symmetric norm 1/sqrt(d_src d_dst), one per edge."""
        return self.kind == "gcn" and self.aggregation == "sum"

    @property
    def agg_width(self) -> int:
        """Width of the rows that are gathered and reduced."""
        return self.out_features if self.kind == "gcn" else self.in_features

    def useful_flops(self, num_edges: int) -> float:
        gemms = 1 if self.kind == "gcn" else 2
        return 2.0 * self.num_nodes * self.in_features * self.out_features * gemms + num_edges * self.agg_width


def backend_unavailable_reason(cfg: GNNConfig) -> str | None:
    """Why ``cfg.backend`` cannot run in this process, or None."""
    return gnn_backend(cfg.backend).unavailable_reason()


@dataclass(frozen=True)
class GraphPlan:
    """Facts of one graph (in the layer's edge order) that the trace needs."""

    num_nodes: int
    num_edges: int
    in_degree_cv: float
    out_degree_cv: float
    src_sorted: bool
    dst_sorted: bool
    #: distinct (dst, src) pairs and the CV of their per-destination counts: the CSR adjacency
    #: merges duplicate edges, so the sparse_csr backend multiplies this many non-zeros
    #: (None: a graph without duplicates, num_edges and in_degree_cv)
    csr_nnz: int | None = None
    csr_row_cv: float | None = None
    #: CV of how often each source node is read by the CSR adjacency, and the share read
    #: at least once: the sparse matmul's cache footprint (``SpmmSpec.src_cv``)
    csr_src_cv: float | None = None
    csr_src_read_share: float | None = None

    @classmethod
    def from_edge_index(cls, edge_index: torch.Tensor, num_nodes: int, *, sorted_by_dst: bool) -> "GraphPlan":
        check_edge_index(edge_index, num_nodes)
        src, dst = _ordered(edge_index, sorted_by_dst)
        return cls(
            num_nodes=num_nodes, num_edges=int(src.size),
            in_degree_cv=_cv(np.bincount(dst, minlength=num_nodes)),
            out_degree_cv=_cv(np.bincount(src, minlength=num_nodes)),
            src_sorted=bool(np.all(src[1:] >= src[:-1])), dst_sorted=bool(np.all(dst[1:] >= dst[:-1])),
            **_csr_facts(src, dst, num_nodes),
        )


def _csr_facts(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> dict[str, object]:
    pairs = np.unique(dst.astype(np.int64) * num_nodes + src)
    src_cv, src_share = pattern_of_counts(np.bincount(pairs % num_nodes, minlength=num_nodes))
    facts: dict[str, object] = {"csr_src_cv": src_cv, "csr_src_read_share": src_share}
    if pairs.size == src.size:
        return facts
    return {**facts, "csr_nnz": int(pairs.size), "csr_row_cv": _cv(np.bincount(pairs // num_nodes, minlength=num_nodes))}


def _cv(counts: np.ndarray) -> float:
    c = counts.astype(np.float64)
    return round(float(c.std() / c.mean()), 3) if c.mean() > 0 else 0.0


def _ordered(edge_index: torch.Tensor, sorted_by_dst: bool) -> tuple[np.ndarray, np.ndarray]:
    host = edge_index.detach().cpu()  # the plan's facts are host-side numpy, wherever the layer runs
    src, dst = host[0].numpy(), host[1].numpy()
    if sorted_by_dst:
        order = np.argsort(dst, kind="stable")
        src, dst = src[order], dst[order]
    return src, dst


def gnn_trace(cfg: GNNConfig, plan: GraphPlan) -> list[KernelSpec]:
    """The kernels ``GNNLayer.forward`` runs for this config and graph, in order."""
    N, dt = cfg.num_nodes, cfg.dtype
    if plan.num_nodes != N:
        raise ValueError(f"graph has {plan.num_nodes} nodes but gnn.num_nodes={N}")
    aggregate = gnn_backend(cfg.backend).aggregate_trace(cfg, plan)
    transform = GemmSpec(N, cfg.in_features, cfg.out_features, dt)
    relu = ElementwiseSpec("relu", N * cfg.out_features, dt)
    if cfg.kind == "gcn":
        return [transform, *aggregate, relu]
    return [*aggregate, transform, transform, ElementwiseSpec("add", N * cfg.out_features, dt), relu]


class GNNLayer(nn.Module):
    """One GCN/SAGE layer bound to one graph (prepared once in ``set_graph``)."""

    def __init__(self, cfg: GNNConfig, *, device: torch.device | str = "cpu", seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.backend = gnn_backend(cfg.backend)  # aggregates (sim/workloads/backends/gnn.py)
        self.device = torch.device(device)
        gen = torch.Generator().manual_seed(seed)
        dtype = getattr(torch, cfg.dtype)

        def init(k: int, n: int) -> nn.Parameter:
            w = torch.randn(k, n, generator=gen) / k**0.5
            return nn.Parameter(w.to(self.device, dtype), requires_grad=False)

        self.weight = init(cfg.in_features, cfg.out_features)
        self.weight_neigh = init(cfg.in_features, cfg.out_features) if cfg.kind == "sage" else None
        self.plan: GraphPlan | None = None

    def set_graph(self, edge_index: torch.Tensor) -> GraphPlan:
        """Order edges, compute degrees, norms and what the backend builds per graph
        (``aggregation_state``: the CSR adjacency for sparse_csr)."""
        cfg = self.cfg
        N = cfg.num_nodes
        self.plan = GraphPlan.from_edge_index(edge_index, N, sorted_by_dst=cfg.edge_order == "dst_sorted")
        src, dst = _ordered(edge_index, cfg.edge_order == "dst_sorted")
        in_deg = np.bincount(dst, minlength=N).astype(np.float64)
        out_deg = np.bincount(src, minlength=N).astype(np.float64)
        dtype = getattr(torch, cfg.dtype)
        if cfg.scales_messages:  # symmetric normalisation per edge
            norm = 1.0 / np.sqrt(np.maximum(out_deg[src], 1) * np.maximum(in_deg[dst], 1))
        elif cfg.aggregation == "mean":
            norm = 1.0 / np.maximum(in_deg[dst], 1)
        else:
            norm = np.ones(src.size)
        self.src = torch.from_numpy(src).to(self.device)
        self.dst = torch.from_numpy(dst).to(self.device)
        self.edge_norm = torch.from_numpy(norm).to(self.device, dtype).unsqueeze(1)
        self.aggregation_state = self.backend.prepare_graph(src, dst, norm, N, dtype, self.device)
        return self.plan

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        if self.plan is None:
            raise RuntimeError("GNNLayer.set_graph(edge_index) must be called before forward")
        if x.shape != (cfg.num_nodes, cfg.in_features):
            raise ValueError(f"GNNLayer input must be [num_nodes={cfg.num_nodes}, in_features={cfg.in_features}], "
                             f"got {list(x.shape)}")
        if cfg.kind == "gcn":
            with kernel_scope("gemm"):
                h = gemm(x, self.weight)
            out = self.backend.aggregate(self, h)
        else:
            agg = self.backend.aggregate(self, x)
            with kernel_scope("gemm"):
                h_self = gemm(x, self.weight)
            with kernel_scope("gemm"):
                h_neigh = gemm(agg, self.weight_neigh)
            with kernel_scope("elementwise"):
                out = elementwise("add", h_self, h_neigh)
        with kernel_scope("elementwise"):
            return elementwise("relu", out)
