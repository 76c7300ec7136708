"""Run a function on W real processes joined by ``torch.distributed`` (gloo), on this host.

The launcher lives in ``costmodel.collectives.workers`` (the collectives benchmark needs it,
and ``costmodel`` may not import ``sim``); this module keeps the names the expert-parallel
layer and its tests import.
"""

from costmodel.collectives.workers import (EPRun, EPTimeoutError, EPWorkerError, free_port,  # noqa: F401
                                           pick_cores, run_ep)

__all__ = ["EPRun", "EPTimeoutError", "EPWorkerError", "free_port", "pick_cores", "run_ep"]
