"""Capture of unusual inputs: sparse COO operands are counted from their non-zeros, not their
dense shape; kwargs that are not a mapping are refused up front; an unused float64 buffer does
not decide the module's dtype; integer matmuls are said plainly not to be modelled."""

from __future__ import annotations

import warnings

import pytest
import torch

from costmodel.families.spmm import SpmmSpec
from sim.api import capture_module, measure_module_latency, predict_module_latency
from sim.capture.dispatch import capture_trace
from tests.sim.capture.test_capture import _model


# ----------------------------------------------------------------------------- sparse COO


def _coo_3_nonzeros() -> torch.Tensor:
    indices = torch.tensor([[0, 5, 999], [7, 7, 3]])
    values = torch.tensor([1.0, 2.0, 3.0])
    return torch.sparse_coo_tensor(indices, values, (1000, 1000), check_invariants=True).coalesce()


def test_sparse_coo_matmul_is_described_from_its_nonzeros():
    coo, dense = _coo_3_nonzeros(), torch.randn(1000, 8)
    trace = capture_trace(lambda a, b: torch.sparse.mm(a, b), coo, dense)
    specs = [s for s in trace.kernels() if isinstance(s, SpmmSpec)]
    assert len(specs) == 1, trace.table()
    spec = specs[0]
    assert (spec.nnz, spec.width, spec.num_dst, spec.num_src) == (3, 8, 1000, 1000)
    assert spec.flops() == 2 * 3 * 8  # not 2 * 1000 * 1000 * 8
    assert spec.bytes_moved() < 1000 * 8 * 4 * 2 + 1000  # two dense [1000, 8] (at most) plus the non-zeros
    # the captured op's ideal traffic counts the COO's values and indices, not its 10^6 elements
    # (_sparse_addmm: the zero-filled init, the COO, the dense operand, the output)
    op = next(op for op in trace.ops if op.spec is spec)
    coo_bytes = 3 * 4 + 2 * 3 * 8  # 3 float32 values, 2 x 3 int64 indices
    assert op.bytes_moved == coo_bytes + 3 * 1000 * 8 * 4


def test_an_elementwise_op_on_a_sparse_tensor_falls_back_on_its_stored_bytes():
    """An entry that does not describe sparse operands (elementwise: numel) is not given one:
    the op is unmapped and the fallback counts the COO's 3 values and 2 x 3 indices."""
    coo = _coo_3_nonzeros()
    trace = capture_trace(lambda a: a * 2.0, coo)
    op = next(op for op in trace.ops if op.aten_op == "aten.mul.Tensor")
    assert op.kind == "unmapped" and "sparse operand (sparse_coo) is not described" in op.reason
    assert op.bytes_moved == 2 * (3 * 4 + 2 * 3 * 8)  # in and out, not 2 x 4 MB


def test_csr_matmul_still_maps_to_spmm_with_its_nonzeros():
    csr = _coo_3_nonzeros().to_sparse_csr()
    trace = capture_trace(lambda a, b: torch.sparse.mm(a, b), csr, torch.randn(1000, 8))
    specs = [s for s in trace.kernels() if isinstance(s, SpmmSpec)]
    assert len(specs) == 1 and specs[0].nnz == 3


# ----------------------------------------------------------------------------- kwargs


@pytest.mark.parametrize("kwargs", [[("x", 1)], "labels", (1, 2), {1: "a"}])
def test_kwargs_that_are_not_a_mapping_are_refused_before_any_work(kwargs, tmp_path):
    model = _model(tmp_path)
    calls = []
    net = torch.nn.Linear(4, 4)
    net.register_forward_hook(lambda *a: calls.append(1))
    for call in (lambda: predict_module_latency(net, (torch.randn(2, 4),), model, kwargs=kwargs),
                 lambda: capture_module(net, (torch.randn(2, 4),), kwargs),
                 lambda: measure_module_latency(net, (torch.randn(2, 4),), model, kwargs=kwargs)):
        with pytest.raises(TypeError, match=r"kwargs must be None or a mapping of keyword-argument names"):
            call()
    assert not calls


def test_kwargs_as_any_mapping_are_passed_on(tmp_path):
    from types import MappingProxyType

    model = _model(tmp_path)

    def fn(x, *, scale):
        return torch.relu(x * scale)

    pred = predict_module_latency(fn, (torch.randn(4, 64),), model, kwargs=MappingProxyType({"scale": 2.0}))
    assert pred.total_s["L3"] > 0


# ----------------------------------------------------------------------------- dtypes


class WithBuffer(torch.nn.Module):
    def __init__(self, use: bool) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.register_buffer("table", torch.zeros(32, 32, dtype=torch.float64))
        self.use = use

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return (y.double() @ self.table).float() if self.use else y


def test_an_unused_float64_buffer_does_not_decide_the_dtype(tmp_path):
    model = _model(tmp_path)
    pred = predict_module_latency(WithBuffer(use=False), (torch.randn(16, 32),), model)
    assert [s.family for s in pred.trace] == ["gemm"]


def test_a_float64_buffer_that_is_computed_with_is_still_refused(tmp_path):
    model = _model(tmp_path)
    with pytest.raises(ValueError, match=r"captured trace computes in \['float64'\]"):
        predict_module_latency(WithBuffer(use=True), (torch.randn(16, 32),), model)


def test_an_integer_matmul_is_said_not_to_be_modelled(tmp_path):
    model = _model(tmp_path)
    a = torch.randint(0, 9, (64, 32))
    b = torch.randint(0, 9, (32, 32))
    with pytest.warns(UserWarning, match=r"not modelled \(aten.mm.default.*integer matmul in int64.*lower bound"):
        pred = predict_module_latency(lambda p, q: p @ q, (a, b), model)
    row = pred.unmapped.set_index("aten_op").loc["aten.mm.default"]
    assert row["count"] == 1 and "not modelled: integer matmul in int64" in row["reason"]
    assert "multiply-adds" in row["reason"]


def test_a_float_trace_predicts_without_that_warning(tmp_path):
    model = _model(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predict_module_latency(torch.nn.Linear(32, 32), (torch.randn(16, 32),), model)
