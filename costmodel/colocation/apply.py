"""Co-location factors applied to predictions, and where an experiment gets them from.

A kernel predicted from a profile measured with one process alone runs slower when other
processes share the machine's cache and memory bandwidth (ranks of one host). The factors
of ``costmodel.colocation.measure`` scale each kernel's predicted seconds by its family's
factor; collectives are not scaled (they are measured between the processes already).

- ``colocated_kernel_times(kernel_times, colocation)``: wraps a kernel-time function
  (``traces -> {level: [seconds per trace]}``, as ``sim.distributed.ep_predict`` takes): each
  trace is split by family, every part predicted in one call, scaled by its family's factor
  and summed back (so the cold-call overhead a cost model adds per kernel is scaled too: the
  ratio was measured on whole calls);
- ``colocated_trace_seconds(trace, seconds_of, colocation)``: the same for one trace and a
  ``trace -> {level: seconds}`` function (``sim.distributed.gnn_partition_predict.trace_seconds``);
- ``resolve_colocation(mode, profile, ...)``: an experiment's ``colocation`` setting
  (``measure``: measure now; ``profile``: the profile's factors, measured first when missing;
  ``off``: none) -> (factors or None, how, in words).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from costmodel.colocation.store import ColocationError, ColocationFactors, load_colocation

MODES = ("measure", "profile", "off")


def _by_family(trace: Sequence[Any]) -> dict[str, list[Any]]:
    parts: dict[str, list[Any]] = {}
    for spec in trace:
        parts.setdefault(spec.family, []).append(spec)
    return parts


def colocated_kernel_times(kernel_times: Callable[[Sequence[Sequence[Any]]], Mapping[str, np.ndarray]],
                           colocation: ColocationFactors | None) -> Callable[[Sequence[Sequence[Any]]], dict[str, np.ndarray]]:
    """``kernel_times`` with every kernel's seconds times its family's factor (unchanged for None)."""
    if colocation is None:
        return kernel_times  # type: ignore[return-value]

    def times(traces: Sequence[Sequence[Any]]) -> dict[str, np.ndarray]:
        owner, factor, parts = [], [], []
        for i, trace in enumerate(traces):
            for fam, specs in _by_family(trace).items():
                owner.append(i)
                factor.append(colocation.factor(fam))
                parts.append(specs)
        n = len(traces)
        if not parts:
            base = kernel_times(traces)
            return {lv: np.zeros(n) for lv in base}
        seconds = kernel_times(parts)
        w = np.asarray(factor, dtype=np.float64)
        return {lv: np.bincount(owner, weights=np.asarray(s, dtype=np.float64) * w, minlength=n)
                for lv, s in seconds.items()}

    return times


def colocated_trace_seconds(trace: Sequence[Any], seconds_of: Callable[[Sequence[Any]], Mapping[str, float]],
                            colocation: ColocationFactors | None) -> dict[str, float]:
    """``seconds_of(trace)`` with each family's part scaled by its factor (unchanged for None)."""
    if colocation is None or not trace:
        return dict(seconds_of(list(trace)))
    out: dict[str, float] = {}
    for fam, specs in _by_family(trace).items():
        f = colocation.factor(fam)
        for lv, s in seconds_of(specs).items():
            out[lv] = out.get(lv, 0.0) + f * float(s)
    return out


def resolve_colocation(mode: str, profile: Any, *, measuring: bool, cores: Sequence[int] | None = None,
                       field: str = "colocation", **measure_kwargs: Any) -> tuple[ColocationFactors | None, str]:
    """The factors an experiment's ``field`` setting asks for, and how they were found.

    ``measure``: measured now on ``cores`` (``measure_colocation``; needs ``measuring``);
    ``profile``: the profile's colocation.json for ``cores`` (any placement when None),
    measured first when missing and ``measuring``, else None with the reason; ``off``: None."""
    if mode not in MODES:
        raise ColocationError(f"{field} must be one of {list(MODES)}, got {mode!r}")
    if mode == "off":
        return None, f"{field}=off: kernels predicted as measured alone"
    where = tuple(cores) if cores is not None else None
    if mode == "profile":
        found = load_colocation(profile, cores=where)
        if found is not None:
            return found, f"{field}=profile: {found.source}, measured {found.measured_at}"
        if not measuring:
            return None, (f"{field}=profile: no co-location factors in {getattr(profile, 'path', profile)} for "
                          f"{'cores ' + str(list(where)) if where else 'any placement'}; predicted as alone "
                          "(measure them with python -m costmodel.colocation measure)")
    elif not measuring:
        raise ColocationError(f"{field}=measure needs a measuring run (measure=true)")
    from costmodel.colocation.measure import measure_colocation

    measure_colocation(profile, where or (0, 1), **measure_kwargs)
    found = load_colocation(profile, cores=where)
    assert found is not None
    return found, f"{field}={mode}: measured in this run ({found.source})"
