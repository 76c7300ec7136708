"""The one registry from aten ops to the project's kernel descriptors.

Each entry says: this aten overload packet is this kernel family, with these descriptor
fields, computed from the op's real arguments (shapes, dtypes and, where the cost model
needs them, values: tokens per expert of a grouped GEMM, index statistics of a gather or
scatter). Entries are registered with ``@register(packets, family=..., note=...)``, as
PyTorch registers FLOP formulas per aten op (``torch/utils/flop_counter.py``,
``register_flop_formula``). Where no family fits an op well, the entry maps it to the
nearest family and its ``note`` says so; ``registry_table()`` lists every entry.

``classify`` is what ``sim.capture`` calls for each op: it returns ``("view", None)`` for
ops that launch no kernel (views, aliases, allocations, host reads), ``("kernel", spec)``
for mapped ops, and ``("unmapped", reason)`` for ops the registry does not know or cannot
describe (predicted by the roofline fallback in ``sim.capture``, never dropped).

Index statistics follow ``sim.gnn_layer.GraphPlan`` and ``costmodel.indices``: the CV of
per-target hit counts (``bincount(index, minlength=targets)``, population std / mean,
rounded to 3 decimals) and whether the index is ascending.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd
import torch

from costmodel.indices import pattern_of_counts
from costmodel.kernels import (
    ElementwiseSpec,
    GatherSpec,
    GemmSpec,
    GroupedGemmSpec,
    HistogramSpec,
    KernelSpec,
    ScatterSpec,
    SoftmaxSpec,
    SortSpec,
    SpmmSpec,
    TopkSpec,
)

aten = torch.ops.aten


class Unmappable(Exception):
    """Raised by a mapper when this call's arguments fall outside its family (reason in args)."""


@dataclass
class OpCall:
    """One aten call as a mapper sees it: the overload, its arguments and its output."""

    func: Any  # torch._ops.OpOverload
    args: tuple
    kwargs: dict
    out: Any
    #: set by mappers that fold a preceding fill of their destination into their own kernel
    absorbs: torch.Tensor | None = None

    def arg(self, i: int, name: str, default: Any = None) -> Any:
        if len(self.args) > i:
            return self.args[i]
        return self.kwargs.get(name, default)

    @property
    def first_out(self) -> torch.Tensor | None:
        out = self.out
        if isinstance(out, (tuple, list)):
            out = out[0] if out else None
        return out if isinstance(out, torch.Tensor) else None


Mapper = Callable[[OpCall], KernelSpec]


@dataclass(frozen=True)
class Entry:
    family: str
    mapper: Mapper
    note: str


_ENTRIES: dict[Any, Entry] = {}


def register(packets: Iterable[Any], *, family: str, note: str = "") -> Callable[[Mapper], Mapper]:
    """Register ``mapper`` for every aten overload packet in ``packets``."""

    def deco(fn: Mapper) -> Mapper:
        for p in packets:
            if p in _ENTRIES:
                raise ValueError(f"aten op {p} is registered twice (as {_ENTRIES[p].family} and {family})")
            _ENTRIES[p] = Entry(family, fn, note)
        return fn

    return deco


def registry_table() -> pd.DataFrame:
    """Every registered aten op with its family and note (the registry as a table)."""
    rows = [{"aten_op": str(p), "family": e.family, "note": e.note} for p, e in _ENTRIES.items()]
    return pd.DataFrame(rows).sort_values(["family", "aten_op"]).reset_index(drop=True)


def entry_for(func: Any) -> Entry | None:
    return _ENTRIES.get(getattr(func, "overloadpacket", func))


# ----------------------------------------------------------------------------- no-kernel ops

#: ops that allocate, alias or read a scalar to the host: no kernel is launched
NO_KERNEL_PACKETS = {
    aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided,
    aten._local_scalar_dense, aten.lift_fresh, aten.lift_fresh_copy, aten.detach, aten.alias,
    aten.resize_, aten.set_, aten.sym_size, aten.sym_stride, aten.sym_numel, aten.is_same_size,
    aten._unsafe_view, aten._reshape_alias,  # views whose schema carries no alias annotation
}


