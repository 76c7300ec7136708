"""Python API: predict a layer's latency without running it.

>>> from sim.api import load_cost_model, predict_moe_latency
>>> from sim.moe_layer import MoEConfig
>>> model = load_cost_model()                    # this machine's fitted profile
>>> p = predict_moe_latency(MoEConfig(backend="padded"), model, counts=[512] * 2 + [64] * 16)
>>> p.total_s["L3"], p.kernels[["kernel", "L3"]]

``load_cost_model`` only loads: it raises, naming the command to run, when this device
has no fitted profile yet (``python -m costmodel bench`` then ``python -m costmodel
fit``, or any ``python -m sim`` experiment, which calibrates on first use).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd
import torch

from costmodel.allocator import configure_allocator
from costmodel.device import check_dtype, check_threads, fingerprint, resolve_device
from costmodel.kernels import KernelSpec
from costmodel.predictor import LEVELS, CostModel
from costmodel.profile import DeviceProfile
from sim.gnn_layer import GNNConfig, GraphPlan, gnn_trace
from sim.moe_layer import DispatchPlan, MoEConfig, moe_trace
from sim.routing import Routing
from sim.simulator import predict_trace


@dataclass(frozen=True)
class LayerPrediction:
    """Predicted end-to-end seconds per level and the per-kernel breakdown."""

    total_s: dict[str, float]
    kernels: pd.DataFrame
    trace: tuple[KernelSpec, ...]
    flops: float


def load_cost_model(device: str = "auto", dtype: str = "float32", profile_root: str | Path = "profiles",
                    threads: int | None = None, allocator: str = "steady", cold_cache: bool = True) -> CostModel:
    """The fitted cost model of this process's device (refuses another device's).

    Every argument is checked before anything is set: ``dtype`` among the dtypes a
    profile can be measured in, ``threads`` a positive integer or None.
    """
    dev = resolve_device(device)
    check_dtype(dtype, dev)
    check_threads(threads)
    configure_allocator(allocator)
    if threads is not None:
        torch.set_num_threads(threads)
    fp = fingerprint(dev, dtype, cold_cache=cold_cache)
    profile = DeviceProfile.open(profile_root, fp, create=False)
    return CostModel.load(profile, expected=fp)


def _predict(model: CostModel, trace: list[KernelSpec], levels: Sequence[str]) -> LayerPrediction:
    kernels = predict_trace(model, trace, levels)
    return LayerPrediction(
        total_s={lv: float(kernels[lv].sum()) for lv in levels},
        kernels=kernels,
        trace=tuple(trace),
        flops=float(sum(s.flops() for s in trace)),
    )


def predict_moe_latency(
    cfg: MoEConfig,
    model: CostModel,
    *,
    routing: Routing | None = None,
    counts: Sequence[int] | None = None,
    levels: Sequence[str] = LEVELS,
) -> LayerPrediction:
    """Latency of ``cfg``'s MoE layer for a routing, or just its per-expert token counts.

    ``counts`` (one whole number per expert, each in [0, tokens], summing to between 1 and
    tokens x top_k) stands for a routing whose tokens are spread evenly over the combine
    step; see ``sim.moe_layer.check_expert_counts``.
    """
    if (routing is None) == (counts is None):
        raise ValueError("give exactly one of routing= or counts=")
    if routing is not None:
        if (routing.tokens, routing.top_k, routing.num_experts) != (cfg.tokens, cfg.top_k, cfg.num_experts):
            raise ValueError(f"routing is for tokens={routing.tokens}, top_k={routing.top_k}, "
                             f"num_experts={routing.num_experts}; the layer has moe.tokens={cfg.tokens}, "
                             f"moe.top_k={cfg.top_k}, moe.num_experts={cfg.num_experts}")
        plan = DispatchPlan.from_routing(routing)
    else:
        plan = DispatchPlan.from_expert_counts(counts, cfg)  # type: ignore[arg-type]
    return _predict(model, moe_trace(cfg, plan), levels)


def predict_gnn_latency(
    cfg: GNNConfig, model: CostModel, edge_index: torch.Tensor, *, levels: Sequence[str] = LEVELS
) -> LayerPrediction:
    """Latency of ``cfg``'s GNN layer on the graph ``edge_index`` ([2, E] int64)."""
    plan = GraphPlan.from_edge_index(edge_index, cfg.num_nodes, sorted_by_dst=cfg.edge_order == "dst_sorted")
    return _predict(model, gnn_trace(cfg, plan), levels)
