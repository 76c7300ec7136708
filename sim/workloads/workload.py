"""A workload: something with a kernel trace, and how to run it.

Every experiment builds a list of ``Workload`` (a layer or a bare kernel: its name, its
kernel trace, a zero-argument callable that runs it, descriptive columns) and predicts and
measures each (``experiments.workloads.evaluate_workloads``); a placement places
``sim.place.placement.PlacementWorkload``, a ``Workload`` that also says what it keeps
resident on a device and how to build its callable on one. ``flops`` and ``bytes_moved``
(the ideal work of the trace: every kernel's FLOPs, every operand and result read or
written once) are defined here, once, for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from costmodel.families.descriptor import KernelSpec


@dataclass(frozen=True, eq=False)
class Workload:
    name: str  # short name for tables and plots
    trace: Sequence[KernelSpec]  # what it executes, as kernel descriptors
    run: Callable[[], Any] | None = None  # runs it once here (None: predicted only, or run elsewhere)
    columns: Mapping[str, Any] = field(default_factory=dict)  # descriptive columns for tables (kind, skew, ...)

    @property
    def flops(self) -> float:
        return float(sum(s.flops() for s in self.trace))

    @property
    def bytes_moved(self) -> float:
        return float(sum(s.bytes_moved() for s in self.trace))
