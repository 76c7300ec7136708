"""Layer backends as registered objects: one class per way a layer can run.

A backend declares in one place how it runs (its part of the layer's forward pass), which
kernels it adds to the simulator's trace, its memory footprint and the kernels calibration
measures for it, and is looked up by the name a config gives (``moe.backend``,
``gnn.backend``): ``sim/workloads/backends/moe.py`` holds the MoE expert backends, ``sim/workloads/backends/gnn.py``
the GNN aggregation backends, ``sim/workloads/backends/registry.py`` the registry both use. Adding a
backend is one class and one ``register`` call in one of those files, plus a test; the layers,
their traces, ``sim.workloads.memory``, calibration and the experiments find it by name.
"""

from sim.workloads.backends.gnn import GNN_BACKENDS, GNNBackend, gnn_backend
from sim.workloads.backends.moe import MOE_BACKENDS, MoEBackend, moe_backend
from sim.workloads.backends.registry import BackendRegistry

__all__ = ["BackendRegistry", "GNN_BACKENDS", "GNNBackend", "MOE_BACKENDS", "MoEBackend", "gnn_backend", "moe_backend"]
