"""Reference workloads: the same layers predicted on every device of a fleet.

The defaults of the main experiments, so a fleet report speaks of layers the README
measures: the ``moe_skew`` default MoE layer (T 32, D 1024, F 2048, E 16, top-2, SwiGLU,
per-expert loop as in HF eager) under Zipf routing at three concentrations (exponent 0:
uniform, 1, 8: nearly all traffic on two experts), the ``gnn_degree`` default GCN layer
(N 65,536, E 524,288, width 64, index_add, R-MAT a = 0.57, Graph500's default) and a
dense MLP ([256, 1024] -> 4096 -> 1024, ``mlp_batch``'s sizes at B = 256). Routings and
graphs are seeded, so every device predicts exactly the same traces.
"""

from __future__ import annotations

from costmodel.families.descriptor import KernelSpec
from sim.workloads.gnn_layer import GNNConfig, GraphPlan, gnn_trace
from sim.workloads.graphs import rmat
from sim.workloads.mlp_layer import MLPConfig, mlp_trace
from sim.workloads.moe_layer import DispatchPlan, MoEConfig, moe_trace
from sim.workloads.routing import ZipfRouting, route

MOE_ZIPF_EXPONENTS = (0.0, 1.0, 8.0)


def reference_workloads(dtype: str = "float32", *, seed: int = 0) -> dict[str, list[KernelSpec]]:
    """{name: kernel trace} of every reference workload, in ``dtype``."""
    out: dict[str, list[KernelSpec]] = {}
    moe = MoEConfig(tokens=32, d_model=1024, d_ff=2048, num_experts=16, top_k=2, backend="loop", dtype=dtype)
    for s in MOE_ZIPF_EXPONENTS:
        routing = route(ZipfRouting(s), tokens=moe.tokens, num_experts=moe.num_experts, top_k=moe.top_k, seed=seed)
        out[f"moe_skew zipf {s:g}"] = moe_trace(moe, DispatchPlan.from_routing(routing))
    gnn = GNNConfig(num_nodes=65536, in_features=64, out_features=64, backend="index_add", dtype=dtype)
    edges = rmat(gnn.num_nodes, 524288, a=0.57, b=None, c=None, d=None, seed=seed)
    out["gnn_degree rmat 0.57"] = gnn_trace(gnn, GraphPlan.from_edge_index(edges, gnn.num_nodes, sorted_by_dst=False))
    out["dense MLP B256"] = mlp_trace(MLPConfig(256, 1024, 4096, dtype))
    return out
