"""Sparse-dense matmul: out[N_dst, F] = A[N_dst, N_src] (CSR) @ X[N_src, F], gather and
sum-aggregation fused (``torch.sparse.mm``; aten ``_sparse_addmm``/``_sparse_mm``, and ``mm``
with a CSR or COO operand via ``costmodel.families.gemm``; a COO operand maps here as the
nearest family, its fields read from its non-zeros)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import pandas as pd
import torch

from costmodel.families.aten_map import OpCall, Unmappable, aten, register, spec_dtype
from costmodel.families.columns import AGGREGATION_RANGE_FEATURES, aggregation_features, column, elem_bytes, log10
from costmodel.families.descriptor import INDEX_BYTES, KernelSpec, check_cv, check_positive
from costmodel.families.indices import column_pattern, index_for_share, pattern_of_counts, realised_cv
from costmodel.families.inputs import csr_from_index, randn, skewed_index
from costmodel.families.registry import SuiteContext, grid, register_family


# ----------------------------------------------------------------------------- descriptor


@dataclass(frozen=True)
class SpmmSpec(KernelSpec):
    """out[N_dst, F] = A[N_dst, N_src] @ X[N_src, F] with A in CSR holding ``nnz`` values.

    Gather and sum-aggregation fused in one sparse-dense matmul (``torch.sparse.mm``).
    ``index_cv`` is the coefficient of variation of the CSR row lengths (in-degree).
    ``src_cv`` and ``src_read_share`` describe the column indices, i.e. which rows of X are
    read: the CV of how often each of the N_src rows is read, and the share read at least
    once. They set the kernel's cache footprint: a skewed graph (R-MAT at a = 0.7) reads
    38% of X and runs 1.4-1.6x faster than the same CSR with uniform columns (the AMD EPYC VM;
    README, "Second pass"). Left unset (None) they
    mean uniform random columns, which is what rows measured before they existed ran.
    """

    family: ClassVar[str] = "spmm"
    nnz: int
    width: int
    num_dst: int
    num_src: int
    index_cv: float = 0.0
    dtype: str = "float32"
    src_cv: float | None = None
    src_read_share: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "nnz", "width", "num_dst", "num_src")
        check_cv(self, "index_cv")
        if (self.src_cv is None) != (self.src_read_share is None):
            raise ValueError("SpmmSpec.src_cv and SpmmSpec.src_read_share are given together or not at all, "
                             f"got src_cv={self.src_cv!r}, src_read_share={self.src_read_share!r}")
        if self.src_cv is not None:
            check_cv(self, "src_cv")
            share = self.src_read_share
            if not isinstance(share, (int, float)) or not 0 < share <= 1:
                raise ValueError(f"SpmmSpec.src_read_share must be in (0, 1], got {share!r}")

    def columns(self) -> tuple[float, float]:
        """(src_cv, src_read_share) in effect: as given, or those of uniform random columns.

        Uniform draws of nnz columns among N_src hit each row Poisson(m) times, m = nnz/N_src:
        CV = 1/sqrt(m), and a row is read at least once with probability 1 - exp(-m)."""
        if self.src_cv is not None and self.src_read_share is not None:
            return float(self.src_cv), float(self.src_read_share)
        m = self.nnz / self.num_src
        return 1.0 / math.sqrt(m), 1.0 - math.exp(-m)

    def flops(self) -> float:
        # One multiply and one add per non-zero and feature column (standard SpMM count).
        return 2.0 * self.nnz * self.width

    def bytes_moved(self) -> float:
        # CSR values + column indices + row pointers, the rows of X that are read (once
        # each), out written once.
        csr = self.nnz * (self.elem_bytes + INDEX_BYTES) + (self.num_dst + 1) * INDEX_BYTES
        x_rows = self.columns()[1] * self.num_src
        return float(csr + (x_rows + self.num_dst) * self.width * self.elem_bytes)


# ----------------------------------------------------------------------------- suite


def suite(cfg: Mapping[str, Any], ctx: SuiteContext) -> list[tuple[str, KernelSpec]]:
    """The spmm grid. ``columns`` (optional) lists the column-index patterns: null for
    uniform random columns, or [src_cv, src_read_share] as wished; each descriptor carries
    the pattern its index realises (the runner draws it with seed 1, as here)."""
    out: list[tuple[str, KernelSpec]] = []
    for nnz, width, nodes, cv in grid(cfg, "nnz", "width", "nodes", "index_cv"):
        rows_cv = realised_cv(nnz, nodes, cv, sorted=True)
        for pattern in cfg.get("columns") or [None]:
            if pattern is None:
                out.append(("grid", SpmmSpec(nnz, width, nodes, nodes, rows_cv, ctx.dtype)))
                continue
            if len(pattern) != 2:
                raise ValueError(f"suite spmm.columns entries are null or [src_cv, src_read_share], got {pattern!r}")
            _, src_cv, share = index_for_share(nnz, nodes, float(pattern[0]), float(pattern[1]), seed=1)
            out.append(("grid", SpmmSpec(nnz, width, nodes, nodes, rows_cv, ctx.dtype, *column_pattern(src_cv, share))))
    return out


# ----------------------------------------------------------------------------- torch call


def spmm(adjacency_csr: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """CSR [N_dst, N_src] @ dense [N_src, F] (gather and sum fused)."""
    return torch.sparse.mm(adjacency_csr, x)


# ----------------------------------------------------------------------------- runner


def build(spec: SpmmSpec, device: torch.device, gen: torch.Generator, seed: int) -> tuple[Callable[..., Any], tuple]:
    dst = skewed_index(spec.nnz, spec.num_dst, spec.index_cv, True, seed, device).cpu()
    if spec.src_cv is None or spec.src_read_share is None:  # unset: uniform random columns
        src_ids = torch.randint(0, spec.num_src, (spec.nnz,), generator=gen)
    else:
        columns = index_for_share(spec.nnz, spec.num_src, spec.src_cv, spec.src_read_share, seed=seed + 1)[0]
        src_ids = torch.from_numpy(columns.copy())
    adjacency = csr_from_index(dst, src_ids, spec.num_dst, spec.num_src, None, getattr(torch, spec.dtype), device)
    return spmm, (adjacency, randn((spec.num_src, spec.width), spec.dtype, device, gen))


# ----------------------------------------------------------------------------- features


def spmm_columns(t: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(src_cv, src_read_share) of spmm rows, unset cells filled as ``SpmmSpec.columns`` does
    (uniform random columns: CV 1/sqrt(m), share 1 - exp(-m), m = nnz/num_src)."""
    m = column(t, "nnz") / column(t, "num_src")
    cv = t["src_cv"].to_numpy(dtype=np.float64) if "src_cv" in t else np.full(len(t), np.nan)
    share = t["src_read_share"].to_numpy(dtype=np.float64) if "src_read_share" in t else np.full(len(t), np.nan)
    unset = np.isnan(cv) | np.isnan(share)
    return np.where(unset, 1.0 / np.sqrt(m), cv), np.where(unset, -np.expm1(-m), share)


