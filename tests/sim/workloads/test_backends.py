"""The backend registries: lookup by config name, clear refusals, one place to add a backend,
and the calibration kernels each backend declares."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from costmodel.families.gemm import GemmSpec
from sim.workloads.backends import GNN_BACKENDS, MOE_BACKENDS, BackendRegistry, gnn_backend, moe_backend
from sim.workloads.backends.gnn import ScatterAggregation
from sim.workloads.backends.moe import LoopExperts
from sim.predict.calibration import moe_suite
from sim.workloads.gnn_layer import GNNConfig, GraphPlan, backend_unavailable_reason
from sim.workloads.memory import moe_need
from sim.workloads.moe_layer import DispatchPlan, MoEConfig, MoELayer, moe_trace
from sim.workloads.routing import ZipfRouting, route

ROOT = Path(__file__).resolve().parents[3]


def test_registries_list_the_backends_in_registration_order():
    assert list(MOE_BACKENDS) == ["loop", "padded", "grouped"]
    assert list(GNN_BACKENDS) == ["index_add", "scatter_reduce", "torch_scatter", "sparse_csr"]
    assert "padded" in MOE_BACKENDS and "megablocks" not in MOE_BACKENDS and len(GNN_BACKENDS) == 4
    assert all(moe_backend(name).name == name for name in MOE_BACKENDS)
    assert all(gnn_backend(name).name == name for name in GNN_BACKENDS)


@pytest.mark.parametrize("make, message", [
    (lambda: MoEConfig(backend="megablocks"),
     r"^moe\.backend must be one of \['loop', 'padded', 'grouped'\] \(the backends registered in "
     r"sim/workloads/backends/moe\.py\), got 'megablocks'$"),
    (lambda: GNNConfig(backend="dgl"),
     r"^gnn\.backend must be one of \['index_add', 'scatter_reduce', 'torch_scatter', 'sparse_csr'\] "
     r"\(the backends registered in sim/workloads/backends/gnn\.py\), got 'dgl'$"),
    (lambda: moe_backend(None), r"moe\.backend must be one of .*, got None"),
    (lambda: GNNConfig(backend="index_add", aggregation="mean"),
     r"^gnn\.backend='index_add' only sums: gnn\.aggregation must be one of \['sum'\], got 'mean'$"),
    (lambda: GNNConfig(backend="sparse_csr", aggregation="max"),
     r"^gnn\.backend='sparse_csr' aggregates by matmul: gnn\.aggregation must be one of \['sum', 'mean'\], got 'max'$"),
])
def test_an_unknown_backend_or_aggregation_names_the_field_and_the_choices(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_registry_refuses_a_second_backend_of_a_name_and_a_nameless_one():
    registry: BackendRegistry = BackendRegistry(field="moe.backend", where="here")
    registry.register(LoopExperts())
    with pytest.raises(ValueError, match=r"moe\.backend backend 'loop' is already registered \(LoopExperts\)"):
        registry.register(LoopExperts())
    with pytest.raises(ValueError, match="needs a non-empty string name, got ''"):
        registry.register(ScatterAggregation("", ("sum",)))


class _LoopCopy(LoopExperts):
    """A 'new' backend: the loop under another name, registered from a test."""

    name = "loop_copy"


@pytest.fixture
def with_loop_copy(monkeypatch):
    monkeypatch.setattr(MOE_BACKENDS, "_backends", dict(MOE_BACKENDS._backends))  # undone after the test
    MOE_BACKENDS.register(_LoopCopy())


def test_a_registered_backend_is_found_everywhere_by_its_name(with_loop_copy):
    # one registration: config validation, the module, the trace and the memory check all take it
    cfg = MoEConfig(tokens=32, d_model=8, d_ff=16, num_experts=4, top_k=2, backend="loop_copy")
    loop = MoEConfig(tokens=32, d_model=8, d_ff=16, num_experts=4, top_k=2, backend="loop")
    routing = route(ZipfRouting(1.0), tokens=32, num_experts=4, top_k=2, seed=0)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(MoELayer(cfg, seed=0)(x, routing), MoELayer(loop, seed=0)(x, routing))
    plan = DispatchPlan.from_routing(routing)
    assert moe_trace(cfg, plan) == moe_trace(loop, plan)
    assert moe_need(cfg) == moe_need(loop)
    assert "loop_copy" in list(MOE_BACKENDS)


def test_the_moe_backends_differ_where_they_should():
    cfg = MoEConfig(tokens=32, d_model=8, d_ff=16, num_experts=4, top_k=2)
    plan = DispatchPlan.from_expert_counts((30, 0, 20, 14), cfg)
    families = {name: [s.family for s in moe_backend(name).expert_trace(cfg, plan)] for name in MOE_BACKENDS}
    assert families["loop"] == ["gemm", "gemm", "elementwise", "elementwise", "gemm"] * 3  # 3 non-empty experts
    assert families["padded"][0] == "scatter" and families["padded"][-1] == "gather"
    assert families["grouped"] == ["grouped_gemm", "grouped_gemm", "elementwise", "elementwise", "grouped_gemm"]
    # hidden rows at the busiest expert of 30: one expert's, every expert padded to it, all assignments
    assert [moe_backend(n).hidden_rows(cfg, 30) for n in MOE_BACKENDS] == [30, 4 * 30, 64]
    assert [moe_backend(n).buffer_elements(cfg, 30) for n in MOE_BACKENDS] == [0, 2 * 4 * 30 * 8, 0]


@pytest.mark.parametrize("expert", ["swiglu", "mlp"])
def test_moe_calibration_kernels_are_what_the_suite_adds_per_backend(expert):
    """The suite (sim.predict.calibration.moe_suite) = the router/dispatch/combine kernels every backend
    shares + the backend's own calibration kernels: the rest is the same for all backends."""
    shared = []
    for name in MOE_BACKENDS:
        cfg = MoEConfig(tokens=48, d_model=8, d_ff=12, num_experts=4, top_k=2, expert=expert, backend=name)
        suite = {s.key() for _, s in moe_suite([cfg])}
        own = {s.key() for s in moe_backend(name).calibration_kernels(cfg, np.random.default_rng(12345))}
        assert own and own <= suite, name
        shared.append(suite - own)
    assert shared[0] == shared[1] == shared[2]
    loop_cfg = MoEConfig(tokens=48, d_model=8, d_ff=12, num_experts=4, top_k=2, expert=expert, backend="loop")
    grid = {s.m for s in moe_backend("loop").calibration_kernels(loop_cfg, np.random.default_rng(0))
            if isinstance(s, GemmSpec)}
    assert min(grid) == 1 and max(grid) == 48  # one expert's rows from a single token to all of them


