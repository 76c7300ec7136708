"""Row softmax of a [rows, cols] tensor, and the nearest home of row-wise passes
(``log_softmax``, layer and RMS norms, their backward passes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import pandas as pd
import torch

from costmodel.families.aten_map import OpCall, aten, prod, register, spec_dtype
from costmodel.families.columns import column, log10
from costmodel.families.descriptor import KernelSpec, check_positive
from costmodel.families.inputs import randn
from costmodel.families.registry import SuiteContext, grid, register_family


# ----------------------------------------------------------------------------- descriptor


@dataclass(frozen=True)
class SoftmaxSpec(KernelSpec):
    """Row softmax of a [rows, cols] tensor."""

    family: ClassVar[str] = "softmax"
    rows: int
    cols: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "rows", "cols")

    def flops(self) -> float:
        # Per element: max-compare, subtract, exp, sum-add, divide = 5 (online-softmax count,
        # Milakov & Gimelshein 2018).
        return 5.0 * self.rows * self.cols

    def bytes_moved(self) -> float:
        return float(2 * self.rows * self.cols * self.elem_bytes)


# ----------------------------------------------------------------------------- suite


def suite(cfg: Mapping[str, Any], ctx: SuiteContext) -> list[tuple[str, KernelSpec]]:
    return [("grid", SoftmaxSpec(r, c, ctx.dtype)) for r, c in grid(cfg, "rows", "cols")]


# ----------------------------------------------------------------------------- torch call


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


# ----------------------------------------------------------------------------- runner


def build(spec: SoftmaxSpec, device: torch.device, gen: torch.Generator, seed: int) -> tuple[Callable[..., Any], tuple]:
    return softmax, (randn((spec.rows, spec.cols), spec.dtype, device, gen),)


# ----------------------------------------------------------------------------- features


def features(t: pd.DataFrame, ceilings: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {"log_rows": log10(column(t, "rows")), "log_cols": log10(column(t, "cols"))}


# ----------------------------------------------------------------------------- aten ops


@register([aten._softmax, aten._log_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data],
          family="softmax", note="rows = numel / size(dim); log_softmax and the backward passes as the "
                                 "nearest family (one row-wise pass)")
def _softmax(call: OpCall) -> KernelSpec:
    backward = call.func.overloadpacket in (aten._softmax_backward_data, aten._log_softmax_backward_data)
    x, dim = call.args[0], int(call.args[2] if backward else call.args[1])
    cols = int(x.shape[dim]) if x.dim() else 1
    return SoftmaxSpec(max(int(x.numel()) // max(cols, 1), 1), max(cols, 1), spec_dtype(x, SoftmaxSpec.allowed_dtypes))


@register([aten.native_layer_norm, aten.native_layer_norm_backward, aten._fused_rms_norm,
           aten._fused_rms_norm_backward] if hasattr(aten, "_fused_rms_norm") else
          [aten.native_layer_norm, aten.native_layer_norm_backward],
          family="softmax", note="nearest family: a row-wise normalisation is one row pass like softmax "
                                 "(rows = numel / normalized size, cols = normalized size)")
def _norm(call: OpCall) -> KernelSpec:
    backward = call.func.overloadpacket.__name__.endswith("_backward")
    x, shape = (call.args[1], call.args[2]) if backward else (call.args[0], call.args[1])
    cols = prod(shape)
    return SoftmaxSpec(max(int(x.numel()) // max(cols, 1), 1), max(cols, 1), spec_dtype(x, SoftmaxSpec.allowed_dtypes))


register_family(SoftmaxSpec, suite=suite, build=build, features=features,
                range_features=("log_rows", "log_cols"))
