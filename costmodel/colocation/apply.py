"""Co-location factors applied to predictions, and where an experiment gets them from.

A kernel predicted from a profile measured with one process alone runs slower when other
processes share the machine's cache and memory bandwidth (ranks of one host). The factors
of ``costmodel.colocation.measure`` scale each kernel's predicted seconds by its family's
factor at its bytes (``ColocationFactors.factor(family, bytes_moved)``); collectives are not
scaled (they are measured between the processes already).

- ``colocated_kernel_times(kernel_times, colocation, pressure=None)``: wraps a kernel-time
  function (``traces -> {level: [seconds per trace]}``, as ``sim.distributed.ep_predict``
  takes): each trace is split into parts of one family and one factor (to 0.01), every part
  predicted in one call, scaled by its factor and summed back (so the cold-call overhead a cost
  model adds per kernel is scaled too: the ratio was measured on whole calls). The factor is
  the twin's (ranks running the same kind of work), or with ``pressure`` the one beside a
  neighbour of that pressure (``ColocationFactors.factor``; devices running different work);
- ``neighbour_pressure(colocation, traces, seconds)``: the pressure of a neighbour running
  ``traces`` in ``seconds`` (their kernels' bytes beyond the private cache per second, as a
  share of the stream neighbour's rate); None without the stream measurement;
- ``colocated_trace_seconds(trace, seconds_of, colocation)``: the same for one trace and a
  ``trace -> {level: seconds}`` function (``sim.distributed.gnn_partition_predict.trace_seconds``);
- ``contended_timeline(alone_s, sensitivity, pressure, device_of, n_devices)``: the start and
  end of every workload of devices that run their shares back to back side by side, each
  slowed at each moment by the pressure of what the others run then (``experiment=placement``'s
  predicted makespan of a placement);
- ``overlapped_seconds(alone_s, colocated_s, start_s)``: how long each rank's local work takes
  when the slow-down lasts only while another rank runs too: a rank whose twin has finished
  (and waits in the next collective) runs at its alone speed. Each rank progresses at
  alone/colocated of its alone speed while two or more ranks are busy, at full speed when it
  is the only one (processor sharing with a per-rank rate; the factor was measured with one
  twin, and is used for any number of co-runners);
- ``resolve_colocation(mode, profile, ...)``: an experiment's ``colocation`` setting
  (``measure``: measure now; ``profile``: the profile's factors, measured first when missing;
  ``off``: none) -> (factors or None, how, in words).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from costmodel.colocation.store import ColocationError, ColocationFactors, load_colocation

MODES = ("measure", "profile", "off")


def _by_factor(trace: Sequence[Any], colocation: ColocationFactors,
               pressure: float | None = None) -> dict[tuple[str, float], list[Any]]:
    """The trace's kernels grouped by (family, factor at their bytes and the neighbour's pressure, to 0.01)."""
    parts: dict[tuple[str, float], list[Any]] = {}
    for spec in trace:
        f = round(colocation.factor(spec.family, float(spec.bytes_moved()), pressure=pressure), 2)
        parts.setdefault((spec.family, f), []).append(spec)
    return parts


def colocated_kernel_times(kernel_times: Callable[[Sequence[Sequence[Any]]], Mapping[str, np.ndarray]],
                           colocation: ColocationFactors | None, *,
                           pressure: float | None = None) -> Callable[[Sequence[Sequence[Any]]], dict[str, np.ndarray]]:
    """``kernel_times`` with every kernel's seconds times its factor (unchanged for None): beside
    its twin, or beside a neighbour of ``pressure`` (``ColocationFactors.factor``)."""
    if colocation is None:
        return kernel_times  # type: ignore[return-value]

    def times(traces: Sequence[Sequence[Any]]) -> dict[str, np.ndarray]:
        owner, factor, parts = [], [], []
        for i, trace in enumerate(traces):
            for (_, f), specs in _by_factor(trace, colocation, pressure).items():
                owner.append(i)
                factor.append(f)
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
    """``seconds_of(trace)`` with each kernel's part scaled by its factor (unchanged for None)."""
    if colocation is None or not trace:
        return dict(seconds_of(list(trace)))
    out: dict[str, float] = {}
    for (_, f), specs in _by_factor(trace, colocation).items():
        for lv, s in seconds_of(specs).items():
            out[lv] = out.get(lv, 0.0) + f * float(s)
    return out


def neighbour_pressure(colocation: ColocationFactors | None, traces: Sequence[Sequence[Any]],
                       seconds: float) -> float | None:
    """``ColocationFactors.pressure_of`` of every kernel of ``traces`` run back to back in
    ``seconds`` (predicted alone); None without factors or without the stream measurement."""
    if colocation is None or not colocation.has_stream:
        return None
    return colocation.pressure_of([float(s.bytes_moved()) for t in traces for s in t], seconds)


