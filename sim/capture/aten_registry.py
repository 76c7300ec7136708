"""Capture's classifier: for each aten call, a view (no kernel), a kernel of a family, or
unmapped.

The registry from aten ops to descriptors is defined with the families: each module of
``costmodel.families`` registers the aten ops that map to it (``costmodel.families.aten_map``,
``@register(packets, family=..., note=...)``, as PyTorch registers FLOP formulas per aten op
in ``torch/utils/flop_counter.py``), and ``costmodel.families.elementwise`` maps every op
PyTorch tags pointwise. ``registry_table()`` lists every entry.

``classify`` is what ``sim.capture.dispatch`` calls for each op: it returns ``("view", None)`` for
ops that launch no kernel (views, aliases, allocations, host reads), ``("kernel", spec)``
for mapped ops, and ``("unmapped", reason)`` for ops the registry does not know or cannot
describe, a sparse operand of an entry that does not describe sparse tensors among them
(predicted by the roofline fallback in ``sim.capture.dispatch``, never dropped).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten

import costmodel.families  # noqa: F401 (registers every family's aten ops)
from costmodel.families.aten_map import (  # noqa: F401 (the registry's public names, re-exported)
    Entry,
    OpCall,
    Unmappable,
    aten,
    dtype_name,
    entry_for,
    index_stats,
    register,
    registry_table,
)
from costmodel.families.elementwise import pointwise_entry


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

def lookup(func: Any) -> Entry | None:
    """The registry entry of an aten overload: explicit entries first, then pointwise by tag."""
    return entry_for(func) or pointwise_entry(func)

def _tensors(values: Any) -> list[torch.Tensor]:
    return [v for v in tree_flatten(values)[0] if isinstance(v, torch.Tensor)]


def classify(call: OpCall) -> tuple[str, Any]:
    """("view", None) | ("kernel", spec) | ("unmapped", reason)."""
    func = call.func
    if func.overloadpacket in NO_KERNEL_PACKETS or is_view(func):
        return "view", None
    entry = lookup(func)
    if entry is None:
        return "unmapped", "no registry entry"
    if not entry.sparse:
        sparse = sorted({str(t.layout).removeprefix("torch.") for t in _tensors((call.args, call.kwargs, call.out))
                         if t.layout != torch.strided})
        if sparse:  # its descriptor would count the dense shape: the fallback counts the stored bytes
            return "unmapped", f"{entry.family}: a sparse operand ({', '.join(sparse)}) is not described"
    try:
        return "kernel", entry.mapper(call)
    except (Unmappable, ValueError) as exc:  # ValueError: a descriptor refused the fields
        return "unmapped", f"{entry.family}: {exc}"
    except Exception as exc:  # a mapper bug must not break the user's run: the op falls back, listed
        return "unmapped", f"{entry.family}: mapper failed ({type(exc).__name__}: {exc})"
