"""How much memory an experiment's layers need, checked against the device before any work.

A layer too large for the device used to calibrate for a minute, refit, and only then die
allocating its weights, leaving rows for impossible shapes in the profile. Each estimate
here is a lower bound from the tensor shapes the layers allocate (``numel x element
size``; the shapes are those of ``MoELayer``, ``GNNLayer`` and ``MLP`` in this package, and
what each layer backend declares it allocates, ``sim/workloads/backends``): every weight that is alive
at once, plus the activations of the largest point. If even
that exceeds ``DEVICE_MEMORY_SHARE`` of the device's memory
(``costmodel.measure.ceilings.device_memory_bytes``: GPU memory, or the host's MemTotal), the run
is refused with the sizes and the keys that set them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from costmodel.families.descriptor import DTYPE_BYTES, INDEX_BYTES
from costmodel.measure.ceilings import device_memory_bytes
from sim.workloads.backends import gnn_backend, moe_backend
from sim.workloads.backends.moe import expert_projections, hidden_maps
from sim.workloads.gnn_layer import GNNConfig
from sim.workloads.mlp_layer import MLPConfig
from sim.workloads.moe_layer import MoEConfig

#: share of the device's memory a run may plan to use: the rest is for the framework, the
#: operating system, the timing harness's cache-eviction buffers and allocator slack
DEVICE_MEMORY_SHARE = 0.9
GB = 1e9


@dataclass(frozen=True)
class MemoryNeed:
    """Bytes of weights alive at once and of the largest point's activations."""

    weights_bytes: float
    activations_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.activations_bytes


def combine(needs: Iterable[MemoryNeed]) -> MemoryNeed:
    """Layers built side by side and run one at a time: weights add, activations take the max."""
    needs = list(needs)
    return MemoryNeed(sum(n.weights_bytes for n in needs), max((n.activations_bytes for n in needs), default=0.0))


def moe_need(cfg: MoEConfig, *, max_rows_per_expert: int | None = None) -> MemoryNeed:
    """One ``MoELayer`` (router + stacked expert projections) and its forward pass at the
    most concentrated routing: ``max_rows_per_expert`` (default all tokens) rows on the busiest expert."""
    b = DTYPE_BYTES[cfg.dtype]
    T, D, F, E, k = cfg.tokens, cfg.d_model, cfg.d_ff, cfg.num_experts, cfg.top_k
    A = T * k
    backend = moe_backend(cfg.backend)
    weights = b * (D * E + E * sum(kk * nn for kk, nn in expert_projections(cfg)))
    max_n = T if max_rows_per_expert is None else max(1, min(T, max_rows_per_expert))
    rows = backend.hidden_rows(cfg, max_n)
    act = b * (2 * T * D + T * E + 3 * A * D + hidden_maps(cfg) * rows * F)  # x, out, logits; x_sorted, y, weighted
    act += b * backend.buffer_elements(cfg, max_n)  # e.g. the padded input and output buffers
    act += INDEX_BYTES * 4 * A  # expert ids, token ids, sort order, slots
    return MemoryNeed(float(weights), float(act))


def gnn_need(cfg: GNNConfig, *, num_edges: int, graphs: int = 1) -> MemoryNeed:
    """``graphs`` layers of config ``cfg``, each bound to its own graph of ``num_edges`` edges
    (edge index, per-edge norms and what the backend builds per graph, e.g. the CSR
    adjacency, stay alive), plus one forward pass."""
    b = DTYPE_BYTES[cfg.dtype]
    N, E, W = cfg.num_nodes, num_edges, cfg.agg_width
    gemms = 1 if cfg.kind == "gcn" else 2
    per_graph = INDEX_BYTES * 4 * E + b * E  # generator's edge index, the layer's src/dst, norms
    per_graph += gnn_backend(cfg.backend).graph_bytes(N, E, cfg.dtype)
    weights = b * gemms * cfg.in_features * cfg.out_features + graphs * per_graph
    act = b * (N * cfg.in_features + 3 * N * cfg.out_features + 2 * E * W)  # x, h, out, relu; messages, scaled
    return MemoryNeed(float(weights), float(act))


def mlp_need(cfg: MLPConfig) -> MemoryNeed:
    """One ``MLP`` and its forward pass at its batch."""
    b = DTYPE_BYTES[cfg.dtype]
    weights = b * 2 * cfg.d_model * cfg.d_hidden
    act = b * cfg.batch * (2 * cfg.d_model + 2 * cfg.d_hidden)
    return MemoryNeed(float(weights), float(act))


def check_fits_device(need: MemoryNeed, device: torch.device, *, what: str, knobs: Sequence[str]) -> None:
    """A ValueError naming the sizes and the keys that set them when ``need`` exceeds
    ``DEVICE_MEMORY_SHARE`` of the device's memory."""
    memory = device_memory_bytes(device)
    budget = DEVICE_MEMORY_SHARE * memory
    if need.total_bytes > budget:
        raise ValueError(
            f"{what} need at least {need.total_bytes / GB:,.1f} GB (weights {need.weights_bytes / GB:,.1f} GB + "
            f"activations of the largest point {need.activations_bytes / GB:,.1f} GB), more than "
            f"{DEVICE_MEMORY_SHARE:.0%} of this {device.type} device's {memory / GB:,.1f} GB; "
            f"reduce {', '.join(knobs)}"
        )