def test_gnn_calibration_kernels_read_shares_only_where_the_backend_needs_them():
    plan = GraphPlan(num_nodes=500, num_edges=4000, in_degree_cv=2.0, out_degree_cv=2.0, src_sorted=False,
                     dst_sorted=False)
    for name in GNN_BACKENDS:
        cfg = GNNConfig(num_nodes=500, in_features=8, out_features=8, backend=name)
        extra = gnn_backend(name).calibration_kernels(cfg, plan, [0.4, 0.7])
        assert bool(extra) == gnn_backend(name).needs_source_read_shares == (name == "sparse_csr")
        assert all(s.family == "spmm" for s in extra)
        assert sorted({round(s.src_read_share, 1) for s in extra}) == ([0.4, 0.7] if extra else [])


def test_gnn_backend_memory_and_availability():
    assert gnn_backend("index_add").graph_bytes(100, 1000, "float32") == 0
    # CSR: (column index + value) per edge, a row pointer per node + 1
    assert gnn_backend("sparse_csr").graph_bytes(100, 1000, "float32") == (8 + 4) * 1000 + 8 * 101
    assert backend_unavailable_reason(GNNConfig(backend="scatter_reduce")) is None
    missing = ScatterAggregation("index_put_somewhere", ("sum",))
    assert "'index_put_somewhere' is not available here" in missing.unavailable_reason()


def test_no_backend_string_chains_are_left_in_the_layer_modules():
    """A backend's behaviour lives in its class: the layers and their consumers only look it up."""
    chain = re.compile(r"backend\s*(==|!=)\s*[\"']|backend\s+(not\s+)?in\s*[(\[{]\s*[\"']")
    for path in ("sim/workloads/moe_layer.py", "sim/workloads/gnn_layer.py", "sim/workloads/memory.py", "sim/place/placement_workloads.py",
                 "experiments/gnn_degree.py"):
        found = [line.strip() for line in (ROOT / path).read_text().splitlines() if chain.search(line)]
        assert not found, f"{path}: {found}"
