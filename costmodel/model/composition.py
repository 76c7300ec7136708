"""What a layer pays beyond the sum of its kernels' predictions: the host's cost per op.

Kernels are predicted from runners that repeat one call in a tight loop. Inside a layer each
call follows calls of other kinds, and the layer also runs ops that launch no kernel (views).
The charges, each measured on its own (``costmodel.measure.host_costs``) and charged at the
levels that model per-call costs (L2, L3; L0 and L1 are FLOPs-only by definition):

- every kernel: ``ceilings.interleave_overhead_s`` (a small op in a sequence of other kinds,
  minus the same op alone), plus its cold start and re-cooling on a cold-cache profile
  (``costmodel.model.cold_start``);
- every view op a captured trace records: ``ceilings.view_op_s``, plus
  ``ceilings.view_cold_overhead_s`` at the first view of each aten op on a cold-cache profile.

A profile without these ceilings (made before they existed) charges nothing for them; the
next calibration measures them (``costmodel.measure.ceilings.ensure_ceilings``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from costmodel.model.cold_start import CHARGED_LEVELS, cold_start_charges_s, first_of_kind


def per_call_s(model: Any, level: str) -> float:
    """Seconds every kernel of a layer pays at ``level`` for running among other kinds."""
    if level not in CHARGED_LEVELS:
        return 0.0
    return float(model.ceilings.get("interleave_overhead_s", 0.0))


def composition_charges_s(model: Any, level: str, trace: Sequence[Any]) -> np.ndarray:
    """Per kernel of ``trace``: ``per_call_s`` plus its cold-start and re-cooling charges."""
    return per_call_s(model, level) + cold_start_charges_s(model, level, trace)


def composition_s(model: Any, level: str, trace: Sequence[Any]) -> float:
    """The trace's whole charge beyond its kernels at ``level`` (``composition_charges_s`` summed)."""
    return float(composition_charges_s(model, level, trace).sum()) if len(trace) else 0.0


def view_charges_s(model: Any, level: str, view_ops: Sequence[str]) -> np.ndarray:
    """Per view op (its aten op name, in order): ``view_op_s``, plus ``view_cold_overhead_s``
    at the first of each name on a cold-cache profile; 0 at L0 and L1."""
    if level not in CHARGED_LEVELS or not len(view_ops):
        return np.zeros(len(view_ops), dtype=np.float64)
    out = np.full(len(view_ops), float(model.ceilings.get("view_op_s", 0.0)))
    if model.fingerprint.cache == "cold":
        out += float(model.ceilings.get("view_cold_overhead_s", 0.0)) * first_of_kind(view_ops)
    return out
