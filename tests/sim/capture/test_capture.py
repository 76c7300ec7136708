"""Capture of real modules: the project's own layers give their hand-written traces kernel by
kernel; prediction of captured traces, coverage, the fallback and the errors on bad input."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gather import GatherSpec
from costmodel.families.gemm import GemmSpec
from costmodel.families.scatter import ScatterSpec
from costmodel.families.softmax import SoftmaxSpec
from costmodel.families.spmm import SpmmSpec
from costmodel.measure.device import fingerprint
from costmodel.model.predictor import CostModel
from costmodel.store.profile import DeviceProfile
from sim.api import measure_module_latency, predict_captured, predict_module_latency
from sim.capture.dispatch import CaptureError, capture_trace
from sim.workloads.gnn_layer import GNNConfig, GNNLayer, gnn_trace
from sim.workloads.moe_layer import MOE_BACKENDS, DispatchPlan, MoEConfig, MoELayer, moe_trace
from sim.workloads.routing import ZipfRouting, route

CEIL = {"peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 2e-6, "ridge_flops_per_byte": 10.0}


@pytest.mark.parametrize("backend", MOE_BACKENDS)
@pytest.mark.parametrize("expert", ["swiglu", "mlp"])
def test_captured_moe_layer_equals_its_hand_written_trace(backend, expert):
    cfg = MoEConfig(tokens=40, d_model=16, d_ff=32, num_experts=6, top_k=2, expert=expert, backend=backend)
    layer = MoELayer(cfg, seed=0)
    x = torch.randn(40, 16, generator=torch.Generator().manual_seed(1))
    routing = route(ZipfRouting(1.2), tokens=40, num_experts=6, top_k=2, seed=3, capacity_factor=1.0)
    layer(x, routing)  # first call builds the layer's cached routing tensors (host-side set-up)
    captured = capture_trace(layer, x, routing)
    assert captured.kernels() == moe_trace(cfg, DispatchPlan.from_routing(routing))
    assert captured.counts()["unmapped"] == 0


@pytest.mark.parametrize("backend", ["index_add", "scatter_reduce", "sparse_csr"])
@pytest.mark.parametrize("kind,aggregation", [("gcn", "sum"), ("sage", "sum"), ("gcn", "mean"), ("sage", "max")])
@pytest.mark.parametrize("edge_order", ["original", "dst_sorted"])
def test_captured_gnn_layer_equals_its_hand_written_trace(backend, kind, aggregation, edge_order):
    if (backend == "index_add" and aggregation != "sum") or (backend == "sparse_csr" and aggregation == "max"):
        pytest.skip("combination the layer refuses")
    cfg = GNNConfig(num_nodes=60, in_features=8, out_features=16, kind=kind, aggregation=aggregation,
                    backend=backend, edge_order=edge_order)
    layer = GNNLayer(cfg, seed=0)
    edges = torch.randint(0, 60, (2, 400), generator=torch.Generator().manual_seed(2))  # has duplicate edges
    plan = layer.set_graph(edges)
    captured = capture_trace(layer, torch.randn(60, 8))
    assert captured.kernels() == gnn_trace(cfg, plan)


def test_csr_trace_counts_merged_duplicate_edges():
    edges = torch.tensor([[0, 0, 1, 2], [1, 1, 2, 0]])  # edge 0 -> 1 twice: the CSR holds 3 non-zeros
    cfg = GNNConfig(num_nodes=3, in_features=4, out_features=4, backend="sparse_csr")
    layer = GNNLayer(cfg)
    plan = layer.set_graph(edges)
    spmm = [s for s in gnn_trace(cfg, plan) if isinstance(s, SpmmSpec)][0]
    assert spmm.nnz == 3 and plan.num_edges == 4
    assert capture_trace(layer, torch.randn(3, 4)).kernels() == gnn_trace(cfg, plan)


# ----------------------------------------------------------------------------- prediction


def _model(tmp_path, dtype="float32", device_kind=None) -> CostModel:
    """A cost model fitted on synthetic rows of the families the tests' modules run."""
    fp = fingerprint(torch.device("cpu"), dtype)
    if device_kind:
        fp = replace(fp, device_kind=device_kind)
    profile = DeviceProfile.open(tmp_path, fp)
    specs = []
    for m in (1, 4, 16, 64, 256):
        specs += [GemmSpec(m, 32, 32, dtype), ElementwiseSpec("relu", m * 64, dtype), ElementwiseSpec("fill", m * 64, dtype),
                  ElementwiseSpec("mul", m * 64, dtype), ElementwiseSpec("scale", m * 64, dtype),
                  ElementwiseSpec("add", m * 64, dtype), SoftmaxSpec(m, 16, dtype),
                  GatherSpec(m * 8, 16, 64, 0.5, False, dtype), ScatterSpec(m * 8, 16, 64, "sum", "index_add", 0.5, False, dtype)]
    rows = [{"key": s.key(), "round": 0, **s.to_record(), "flops": s.flops(), "bytes_moved": s.bytes_moved(),
             "median_s": 1e-6 + s.bytes_moved() / 5e9 + s.flops() / 5e10, "iqr_s": 1e-8, "noisy": False} for s in specs]
    profile.append_measurements(rows)
    profile.write_ceilings(CEIL)
    return CostModel.fit_profile(profile, cv_folds=3)


