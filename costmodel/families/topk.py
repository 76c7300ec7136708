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


def features(t: pd.DataFrame, ceilings: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {"log_rows": log10(column(t, "rows")), "log_cols": log10(column(t, "cols")), "log_k": log10(column(t, "k"))}


# ----------------------------------------------------------------------------- aten ops


@register([aten.topk], family="topk", note="rows = numel / size(dim)")
def _topk(call: OpCall) -> KernelSpec:
    x, k = call.args[0], int(call.arg(1, "k"))
    dim = call.arg(2, "dim", -1)
    cols = int(x.shape[dim]) if x.dim() else 1
    return TopkSpec(max(int(x.numel()) // max(cols, 1), 1), cols, max(k, 1), spec_dtype(x, TopkSpec.allowed_dtypes))


register_family(TopkSpec, suite=suite, build=build, features=features,
                range_features=("log_rows", "log_cols", "log_k"))
