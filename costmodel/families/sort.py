"""Stable sort of n keys with the permutation (``torch.sort``: the MoE dispatch by expert)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import pandas as pd
import torch

from costmodel.families.aten_map import OpCall, aten, register, spec_dtype
from costmodel.families.columns import column, integer_dtype, log10
from costmodel.families.descriptor import FLOAT_DTYPES, INDEX_BYTES, KernelSpec, check_positive
from costmodel.families.inputs import randn
from costmodel.families.registry import SuiteContext, grid, register_family


# ----------------------------------------------------------------------------- descriptor


@dataclass(frozen=True)
class SortSpec(KernelSpec):
    """Stable sort of n keys, returning sorted values and the permutation (``torch.sort``)."""

    family: ClassVar[str] = "sort"
    allowed_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES + ("int64", "int32")
    n: int
    dtype: str = "int64"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "n")

    def flops(self) -> float:
        return 0.0  # comparisons and moves only

    def bytes_moved(self) -> float:
        # Keys read once; sorted keys and int64 permutation written once.
        return float(self.n * (2 * self.elem_bytes + INDEX_BYTES))

    def intensity(self) -> float:
        return 0.0


# ----------------------------------------------------------------------------- suite


def suite(cfg: Mapping[str, Any], ctx: SuiteContext) -> list[tuple[str, KernelSpec]]:
    """int64 keys (expert ids, as the MoE dispatch sorts them)."""
    return [("grid", SortSpec(n, "int64")) for (n,) in grid(cfg, "n")]


# ----------------------------------------------------------------------------- torch call


def sort(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = torch.sort(x, stable=True)
    return values, indices


# ----------------------------------------------------------------------------- runner


def build(spec: SortSpec, device: torch.device, gen: torch.Generator, seed: int) -> tuple[Callable[..., Any], tuple]:
    if spec.dtype.startswith("int"):
        keys = torch.randint(0, max(spec.n, 2), (spec.n,), generator=gen).to(device=device, dtype=getattr(torch, spec.dtype))
    else:
        keys = randn((spec.n,), spec.dtype, device, gen)
    return sort, (keys,)


# ----------------------------------------------------------------------------- features


#: ATen's CPU sort (``sort_kernel`` in aten/src/ATen/native/cpu/SortingKernel.cpp) hands a 1-D
#: ascending sort of integer keys with at least ``at::internal::GRAIN_SIZE`` (32,768) of them to
#: FBGEMM's ``radix_sort_parallel`` (``can_use_radix_sort``: PyPI's x86 builds have FBGEMM and
#: OpenMP), which makes one pass per key byte over every key, split across the threads; below
#: that, and for floating-point keys, it runs ``std::stable_sort`` over (key, index) pairs on one
#: thread, about n*log2(n) compares. The switch is a step the key count alone hides: on the Intel
#: VM's profile 24,576 int64 keys took 1.7 ms and 32,768 took 0.76 ms.
CPU_RADIX_SORT_MIN_KEYS = 32768


def uses_radix_sort(n_dtype: pd.DataFrame, device_kind: str) -> np.ndarray:
    """1.0 where ATen's CPU sort takes FBGEMM's radix path (integer keys, n >= 32,768), else
    0.0; all 0.0 off the CPU (CUDA sorts by its own radix sort at every size)."""
    if device_kind != "cpu":
        return np.zeros(len(n_dtype))
    return integer_dtype(n_dtype) * (column(n_dtype, "n") >= CPU_RADIX_SORT_MIN_KEYS)


def features(t: pd.DataFrame, ceilings: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {"log_n": log10(column(t, "n")),
            "radix_sort": uses_radix_sort(t, str(ceilings.get("device_kind", "cpu")))}


# ----------------------------------------------------------------------------- aten ops


@register([aten.sort], family="sort", note="argsort lands here; a batched sort along a dim as one sort of numel keys (nearest)")
def _sort(call: OpCall) -> KernelSpec:
    x = call.args[0]
    return SortSpec(max(int(x.numel()), 1), spec_dtype(x, SortSpec.allowed_dtypes))


register_family(SortSpec, suite=suite, build=build, features=features,
                range_features=("log_n",))
