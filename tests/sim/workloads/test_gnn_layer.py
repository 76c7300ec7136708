"""The GNN module's backends agree, its trace matches execution, bad input is refused."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from costmodel.families.scatter import scatter_backends_available
from costmodel.measure.scope import SCOPE_PREFIX
from sim.workloads.gnn_layer import GNN_BACKENDS, GNNConfig, GNNLayer, GraphPlan, gnn_trace
from sim.workloads.graphs import rmat

N = 256
EDGES = rmat(N, 2000, seed=0)
BACKENDS = [b for b in GNN_BACKENDS if b != "torch_scatter" or "torch_scatter" in scatter_backends_available()]


def _run(kind, aggregation, backend, order="original"):
    cfg = GNNConfig(num_nodes=N, in_features=8, out_features=4, kind=kind, aggregation=aggregation, backend=backend,
                    edge_order=order)
    layer = GNNLayer(cfg, seed=0)
    layer.set_graph(EDGES)
    x = torch.randn(N, 8, generator=torch.Generator().manual_seed(0))
    return cfg, layer, x


@pytest.mark.parametrize("kind", ["gcn", "sage"])
@pytest.mark.parametrize("aggregation", ["sum", "mean", "max"])
def test_backends_and_edge_orders_agree(kind, aggregation):
    outs = []
    for backend in BACKENDS:
        for order in ("original", "dst_sorted"):
            try:
                _, layer, x = _run(kind, aggregation, backend, order)
            except ValueError:
                continue  # e.g. index_add cannot take a max
            outs.append(layer(x))
    assert len(outs) >= 2
    for out in outs[1:]:
        assert torch.allclose(out, outs[0], atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_trace_agrees_with_execution(backend, kind):
    cfg, layer, x = _run(kind, "sum", backend, "dst_sorted")
    trace = gnn_trace(cfg, layer.plan)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        layer(x)
    families = [ev.name[len(SCOPE_PREFIX):] for ev in prof.events() if ev.name.startswith(SCOPE_PREFIX)]
    assert families == [s.family for s in trace]
    assert layer.plan.dst_sorted and layer.plan.num_edges == EDGES.shape[1]
    agg = [s for s in trace if s.family in ("scatter", "spmm")][0]
    assert agg.num_dst == N and agg.width == cfg.agg_width


def test_plan_reads_the_graph():
    plan = GraphPlan.from_edge_index(torch.tensor([[0, 1, 2, 3], [0, 0, 0, 1]]), 4, sorted_by_dst=False)
    assert plan.num_edges == 4 and plan.dst_sorted and plan.src_sorted
    assert plan.in_degree_cv == pytest.approx(round(float(torch.tensor([3.0, 1, 0, 0]).std(unbiased=False)), 3))
    # sources 0..3 each read once: CV 0, all read; the sparse matmul carries that
    assert (plan.csr_src_cv, plan.csr_src_read_share) == (0.0, 1.0)
    hub = GraphPlan.from_edge_index(torch.tensor([[0, 0, 0, 1], [0, 1, 2, 3]]), 4, sorted_by_dst=False)
    # source counts [3, 1, 0, 0]: mean 1, std sqrt((4 + 0 + 1 + 1) / 4) = 1.225; half the sources read
    assert (hub.csr_src_cv, hub.csr_src_read_share) == (1.225, 0.5)
    spmm = gnn_trace(GNNConfig(num_nodes=4, in_features=2, out_features=2, backend="sparse_csr"), hub)[1]
    assert (spmm.src_cv, spmm.src_read_share) == (1.225, 0.5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(backend="index_add", aggregation="max"), "index_add' only sums"),
        (dict(backend="sparse_csr", aggregation="max"), "'sparse_csr' aggregates by matmul"),
        (dict(backend="dgl"), "gnn.backend must be one of"),
        (dict(aggregation="median"), "gnn.aggregation must be one of"),
        (dict(num_nodes=0), "gnn.num_nodes must be a positive integer"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GNNConfig(**kwargs)


def test_bad_graph_is_refused_before_running():
    layer = GNNLayer(GNNConfig(num_nodes=4, in_features=2, out_features=2), seed=0)
    with pytest.raises(ValueError, match=r"values must be in \[0, num_nodes=4\)"):
        layer.set_graph(torch.tensor([[0, 9], [1, 2]]))
    with pytest.raises(RuntimeError, match="set_graph"):
        layer(torch.randn(4, 2))


def test_gnn_suite_calibrates_sparse_matmuls_on_the_shares_real_graphs_read():
    from costmodel.families.indices import min_cv_for_share
    from sim.predict.calibration import gnn_suite

    cfg = GNNConfig(num_nodes=500, in_features=8, out_features=8, backend="sparse_csr")
    plain = {s.key() for _, s in gnn_suite([cfg], num_edges=4000, cv_range=(0.5, 3.0), points=4)}
    tagged = gnn_suite([cfg], num_edges=4000, cv_range=(0.5, 3.0), points=4, src_read_shares=[0.4])
    extra = [s for _, s in tagged if s.key() not in plain]
    assert extra and all(s.family == "spmm" and s.src_read_share == pytest.approx(0.4, abs=0.03) for s in extra)
    # a share of 0.4 needs CV >= sqrt(1/0.4 - 1) = 1.22: only the grid's larger CVs get one
    assert all(s.src_cv >= min_cv_for_share(0.4) - 0.05 for s in extra)
    index_add = GNNConfig(num_nodes=500, in_features=8, out_features=8, backend="index_add")
    assert not [s for _, s in gnn_suite([index_add], num_edges=4000, cv_range=(0.5, 3.0), src_read_shares=[0.4])
                if s.family == "spmm"]
