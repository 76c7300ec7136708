"""Kernel families, one module each: the single place that defines a family.

A family module holds its descriptor (a frozen ``KernelSpec`` dataclass with fields,
``flops()`` and ``bytes_moved()``, each formula with its source), its torch call (the code
the suite times and the layers in ``sim`` run), ``suite`` (its section of a suite yaml ->
descriptors), ``build`` (how the suite makes and runs it), ``features`` (its own model
columns; the ones every family shares are in ``costmodel.model.features``) with the ones
whose training range a prediction is checked against, the aten ops that map to it
(``@register`` of ``costmodel.families.aten_map``), and ends with ``register_family``.

Adding a family is one new module here and its kernels in the suite yaml
(``conf/suite/*.yaml``): every module of this package is imported below (importing a family
module registers it), except the shared helpers in ``HELPERS``; nothing else dispatches on
family names.
"""

import importlib
import pkgutil

from costmodel.families.registry import Family, family_of, register_family, registered

#: modules of this package that define no family: the base, the registries and shared helpers
HELPERS = frozenset({"aten_map", "columns", "descriptor", "indices", "inputs", "registry"})


def _discover() -> None:
    """Import every family module of this package, in name order (a family a module imports
    registers first)."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name not in HELPERS and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_discover()

__all__ = ["HELPERS", "Family", "family_of", "register_family", "registered"]