def test_predict_module_with_an_unmapped_op_lists_it_and_uses_the_fallback(tmp_path):
    model = _model(tmp_path)
    net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU())

    def fn(x):
        y = net(x)
        return torch.fft.rfft(y, dim=-1)  # no registry entry: listed, predicted by the roofline fallback

    pred = predict_module_latency(fn, (torch.randn(16, 32),), model)
    unmapped = pred.unmapped
    assert list(unmapped["aten_op"]) == ["aten._fft_r2c.default"] and unmapped["count"].iloc[0] == 1
    assert "16x32" in unmapped["shapes"].iloc[0]
    row = pred.kernels[~pred.kernels["modelled"]].iloc[0]
    expected_s = unmapped["bytes_moved"].iloc[0] / CEIL["bandwidth_bytes_per_s"] + CEIL["overhead_s"]
    expected_s += model.ceilings.get("cold_call_overhead_s", 0.0) if model.fingerprint.cache == "cold" else 0.0
    assert row["L3"] == pytest.approx(expected_s)
    modelled = pred.kernels.loc[pred.kernels["modelled"], "L3"].sum()
    assert pred.coverage["L3"] == pytest.approx(modelled / pred.total_s["L3"])
    assert 0 < pred.coverage["L3"] < 1
    assert [k.family for k in pred.trace] == ["gemm", "elementwise"]


def test_views_are_charged_the_profiles_host_costs_in_execution_order(tmp_path):
    model = _model(tmp_path)
    net = torch.nn.Linear(32, 32)  # addmm on a transposed weight: a view (t) before the kernel
    plain = predict_module_latency(net, (torch.randn(16, 32),), model)
    assert "view" not in set(plain.kernels["family"])  # a profile without host costs charges no view
    host = {"interleave_overhead_s": 3e-6, "view_op_s": 1e-6, "view_cold_overhead_s": 1e-5}
    model.ceilings.update(host)
    pred = predict_captured(plain.captured, model)
    views = [op for op in plain.captured.ops if op.kind == "view"]
    assert views and list(pred.kernels["aten_op"]) == [op.aten_op for op in plain.captured.ops
                                                       if op.kind in ("kernel", "unmapped", "view")]
    cold = model.fingerprint.cache == "cold"
    names = [op.aten_op for op in views]
    want_views = sum(1e-6 + (1e-5 if cold and names.index(n) == i else 0.0) for i, n in enumerate(names))
    kernels = len(pred.trace)
    assert pred.total_s["L3"] - plain.total_s["L3"] == pytest.approx(want_views + kernels * 3e-6)
    assert pred.total_s["L0"] == pytest.approx(plain.total_s["L0"])  # FLOPs-only levels pay no host cost


def test_backward_capture_tags_phases_and_predicts_both(tmp_path):
    model = _model(tmp_path)
    net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    pred = predict_module_latency(net, (torch.randn(16, 32),), model, backward=True)
    assert set(pred.phase_s) == {"forward", "backward"}
    back_gemms = [op.spec for op in pred.captured.ops if op.phase == "backward" and isinstance(op.spec, GemmSpec)]
    # grad of the last layer's input and weight, grad of the first layer's weight (x needs no grad)
    assert sorted((g.m, g.k, g.n) for g in back_gemms) == sorted([(16, 32, 32), (32, 16, 32), (32, 16, 32)])
    assert pred.total_s["L3"] == pytest.approx(pred.phase_s["forward"]["L3"] + pred.phase_s["backward"]["L3"])


