"""Scatter / segment reduce: out[N, F] (reduce)= src[E, F] at index[E] (``index_add_``,
``scatter_reduce``, torch-scatter, ``index_copy_``, ``index_put_`` with accumulate; and the
embedding backward)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import pandas as pd
import torch

from costmodel.families.aten_map import OpCall, Unmappable, aten, dtype_name, index_stats, prod, register, spec_dtype
from costmodel.families.columns import AGGREGATION_RANGE_FEATURES, aggregation_features, column, flag, onehot
from costmodel.families.descriptor import INDEX_BYTES, KernelSpec, check_choice, check_cv, check_positive
from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.indices import realised_cv
from costmodel.families.inputs import randn, skewed_index
from costmodel.families.registry import SuiteContext, grid, register_family


# ----------------------------------------------------------------------------- descriptor


SCATTER_BACKENDS = ("index_add", "scatter_reduce", "torch_scatter", "index_copy", "index_put")
SCATTER_REDUCES = ("sum", "mean", "max", "copy")
#: which reductions each scatter backend implements
SCATTER_BACKEND_REDUCES: dict[str, tuple[str, ...]] = {
    "index_add": ("sum",),
    "scatter_reduce": ("sum", "mean", "max"),
    "torch_scatter": ("sum", "mean", "max"),
    "index_copy": ("copy",),
    # ``index_put_(..., accumulate=True)``: autograd's backward of advanced indexing. On CPU
    # it accumulates serially, 10x slower than index_add_ on the same rows (HF batched_mm's
    # weight-gradient scatter: 696 ms against 73 ms predicted as index_add)
    "index_put": ("sum",),
}


@dataclass(frozen=True)
class ScatterSpec(KernelSpec):
    """out[N, F] (reduce)= src[E, F] at index[E] in [0, num_dst).

    ``backend`` is the implementation (``index_add_``, ``scatter_reduce``, torch-scatter's
    ``scatter``, ``index_copy_`` for a plain scatter-copy, ``index_put_`` with accumulate),
    ``reduce`` the reduction,
    ``index_cv`` the coefficient of variation of destination in-degree, ``sorted``
    whether the index is ascending (destination-sorted edges).
    """

    family: ClassVar[str] = "scatter"
    num_rows: int
    width: int
    num_dst: int
    reduce: str = "sum"
    backend: str = "index_add"
    index_cv: float = 0.0
    sorted: bool = False
    dtype: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "num_rows", "width", "num_dst")
        check_choice(self, "backend", SCATTER_BACKENDS)
        check_choice(self, "reduce", SCATTER_BACKEND_REDUCES[self.backend])
        check_cv(self, "index_cv")
        if self.backend == "index_copy" and (self.index_cv != 0 or self.num_rows > self.num_dst):
            raise ValueError(
                "ScatterSpec with backend='index_copy' writes distinct destinations: it needs index_cv=0 "
                f"and num_rows <= num_dst, got index_cv={self.index_cv}, num_rows={self.num_rows}, num_dst={self.num_dst}"
            )

    def flops(self) -> float:
        # One add (or compare) per incoming element; a copy does no arithmetic.
        return 0.0 if self.reduce == "copy" else float(self.num_rows * self.width)

    def bytes_moved(self) -> float:
        # Read E*F source elements and the index, write the N*F destination once.
        return float(
            (self.num_rows + self.num_dst) * self.width * self.elem_bytes + self.num_rows * INDEX_BYTES
        )


# ----------------------------------------------------------------------------- suite


def suite(cfg: Mapping[str, Any], ctx: SuiteContext) -> list[tuple[str, KernelSpec]]:
    """Rows x width x destinations x index CV x order x backend (those this machine has),
    each with the reductions it implements (``reduce`` filters them)."""
    out: list[tuple[str, KernelSpec]] = []
    allowed = set(ctx.scatter_backends)
    for rows, width, dst, cv, srt, backend in grid(cfg, "num_rows", "width", "num_dst", "index_cv", "sorted", "backend"):
        if backend not in SCATTER_BACKEND_REDUCES:
            raise ValueError(f"suite scatter.backend must be among {sorted(SCATTER_BACKEND_REDUCES)}, got {backend!r}")
        if backend not in allowed:
            continue  # e.g. torch_scatter not installed: measured where it is
        for reduce in SCATTER_BACKEND_REDUCES[backend]:
            if reduce not in cfg.get("reduce", ["sum", "mean", "max", "copy"]):
                continue
            if backend == "index_copy" and (rows > dst or cv != cfg["index_cv"][0]):
                continue  # a copy needs distinct destinations: one index pattern only
            cv_real = 0.0 if backend == "index_copy" else realised_cv(rows, dst, cv, sorted=bool(srt))
            out.append(("grid", ScatterSpec(rows, width, dst, reduce, backend, cv_real, bool(srt), ctx.dtype)))
    return out


# ----------------------------------------------------------------------------- torch call


def torch_scatter_version() -> str | None:
    """Installed torch-scatter version, or None (it is an optional backend)."""
    try:
        import torch_scatter  # noqa: F401
    except Exception:  # ImportError, or an ABI mismatch with the installed torch
        return None
    return str(getattr(torch_scatter, "__version__", "unknown"))


def scatter_backends_available() -> tuple[str, ...]:
    """Scatter backends usable in this process (torch-scatter only where installed)."""
    if torch_scatter_version() is None:
        return tuple(b for b in SCATTER_BACKENDS if b != "torch_scatter")
    return SCATTER_BACKENDS


def check_scatter_backend(backend: str) -> None:
    if backend not in SCATTER_BACKENDS:
        raise ValueError(f"scatter backend must be one of {list(SCATTER_BACKENDS)}, got {backend!r}")
    if backend not in scatter_backends_available():
        raise ValueError(
            "scatter backend 'torch_scatter' is not installed here: "
            "pip install --no-build-isolation torch-scatter (compiles against the installed torch); "
            f"available: {list(scatter_backends_available())}"
        )


def scatter(
    src: torch.Tensor, index: torch.Tensor, num_dst: int, *, reduce: str, backend: str
) -> torch.Tensor:
    """Reduce rows of ``src`` [E, F] into a fresh [num_dst, F] at ``index`` [E].

    Rows of the output that receive nothing are 0 for every backend and reduction.
    """
    width = src.shape[1]
    if backend == "index_add":
        return torch.zeros(num_dst, width, dtype=src.dtype, device=src.device).index_add_(0, index, src)
    if backend == "index_copy":
        return torch.zeros(num_dst, width, dtype=src.dtype, device=src.device).index_copy_(0, index, src)
    if backend == "index_put":
        return torch.zeros(num_dst, width, dtype=src.dtype, device=src.device).index_put_((index,), src, accumulate=True)
    if backend == "scatter_reduce":
        out = torch.zeros(num_dst, width, dtype=src.dtype, device=src.device)
        torch_reduce = {"sum": "sum", "mean": "mean", "max": "amax"}[reduce]
        return out.scatter_reduce_(0, index.view(-1, 1).expand_as(src), src, torch_reduce, include_self=False)
    if backend == "torch_scatter":
        import torch_scatter

        return torch_scatter.scatter(src, index, dim=0, dim_size=num_dst, reduce=reduce)
    raise ValueError(f"scatter backend must be one of {list(SCATTER_BACKENDS)}, got {backend!r}")


# ----------------------------------------------------------------------------- runner


def build(spec: ScatterSpec, device: torch.device, gen: torch.Generator, seed: int) -> tuple[Callable[..., Any], tuple]:
    src = randn((spec.num_rows, spec.width), spec.dtype, device, gen)
    if spec.backend == "index_copy":  # a copy needs distinct destinations
        perm = np.random.default_rng(seed).permutation(spec.num_dst)[: spec.num_rows]
        index = torch.from_numpy(np.sort(perm) if spec.sorted else perm).to(device)
    else:
        index = skewed_index(spec.num_rows, spec.num_dst, spec.index_cv, spec.sorted, seed, device)

    def run_scatter(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return scatter(src, index, spec.num_dst, reduce=spec.reduce, backend=spec.backend)

    return run_scatter, (src, index)


# ----------------------------------------------------------------------------- features


def features(t: pd.DataFrame, ceilings: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The aggregation features over the rows written, order, backend and reduction."""
    return {**aggregation_features(t, column(t, "num_rows"), column(t, "num_dst")), "sorted": flag(t["sorted"]),
            **onehot(t["backend"], SCATTER_BACKENDS, "backend"), **onehot(t["reduce"], SCATTER_REDUCES, "reduce")}


