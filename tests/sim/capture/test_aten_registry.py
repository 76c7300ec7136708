"""The aten registry maps each op kind to the descriptor fields computed by hand here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gather import GatherSpec
from costmodel.families.gemm import GemmSpec
from costmodel.families.grouped_gemm import GroupedGemmSpec
from costmodel.families.histogram import HistogramSpec
from costmodel.families.scatter import ScatterSpec
from costmodel.families.softmax import SoftmaxSpec
from costmodel.families.sort import SortSpec
from costmodel.families.spmm import SpmmSpec
from costmodel.families.topk import TopkSpec
from sim.capture.aten_registry import index_stats, registry_table
from sim.capture.dispatch import capture_trace


def kernels(fn, *args):
    return capture_trace(fn, *args).kernels()


def only(fn, *args):
    ks = kernels(fn, *args)
    assert len(ks) == 1, ks
    return ks[0]


def test_a_boolean_mask_gathers_the_rows_it_keeps_in_order():
    src = torch.randn(8, 3)
    mask = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool)  # keeps 5 of 8 rows
    cv = round(float(np.sqrt((1 - 5 / 8) / (5 / 8))), 3)  # hits per source row: 1 for 5 of them, 0 for 3
    assert only(lambda s, m: s[m], src, mask) == GatherSpec(5, 3, 8, cv, True, op="index")
    # behind a full slice (PyG's edge_index[:, mask]) every element moves on its own: width 1
    edges = torch.arange(16).view(2, 8)
    assert only(lambda e, m: e[:, m], edges, mask) == GatherSpec(10, 1, 16, cv, True, "int64", "index")


def test_index_stats_by_hand():
    # hits per target [2, 1, 0, 1]: mean 1, population std sqrt(0.5)
    assert index_stats(torch.tensor([0, 0, 1, 3]), 4) == (round(0.5**0.5, 3), True)
    assert index_stats(torch.tensor([3, 0, 1, 2]), 4) == (0.0, False)


def test_gemms_linear_with_transposed_weight_and_bias():
    x, w, b = torch.randn(5, 7), torch.randn(3, 7), torch.randn(3)
    assert only(torch.mm, x, w.t()) == GemmSpec(5, 7, 3, layout="nt")
    assert only(F.linear, x, w, b) == GemmSpec(5, 7, 3, layout="nt")  # addmm: bias fused
    assert only(F.linear, x, w) == GemmSpec(5, 7, 3, layout="nt")
    captured = capture_trace(F.linear, x, w)
    gemm = [op for op in captured.ops if op.kind == "kernel"][0]
    assert gemm.strides[1] == (1, 7)  # the transposed weight, seen through its strides
    assert only(torch.matmul, torch.randn(7), torch.randn(7, 4)) == GemmSpec(1, 7, 4)  # mv path via mm


def test_gemm_layouts_read_from_strides():
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    assert only(torch.mm, a, b) == GemmSpec(5, 7, 3)  # row-major: "nn", stored unset
    assert only(torch.mm, a.t().contiguous().t(), b) == GemmSpec(5, 7, 3, layout="tn")
    assert only(torch.mm, a.t().contiguous().t(), b.t().contiguous().t()) == GemmSpec(5, 7, 3, layout="tt")
    assert only(torch.mm, a, b.expand(7, 3)) == GemmSpec(5, 7, 3)
    assert GemmSpec(5, 7, 3, layout="nn") == GemmSpec(5, 7, 3)  # one key for row-major, as before layouts
    assert GemmSpec(5, 7, 3, layout="nn").key() == "dtype=float32|family=gemm|k=7|m=5|n=3"
    with pytest.raises(ValueError, match=r"GemmSpec.layout must be one of \['nn', 'nt', 'tn', 'tt'\]"):
        GemmSpec(5, 7, 3, layout="n")


def test_bmm_counts_non_zero_rows_as_tokens():
    x = torch.randn(3, 4, 8)
    x[0, 2:] = 0  # expert 0: 2 real tokens, 2 rows of padding
    x[2] = 0
    x[2, 0] = 1.0  # expert 2: 1 token
    assert only(torch.bmm, x, torch.randn(3, 8, 6)) == GroupedGemmSpec((2, 4, 1), 8, 6, "padded_bmm")


def test_grouped_mm_counts_from_offsets():
    if not hasattr(F, "grouped_mm"):
        pytest.skip("torch without grouped_mm")
    offs = torch.tensor([3, 3, 8], dtype=torch.int32)
    spec = only(lambda x, w: F.grouped_mm(x, w, offs=offs), torch.randn(8, 16), torch.randn(3, 16, 8))
    assert spec == GroupedGemmSpec((3, 0, 5), 16, 8, "grouped_mm")
    # transformers' Mixtral experts: weights stored [E, N, K], multiplied transposed
    spec = only(lambda x, w: F.grouped_mm(x, w.transpose(-2, -1), offs=offs), torch.randn(8, 16), torch.randn(3, 8, 16))
    assert spec == GroupedGemmSpec((3, 0, 5), 16, 8, "grouped_mm", layout="nt")
    # the weight gradient: X^T [K, sum n] @ G [sum n, N] -> [E, K, N], ragged along the reduction
    spec = only(lambda x, g: F.grouped_mm(x.t(), g, offs=offs), torch.randn(8, 16), torch.randn(8, 4))
    assert spec == GroupedGemmSpec((3, 0, 5), 16, 4, "grouped_mm_ragged_k", layout="tn")
    assert spec.bytes_moved() == 4 * (8 * 16 + 8 * 4 + 3 * 16 * 4)  # X, G read; every expert's dW written


def test_gathers():
    src, idx = torch.randn(10, 6), torch.tensor([1, 1, 4, 9, 0])
    cv, asc = index_stats(idx, 10)
    assert only(torch.index_select, src, 0, idx) == GatherSpec(5, 6, 10, cv, asc)
    # advanced indexing is another aten kernel than index_select (several-fold slower on CPU)
    assert only(lambda s, i: s[i], src, idx) == GatherSpec(5, 6, 10, cv, asc, op="index")
    assert only(F.embedding, idx, src) == GatherSpec(5, 6, 10, cv, asc)  # embedding calls index_select
    g_idx = torch.tensor([[0, 2], [1, 1]])
    g_cv, g_asc = index_stats(g_idx, 6)
    assert only(torch.gather, src[:2], 1, g_idx) == GatherSpec(4, 1, 6, g_cv, g_asc, op="gather")
    # an index broadcast along the row (PyG's scatter backward: index.view(-1, 1).expand(-1, F)) gathers rows
    rows = idx.view(-1, 1).expand(5, 6)
    assert only(torch.gather, src, 0, rows) == GatherSpec(5, 6, 10, cv, asc, op="gather")


def test_scatters_fold_their_zero_fill():
    src, idx = torch.randn(4, 3), torch.tensor([0, 0, 1, 3])
    cv = round(0.5**0.5, 3)
    spec = only(lambda s, i: torch.zeros(4, 3).index_add_(0, i, s), src, idx)
    assert spec == ScatterSpec(4, 3, 4, "sum", "index_add", cv, True)
    b_idx = idx.view(-1, 1).expand(4, 3)
    assert only(lambda s, i: torch.zeros(4, 3).scatter_add_(0, i, s), src, b_idx) == \
        ScatterSpec(4, 3, 4, "sum", "scatter_reduce", cv, True)
    assert only(lambda s, i: torch.zeros(4, 3).scatter_reduce_(0, i, s, "amax", include_self=False), src, b_idx) == \
        ScatterSpec(4, 3, 4, "max", "scatter_reduce", cv, True)
    # index_put_ with accumulate is its own backend (serial on CPU), not index_add's
    assert only(lambda s, i: torch.zeros(4, 3).index_put_((i,), s, accumulate=True), src, idx) == \
        ScatterSpec(4, 3, 4, "sum", "index_put", cv, True)
    perm = torch.tensor([2, 0, 3])
    assert only(lambda s, i: torch.zeros(5, 3).index_copy_(0, i, s), src[:3], perm) == \
        ScatterSpec(3, 3, 5, "copy", "index_copy", 0.0, False)


def test_a_fill_read_by_another_kernel_stays_a_kernel():
    src, idx = torch.randn(4, 3), torch.tensor([0, 0, 1, 3])

    def fn(s, i):
        out = torch.zeros(4, 3)
        out.add_(1.0)  # the fill's tensor is read before the scatter: the fill is its own kernel
        return out.index_add_(0, i, s)

    ks = kernels(fn, src, idx)
    assert ks[0] == ElementwiseSpec("fill", 12) and isinstance(ks[-1], ScatterSpec) and len(ks) == 3


def test_sparse_csr_matmul():
    dense = torch.tensor([[0, 1.0, 0], [2.0, 0, 3.0], [0, 0, 0], [1.0, 1.0, 1.0]])
    csr = dense.to_sparse_csr()
    lengths = np.array([1, 2, 0, 3], dtype=float)
    cv = round(float(lengths.std() / lengths.mean()), 3)
    # columns read 2, 2, 2 times: CV 0, every source row read
    assert only(torch.sparse.mm, csr, torch.randn(3, 5)) == SpmmSpec(6, 5, 4, 3, cv, "float32", 0.0, 1.0)
    # columns read 2, 2, 0 times: CV = std/mean = (sqrt(8/9)) / (4/3) = 0.707, two of three rows read
    skewed = torch.tensor([[0, 1.0, 0], [2.0, 0, 0], [0, 0, 0], [1.0, 1.0, 0]]).to_sparse_csr()
    spec = only(torch.sparse.mm, skewed, torch.randn(3, 5))
    assert (spec.src_cv, spec.src_read_share) == (0.707, 0.667)


def test_pointwise_unary_binary_ternary():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    assert only(torch.relu, x) == ElementwiseSpec("relu", 32)
    assert only(F.silu, x) == ElementwiseSpec("silu", 32)
    assert only(torch.exp, x) == ElementwiseSpec("sigmoid", 32)  # nearest: transcendental unary
    assert only(torch.add, x, y) == ElementwiseSpec("add", 32)
    assert only(torch.mul, x, y) == ElementwiseSpec("mul", 32)
    assert only(torch.mul, x, y[:, :1]) == ElementwiseSpec("scale", 32)  # broadcast column
    assert only(lambda a: a * 2.0, x) == ElementwiseSpec("scale", 32)
    assert only(torch.where, x > 0, x, y)  # two kernels: the comparison and where
    assert kernels(torch.where, x > 0, x, y)[-1] == ElementwiseSpec("add", 32)  # nearest: two full inputs


def test_small_ops():
    x = torch.randn(6, 10)
    assert only(torch.softmax, x, -1) == SoftmaxSpec(6, 10)
    assert only(torch.log_softmax, x, -1) == SoftmaxSpec(6, 10)
    assert only(torch.topk, x, 3) == TopkSpec(6, 10, 3)
    ids = torch.tensor([3, 1, 2, 2, 0])
    assert only(torch.sort, ids) == SortSpec(5, "int64")
    assert only(torch.argsort, ids) == SortSpec(5, "int64")
    assert only(torch.bincount, ids) == HistogramSpec(5, 4)
    assert only(lambda v: torch.bincount(v, minlength=9), ids) == HistogramSpec(5, 9)
    assert only(torch.histc, x, 7) == HistogramSpec(60, 7)
    assert only(torch.cumsum, x, 0) == ElementwiseSpec("scale", 60)
    assert only(torch.clone, x) == ElementwiseSpec("copy", 60)
    assert only(torch.zeros_like, x) == ElementwiseSpec("fill", 60)
    assert only(torch.nonzero, ids) == ElementwiseSpec("copy", 5, "int64")
    one_hot = kernels(F.one_hot, ids, 4)
    assert ElementwiseSpec("copy", 5, "int64") in one_hot  # the scatter of ones
    assert only(lambda a: a.float(), ids) == ElementwiseSpec("copy", 5, "float32")
    # the backward of selecting one expert's [4, 10] slice of a [6, 4, 10] weight zeroes the
    # whole [6, 4, 10] gradient: a fill of 240 (write only), not a copy that would read 240
    grad = torch.randn(4, 10)
    assert only(lambda g: torch.ops.aten.select_backward(g, [6, 4, 10], 0, 2), grad) == ElementwiseSpec("fill", 240)


def test_views_launch_no_kernel():
    captured = capture_trace(lambda a: a.view(2, 3).t().expand(2, 3, 2)[0, 1:].relu(), torch.randn(6))
    assert [op.kind for op in captured.ops if op.kind != "view"] == ["kernel"]
    # reshape of a transposed tensor is not a view: it copies
    assert only(lambda a: a.view(2, 3).t().reshape(6), torch.randn(6)) == ElementwiseSpec("copy", 6)


def test_registry_table_lists_nearest_mappings():
    table = registry_table()
    assert {"aten.mm", "aten._grouped_mm", "aten.index_add_", "aten.embedding"} <= set(table["aten_op"])
    assert table.loc[table["aten_op"] == "aten.gather", "note"].str.contains("nearest").all()
