"""The MoE module computes the right thing with every backend, and its trace matches it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from costmodel.measure.scope import SCOPE_PREFIX
from sim.workloads.moe_layer import MOE_BACKENDS, DispatchPlan, MoEConfig, MoELayer, moe_trace
from sim.workloads.routing import ZipfRouting, route


def _reference(layer: MoELayer, x: torch.Tensor, routing) -> torch.Tensor:
    out = torch.zeros_like(x)
    experts, tokens, gates = routing.flat_assignments()
    for e, t, g in zip(experts, tokens, gates):
        w = [p[e] for p in layer.projections]
        xt = x[t]
        h = F.silu(xt @ w[0]) * (xt @ w[1]) if layer.cfg.expert == "swiglu" else F.gelu(xt @ w[0], approximate="tanh")
        out[t] += g * (h @ w[-1])
    return out


@pytest.mark.parametrize("backend", MOE_BACKENDS)
@pytest.mark.parametrize("expert", ["swiglu", "mlp"])
def test_backends_compute_the_moe_function(backend, expert):
    cfg = MoEConfig(tokens=48, d_model=16, d_ff=32, num_experts=6, top_k=2, expert=expert, backend=backend)
    layer = MoELayer(cfg, seed=0)
    x = torch.randn(48, 16, generator=torch.Generator().manual_seed(1))
    routing = route(ZipfRouting(1.5), tokens=48, num_experts=6, top_k=2, seed=2, capacity_factor=1.0)
    assert torch.allclose(layer(x, routing), _reference(layer, x, routing), atol=1e-5)


MATMULS = ("aten::matmul", "aten::mm", "aten::bmm", "aten::_grouped_mm")


def _executed(layer, x, routing):
    """(family, input shapes of the scope's first matmul op) for every kernel scope, in order."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        layer(x, routing)
    out = []
    for ev in prof.events():
        if ev.name.startswith(SCOPE_PREFIX):
            mats = [c for c in ev.cpu_children if c.name in MATMULS]
            out.append((ev.name[len(SCOPE_PREFIX):], [list(s) for s in mats[0].input_shapes[:2]] if mats else None))
    return out


@pytest.mark.parametrize(
    "cfg",
    [
        MoEConfig(tokens=64, d_model=16, d_ff=32, num_experts=8, top_k=2, backend="loop"),
        MoEConfig(tokens=64, d_model=16, d_ff=32, num_experts=8, top_k=1, expert="mlp", backend="padded"),
        MoEConfig(tokens=32, d_model=32, d_ff=16, num_experts=4, top_k=3, backend="grouped"),
    ],
)
def test_trace_agrees_with_execution(cfg):
    layer = MoELayer(cfg, seed=0)
    x = torch.randn(cfg.tokens, cfg.d_model)
    routing = route(ZipfRouting(2.0), tokens=cfg.tokens, num_experts=cfg.num_experts, top_k=cfg.top_k, seed=0)
    trace = moe_trace(cfg, DispatchPlan.from_routing(routing))
    executed = _executed(layer, x, routing)
    assert [f for f, _ in executed] == [s.family for s in trace]
    for spec, (_, shapes) in zip(trace, executed):  # the same GEMM shapes, kernel by kernel
        if spec.family == "gemm":
            assert shapes == [[spec.m, spec.k], [spec.k, spec.n]]
        elif spec.family == "grouped_gemm" and spec.impl == "padded_bmm":
            assert shapes == [[spec.num_experts, spec.max_tokens, spec.k], [spec.num_experts, spec.k, spec.n]]
        elif spec.family == "grouped_gemm":
            assert shapes == [[spec.total_tokens, spec.k], [spec.num_experts, spec.k, spec.n]]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(top_k=9, num_experts=8), r"moe.top_k must be in \[1, moe.num_experts=8\], got 9"),
        (dict(d_model=-4), "moe.d_model must be a positive integer"),
        (dict(backend="megablocks"), "moe.backend must be one of"),
        (dict(expert="glu3"), "moe.expert must be one of"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MoEConfig(**kwargs)
