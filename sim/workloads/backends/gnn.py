"""The GNN layer's aggregation backends: how messages along the edges reach their destinations.

``GNNLayer`` (``sim/workloads/gnn_layer.py``) transforms node features and hands them to its backend
for the neighbourhood aggregation; ``gnn_trace`` does the same with kernel descriptors.
Each backend is one object that declares, side by side:

- ``aggregations``: the ``gnn.aggregation`` values it computes (and why only those);
- ``prepare_graph``: what it builds once per graph beyond the ordered edges and their
  norms (outside the forward pass and the trace, as a data loader would);
- ``aggregate``: its part of the forward pass, every kernel in a ``kernel_scope``;
- ``aggregate_trace``: the kernels that part runs, with the same shapes, without running;
- ``unavailable_reason``: why it cannot run in this process (None when it can);
- ``graph_bytes``: what ``prepare_graph`` keeps alive per graph, for the memory checks;
- ``calibration_kernels`` and ``needs_source_read_shares``: kernels calibration measures
  beyond the layer's trace (``sim.predict.calibration.gnn_suite``).

Registered backends (``GNN_BACKENDS``, looked up by ``gnn.backend``):

- ``index_add`` (``index_add_``, sum only), ``scatter_reduce`` and ``torch_scatter``
  (where installed): gather the source rows, scale them (GCN sum), scatter-reduce them into
  the destinations; the backend's name is the ``ScatterSpec`` / ``costmodel.families.scatter.scatter`` implementation;
- ``sparse_csr``: gather, scaling and sum/mean fused into one CSR sparse-dense matmul
  (``torch.sparse.mm``; no max), whose cost depends on which source rows it reads.

A new backend is a ``GNNBackend`` subclass (or a ``ScatterAggregation`` over a new scatter
implementation) here and one ``GNN_BACKENDS.register`` call.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from costmodel.families.descriptor import DTYPE_BYTES, INDEX_BYTES, KernelSpec
from costmodel.families.elementwise import ElementwiseSpec, elementwise
from costmodel.families.gather import GatherSpec, gather
from costmodel.families.indices import column_pattern, index_for_share, min_cv_for_share
from costmodel.families.scatter import ScatterSpec, scatter, scatter_backends_available
from costmodel.families.spmm import SpmmSpec, spmm
from costmodel.measure.runners import csr_from_index
from costmodel.measure.scope import kernel_scope
from sim.workloads.backends.registry import BackendRegistry

if TYPE_CHECKING:  # annotations only: sim.workloads.gnn_layer imports this module
    from sim.workloads.gnn_layer import GNNConfig, GNNLayer, GraphPlan


class GNNBackend(ABC):
    """How a GNN layer aggregates; see the module docstring for what each member declares."""

    name: str
    aggregations: tuple[str, ...]  # the gnn.aggregation values it computes
    aggregation_limit: str = ""  # why only those, for the error message (e.g. "only sums")
    #: its kernels' cost depends on the share of source rows they read, so calibration
    #: measures them at the shares of the experiment's graphs (``calibration_kernels``)
    needs_source_read_shares: bool = False

    def check_aggregation(self, aggregation: str) -> None:
        """A ValueError naming both fields when this backend cannot compute ``aggregation``."""
        if aggregation not in self.aggregations:
            raise ValueError(f"gnn.backend={self.name!r} {self.aggregation_limit}: gnn.aggregation must be one of "
                             f"{list(self.aggregations)}, got {aggregation!r}")

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run in this process, or None."""
        return None

    def prepare_graph(self, src: np.ndarray, dst: np.ndarray, norm: np.ndarray, num_nodes: int,
                      dtype: torch.dtype, device: torch.device) -> Any:
        """What ``aggregate`` needs of one graph beyond ``layer.src``, ``layer.dst`` and
        ``layer.edge_norm`` (kept as ``layer.aggregation_state``); nothing by default."""
        return None

    @abstractmethod
    def aggregate(self, layer: GNNLayer, h: torch.Tensor) -> torch.Tensor:
        """[N, W] aggregated messages of the [N, W] node rows ``h`` over ``layer``'s graph."""

    @abstractmethod
    def aggregate_trace(self, cfg: GNNConfig, plan: GraphPlan) -> list[KernelSpec]:
        """The kernels ``aggregate`` runs on the graph of ``plan``, in order."""

    def graph_bytes(self, num_nodes: int, num_edges: int, dtype: str) -> int:
        """Bytes ``prepare_graph`` keeps alive per graph (none by default)."""
        return 0

    def calibration_kernels(self, cfg: GNNConfig, plan: GraphPlan,
                            src_read_shares: Sequence[float]) -> list[KernelSpec]:
        """Kernels to measure beyond ``gnn_trace(cfg, plan)`` on a calibration grid graph (none by default)."""
        return []


