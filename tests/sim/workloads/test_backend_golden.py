"""Every layer backend yields the same kernels, memory estimates and calibration suites as
before the backends became registered objects (frozen in golden/backends.json).

The golden file was written by ``python tests/sim/workloads/test_backend_golden.py --freeze`` on the
code with the ``backend == ...`` chains (the commit before the backends became classes): a change here is a
change of behaviour, never a refactoring. Regenerate it only for an intended change, and
say so in the commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sim.predict.calibration import gnn_suite, moe_suite
from sim.workloads.gnn_layer import GNNConfig, GraphPlan, gnn_trace
from sim.workloads.graphs import rmat
from sim.workloads.memory import gnn_need, moe_need
from sim.workloads.moe_layer import DispatchPlan, MoEConfig, moe_trace
from sim.place.placement_workloads import gnn_workload, moe_workload
from sim.workloads.routing import ZipfRouting, route

GOLDEN = Path(__file__).with_name("golden") / "backends.json"
MOE_BACKEND_NAMES = ("loop", "padded", "grouped")
GNN_BACKEND_NAMES = ("index_add", "scatter_reduce", "torch_scatter", "sparse_csr")
GNN_GRAPH = rmat(64, 300, seed=0)  # R-MAT: skewed degrees and duplicate edges (csr_nnz < num_edges)


def _keys(trace) -> list[str]:
    return [s.key() for s in trace]


def _moe_observed() -> dict[str, object]:
    out: dict[str, object] = {}
    routing = route(ZipfRouting(1.0), tokens=24, num_experts=4, top_k=2, seed=3)
    for backend in MOE_BACKEND_NAMES:
        for expert in ("swiglu", "mlp"):
            cfg = MoEConfig(tokens=24, d_model=8, d_ff=12, num_experts=4, top_k=2, expert=expert, backend=backend)
            name = f"moe/{backend}/{expert}"
            out[f"{name}/trace_counts"] = _keys(moe_trace(cfg, DispatchPlan.from_expert_counts((20, 0, 9, 11), cfg)))
            out[f"{name}/trace_routing"] = _keys(moe_trace(cfg, DispatchPlan.from_routing(routing)))
            for label, need in (("all", moe_need(cfg)), ("busiest5", moe_need(cfg, max_rows_per_expert=5))):
                out[f"{name}/memory_{label}"] = [need.weights_bytes, need.activations_bytes]
            out[f"{name}/suite"] = sorted(s.key() for _, s in moe_suite([cfg]))
        workload = moe_workload("w", tokens=24, d_model=8, d_ff=12, num_experts=4, top_k=2, zipf_exponent=1.0,
                                backend=backend, seed=3)
        out[f"moe/{backend}/placement"] = [workload.memory_bytes, _keys(workload.trace)]
    return out


def _gnn_configs(backend: str):
    for kind in ("gcn", "sage"):
        for aggregation in ("sum", "mean", "max"):
            for order in ("original", "dst_sorted"):
                try:
                    yield GNNConfig(num_nodes=64, in_features=8, out_features=4, kind=kind, aggregation=aggregation,
                                    backend=backend, edge_order=order)
                except ValueError:
                    continue  # e.g. index_add cannot take a max


def _gnn_observed() -> dict[str, object]:
    out: dict[str, object] = {}
    for backend in GNN_BACKEND_NAMES:
        for cfg in _gnn_configs(backend):
            name = f"gnn/{backend}/{cfg.kind}/{cfg.aggregation}/{cfg.edge_order}"
            plan = GraphPlan.from_edge_index(GNN_GRAPH, 64, sorted_by_dst=cfg.edge_order == "dst_sorted")
            out[f"{name}/trace"] = _keys(gnn_trace(cfg, plan))
            need = gnn_need(cfg, num_edges=300, graphs=2)
            out[f"{name}/memory"] = [need.weights_bytes, need.activations_bytes]
            suite = gnn_suite([cfg], num_edges=300, cv_range=(0.5, 1.5), points=3, src_read_shares=(0.3, 0.6))
            out[f"{name}/suite"] = sorted(s.key() for _, s in suite)
        for kind in ("gcn", "sage"):
            workload = gnn_workload("w", num_nodes=64, num_edges=300, width=8, rmat_a=0.6, backend=backend, kind=kind)
            out[f"gnn/{backend}/{kind}/placement"] = [workload.memory_bytes, _keys(workload.trace)]
    return out


def observed() -> dict[str, object]:
    return {**_moe_observed(), **_gnn_observed()}


def test_every_backend_keeps_its_frozen_traces_memory_and_suites():
    golden = json.loads(GOLDEN.read_text())
    now = observed()
    assert sorted(now) == sorted(golden)
    changed = [key for key in golden if now[key] != golden[key]]
    assert not changed, f"{len(changed)} of {len(golden)} entries changed, e.g. {changed[:5]}"


@pytest.mark.parametrize("family, names", [("moe", MOE_BACKEND_NAMES), ("gnn", GNN_BACKEND_NAMES)])
def test_the_golden_file_covers_every_backend(family, names):
    golden = json.loads(GOLDEN.read_text())
    assert {key.split("/")[1] for key in golden if key.startswith(family + "/")} == set(names)


if __name__ == "__main__" and sys.argv[1:] == ["--freeze"]:
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(observed(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
