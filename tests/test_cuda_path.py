"""The CUDA path: event timing, kernel runners, MoE and GNN layers on a GPU agree with the CPU.

Marked ``gpu`` (deselected by default, skipped without CUDA); ``scripts/gpu_check.sh`` runs
them first on a lent GPU: ``python -m pytest -m gpu``.
"""

from __future__ import annotations

import pytest
import torch

from costmodel.families.gemm import GemmSpec
from costmodel.families.grouped_gemm import GroupedGemmSpec
from costmodel.families.scatter import ScatterSpec
from costmodel.measure.runners import make_runner
from costmodel.measure.timing import TimingConfig, measure
from sim.workloads.gnn_layer import GNN_BACKENDS, GNNConfig, GNNLayer
from sim.workloads.graphs import rmat
from sim.workloads.moe_layer import MOE_BACKENDS, MoEConfig, MoELayer, backend_unavailable_reason
from sim.workloads.routing import ZipfRouting, route

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize(
    "spec",
    [GemmSpec(512, 512, 512, "bfloat16"), GroupedGemmSpec((64, 0, 3, 200), 128, 256, dtype="bfloat16"),
     ScatterSpec(4096, 64, 512, "sum", "index_add", 1.0, False, "float32")],
)
def test_cuda_event_timing_measures_real_kernels(spec):
    m = measure(make_runner(spec, "cuda"), device="cuda", config=TimingConfig(min_run_time_s=0.02, min_runs=5))
    assert m.device.startswith("cuda") and len(m.times_s) >= 5
    assert 0 < m.median_s < 0.1


@pytest.mark.parametrize("backend", MOE_BACKENDS)
def test_moe_layer_on_cuda_matches_cpu(backend):
    cfg = MoEConfig(tokens=128, d_model=32, d_ff=64, num_experts=8, top_k=2, backend=backend)
    if backend_unavailable_reason(cfg, torch.device("cuda")):
        pytest.skip(backend_unavailable_reason(cfg, torch.device("cuda")))
    routing = route(ZipfRouting(1.0), tokens=128, num_experts=8, top_k=2, seed=0)
    x = torch.randn(128, 32, generator=torch.Generator().manual_seed(0))
    cpu = MoELayer(cfg, seed=0)(x, routing)
    gpu = MoELayer(cfg, device="cuda", seed=0)(x.cuda(), routing)
    assert torch.allclose(gpu.cpu(), cpu, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("backend", GNN_BACKENDS)
def test_gnn_layer_on_cuda_matches_cpu(backend):
    cfg = GNNConfig(num_nodes=512, in_features=16, out_features=8, backend=backend)
    edges = rmat(512, 4096, seed=0)
    x = torch.randn(512, 16, generator=torch.Generator().manual_seed(0))
    try:
        cpu_layer, gpu_layer = GNNLayer(cfg, seed=0), GNNLayer(cfg, device="cuda", seed=0)
    except (ValueError, RuntimeError) as err:  # torch-scatter not installed
        pytest.skip(str(err))
    cpu_layer.set_graph(edges)
    gpu_layer.set_graph(edges.cuda())
    assert torch.allclose(gpu_layer(x.cuda()).cpu(), cpu_layer(x), atol=1e-3, rtol=1e-3)
