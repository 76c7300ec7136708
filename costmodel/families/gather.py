"""Gather: out[E, F] = src[index] (``index_select`` on rows; aten ``index_select``,
``embedding``, advanced indexing ``index``, ``gather``, and ``nll_loss`` as the nearest),
each timed through the aten op it came from (``op``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import pandas as pd
import torch

from costmodel.families.aten_map import OpCall, Unmappable, aten, index_stats, prod, register, spec_dtype
from costmodel.families.columns import AGGREGATION_RANGE_FEATURES, aggregation_features, column, flag, onehot, optional_column
from costmodel.families.descriptor import (
    FLOAT_DTYPES, INDEX_BYTES, KernelSpec, check_cv, check_optional_choice, check_positive,
)
from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.indices import realised_cv
from costmodel.families.inputs import randn, skewed_index
from costmodel.families.registry import SuiteContext, grid, register_family


# ----------------------------------------------------------------------------- descriptor


GATHER_OPS = ("index_select", "index", "gather")


@dataclass(frozen=True)
class GatherSpec(KernelSpec):
    """out[E, F] = src[index] with index[E] in [0, num_src) (``index_select`` on rows).

    ``index_cv`` is the coefficient of variation of how often each source row is read
    (0 = every row equally often; large = a few hot rows), ``sorted`` whether the index
    is ascending.

    ``op`` is the aten kernel that moves the rows, as they differ several-fold on the CPU:
    None is ``index_select`` (and ``embedding``, which calls it), "index" advanced indexing
    ``src[index]`` (a TensorIterator over every element: on the development VM 35 us where
    ``index_select`` took 6 us for 64 rows of 1024 floats, and 89 vs 61 ms for 64 rows of
    4M floats), "gather" ``torch.gather`` along dim 0.
    """

    family: ClassVar[str] = "gather"
    allowed_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES + ("int64",)
    num_rows: int
    width: int
    num_src: int
    index_cv: float = 0.0
    sorted: bool = False
    dtype: str = "float32"
    op: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "num_rows", "width", "num_src")
        check_cv(self, "index_cv")
        check_optional_choice(self, "op", GATHER_OPS)  # index_select unset: the keys of rows from before ``op``

    def flops(self) -> float:
        return 0.0  # pure data movement

    def bytes_moved(self) -> float:
        # E*F elements read and written, plus the E-entry int64 index read once.
        return float(2 * self.num_rows * self.width * self.elem_bytes + self.num_rows * INDEX_BYTES)

    def intensity(self) -> float:
        return 0.0


# ----------------------------------------------------------------------------- suite


def suite(cfg: Mapping[str, Any], ctx: SuiteContext) -> list[tuple[str, KernelSpec]]:
    """Rows x width x sources x index CV (as realised by the runner's index) x order."""
    return [("grid", GatherSpec(rows, width, src, realised_cv(rows, src, cv, sorted=bool(srt)), bool(srt), ctx.dtype))
            for rows, width, src, cv, srt in grid(cfg, "num_rows", "width", "num_src", "index_cv", "sorted")]


# ----------------------------------------------------------------------------- torch call


def gather(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return src.index_select(0, index)


def gather_by_indexing(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``src[index]``: aten ``index``, another kernel than ``index_select`` on the CPU."""
    return src[index]


def gather_elements(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``torch.gather`` along dim 0."""
    return torch.gather(src, 0, index)


# ----------------------------------------------------------------------------- runner


def build(spec: GatherSpec, device: torch.device, gen: torch.Generator, seed: int) -> tuple[Callable[..., Any], tuple]:
    src = randn((spec.num_src, spec.width) if spec.width > 1 else (spec.num_src,), spec.dtype, device, gen)
    index = skewed_index(spec.num_rows, spec.num_src, spec.index_cv, spec.sorted, seed, device)
    if spec.op == "index":
        return gather_by_indexing, (src, index)
    if spec.op == "gather":
        return gather_elements, (src, index[:, None].expand(-1, spec.width) if spec.width > 1 else index)
    return gather, (src, index)


# ----------------------------------------------------------------------------- features


def features(t: pd.DataFrame, ceilings: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The aggregation features over the rows read, whether the index is ascending, and the
    aten op (``op``; unset = index_select)."""
    return {**aggregation_features(t, column(t, "num_rows"), column(t, "num_src")), "sorted": flag(t["sorted"]),
            **onehot(optional_column(t, "op", GATHER_OPS[0]), GATHER_OPS[1:], "op")}


# ----------------------------------------------------------------------------- aten ops


def _gather_spec(index: torch.Tensor, width: int, num_src: int, src: torch.Tensor, op: str | None = None) -> KernelSpec:
    if index.dtype == torch.bool:
        raise Unmappable("boolean-mask indexing")
    cv, ascending = index_stats(index, num_src)
    return GatherSpec(max(int(index.numel()), 1), max(int(width), 1), max(int(num_src), 1), cv, ascending,
                      spec_dtype(src, GatherSpec.allowed_dtypes), op)


@register([aten.index_select], family="gather", note="rows of dim 0; other dims as rows of the outer block")
def _index_select(call: OpCall) -> KernelSpec:
    src, dim, index = call.args[0], call.args[1] % max(call.args[0].dim(), 1), call.args[2]
    width = prod(src.shape[dim + 1:])
    if dim != 0:
        raise Unmappable("index_select along a dim other than 0")
    return _gather_spec(index, width, int(src.shape[0]) if src.dim() else 1, src)


@register([aten.embedding], family="gather", note="embedding lookup = row gather of the weight table")
def _embedding(call: OpCall) -> KernelSpec:
    weight, indices = call.args[0], call.args[1]
    return _gather_spec(indices, int(weight.shape[1]), int(weight.shape[0]), weight)


@register([aten.index], family="gather",
          note="op=index: advanced indexing x[idx] (or x[i, j] on leading dims: rows of the flattened block at the "
               "linear index); a boolean mask as the rows it keeps, gathered in order; indices after a full "
               "slice as the nearest elementwise copy of the input")
def _index(call: OpCall) -> KernelSpec:
    src, indices = call.args[0], list(call.args[1])
    while indices and indices[-1] is None:
        indices.pop()
    masks = [j for j, i in enumerate(indices) if i is not None and i.dtype == torch.bool]
    if masks == [len(indices) - 1] and all(i is None for i in indices[:-1]) and call.first_out is not None:
        return _mask_spec(src, indices[-1], len(indices) - 1, call.first_out)
    if not indices or any(i is None or i.dtype == torch.bool for i in indices):
        # indices after a full slice: nearest, one copy pass of the input
        return ElementwiseSpec("copy", max(int(src.numel()), 1), spec_dtype(src, ElementwiseSpec.allowed_dtypes))
    if len(indices) == 1:
        return _gather_spec(indices[0], prod(src.shape[1:]), int(src.shape[0]), src, "index")
    # x[i, j, ...] on the leading dims: rows of the flattened leading block, at the linear index
    lead = [int(s) for s in src.shape[:len(indices)]]
    idx = torch.broadcast_tensors(*[i.detach().to("cpu", torch.int64) for i in indices])
    linear = torch.zeros_like(idx[0])
    for i, size in zip(idx, lead):
        linear = linear * size + i
    return _gather_spec(linear, prod(src.shape[len(indices):]), prod(lead), src, "index")


def _mask_spec(src: torch.Tensor, mask: torch.Tensor, sliced: int, out: torch.Tensor) -> KernelSpec:
    """``src[..., mask]`` with ``sliced`` full slices before the mask: ATen turns the mask into
    the ascending positions it keeps (``nonzero``) and indexes with them, so the kept rows of
    width ``prod(src.shape[sliced + mask.dim():])`` are gathered in order, each read once:
    hits per source row are 1 for a kept share p and 0 otherwise, a CV of sqrt((1 - p) / p).
    Behind a full slice every element is moved on its own (width 1), as the TensorIterator runs it:
    in situ PyG's ``edge_index[:, mask]`` (2 x 135k int64) took 233-247 us where a copy of the
    input, its mapping until 2026-12-07, took 10 us on its runner."""
    sources = max(prod(src.shape[sliced:sliced + mask.dim()]), 1)
    kept = int(out.shape[sliced]) if out.dim() > sliced else 0
    width = 1 if sliced else prod(src.shape[mask.dim():])
    rows = max(int(out.numel()) // max(width, 1), 1)
    num_src = sources * (prod(src.shape[:sliced]) * prod(src.shape[sliced + mask.dim():]) if sliced else 1)
    share = max(kept, 1) / sources
    return GatherSpec(rows, max(int(width), 1), max(int(num_src), 1), round(float(np.sqrt(max(1 - share, 0) / share)), 3),
                      True, spec_dtype(src, GatherSpec.allowed_dtypes), "index")


@register([aten.gather], family="gather",
          note="op=gather; along dim 0 with the index broadcast over the other dims (stride 0: index.expand, "
               "the backward of PyG's scatter) as rows of the trailing width; otherwise, nearest, "
               "index.numel() rows of width 1 out of size(dim) sources")
def _gather(call: OpCall) -> KernelSpec:
    src, dim, index = call.args[0], call.args[1], call.args[2]
    if not src.dim():
        return _gather_spec(index, 1, 1, src, "gather")
    dim = dim % src.dim()
    if dim == 0 and index.dim() > 1 and all(index.stride(d) == 0 for d in range(1, index.dim())):
        # one index per row, broadcast along it: the kernel reads rows (its index reads are one per row)
        return _gather_spec(index.reshape(index.shape[0], -1)[:, 0], prod(index.shape[1:]), int(src.shape[0]), src,
                            "gather")
    return _gather_spec(index, 1, int(src.shape[dim]), src, "gather")


@register([aten.nll_loss_forward], family="gather",
          note="op=gather; nearest: picks one log-probability per row: a gather of N rows of width 1 out of C")
def _nll(call: OpCall) -> KernelSpec:
    logp, target = call.args[0], call.args[1]
    return _gather_spec(target.clamp(min=0), 1, int(logp.shape[-1]), logp, "gather")


register_family(GatherSpec, suite=suite, build=build, features=features,
                range_features=AGGREGATION_RANGE_FEATURES)