def is_view(func: Any) -> bool:
    """An op whose result aliases an input without writing it (view, reshape, permute,
    expand, t, slice, select...): it launches no kernel."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


# ----------------------------------------------------------------------------- helpers


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _spec_dtype(t: torch.Tensor, allowed: tuple[str, ...]) -> str:
    name = dtype_name(t)
    if name not in allowed:
        raise Unmappable(f"dtype {name} is not one of the family's dtypes {list(allowed)}")
    return name


def index_stats(index: torch.Tensor, num_targets: int) -> tuple[float, bool]:
    """(CV of per-target hit counts, ascending?) of an integer index, read from its values
    (the statistics ``sim.gnn_layer.GraphPlan`` and ``costmodel.indices`` use)."""
    idx = index.detach().reshape(-1).to("cpu", torch.int64).numpy()
    if idx.size == 0:
        return 0.0, True
    counts = np.bincount(idx, minlength=max(int(num_targets), 1)).astype(np.float64)
    cv = float(counts.std() / counts.mean()) if counts.mean() > 0 else 0.0
    return round(cv, 3), bool(np.all(idx[1:] >= idx[:-1]))


def _prod(shape: Iterable[int]) -> int:
    return int(math.prod(int(s) for s in shape))


# ----------------------------------------------------------------------------- GEMM


@register([aten.mm, aten.addmm], family="gemm",
          note="linear/matmul land here (weights transposed by a view, bias fused by addmm's beta*C); "
               "a sparse CSR first operand maps to spmm")
def _mm(call: OpCall) -> KernelSpec:
    is_add = call.func.overloadpacket is aten.addmm
    a, b = (call.args[1], call.args[2]) if is_add else (call.args[0], call.args[1])
    if a.layout == torch.sparse_csr:
        return _spmm_spec(a, b, call, call.args[0] if is_add else None)
    if a.layout != torch.strided or b.layout != torch.strided:
        raise Unmappable(f"operand layouts {a.layout}, {b.layout} are not dense or CSR")
    return GemmSpec(int(a.shape[0]), int(a.shape[1]), int(b.shape[1]), _spec_dtype(a, GemmSpec.allowed_dtypes))


@register([aten.mv, aten.addmv], family="gemm", note="matrix-vector product as a GEMM with N = 1")
def _mv(call: OpCall) -> KernelSpec:
    a = call.args[1] if call.func.overloadpacket is aten.addmv else call.args[0]
    return GemmSpec(int(a.shape[0]), int(a.shape[1]), 1, _spec_dtype(a, GemmSpec.allowed_dtypes))


@register([aten.dot], family="gemm", note="dot product as a GEMM with M = N = 1")
def _dot(call: OpCall) -> KernelSpec:
    a = call.args[0]
    return GemmSpec(1, int(a.numel()), 1, _spec_dtype(a, GemmSpec.allowed_dtypes))


def _nonzero_rows(x: torch.Tensor) -> tuple[int, ...]:
    """Rows per batch that hold any non-zero: the real tokens of a zero-padded expert batch."""
    return tuple(int(c) for c in (x.detach() != 0).any(dim=-1).sum(dim=-1).tolist())


@register([aten.bmm, aten.baddbmm], family="grouped_gemm",
          note="impl=padded_bmm; tokens per batch are the rows holding any non-zero value (read from the "
               "input: zero-padding rows of a padded MoE batch are not useful work); a dense bmm "
               "(attention) has every row non-zero and counts all of them")
def _bmm(call: OpCall) -> KernelSpec:
    x, w = (call.args[1], call.args[2]) if call.func.overloadpacket is aten.baddbmm else (call.args[0], call.args[1])
    counts = _nonzero_rows(x)
    if sum(counts) == 0:
        counts = (int(x.shape[1]),) * int(x.shape[0])
    return GroupedGemmSpec(counts, int(x.shape[2]), int(w.shape[2]), "padded_bmm",
                           _spec_dtype(x, GroupedGemmSpec.allowed_dtypes))


@register([aten._grouped_mm], family="grouped_gemm",
          note="impl=grouped_mm; tokens per expert from the offsets tensor; the weight-gradient form "
               "(2-D x 2-D, ragged reduction dim) as the nearest: same FLOPs and ideal bytes")
def _grouped(call: OpCall) -> KernelSpec:
    x, w, offs = call.args[0], call.args[1], call.arg(2, "offs")
    if offs is None or x.dim() != 2 or w.dim() not in (2, 3):
        raise Unmappable("only the ragged forms with offsets ([sum n, K] x [E, K, N], [K, sum n] x [sum n, N]) are described")
    ends = offs.detach().to("cpu", torch.int64).numpy()
    counts = tuple(int(c) for c in np.diff(ends, prepend=0))
    # 2-D x 2-D is the weight gradient (ragged reduction dim): the same 2*K*N*sum(n) FLOPs and ideal bytes
    k = int(x.shape[1]) if w.dim() == 3 else int(x.shape[0])
    return GroupedGemmSpec(counts, k, int(w.shape[-1]), "grouped_mm", _spec_dtype(x, GroupedGemmSpec.allowed_dtypes))


# ----------------------------------------------------------------------------- sparse matmul


def _spmm_spec(csr: torch.Tensor, dense: torch.Tensor, call: OpCall, init: torch.Tensor | None) -> KernelSpec:
    if dense.dim() != 2:
        raise Unmappable("sparse matmul with a non-matrix dense operand")
    cv, _ = pattern_of_counts(np.diff(csr.crow_indices().detach().to("cpu", torch.int64).numpy()))
    num_src = int(csr.shape[1])
    src_cv, src_share = pattern_of_counts(
        np.bincount(csr.col_indices().detach().to("cpu", torch.int64).numpy(), minlength=num_src))
    if init is not None:
        call.absorbs = init
    return SpmmSpec(max(int(csr._nnz()), 1), int(dense.shape[1]), int(csr.shape[0]), num_src, cv,
                    _spec_dtype(dense, SpmmSpec.allowed_dtypes), src_cv, src_share)


@register([aten._sparse_addmm, aten._sparse_mm], family="spmm",
          note="CSR x dense; index_cv = CV of CSR row lengths (in-degree), src_cv and src_read_share "
               "from the column indices (which rows of the dense operand are read); a zero fill of the output just "
               "before is part of the call (as in costmodel.ops.spmm)")
def _sparse(call: OpCall) -> KernelSpec:
    if call.func.overloadpacket is aten._sparse_addmm:
        return _spmm_spec(call.args[1], call.args[2], call, call.args[0])
    return _spmm_spec(call.args[0], call.args[1], call, None)


# ----------------------------------------------------------------------------- gather


def _gather_spec(index: torch.Tensor, width: int, num_src: int, src: torch.Tensor) -> KernelSpec:
    if index.dtype == torch.bool:
        raise Unmappable("boolean-mask indexing")
    cv, ascending = index_stats(index, num_src)
    return GatherSpec(max(int(index.numel()), 1), max(int(width), 1), max(int(num_src), 1), cv, ascending,
                      _spec_dtype(src, GatherSpec.allowed_dtypes))


@register([aten.index_select], family="gather", note="rows of dim 0; other dims as rows of the outer block")
def _index_select(call: OpCall) -> KernelSpec:
    src, dim, index = call.args[0], call.args[1] % max(call.args[0].dim(), 1), call.args[2]
    width = _prod(src.shape[dim + 1:])
    if dim != 0:
        raise Unmappable("index_select along a dim other than 0")
    return _gather_spec(index, width, int(src.shape[0]) if src.dim() else 1, src)


@register([aten.embedding], family="gather", note="embedding lookup = row gather of the weight table")
def _embedding(call: OpCall) -> KernelSpec:
    weight, indices = call.args[0], call.args[1]
    return _gather_spec(indices, int(weight.shape[1]), int(weight.shape[0]), weight)


@register([aten.index], family="gather",
          note="advanced indexing x[idx] (or x[i, j] on leading dims: rows of the flattened block at the linear "
               "index); boolean masks and indices after a full slice as the nearest elementwise copy of the input")
def _index(call: OpCall) -> KernelSpec:
    src, indices = call.args[0], list(call.args[1])
    while indices and indices[-1] is None:
        indices.pop()
    if not indices or any(i is None or i.dtype == torch.bool for i in indices):
        # boolean masks (compaction) and indices after a full slice: nearest, one copy pass of the input
        return ElementwiseSpec("copy", max(int(src.numel()), 1), _spec_dtype(src, ElementwiseSpec.allowed_dtypes))
    if len(indices) == 1:
        return _gather_spec(indices[0], _prod(src.shape[1:]), int(src.shape[0]), src)
    # x[i, j, ...] on the leading dims: rows of the flattened leading block, at the linear index
    lead = [int(s) for s in src.shape[:len(indices)]]
    idx = torch.broadcast_tensors(*[i.detach().to("cpu", torch.int64) for i in indices])
    linear = torch.zeros_like(idx[0])
    for i, size in zip(idx, lead):
        linear = linear * size + i
    return _gather_spec(linear, _prod(src.shape[len(indices):]), _prod(lead), src)


@register([aten.gather], family="gather",
          note="nearest family: element-wise gather along a dim as index.numel() rows of width 1 out of "
               "size(dim) sources")
def _gather(call: OpCall) -> KernelSpec:
    src, dim, index = call.args[0], call.args[1], call.args[2]
    return _gather_spec(index, 1, int(src.shape[dim]) if src.dim() else 1, src)


# ----------------------------------------------------------------------------- scatter


def _row_index(index: torch.Tensor) -> torch.Tensor:
    """The destination row of each source row of a (usually broadcast) scatter index."""
    return index if index.dim() == 1 else index.reshape(index.shape[0], -1)[:, 0]


def _scatter_spec(call: OpCall, dest: torch.Tensor, index: torch.Tensor, src: torch.Tensor, reduce: str,
                  backend: str) -> KernelSpec:
    rows_idx = _row_index(index)
    num_rows = int(rows_idx.numel())
    if num_rows == 0:
        raise Unmappable("empty index")
    width = max(int(src.numel()) // num_rows, 1) if isinstance(src, torch.Tensor) and src.dim() else (
        _prod(dest.shape[1:]))
    num_dst = int(dest.shape[0])
    cv, ascending = index_stats(rows_idx, num_dst)
    if backend == "index_copy":
        cv = 0.0  # a copy writes distinct rows: the descriptor's index_cv is defined as 0
    call.absorbs = dest
    return ScatterSpec(num_rows, max(width, 1), num_dst, reduce, backend, cv, ascending,
                       _spec_dtype(dest, ScatterSpec.allowed_dtypes))


def _check_dim0(dim: int, dest: torch.Tensor) -> None:
    if dim % max(dest.dim(), 1) != 0:
        raise Unmappable("scatter along a dim other than 0")


@register([aten.index_add_, aten.index_add], family="scatter",
          note="backend index_add, reduce sum; a zero fill of the destination just before is part of the "
               "call (as in costmodel.ops.scatter)")
def _index_add(call: OpCall) -> KernelSpec:
    dest, dim, index, src = call.args[:4]
    _check_dim0(dim, dest)
    return _scatter_spec(call, dest, index, src, "sum", "index_add")


@register([aten.index_copy_, aten.index_copy], family="scatter", note="backend index_copy, reduce copy")
def _index_copy(call: OpCall) -> KernelSpec:
    dest, dim, index, src = call.args[:4]
    _check_dim0(dim, dest)
    return _scatter_spec(call, dest, index, src, "copy", "index_copy")


_REDUCES = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "max", "prod": "sum"}


@register([aten.scatter_reduce_, aten.scatter_reduce], family="scatter",
          note="backend scatter_reduce; amin maps to max and prod to sum (nearest reductions); index stats "
               "from the first column of a broadcast index")
def _scatter_reduce(call: OpCall) -> KernelSpec:
    dest, dim, index, src = call.args[:4]
    _check_dim0(dim, dest)
    reduce = call.arg(4, "reduce")
    return _scatter_spec(call, dest, index, src, _REDUCES.get(reduce, "sum"), "scatter_reduce")


@register([aten.scatter_add_, aten.scatter_add], family="scatter",
          note="nearest backend: scatter_reduce with reduce sum (the same CPU/CUDA scatter kernel family)")
def _scatter_add(call: OpCall) -> KernelSpec:
    dest, dim, index, src = call.args[:4]
    _check_dim0(dim, dest)
    return _scatter_spec(call, dest, index, src, "sum", "scatter_reduce")


@register([aten.index_put_, aten.index_put, aten._index_put_impl_], family="scatter",
          note="accumulate=True as backend index_put (its own, serial on CPU); accumulate=False "
               "as index_copy when the index is duplicate-free; into an integer tensor as an elementwise copy "
               "of the values (nearest)")
def _index_put(call: OpCall) -> KernelSpec:
    dest, indices, values = call.args[0], call.args[1], call.args[2]
    accumulate = bool(call.arg(3, "accumulate", False))
    if len(indices) != 1 or indices[0] is None or indices[0].dtype == torch.bool:
        raise Unmappable("index_put with other than one integer index tensor on dim 0")
    index = indices[0]
    if dtype_name(dest) not in ScatterSpec.allowed_dtypes:  # integer bookkeeping (e.g. an inverse permutation)
        return ElementwiseSpec("copy", max(int(values.numel()), 1), _spec_dtype(dest, ElementwiseSpec.allowed_dtypes))
    if not accumulate:
        if index.unique().numel() != index.numel() or index.numel() > dest.shape[0]:
            return _scatter_spec(call, dest, index, _expand_values(values, index, dest), "sum", "index_add")
        return _scatter_spec(call, dest, index, _expand_values(values, index, dest), "copy", "index_copy")
    return _scatter_spec(call, dest, index, _expand_values(values, index, dest), "sum", "index_put")


def _expand_values(values: torch.Tensor, index: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
    return values.expand(index.numel(), *dest.shape[1:]) if values.numel() < index.numel() * _prod(dest.shape[1:]) else values


@register([aten.scatter_, aten.scatter], family="elementwise",
          note="nearest family: a plain scatter (one_hot, masks) writes index.numel() elements: an "
               "elementwise copy of that many")
def _scatter_plain(call: OpCall) -> KernelSpec:
    dest, index = call.args[0], call.args[2]
    return ElementwiseSpec("copy", max(int(index.numel()), 1), _spec_dtype(dest, ElementwiseSpec.allowed_dtypes))


# ----------------------------------------------------------------------------- small ops


@register([aten._softmax, aten._log_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data],
          family="softmax", note="rows = numel / size(dim); log_softmax and the backward passes as the "
                                 "nearest family (one row-wise pass)")
def _softmax(call: OpCall) -> KernelSpec:
    backward = call.func.overloadpacket in (aten._softmax_backward_data, aten._log_softmax_backward_data)
    x, dim = call.args[0], int(call.args[2] if backward else call.args[1])
    cols = int(x.shape[dim]) if x.dim() else 1
    return SoftmaxSpec(max(int(x.numel()) // max(cols, 1), 1), max(cols, 1), _spec_dtype(x, SoftmaxSpec.allowed_dtypes))


@register([aten.native_layer_norm, aten.native_layer_norm_backward, aten._fused_rms_norm,
           aten._fused_rms_norm_backward] if hasattr(aten, "_fused_rms_norm") else
          [aten.native_layer_norm, aten.native_layer_norm_backward],
          family="softmax", note="nearest family: a row-wise normalisation is one row pass like softmax "
                                 "(rows = numel / normalized size, cols = normalized size)")
def _norm(call: OpCall) -> KernelSpec:
    backward = call.func.overloadpacket.__name__.endswith("_backward")
    x, shape = (call.args[1], call.args[2]) if backward else (call.args[0], call.args[1])
    cols = _prod(shape)
    return SoftmaxSpec(max(int(x.numel()) // max(cols, 1), 1), max(cols, 1), _spec_dtype(x, SoftmaxSpec.allowed_dtypes))


@register([aten.topk], family="topk", note="rows = numel / size(dim)")
def _topk(call: OpCall) -> KernelSpec:
    x, k = call.args[0], int(call.arg(1, "k"))
    dim = call.arg(2, "dim", -1)
    cols = int(x.shape[dim]) if x.dim() else 1
    return TopkSpec(max(int(x.numel()) // max(cols, 1), 1), cols, max(k, 1), _spec_dtype(x, TopkSpec.allowed_dtypes))


@register([aten.sort], family="sort", note="argsort lands here; a batched sort along a dim as one sort of numel keys (nearest)")
def _sort(call: OpCall) -> KernelSpec:
    x = call.args[0]
    return SortSpec(max(int(x.numel()), 1), _spec_dtype(x, SortSpec.allowed_dtypes))


@register([aten.bincount], family="histogram", note="bins = the output length")
def _bincount(call: OpCall) -> KernelSpec:
    x, out = call.args[0], call.first_out
    return HistogramSpec(max(int(x.numel()), 1), max(int(out.numel()), 1))


@register([aten.histc], family="histogram",
          note="nearest: histc bins floats; described as an int64 bincount of the same n and bins")
def _histc(call: OpCall) -> KernelSpec:
    x = call.args[0]
    return HistogramSpec(max(int(x.numel()), 1), max(int(call.arg(1, "bins", 100)), 1))


def _out_numel(call: OpCall) -> int:
    out = call.first_out
    if out is None:
        out = call.args[0]
    return max(int(out.numel()), 1)


def _elementwise(op: str, call: OpCall, dtype_from: torch.Tensor | None = None) -> KernelSpec:
    ref = dtype_from if dtype_from is not None else (call.first_out if call.first_out is not None else call.args[0])
    return ElementwiseSpec(op, _out_numel(call), _spec_dtype(ref, ElementwiseSpec.allowed_dtypes))


@register([aten.zeros, aten.zeros_like, aten.ones, aten.ones_like, aten.full, aten.full_like, aten.fill_,
           aten.fill, aten.zero_, aten.new_zeros, aten.new_ones, aten.new_full, aten.arange,
           aten.scalar_tensor],
          family="elementwise", note="op fill; a fill consumed by the next scatter or spmm into the same tensor "
                                     "is folded into that kernel (the suite times them together)")
def _fill(call: OpCall) -> KernelSpec:
    return _elementwise("fill", call)


@register([aten.clone, aten._to_copy, aten.copy_, aten.copy, aten.repeat, aten.cat, aten.stack, aten.flip, aten.roll,
           aten.constant_pad_nd, aten.tril, aten.triu, aten.masked_fill, aten.masked_fill_],
          family="elementwise", note="op copy (one read, one write); dtype conversions, cat, repeat, pad, "
                                     "masked_fill as the nearest copy")
def _copy(call: OpCall) -> KernelSpec:
    return _elementwise("copy", call)


@register([aten.slice_backward, aten.select_backward], family="elementwise",
          note="op fill of the output numel: the pass that zeroes the full-size gradient dominates (the "
               "slice copied into it is 1/E of it for one expert's weight slice); a copy of the output numel "
               "would read a full-size input that does not exist (2x: eager MoE backward)")
def _slice_backward(call: OpCall) -> KernelSpec:
    return _elementwise("fill", call)


@register([aten.nll_loss_forward], family="gather",
          note="nearest: picks one log-probability per row: a gather of N rows of width 1 out of C")
def _nll(call: OpCall) -> KernelSpec:
    logp, target = call.args[0], call.args[1]
    return _gather_spec(target.clamp(min=0), 1, int(logp.shape[-1]), logp)


@register([aten.nll_loss_backward], family="elementwise",
          note="nearest: writes the zeroed [N, C] input gradient: op fill of N*C")
def _nll_backward(call: OpCall) -> KernelSpec:
    return _elementwise("fill", call)


@register([aten.cumsum, aten.cumprod], family="elementwise", note="nearest: op scale (one input read, one FLOP per element)")
def _cumsum(call: OpCall) -> KernelSpec:
    return _elementwise("scale", call)


@register([aten.nonzero], family="elementwise",
          note="nearest: op copy over the input (one read pass, indices written); output size is value-dependent")
def _nonzero(call: OpCall) -> KernelSpec:
    x = call.args[0]
    dt = dtype_name(x) if dtype_name(x) in ElementwiseSpec.allowed_dtypes else "int64"
    return ElementwiseSpec("copy", max(int(x.numel()), 1), dt)


@register([aten.sum, aten.mean, aten.amax, aten.amin, aten.max, aten.min, aten.argmax, aten.argmin, aten.prod,
           aten.norm, aten.linalg_vector_norm, aten.var, aten.std, aten.var_mean, aten.any, aten.all,
           aten.logsumexp, aten.aminmax, aten.count_nonzero],
          family="elementwise", note="nearest: a reduction is one streaming read of its input: op fill over "
                                     "the input's numel (numel*bytes, the same ideal traffic)")
def _reduction(call: OpCall) -> KernelSpec:
    x = call.args[0]
    dt = dtype_name(x)
    if dt == "bool":
        dt = "int64" if x.numel() < 8 else dt  # a tiny mask: nearest int dtype (size barely matters)
    if dt not in ElementwiseSpec.allowed_dtypes:
        raise Unmappable(f"dtype {dt} is not one of the family's dtypes")
    return ElementwiseSpec("fill", max(int(x.numel()), 1), dt)


@register([aten.floor_divide, aten.remainder], family="elementwise", note="op floordiv (one full input)")
def _floordiv(call: OpCall) -> KernelSpec:
    ref = call.args[0]
    return _elementwise("floordiv", call, dtype_from=ref if dtype_name(ref) in ElementwiseSpec.allowed_dtypes else None)


# pointwise ops: classified by name into the nearest ElementwiseSpec op
_UNARY_NAMED = {"relu": "relu", "silu": "silu", "gelu": "gelu", "sigmoid": "sigmoid"}
_TRANSCENDENTAL = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "tanh", "erf", "erfc", "erfinv",
                   "rsqrt", "sqrt", "sin", "cos", "tan", "pow", "reciprocal", "softplus", "elu", "mish",
                   "hardswish", "hardsigmoid", "leaky_relu", "logit", "atan", "asin", "acos", "sinh", "cosh",
                   "sign", "sgn", "lgamma", "digamma"}
_ADD_LIKE = {"add", "sub", "rsub", "maximum", "minimum", "fmax", "fmin", "eq", "ne", "lt", "le", "gt", "ge",
             "bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or", "logical_xor", "remainder",
             "fmod", "atan2", "hypot", "copysign", "threshold"}
_MUL_LIKE = {"mul", "div", "true_divide", "floor_divide", "xlogy"}


def _pointwise_op(name: str, call: OpCall) -> str:
    """The nearest ElementwiseSpec op for a pointwise aten op."""
    base = name.rstrip("_")
    tensors = [a for a in call.args if isinstance(a, torch.Tensor)]
    out_numel = _out_numel(call)
    full = [t for t in tensors if t.numel() == out_numel]
    if base in _UNARY_NAMED:
        return _UNARY_NAMED[base]
    if base.endswith("_backward"):
        return "mul" if len(full) >= 2 else "scale"
    if base in ("where", "addcmul", "addcdiv", "lerp", "clamp", "clip") and len(full) >= 2:
        return "add"  # ternary: nearest with two full-size inputs (a third, often smaller, is not counted)
    if len(tensors) <= 1 or len(full) <= 1:
        if base in _TRANSCENDENTAL:
            return "sigmoid"  # one input, a few FLOPs (a transcendental counted as one)
        return "scale" if len(tensors) == 2 or base in _MUL_LIKE | _ADD_LIKE else "relu"
    if base in _MUL_LIKE:
        return "mul"
    return "add"


class _PointwiseMapper:
    def __call__(self, call: OpCall) -> KernelSpec:
        name = call.func.overloadpacket.__name__
        tensors = [a for a in call.args if isinstance(a, torch.Tensor)]
        allowed = ElementwiseSpec.allowed_dtypes
        # the compute dtype: a float input first (comparisons write bool), else any input the family knows
        ref = next((t for t in tensors if t.is_floating_point() and dtype_name(t) in allowed), None)
        ref = ref if ref is not None else next((t for t in tensors if dtype_name(t) in allowed), None)
        return _elementwise(_pointwise_op(name, call), call, dtype_from=ref)


POINTWISE_NOTE = ("any op tagged torch.Tag.pointwise: relu/silu/gelu/sigmoid by name; other transcendental unary "
                  "ops as sigmoid; binary ops as add or mul (both inputs full size) or scale (one broadcast); "
                  "ternary (where, addcmul, lerp) as add (nearest: the third input is not counted); "
                  "*_backward ops as mul; comparisons counted in the input's float dtype")
_POINTWISE = _PointwiseMapper()


def pointwise_entry(func: Any) -> Entry | None:
    """Registry entry for ops tagged pointwise by PyTorch (native_functions.yaml tags)."""
    if torch.Tag.pointwise in getattr(func, "tags", ()):
        return Entry("elementwise", _POINTWISE, POINTWISE_NOTE)
    return None


_BACKWARD_POINTWISE = [getattr(aten, n) for n in ("threshold_backward", "silu_backward", "gelu_backward",
                                                  "sigmoid_backward", "tanh_backward", "hardswish_backward",
                                                  "leaky_relu_backward", "elu_backward") if hasattr(aten, n)]
register(_BACKWARD_POINTWISE, family="elementwise", note=POINTWISE_NOTE)(_POINTWISE)


@register([aten.embedding_dense_backward], family="scatter",
          note="embedding backward = sum of output-gradient rows into the weight rows (index_add)")
def _embedding_backward(call: OpCall) -> KernelSpec:
    grad, indices, num_weights = call.args[0], call.args[1], int(call.args[2])
    width = int(grad.shape[-1])
    cv, ascending = index_stats(indices, num_weights)
    return ScatterSpec(max(int(indices.numel()), 1), width, num_weights, "sum", "index_add", cv, ascending,
                       _spec_dtype(grad, ScatterSpec.allowed_dtypes))


def lookup(func: Any) -> Entry | None:
    """The registry entry of an aten overload: explicit entries first, then pointwise by tag."""
    return entry_for(func) or pointwise_entry(func)


def classify(call: OpCall) -> tuple[str, Any]:
    """("view", None) | ("kernel", spec) | ("unmapped", reason)."""
    func = call.func
    if func.overloadpacket in NO_KERNEL_PACKETS or is_view(func):
        return "view", None
    entry = lookup(func)
    if entry is None:
        return "unmapped", "no registry entry"
    try:
        return "kernel", entry.mapper(call)
    except (Unmappable, ValueError) as exc:  # ValueError: a descriptor refused the fields
        return "unmapped", f"{entry.family}: {exc}"
    except Exception as exc:  # a mapper bug must not break the user's run: the op falls back, listed
        return "unmapped", f"{entry.family}: mapper failed ({type(exc).__name__}: {exc})"