# ----------------------------------------------------------------------------- bad input


def test_a_callable_that_raises_is_named():
    def broken(x):
        return x @ torch.ones(3, 3)

    with pytest.raises(CaptureError, match="raised RuntimeError.*fix that error"):
        capture_trace(broken, torch.ones(2, 4))


def test_zero_kernels_is_a_clear_error():
    with pytest.raises(CaptureError, match="no op that launches a kernel"):
        capture_trace(lambda x: x.view(-1).t(), torch.ones(2, 4))


def test_a_dtype_the_profile_lacks_is_refused_before_capture(tmp_path):
    model = _model(tmp_path)
    calls = []
    net = torch.nn.Linear(32, 32).to(torch.bfloat16)
    net.register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(ValueError, match=r"bfloat16.*measured for float32.*dtype=bfloat16"):
        predict_module_latency(net, (torch.randn(4, 32, dtype=torch.bfloat16),), model)
    assert not calls  # refused before running anything


def test_a_profile_without_fitted_models_is_refused(tmp_path):
    profile = DeviceProfile.open(tmp_path, fingerprint(torch.device("cpu"), "float32"))
    with pytest.raises(TypeError, match="costmodel fit"):
        predict_module_latency(torch.nn.Linear(4, 4), (torch.randn(2, 4),), profile)


def test_measuring_a_module_on_another_device_than_the_profile_is_refused(tmp_path, tiny_timing):
    model = _model(tmp_path, device_kind="cuda")
    with pytest.raises(ValueError, match="runs on cpu but the profile is for cuda"):
        measure_module_latency(torch.nn.Linear(4, 4), (torch.randn(2, 4),), model, timing=tiny_timing)


def test_a_trace_captured_here_predicts_against_another_devices_profile(tmp_path):
    from sim.api import load_stored_cost_model

    model = _model(tmp_path, device_kind="cuda")  # prediction alone works across devices
    profile = DeviceProfile.open(tmp_path, model.fingerprint, create=False)
    model.save(profile)
    stored = load_stored_cost_model(profile.path)
    assert stored.fingerprint.device_kind == "cuda"
    trace = capture_trace(torch.nn.Linear(32, 32), torch.randn(16, 32))
    pred = predict_captured(trace, stored)
    assert pred.total_s["L3"] == pytest.approx(predict_captured(trace, model).total_s["L3"])
    assert pred.total_s["L3"] > 0


def test_families_the_model_lacks_are_named(tmp_path):
    model = _model(tmp_path)
    captured = capture_trace(lambda x: torch.sort(x), torch.randn(64))
    with pytest.raises(ValueError, match=r"families \['sort'\].*not fitted"):
        predict_captured(captured, model)


def test_measure_module_latency_times_forward_and_step(tmp_path, tiny_timing):
    model = _model(tmp_path)
    net = torch.nn.Linear(32, 32)
    m = measure_module_latency(net, (torch.randn(8, 32),), model, backward=True, timing=tiny_timing)
    assert m.forward.median_s > 0 and m.step is not None and m.backward_s is not None
    assert np.isfinite(m.backward_s)


def test_measured_coverage_counts_only_op_names_the_capture_saw():
    import pandas as pd

    from sim.predict.simulator import measured_coverage

    times = pd.DataFrame({"aten_op": ["aten::mm", "aten::_fft_r2c", "aten::linear"], "measured_s": [3.0, 1.0, 5.0]})
    share, rows = measured_coverage(times, {"aten::mm": {"kernel", "view"}, "aten::_fft_r2c": {"unmapped"}})
    assert share == pytest.approx(0.75)  # aten::linear (a composite wrapper the capture never saw) is left out
    assert list(rows["kinds"]) == ["kernel,view", "unmapped", ""]


def test_captured_suite_holds_each_distinct_kernel_once():
    from sim.predict.calibration import captured_suite

    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU())
    a = capture_trace(net, torch.randn(4, 8))
    b = capture_trace(net, torch.randn(16, 8))
    suite = [s for _, s in captured_suite([a, b])]
    # nn.Linear multiplies by its weight transposed: layout "nt"
    assert suite == [GemmSpec(4, 8, 8, layout="nt"), ElementwiseSpec("relu", 32), GemmSpec(16, 8, 8, layout="nt"),
                     ElementwiseSpec("relu", 128)]