def contended_timeline(alone_s: Sequence[float], sensitivity: Sequence[float], pressure: Sequence[float],
                       device_of: Sequence[int], n_devices: int,
                       ready_s: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) seconds of every workload when each device runs its workloads back to back
    (in index order, none before its ``ready_s``, default 0) beside the others, each slowed by
    what its neighbours run *at that moment*.

    Workload i alone takes ``alone_s[i]``; beside neighbours whose workloads have pressures
    P_j (``ColocationFactors.pressure_of``) it progresses at rate 1 / (1 + ``sensitivity[i]`` x
    min(1, sum of P_j)), its sensitivity being the time-weighted mean over its kernels of
    (stream ratio - 1) (``ColocationFactors.factor`` at pressure 1, minus 1). The rates change
    whenever a workload starts or ends: an event simulation (processor sharing with a rate per
    workload), one event per start or end, so it ends after at most 2 x len(alone_s) steps."""
    alone = np.asarray(alone_s, dtype=np.float64)
    sens = np.maximum(np.asarray(sensitivity, dtype=np.float64), -0.99)  # a rate stays finite
    pres = np.asarray(pressure, dtype=np.float64)
    where = np.asarray(device_of, dtype=np.int64)
    n = len(alone)
    ready = np.zeros(n) if ready_s is None else np.asarray(ready_s, dtype=np.float64)
    if not (sens.shape == pres.shape == where.shape == ready.shape == (n,)):
        raise ValueError(f"alone_s, sensitivity, pressure, device_of and ready_s must have one entry per workload ({n}), "
                         f"got {sens.shape}, {pres.shape}, {where.shape}, {ready.shape}")
    if n and (np.any(alone < 0) or np.any(pres < 0) or np.any(where < 0) or np.any(where >= n_devices)
              or not np.all(np.isfinite(ready))):
        raise ValueError(f"alone_s and pressure must be >= 0, ready_s finite and device_of in [0, {n_devices})")
    queues = [list(np.flatnonzero(where == d)) for d in range(n_devices)]
    start, end = np.full(n, np.nan), np.full(n, np.nan)
    for q in queues:
        if q:
            start[q[0]] = ready[q[0]]
    left = alone.copy()
    t = float(ready.min()) if n else 0.0
    for _ in range(2 * n + 2):  # every pass starts or ends at least one workload
        heads = [q[0] for q in queues if q]
        if not heads:
            break
        running = [i for i in heads if start[i] <= t]
        total = sum(pres[i] for i in running)
        rate = {i: 1.0 / (1.0 + sens[i] * min(1.0, total - pres[i])) for i in running}
        t_next = min([t + left[i] / rate[i] for i in running] + [start[i] for i in heads if start[i] > t])
        for i in running:
            left[i] -= rate[i] * (t_next - t)
        t = t_next
        for q in queues:
            if q and q[0] in rate and left[q[0]] <= 1e-12 * max(alone[q[0]], 1.0):
                end[q.pop(0)] = t
                if q:
                    start[q[0]] = max(t, ready[q[0]])
    return start, end


def overlapped_seconds(alone_s: Sequence[float], colocated_s: Sequence[float],
                       start_s: Sequence[float] | None = None) -> np.ndarray:
    """[W] seconds each rank's local work takes from its own start (``start_s``, default all 0):
    ``alone_s[r]`` of work done at rate alone/colocated while at least two ranks are busy and
    at rate 1 while rank r is the only one. Equal starts and equal work give ``colocated_s``;
    one rank's work alone gives ``alone_s``. ``contended_timeline`` with one workload per rank,
    each of pressure 1 and sensitivity colocated/alone - 1 (so any busy neighbour slows it by
    the measured twin's ratio)."""
    alone = np.asarray(alone_s, dtype=np.float64)
    coloc = np.asarray(colocated_s, dtype=np.float64)
    start = np.zeros_like(alone) if start_s is None else np.asarray(start_s, dtype=np.float64)
    if not (alone.shape == coloc.shape == start.shape) or alone.ndim != 1:
        raise ValueError(f"alone_s, colocated_s and start_s must be [W] vectors of one length, got "
                         f"{alone.shape}, {coloc.shape}, {start.shape}")
    if np.any(alone < 0) or np.any(coloc < 0):
        raise ValueError("alone_s and colocated_s must be >= 0 seconds")
    ratio = np.divide(coloc, alone, out=np.ones_like(alone), where=(alone > 0) & (coloc > 0))
    W = len(alone)
    began, done = contended_timeline(alone, ratio - 1.0, np.ones(W), np.arange(W), W, ready_s=start)
    return done - began


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