# ----------------------------------------------------------------------------- aten ops


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
        prod(dest.shape[1:]))
    num_dst = int(dest.shape[0])
    cv, ascending = index_stats(rows_idx, num_dst)
    if backend == "index_copy":
        cv = 0.0  # a copy writes distinct rows: the descriptor's index_cv is defined as 0
    call.absorbs = dest
    return ScatterSpec(num_rows, max(width, 1), num_dst, reduce, backend, cv, ascending,
                       spec_dtype(dest, ScatterSpec.allowed_dtypes))


def _check_dim0(dim: int, dest: torch.Tensor) -> None:
    if dim % max(dest.dim(), 1) != 0:
        raise Unmappable("scatter along a dim other than 0")


def _index_op(reduce: str, backend: str) -> Callable[[OpCall], KernelSpec]:
    """The mapper of ``index_add_``/``index_copy_``-style calls (dest, dim, index, src)."""

    def mapper(call: OpCall) -> KernelSpec:
        dest, dim, index, src = call.args[:4]
        _check_dim0(dim, dest)
        return _scatter_spec(call, dest, index, src, reduce, backend)

    return mapper


register([aten.index_add_, aten.index_add], family="scatter",
         note="backend index_add, reduce sum; a zero fill of the destination just before is part of the "
              "call (as in costmodel.families.scatter.scatter)")(_index_op("sum", "index_add"))