def features(t: pd.DataFrame, ceilings: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The aggregation features over the non-zeros, plus the column skew and the bytes of the
    X rows it reads (its cache footprint)."""
    src_cv, share = spmm_columns(t)
    return {**aggregation_features(t, column(t, "nnz"), column(t, "num_dst")),
            "log1p_src_cv": np.log1p(src_cv), "src_read_share": share,
            "log_src_read_bytes": log10(share * column(t, "num_src") * column(t, "width") * elem_bytes(t))}


# ----------------------------------------------------------------------------- aten ops


def _host(index: torch.Tensor) -> np.ndarray:
    return index.detach().to("cpu", torch.int64).numpy()


def spmm_spec(sparse: torch.Tensor, dense: torch.Tensor, call: OpCall, init: torch.Tensor | None) -> KernelSpec:
    """The SpmmSpec of ``sparse @ dense``, ``sparse`` in CSR or COO: every field from its
    non-zeros (a 100k x 100k COO with 3 non-zeros is nnz = 3, not 10^10 elements). A COO
    operand runs torch's COO kernel, not the CSR one the family is measured on: the nearest
    family, the same work over the same non-zeros."""
    if dense.dim() != 2 or sparse.dim() != 2:
        raise Unmappable("sparse matmul with a non-matrix operand")
    num_dst, num_src = int(sparse.shape[0]), int(sparse.shape[1])
    if sparse.layout == torch.sparse_csr:
        row_lengths = np.diff(_host(sparse.crow_indices()))
        cols = _host(sparse.col_indices())
    elif sparse.layout == torch.sparse_coo:
        if sparse.dense_dim() != 0:
            raise Unmappable("hybrid COO (values with dense dims) is not described")
        rows, cols = _host(sparse._indices())
        row_lengths = np.bincount(rows, minlength=num_dst)
    else:
        raise Unmappable(f"sparse layout {sparse.layout} is not described (CSR and COO are)")
    cv, _ = pattern_of_counts(row_lengths)
    src_cv, src_share = pattern_of_counts(np.bincount(cols, minlength=num_src))
    if init is not None:
        call.absorbs = init
    return SpmmSpec(max(int(sparse._nnz()), 1), int(dense.shape[1]), num_dst, num_src, cv,
                    spec_dtype(dense, SpmmSpec.allowed_dtypes), src_cv, src_share)


@register([aten._sparse_addmm, aten._sparse_mm], family="spmm", sparse=True,
          note="CSR (or COO: nearest, the same work over its non-zeros) x dense; index_cv = CV of the row lengths "
               "(in-degree), src_cv and src_read_share from the column indices (which rows of the dense operand "
               "are read); a zero fill of the output just before is part of the call (as in costmodel.families.spmm.spmm)")
def _sparse(call: OpCall) -> KernelSpec:
    if call.func.overloadpacket is aten._sparse_addmm:
        return spmm_spec(call.args[1], call.args[2], call, call.args[0])
    return spmm_spec(call.args[0], call.args[1], call, None)


register_family(SpmmSpec, suite=suite, build=build, features=features,
                range_features=AGGREGATION_RANGE_FEATURES)
