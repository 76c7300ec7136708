"""Top-k values and indices along the last dim of a [rows, cols] tensor (the router's choice)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import math

import numpy as np
import pandas as pd
import torch

from costmodel.families.aten_map import OpCall, aten, register, spec_dtype
from costmodel.families.columns import column, log10
from costmodel.families.descriptor import INDEX_BYTES, KernelSpec, check_positive
from costmodel.families.inputs import randn
from costmodel.families.registry import SuiteContext, grid, register_family


# ----------------------------------------------------------------------------- descriptor


@dataclass(frozen=True)
class TopkSpec(KernelSpec):
    """Top-k values and indices along the last dim of a [rows, cols] tensor."""

    family: ClassVar[str] = "topk"
    rows: int
    cols: int
    k: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "rows", "cols", "k")
        if self.k > self.cols:
            raise ValueError(f"TopkSpec.k must be in [1, cols={self.cols}], got {self.k}")

    def flops(self) -> float:
        # Comparisons, not floating-point arithmetic: a heap selection does
        # ~cols*log2(k+1) compares per row; counted as FLOPs for the roofline.
        return float(self.rows * self.cols * math.log2(self.k + 1))

    def bytes_moved(self) -> float:
        return float(self.rows * self.cols * self.elem_bytes + self.rows * self.k * (self.elem_bytes + INDEX_BYTES))


# ----------------------------------------------------------------------------- suite


def suite(cfg: Mapping[str, Any], ctx: SuiteContext) -> list[tuple[str, KernelSpec]]:
    """Rows x cols x k, where k <= cols."""
    return [("grid", TopkSpec(r, c, k, ctx.dtype)) for r, c, k in grid(cfg, "rows", "cols", "k") if k <= c]


# ----------------------------------------------------------------------------- torch call


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = torch.topk(x, k, dim=-1)
    return values, indices


# ----------------------------------------------------------------------------- runner


def build(spec: TopkSpec, device: torch.device, gen: torch.Generator, seed: int) -> tuple[Callable[..., Any], tuple]:
    k = spec.k
    return (lambda x: topk(x, k)), (randn((spec.rows, spec.cols), spec.dtype, device, gen),)


# ----------------------------------------------------------------------------- features


#: ATen's CPU top-k (``topk_impl_loop`` in aten/src/ATen/native/TopKImpl.h) copies each row
#: into (value, index) pairs, then selects with ``std::partial_sort`` (a k-heap: about
#: cols*log2(k) compares) when ``k * 64 <= cols``, and otherwise with ``std::nth_element``
#: (introselect: linear in cols on average, Musser 1997) followed by ``std::sort`` of the k,
#: and parallelises over rows in chunks of GRAIN_SIZE / cols (SortingKernel.cpp, ``topk_kernel``).
#: The switch is a step the shape alone hides: on the Intel VM's profile, 24,576 rows of 60
#: columns (k=1, nth_element) took 2.3x as long as 128 columns (k=1, partial_sort).
CPU_PARTIAL_SORT_MAX_K_SHARE = 64


def uses_partial_sort(rows_cols_k: pd.DataFrame, device_kind: str) -> np.ndarray:
    """1.0 where ATen's CPU top-k takes the partial-sort path (k*64 <= cols), else 0.0;
    all 0.0 off the CPU (CUDA selects by radix, without this switch)."""
    if device_kind != "cpu":
        return np.zeros(len(rows_cols_k))
    k, cols = column(rows_cols_k, "k"), column(rows_cols_k, "cols")
    return (k * CPU_PARTIAL_SORT_MAX_K_SHARE <= cols).astype(np.float64)


def features(t: pd.DataFrame, ceilings: Mapping[str, Any]) -> dict[str, np.ndarray]:
    # The path switch alone, not also a compares-per-row count on each path: with that count the
    # trend extrapolated the Intel profile's largest shapes to a p90 of 303%; with the switch alone,
    # held out by shape group, Intel 10.0 -> 8.4% median and EPYC 14.3 -> 11.0%, and the
    # extrapolation split improved on both (24.0 -> 19.4%, 19.5 -> 17.3%).
    return {"log_rows": log10(column(t, "rows")), "log_cols": log10(column(t, "cols")),
            "log_k": log10(column(t, "k")),
            "partial_sort": uses_partial_sort(t, str(ceilings.get("device_kind", "cpu")))}


# ----------------------------------------------------------------------------- aten ops


@register([aten.topk], family="topk", note="rows = numel / size(dim)")
def _topk(call: OpCall) -> KernelSpec:
    x, k = call.args[0], int(call.arg(1, "k"))
    dim = call.arg(2, "dim", -1)
    cols = int(x.shape[dim]) if x.dim() else 1
    return TopkSpec(max(int(x.numel()) // max(cols, 1), 1), cols, max(k, 1), spec_dtype(x, TopkSpec.allowed_dtypes))


register_family(TopkSpec, suite=suite, build=build, features=features,
                range_features=("log_rows", "log_cols", "log_k"))