register([aten.index_copy_, aten.index_copy], family="scatter",
         note="backend index_copy, reduce copy")(_index_op("copy", "index_copy"))


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
        return ElementwiseSpec("copy", max(int(values.numel()), 1), spec_dtype(dest, ElementwiseSpec.allowed_dtypes))
    if not accumulate:
        if index.unique().numel() != index.numel() or index.numel() > dest.shape[0]:
            return _scatter_spec(call, dest, index, _expand_values(values, index, dest), "sum", "index_add")
        return _scatter_spec(call, dest, index, _expand_values(values, index, dest), "copy", "index_copy")
    return _scatter_spec(call, dest, index, _expand_values(values, index, dest), "sum", "index_put")


def _expand_values(values: torch.Tensor, index: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
    return values.expand(index.numel(), *dest.shape[1:]) if values.numel() < index.numel() * prod(dest.shape[1:]) else values


@register([aten.embedding_dense_backward], family="scatter",
          note="embedding backward = sum of output-gradient rows into the weight rows (index_add)")
def _embedding_backward(call: OpCall) -> KernelSpec:
    grad, indices, num_weights = call.args[0], call.args[1], int(call.args[2])
    width = int(grad.shape[-1])
    cv, ascending = index_stats(indices, num_weights)
    return ScatterSpec(max(int(indices.numel()), 1), width, num_weights, "sum", "index_add", cv, ascending,
                       spec_dtype(grad, ScatterSpec.allowed_dtypes))


register_family(ScatterSpec, suite=suite, build=build, features=features,
                range_features=AGGREGATION_RANGE_FEATURES)
