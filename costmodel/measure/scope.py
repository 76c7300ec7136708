"""``kernel_scope``: the profiler label around one kernel call, shared by the suite and the layers.

Each family's torch call lives in its family module (``costmodel.families.<family>``): the
microbenchmark runners (``costmodel.measure.runners``, through each family's ``build``) and
the real MoE and GNN modules (``sim.workloads.moe_layer``, ``sim.workloads.gnn_layer``, ``sim.workloads.backends``) call the
same functions, so a kernel in a layer's trace is timed by the suite through exactly the code
the layer runs.

``kernel_scope`` labels each call for the torch profiler, which is how the simulator times
kernels inside a real forward pass and how the tests check that a layer's trace and its
execution agree.
"""

from __future__ import annotations

import contextlib

from torch._C._autograd import _profiler_enabled
from torch.profiler import record_function

#: label prefix of the profiler ranges opened by kernel_scope
SCOPE_PREFIX = "kernel::"


_NO_SCOPE = contextlib.nullcontext()


def kernel_scope(family: str) -> contextlib.AbstractContextManager:
    """Profiler range around one kernel call; a no-op unless a profiler is recording
    (an idle ``record_function`` still costs ~9 us a call on CPU, a tax the layer's
    measured latency would pay and its kernels' microbenchmarks would not)."""
    return record_function(SCOPE_PREFIX + family) if _profiler_enabled() else _NO_SCOPE
