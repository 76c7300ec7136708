"""Runners: every family runs; cold runners rotate their operands through the arena."""

from __future__ import annotations

import pytest
import torch

from costmodel import ops, runners
from costmodel.kernels import (
    ElementwiseSpec, GatherSpec, GemmSpec, GroupedGemmSpec, HistogramSpec, ScatterSpec, SoftmaxSpec, SortSpec, SpmmSpec,
    TopkSpec,
)
from costmodel.ops import scatter_backends_available

SPECS = [
    GemmSpec(3, 8, 16), GroupedGemmSpec((3, 0, 5), 8, 16, "padded_bmm"), GroupedGemmSpec((3, 0, 5), 8, 16, "grouped_mm"),
    GatherSpec(50, 4, 10, 1.0, True), GatherSpec(50, 1, 50, 0.0, False, "int64"),
    ScatterSpec(50, 4, 10, "max", "scatter_reduce", 0.5), ScatterSpec(5, 4, 10, "copy", "index_copy"),
    ScatterSpec(50, 4, 10, "sum", "index_put", 0.5),
    SpmmSpec(40, 4, 10, 10, 0.5), SpmmSpec(40, 4, 10, 10, 0.5, "float32", 1.0, 0.5), ElementwiseSpec("gelu", 100), ElementwiseSpec("floordiv", 100, "int64"),
    SoftmaxSpec(4, 8), TopkSpec(4, 8, 2), SortSpec(64), HistogramSpec(64, 8),
    GemmSpec(3, 8, 16, layout="nt"), GemmSpec(3, 8, 16, layout="tt"),
    GroupedGemmSpec((3, 0, 5), 8, 16, "grouped_mm", layout="nt"),
    GroupedGemmSpec((3, 0, 5), 8, 16, "grouped_mm_ragged_k", layout="tn"),
    GroupedGemmSpec((3, 1, 5), 8, 16, "padded_bmm", layout="tn"),
    GatherSpec(50, 4, 10, 1.0, True, op="index"), GatherSpec(50, 4, 10, 0.0, False, op="gather"),
] + ([ScatterSpec(50, 4, 10, "mean", "torch_scatter")] if "torch_scatter" in scatter_backends_available() else [])


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.family)
@pytest.mark.parametrize("cold", [False, True])
def test_every_family_runs(spec, cold):
    out = runners.make_runner(spec, cold=cold)()
    first = out[0] if isinstance(out, tuple) else out
    assert isinstance(first, torch.Tensor) and first.numel() > 0



def test_cold_runner_reads_different_operands_each_call(monkeypatch):
    seen: list[tuple[int, int]] = []
    real = ops.gemm

    def spy(a, b):
        seen.append((a.data_ptr(), b.data_ptr()))
        return real(a, b)

    monkeypatch.setattr(ops, "gemm", spy)
    cold, warm = runners.make_runner(GemmSpec(4, 64, 64), cold=True), runners.make_runner(GemmSpec(4, 64, 64))
    for _ in range(10):
        cold()
    assert len(set(seen)) == 10  # ten calls, ten different operand addresses
    seen.clear()
    for _ in range(10):
        warm()
    assert len(set(seen)) == 1


@pytest.mark.parametrize("layout, a_t, b_t", [("nt", False, True), ("tn", True, False), (None, False, False)])
def test_runners_call_in_the_layout_and_rotate_it_cold(monkeypatch, layout, a_t, b_t):
    seen: list[tuple[bool, bool, int]] = []
    real = ops.gemm

    def spy(a, b):
        seen.append((not a.is_contiguous(), not b.is_contiguous(), b.data_ptr()))
        return real(a, b)

    monkeypatch.setattr(ops, "gemm", spy)
    cold = runners.make_runner(GemmSpec(4, 64, 32, layout=layout), cold=True)
    for _ in range(5):
        assert tuple(cold().shape) == (4, 32)
    assert {s[:2] for s in seen} == {(a_t, b_t)}  # transposed views stay transposed views
    assert len({s[2] for s in seen}) == 5  # and rotate through the arena like any operand


def test_gather_ops_agree_on_values():
    for op in (None, "index", "gather"):
        out = runners.make_runner(GatherSpec(20, 3, 7, 0.5, False, op=op), seed=3)()
        assert tuple(out.shape) == (20, 3)
    a = runners.make_runner(GatherSpec(20, 3, 7, 0.5, False), seed=3)()
    assert torch.equal(a, runners.make_runner(GatherSpec(20, 3, 7, 0.5, False, op="index"), seed=3)())
    assert torch.equal(a, runners.make_runner(GatherSpec(20, 3, 7, 0.5, False, op="gather"), seed=3)())


def test_gemm_output_has_the_descriptor_shape():
    assert tuple(runners.make_runner(GemmSpec(3, 8, 16))().shape) == (3, 16)


def test_index_put_and_index_add_sum_the_same_rows():
    src, index = torch.randn(6, 3), torch.tensor([0, 2, 2, 4, 0, 0])
    put = ops.scatter(src, index, 5, reduce="sum", backend="index_put")
    add = ops.scatter(src, index, 5, reduce="sum", backend="index_add")
    assert torch.allclose(put, add) and put[1].abs().sum() == 0
