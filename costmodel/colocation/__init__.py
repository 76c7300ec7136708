"""Co-location: how much slower a kernel runs while other processes run on the other cores
of the same host (shared cache and memory bandwidth), measured per kernel family of a device
profile and applied to predictions of ranks that share a host. See docs/expert_parallel.md.

Modules: ``rank`` (what each spawned rank runs), ``measure`` (pick kernels, launch, store),
``store`` (colocation.json, ``ColocationFactors``, ``load_colocation``), ``apply``
(factors applied to kernel times; an experiment's ``measure | profile | off`` setting),
``__main__`` (CLI: ``python -m costmodel.colocation measure``).

Names are imported lazily (PEP 562): a spawned rank imports ``costmodel.colocation.rank``
and must not pay for pandas.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ColocationFactors": "store", "ColocationError": "store", "load_colocation": "store", "placement_id": "store",
    "measure_colocation": "measure", "pick_kernels": "measure", "check_cores": "measure",
    "colocated_kernel_times": "apply", "colocated_trace_seconds": "apply", "overlapped_seconds": "apply", "resolve_colocation": "apply",
    "neighbour_pressure": "apply", "contended_timeline": "apply",
    "MODES": "apply",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"costmodel.colocation.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'costmodel.colocation' has no attribute {name!r}")
