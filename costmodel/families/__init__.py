"""Kernel families, one module each: the single place that defines a family.

A family module holds its descriptor (a frozen ``KernelSpec`` dataclass with fields,
``flops()`` and ``bytes_moved()``, each formula with its source), ``build`` (how the suite
makes and runs it), ``features`` (its own model columns; the ones every family shares are in
``costmodel.model.features``), the aten ops that map to it (``@register`` of
``costmodel.families.aten_map``), and ends with ``register_family``.

Adding a family is one new module here, its name in the import list below, and its kernels
in the suite yaml (``conf/suite/*.yaml``); nothing else dispatches on family names.
``costmodel.families`` re-exports the descriptors under their historical names.
"""

from costmodel.families.registry import Family, family_of, register_family, registered

# importing a family module registers it (a family a module imports registers first)
from costmodel.families import gemm, grouped_gemm, gather, scatter, spmm, elementwise  # noqa: E402,F401,I001
from costmodel.families import softmax, topk, sort, histogram  # noqa: E402,F401,I001

__all__ = ["Family", "family_of", "register_family", "registered"]
