"""Collectives as a measured kernel family: all_to_all (uneven splits), all_gather,
reduce_scatter and all_reduce through ``torch.distributed``, measured on W processes of
this host, stored beside the device profile, and predicted per rank by a latency-bandwidth
model (L2, Hockney) and a fitted regression (L3). See docs/collectives.md.

Modules: ``spec`` (descriptor and bytes formulas), ``suite`` (yaml -> specs), ``workers``
(the W-process launcher), ``rank`` (what each rank times), ``bench`` (measure and store),
``store`` (the profile folder), ``models`` (L2, L3, ``CollectiveModel``), ``report``
(held-out fit report), ``__main__`` (CLI).

Names are imported lazily (PEP 562): a spawned rank imports ``costmodel.collectives.rank``
and must not pay for pandas and scikit-learn.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "CollectiveSpec": "spec", "CollectiveSpecError": "spec", "OPS": "spec",
    "bench_collectives": "bench", "BenchResult": "bench",
    "CollectiveProfile": "store", "CollectiveProfileError": "store",
    "CollectiveModel": "models", "load_collective_model": "models", "make_latency_bandwidth_model": "models",
    "load_step_model": "models",
    "LatencyBandwidth": "models", "fit_collective_model": "models",
    "fit_report": "report",
    "run_workers": "workers", "WorkerSetupError": "workers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"costmodel.collectives.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'costmodel.collectives' has no attribute {name!r}")
