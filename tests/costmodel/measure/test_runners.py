"""Runners: every family runs; cold runners rotate their operands through the arena."""

from __future__ import annotations

import pytest
import torch

import costmodel.families.gemm as gemm_family
import costmodel.families.grouped_gemm as grouped_gemm_family
from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gather import GatherSpec
from costmodel.families.gemm import GemmSpec, gemm
from costmodel.families.grouped_gemm import GroupedGemmSpec, grouped_mm
from costmodel.families.histogram import HistogramSpec
from costmodel.families.scatter import ScatterSpec, scatter, scatter_backends_available
from costmodel.families.softmax import SoftmaxSpec
from costmodel.families.sort import SortSpec
from costmodel.families.spmm import SpmmSpec
from costmodel.families.topk import TopkSpec
from costmodel.measure import runners

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
    real = gemm

    def spy(a, b):
        seen.append((a.data_ptr(), b.data_ptr()))
        return real(a, b)

    monkeypatch.setattr(gemm_family, "gemm", spy)  # the runner calls the family's torch call
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
    real = gemm

    def spy(a, b):
        seen.append((not a.is_contiguous(), not b.is_contiguous(), b.data_ptr()))
        return real(a, b)

    monkeypatch.setattr(gemm_family, "gemm", spy)  # the runner calls the family's torch call
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
    put = scatter(src, index, 5, reduce="sum", backend="index_put")
    add = scatter(src, index, 5, reduce="sum", backend="index_add")
    assert torch.allclose(put, add) and put[1].abs().sum() == 0


def test_grouped_mm_reads_a_prefix_of_its_weights_only_when_experts_are_empty():
    assert GroupedGemmSpec((3, 0, 5, 0), 8, 16, "grouped_mm").read_prefix_numel() == (None, 2 * 8 * 16, None)
    assert GroupedGemmSpec((3, 1, 5), 8, 16, "grouped_mm").read_prefix_numel() is None  # every expert read
    assert GroupedGemmSpec((3, 0, 5), 8, 16, "padded_bmm").read_prefix_numel() is None  # bmm reads every slice
    assert GroupedGemmSpec((3, 0, 5), 8, 16, "grouped_mm_ragged_k").read_prefix_numel() is None  # writes every dW_e
    assert GemmSpec(3, 8, 16).read_prefix_numel() is None


def test_grouped_mm_runner_puts_the_non_empty_groups_first(monkeypatch):
    seen = []
    real = grouped_mm
    monkeypatch.setattr(grouped_gemm_family, "grouped_mm", lambda x, w, offs: seen.append(offs.tolist()) or real(x, w, offs))
    out = runners.make_runner(GroupedGemmSpec((0, 3, 0, 5), 8, 16, "grouped_mm"))()
    assert seen == [[3, 8, 8, 8]] and tuple(out.shape) == (8, 16)  # groups 3, 5, 0, 0: the same work


@pytest.mark.parametrize("layout", [None, "nt"])
def test_cold_rotation_spaces_copies_by_what_a_call_reads(monkeypatch, layout):
    # 2 of 64 experts hold tokens: 64 * 64 * 64 floats held, 2 * 64 * 64 read per call
    spec = GroupedGemmSpec((5, 3) + (0,) * 62, 64, 64, "grouped_mm", layout=layout)
    monkeypatch.setattr(runners, "ARENA_BYTES", 8 * 1024**2)  # 2M floats
    runners._arena.cache_clear()
    try:
        op, inputs = runners._build(spec, torch.device("cpu"), 0)
        pool = runners._rotations(inputs, torch.device("cpu"), spec.read_prefix_numel())
        read = 2 * 64 * 64
        # spaced by the operand's size, (2M - 262k) / 262k + 1 = 7 copies would fit; spaced by
        # what is read, (2M - 262k - 512) / (8192 + 512) + 1 = 211
        assert len(pool) == 211
        arena = runners._arena(torch.float32, "cpu")
        starts = [(w.data_ptr() - arena.data_ptr()) // 4 for _, w, _ in pool]
        assert all(b - a == read for a, b in zip(starts, starts[1:]))  # read parts never overlap
        assert starts[-1] + 64 * 64 * 64 <= arena.numel()
        xs = [(x.data_ptr() - arena.data_ptr()) // 4 for x, _, _ in pool]
        assert max(xs) + 8 * 64 <= starts[0]  # the tokens rotate in their own part of the arena
        assert all(not w.is_contiguous() for _, w, _ in pool) == (layout == "nt")
        assert torch.equal(pool[3][2], inputs[2])  # offsets are not rotated
    finally:
        runners._arena.cache_clear()


@pytest.mark.parametrize("spec", [ElementwiseSpec("add", 4096), ElementwiseSpec("mul", 1000), GemmSpec(64, 64, 64),
                                  GemmSpec(8, 32, 16, layout="nt")])
def test_cold_operands_of_one_call_never_share_bytes(spec):
    # until 2026-12-07 every operand of a copy started at the same arena offset: add(a, b) read one buffer twice
    _, inputs = runners._build(spec, torch.device("cpu"), 0)
    pool = runners._rotations(inputs, torch.device("cpu"), spec.read_prefix_numel())
    assert len(pool) > 2
    for args in pool[:3] + pool[-2:]:
        spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())  # [first byte, end)
                       for t in args if isinstance(t, torch.Tensor) and t.is_floating_point())
        assert len(spans) == 2 and spans[0][1] <= spans[1][0]  # the first ends before the second starts
    for t in range(len(inputs)):
        if isinstance(inputs[t], torch.Tensor) and inputs[t].is_floating_point():
            assert len({args[t].data_ptr() for args in pool}) == len(pool)  # and every copy is elsewhere