@dataclass(frozen=True)
class ScatterAggregation(GNNBackend):
    """Gather the source rows, scale them (GCN sum), scatter-reduce into the destinations
    with the scatter implementation of the same name (``costmodel.families.scatter.scatter``)."""

    name: str
    aggregations: tuple[str, ...]
    aggregation_limit: str = ""
    missing_hint: str = ""  # what to install when the implementation is absent here

    def unavailable_reason(self) -> str | None:
        if self.name not in scatter_backends_available():
            return self.missing_hint or f"scatter implementation {self.name!r} is not available here"
        return None

    def aggregate(self, layer: GNNLayer, h: torch.Tensor) -> torch.Tensor:
        cfg = layer.cfg
        with kernel_scope("gather"):
            messages = gather(h, layer.src)
        if cfg.scales_messages:
            with kernel_scope("elementwise"):
                messages = elementwise("scale", messages, layer.edge_norm)
        with kernel_scope("scatter"):
            return scatter(messages, layer.dst, cfg.num_nodes, reduce=cfg.aggregation, backend=self.name)

    def aggregate_trace(self, cfg: GNNConfig, plan: GraphPlan) -> list[KernelSpec]:
        N, E, W, dt = cfg.num_nodes, plan.num_edges, cfg.agg_width, cfg.dtype
        trace: list[KernelSpec] = [GatherSpec(E, W, N, plan.out_degree_cv, plan.src_sorted, dt)]
        if cfg.scales_messages:
            trace.append(ElementwiseSpec("scale", E * W, dt))
        trace.append(ScatterSpec(E, W, N, cfg.aggregation, self.name, plan.in_degree_cv, plan.dst_sorted, dt))
        return trace


class SparseCSRAggregation(GNNBackend):
    """One CSR sparse-dense matmul (``torch.sparse.mm``) of the normalised adjacency."""

    name = "sparse_csr"
    aggregations = ("sum", "mean")
    aggregation_limit = "aggregates by matmul"
    needs_source_read_shares = True

    def prepare_graph(self, src: np.ndarray, dst: np.ndarray, norm: np.ndarray, num_nodes: int,
                      dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return csr_from_index(dst, src, num_nodes, num_nodes, torch.from_numpy(norm), dtype, device)

    def aggregate(self, layer: GNNLayer, h: torch.Tensor) -> torch.Tensor:
        with kernel_scope("spmm"):
            return spmm(layer.aggregation_state, h)

    def aggregate_trace(self, cfg: GNNConfig, plan: GraphPlan) -> list[KernelSpec]:
        N = cfg.num_nodes
        # the CSR adjacency merges duplicate edges: plan.csr_* when the graph has any
        nnz = plan.csr_nnz if plan.csr_nnz is not None else plan.num_edges
        row_cv = plan.csr_row_cv if plan.csr_row_cv is not None else plan.in_degree_cv
        return [SpmmSpec(nnz, cfg.agg_width, N, N, row_cv, cfg.dtype, plan.csr_src_cv, plan.csr_src_read_share)]

    def graph_bytes(self, num_nodes: int, num_edges: int, dtype: str) -> int:
        # values and column indices per edge, row pointers per node + 1
        return (INDEX_BYTES + DTYPE_BYTES[dtype]) * num_edges + INDEX_BYTES * (num_nodes + 1)

    def calibration_kernels(self, cfg: GNNConfig, plan: GraphPlan,
                            src_read_shares: Sequence[float]) -> list[KernelSpec]:
        """The sparse matmul again with columns that read each share in ``src_read_shares``
        of the source nodes (where the plan's out-degree CV allows it: ``min_cv_for_share``),
        since real graphs read fewer rows than a Zipf index of the same CV."""
        out: list[KernelSpec] = []
        cv_src = plan.out_degree_cv
        for share in src_read_shares:
            if min_cv_for_share(share) > cv_src:
                continue
            _, src_cv, src_share = index_for_share(plan.num_edges, cfg.num_nodes, cv_src, float(share), seed=1)
            src_cv, src_share = column_pattern(src_cv, src_share)
            out += self.aggregate_trace(cfg, dataclasses.replace(plan, csr_src_cv=src_cv, csr_src_read_share=src_share))
        return out


GNN_BACKENDS: BackendRegistry[GNNBackend] = BackendRegistry(field="gnn.backend", where="sim/workloads/backends/gnn.py")
for _backend in (
    ScatterAggregation("index_add", ("sum",), "only sums"),
    ScatterAggregation("scatter_reduce", ("sum", "mean", "max")),
    ScatterAggregation("torch_scatter", ("sum", "mean", "max"),
                       missing_hint="torch-scatter is not installed (pip install --no-build-isolation torch-scatter)"),
    SparseCSRAggregation(),
):
    GNN_BACKENDS.register(_backend)


def gnn_backend(name: str) -> GNNBackend:
    """The registered GNN backend ``name`` (a ValueError naming ``gnn.backend`` and the choices)."""
    return GNN_BACKENDS.lookup(name)
