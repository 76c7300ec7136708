"""Histogram: count n int64 ids into bins (``torch.bincount``: expert loads, degrees)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import pandas as pd
import torch

from costmodel.families.aten_map import OpCall, aten, register
from costmodel.families.columns import column, log10
from costmodel.families.descriptor import INDEX_BYTES, KernelSpec, check_positive
from costmodel.families.registry import SuiteContext, grid, register_family


# ----------------------------------------------------------------------------- descriptor


@dataclass(frozen=True)
class HistogramSpec(KernelSpec):
    """Count n int64 ids into ``bins`` bins (``torch.bincount``)."""

    family: ClassVar[str] = "histogram"
    allowed_dtypes: ClassVar[tuple[str, ...]] = ("int64",)
    n: int
    bins: int
    dtype: str = "int64"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "n", "bins")

    def flops(self) -> float:
        return 0.0  # integer increments

    def bytes_moved(self) -> float:
        return float((self.n + self.bins) * INDEX_BYTES)

    def intensity(self) -> float:
        return 0.0


# ----------------------------------------------------------------------------- suite


def suite(cfg: Mapping[str, Any], ctx: SuiteContext) -> list[tuple[str, KernelSpec]]:
    return [("grid", HistogramSpec(n, b)) for n, b in grid(cfg, "n", "bins")]


# ----------------------------------------------------------------------------- torch call


def histogram(x: torch.Tensor, bins: int) -> torch.Tensor:
    return torch.bincount(x, minlength=bins)


# ----------------------------------------------------------------------------- runner


def build(spec: HistogramSpec, device: torch.device, gen: torch.Generator,
          seed: int) -> tuple[Callable[..., Any], tuple]:
    bins = spec.bins
    return (lambda x: histogram(x, bins)), (torch.randint(0, bins, (spec.n,), generator=gen).to(device),)


# ----------------------------------------------------------------------------- features


def features(t: pd.DataFrame, ceilings: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {"log_n": log10(column(t, "n")), "log_bins": log10(column(t, "bins"))}


# ----------------------------------------------------------------------------- aten ops


@register([aten.bincount], family="histogram", note="bins = the output length")
def _bincount(call: OpCall) -> KernelSpec:
    x, out = call.args[0], call.first_out
    return HistogramSpec(max(int(x.numel()), 1), max(int(out.numel()), 1))


@register([aten.histc], family="histogram",
          note="nearest: histc bins floats; described as an int64 bincount of the same n and bins")
def _histc(call: OpCall) -> KernelSpec:
    x = call.args[0]
    return HistogramSpec(max(int(x.numel()), 1), max(int(call.arg(1, "bins", 100)), 1))


register_family(HistogramSpec, suite=suite, build=build, features=features,
                range_features=("log_n", "log_bins"))
