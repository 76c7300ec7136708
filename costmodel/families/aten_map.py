"""The aten side of the kernel-family registry: which aten op is which family, with which
descriptor fields.

Each family module of ``costmodel.families`` registers its mappers with
``@register(packets, family=..., note=...)``, as PyTorch registers FLOP formulas per aten op
(``torch/utils/flop_counter.py``, ``register_flop_formula``). A mapper turns one aten call
(``OpCall``: the overload, its real arguments and output) into a descriptor, reading from the
tensors what the cost model needs (tokens per expert of a grouped GEMM, index statistics of a
gather or scatter), or raises ``Unmappable``. Where no family fits an op well, the entry maps
it to the nearest family and its ``note`` says so; ``registry_table()`` lists every entry.
``sim.capture.aten_registry.classify`` is what capture calls for each op.

Index statistics follow ``sim.workloads.gnn_layer.GraphPlan`` and ``costmodel.families.indices``: the CV of
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

from costmodel.families.descriptor import KernelSpec

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
    #: whether the mapper describes sparse operands (from their non-zeros); an entry that does
    #: not is never given one: its descriptor would count the dense shape (``classify``)
    sparse: bool = False

_ENTRIES: dict[Any, Entry] = {}

def register(packets: Iterable[Any], *, family: str, note: str = "",
             sparse: bool = False) -> Callable[[Mapper], Mapper]:
    """Register ``mapper`` for every aten overload packet in ``packets`` (``sparse``: it
    describes sparse operands itself; otherwise a call with one is left unmapped)."""

    def deco(fn: Mapper) -> Mapper:
        for p in packets:
            if p in _ENTRIES:
                raise ValueError(f"aten op {p} is registered twice (as {_ENTRIES[p].family} and {family})")
            _ENTRIES[p] = Entry(family, fn, note, sparse)
        return fn

    return deco

def registry_table() -> pd.DataFrame:
    """Every registered aten op with its family and note (the registry as a table)."""
    rows = [{"aten_op": str(p), "family": e.family, "note": e.note} for p, e in _ENTRIES.items()]
    return pd.DataFrame(rows).sort_values(["family", "aten_op"]).reset_index(drop=True)

def entry_for(func: Any) -> Entry | None:
    return _ENTRIES.get(getattr(func, "overloadpacket", func))

def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")

def spec_dtype(t: torch.Tensor, allowed: tuple[str, ...]) -> str:
    name = dtype_name(t)
    if name not in allowed:
        raise Unmappable(f"dtype {name} is not one of the family's dtypes {list(allowed)}")
    return name

#: begins the reason of an op a family refuses although it is that family's kind of work (an
#: integer matmul): the roofline fallback, which counts bytes only, underestimates it, and
#: ``sim.api.predict_captured`` warns about it
NOT_MODELLED = "not modelled: "


def matmul_dtype(t: torch.Tensor, allowed: tuple[str, ...]) -> str:
    """``spec_dtype`` of a matmul operand, refusing a dtype outside the family plainly: an
    integer matmul is not modelled (the family is measured in floating point, through BLAS;
    torch runs integer matmuls without it, at a small fraction of that rate)."""
    name = dtype_name(t)
    if name not in allowed:
        kind = "floating-point" if t.is_floating_point() else ("complex" if t.is_complex() else "integer")
        raise Unmappable(f"{NOT_MODELLED}{kind} matmul in {name}: the family is measured in {list(allowed)} only; "
                         "the roofline fallback counts its bytes, not its multiply-adds, so it is underestimated")
    return name


def index_stats(index: torch.Tensor, num_targets: int) -> tuple[float, bool]:
    """(CV of per-target hit counts, ascending?) of an integer index, read from its values
    (the statistics ``sim.workloads.gnn_layer.GraphPlan`` and ``costmodel.families.indices`` use)."""
    idx = index.detach().reshape(-1).to("cpu", torch.int64).numpy()
    if idx.size == 0:
        return 0.0, True
    counts = np.bincount(idx, minlength=max(int(num_targets), 1)).astype(np.float64)
    cv = float(counts.std() / counts.mean()) if counts.mean() > 0 else 0.0
    return round(cv, 3), bool(np.all(idx[1:] >= idx[:-1]))


def prod(shape: Iterable[int]) -> int:
    return int(math.prod(int(s) for s in shape))


def matrix_layout(*operands: torch.Tensor) -> str:
    """The layout of matrix operands as called: "t" for one whose last two dims are a
    transposed view of row-major storage (``W.t()``), "n" otherwise (an operand in any other
    strided form is copied by BLAS or read as it is: the nearest is "n")."""
    return "".join("t" if is_transposed_view(x) else "n" for x in operands)


def is_transposed_view(x: torch.Tensor) -> bool:
    """Whether ``x``'s last two dims are a transposed view of row-major storage."""
    if x.dim() < 2 or x.is_contiguous():
        return False
    return x.transpose(-2, -1).is_contiguous()
