"""Latency-aware placement: put workloads on devices so the slowest device finishes first.

``place(workloads, devices, predict) -> Placement``. A ``PlacementWorkload`` is any predictable
unit, a ``sim.workloads.workload.Workload``: a name, its kernel trace (``costmodel.families``
descriptors: a layer's hand-written trace, or a captured module's), plus a memory footprint
and a picklable factory that builds a runnable callable on a device (so a worker process
can run it). A ``Device`` is a stored, fitted profile (``CostModel``: its fingerprint names
device, threads, dtype) plus its memory and, for CPU "devices", the cores it is pinned to.
``predict`` is a cost-model level ("L0" FLOPs/peak, "L1", "L2" roofline, "L3" fitted) or
any callable ``(workload, device) -> seconds`` (the oracle passes measured latencies).

The problem is makespan minimisation on unrelated parallel machines, R||Cmax in the
notation of Graham, Lawler, Lenstra & Rinnooy Kan (1979): every workload runs on one
device, a device runs its workloads back to back, minimise the largest per-device sum.

- exact (up to ``exact_max_binaries`` workload-device pairs under ``auto``, 20,000 by
  default): the integer program
  ``min C  s.t.  sum_d x_id = 1,  sum_i p_id x_id <= C,  sum_i m_i x_id <= M_d,  x binary``
  (Lenstra, Shmoys & Tardos 1990, eq. (1)-(4), plus the memory rows) solved by
  ``scipy.optimize.milp`` (HiGHS branch and cut) within ``time_limit_s``: past it, the best
  placement found and its gap; LPT's placement where it is no worse, or (with a note)
  where HiGHS found none in time;
- greedy (larger instances): LPT, longest processing time first (Graham 1969), each
  workload, longest first by its fastest device, to the device where it finishes
  earliest; on identical devices LPT is within 4/3 - 1/(3m) of optimal (Graham 1969);
- the optimality gap is measured against a proven lower bound: HiGHS's dual bound (exact
  path) or the LP relaxation of the program above (LPT path), together with
  max_i min_d p_id (every workload runs somewhere, whole) and sum_i min_d p_id / m.

Bad input (no workloads, no devices, something that is not a ``PlacementWorkload`` or ``Device``,
a device without a fitted profile, a workload too large for every device's memory, a
predicted cost that is not a finite number >= 0, a memory size or count given as a bool;
for ``solve``, a cost matrix whose shape does not match the names or that holds NaN,
inf or negative seconds) raises ``PlacementError`` naming what is wrong, before anything
is solved or run.
"""

from __future__ import annotations

import math
import numbers
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np
import pandas as pd
import torch

from costmodel.families.descriptor import KernelSpec
from costmodel.measure.device import Fingerprint
from costmodel.model.predictor import CostModel
from sim.workloads.workload import Workload

#: solvers ``place`` accepts: auto (exact when small, else LPT), milp, lpt
SOLVERS = ("auto", "milp", "lpt")
#: ``auto`` solves exactly (within ``time_limit_s``, keeping LPT's answer where it is no
#: worse) up to this many (workload, device) binaries: 1,000 workloads on 20 devices
EXACT_MAX_BINARIES = 20_000
#: wall-clock limit of the exact solver; past it HiGHS returns its best solution and gap
EXACT_TIME_LIMIT_S = 20.0


class PlacementError(ValueError):
    """Placement input that cannot be placed: said before anything runs."""


def _is_int(value: object) -> bool:
    """An integer, and not a bool (``True`` is no memory size or count)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _seconds(value: object) -> float | None:
    """A real number as float, or None for anything else (str, None, bool, arrays)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    return float(value)


@runtime_checkable
class WorkloadFactory(Protocol):
    """Builds a workload's runnable form on a device. Must be picklable (a worker process
    receives it and calls ``build`` there); the callable it returns runs the workload once."""

    def build(self, device: torch.device) -> Callable[[], Any]: ...


@dataclass(frozen=True, eq=False, kw_only=True)
class PlacementWorkload(Workload):
    """A ``Workload`` that can be placed: predictable from its trace, runnable on any device.

    ``trace`` is what it executes, as kernel descriptors (a layer's ``moe_trace``/``gnn_trace``
    /``mlp_trace``, or a captured module's descriptors: ``PlacementWorkload(name, captured.specs,
    memory_bytes=..., factory=...)`` works for any sequence of ``KernelSpec``); ``memory_bytes``
    what it keeps resident on a device while placed there (weights, inputs, indices and its
    largest working set); ``factory`` builds its callable on a device, in whatever process runs
    it (``run`` stays None: a placement workload runs where it is placed).
    """

    memory_bytes: int
    factory: WorkloadFactory

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise PlacementError(f"workload.name must be a non-empty string, got {self.name!r}")
        if isinstance(self.trace, (str, bytes, Mapping)) or not isinstance(self.trace, Iterable):
            raise PlacementError(f"workload {self.name!r}: trace must be a sequence of costmodel.families descriptors, "
                                 f"got {type(self.trace).__name__}")
        trace = tuple(self.trace)
        if not trace:
            raise PlacementError(f"workload {self.name!r}: trace must list at least one kernel descriptor")
        bad = [type(s).__name__ for s in trace if not isinstance(s, KernelSpec)]
        if bad:
            raise PlacementError(f"workload {self.name!r}: trace entries must be costmodel.families descriptors, "
                                 f"got {sorted(set(bad))}")
        object.__setattr__(self, "trace", trace)
        if not _is_int(self.memory_bytes) or self.memory_bytes < 0:
            raise PlacementError(f"workload {self.name!r}: memory_bytes must be an integer >= 0, got {self.memory_bytes!r}")
        if not callable(getattr(self.factory, "build", None)):
            raise PlacementError(f"workload {self.name!r}: factory must have a build(device) method, "
                                 f"got {type(self.factory).__name__}")
        if self.run is not None:
            raise PlacementError(f"workload {self.name!r}: run must be None (a placement workload runs through "
                                 "factory.build(device), on the device it is placed on)")


@dataclass(frozen=True, eq=False)
class Device:
    """A device as the placement sees it: a fitted profile, its memory, where it runs.

    ``cores`` pins a CPU "device" (a process with ``fingerprint.threads`` threads) to those
    cores when it runs for real; None runs unpinned. ``colocation``
    (``costmodel.colocation.ColocationFactors``, or None): the device shares its host with
    others that run at the same time, so a level's prediction of each kernel is multiplied
    by its family's measured co-location factor at its bytes, beside the workload pool's
    pressure where the stream neighbour was measured (``cost_matrix``, ``pool_pressure``); a
    callable predictor is left as it is (it answers for itself).
    """

    name: str
    model: CostModel | None
    memory_bytes: int
    cores: tuple[int, ...] | None = None
    colocation: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise PlacementError(f"device.name must be a non-empty string, got {self.name!r}")
        if not _is_int(self.memory_bytes) or self.memory_bytes < 1:
            raise PlacementError(f"device {self.name!r}: memory_bytes must be a positive integer, got {self.memory_bytes!r}")
        if self.cores is not None:
            cores = self.cores
            if isinstance(cores, (str, bytes, Mapping)) or not isinstance(cores, Iterable) \
                    or not all(_is_int(c) for c in tuple(cores)):
                raise PlacementError(f"device {self.name!r}: cores must be a list of distinct integer core ids >= 0, "
                                     f"got {self.cores!r}")
            cores = tuple(int(c) for c in cores)
            if not cores or min(cores) < 0 or len(set(cores)) != len(cores):
                raise PlacementError(f"device {self.name!r}: cores must be distinct core ids >= 0, got {self.cores!r}")
            object.__setattr__(self, "cores", cores)

    @classmethod
    def from_profile(cls, name: str, profile_root: str | Path, fingerprint: Fingerprint, *,
                     memory_bytes: int, cores: Sequence[int] | None = None) -> "Device":
        """The device whose fitted profile for ``fingerprint`` lies under ``profile_root``."""
        from costmodel.model.predictor import StaleModelError
        from costmodel.store.profile import DeviceProfile, ProfileError

        try:
            profile = DeviceProfile.open(profile_root, fingerprint, create=False)
            model = CostModel.load(profile, expected=fingerprint)
        except (ProfileError, StaleModelError, FileNotFoundError) as err:
            raise PlacementError(f"device {name!r} has no fitted profile for {fingerprint.id} under {profile_root}: "
                                 f"{err} (run `python -m costmodel bench threads={fingerprint.threads}` and "
                                 "`python -m costmodel fit`, or an experiment that calibrates)") from None
        return cls(name, model, memory_bytes, None if cores is None else tuple(cores))

    @property
    def fingerprint(self) -> Fingerprint:
        return self._fitted().fingerprint

    @property
    def threads(self) -> int:
        return self.fingerprint.threads

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.fingerprint.device_kind)

    def _fitted(self) -> CostModel:
        if not isinstance(self.model, CostModel):
            raise PlacementError(f"device {self.name!r} has no fitted profile (model is {type(self.model).__name__}); "
                                 "load one with Device.from_profile")
        return self.model


Predictor = str | Callable[[PlacementWorkload, Device], float]


@dataclass(frozen=True, eq=False)
class Placement:
    """Which device runs which workload, by what predictor and solver, and how good it is.

    ``cost_s[i, d]`` is the predicted latency of workload i on device d that the solver saw;
    ``makespan_s`` the predicted makespan; ``lower_bound_s`` a proven lower bound on the
    optimum under the same costs and ``gap_pct`` = 100 (makespan / lower bound - 1), an upper
    bound on how far from optimal the placement is (0 when ``optimal``).
    """

    workloads: tuple[str, ...]
    devices: tuple[str, ...]
    device_of: tuple[int, ...]  # per workload: index into ``devices``
    cost_s: np.ndarray = field(repr=False)
    predictor: str
    solver: str  # "milp" or "lpt"
    makespan_s: float
    lower_bound_s: float
    gap_pct: float
    optimal: bool
    note: str = ""

    def assignment(self) -> dict[str, list[str]]:
        """Device name -> its workloads, in the order it runs them."""
        return {d: [w for w, j in zip(self.workloads, self.device_of) if j == k] for k, d in enumerate(self.devices)}

    def loads_s(self, cost_s: np.ndarray | None = None) -> np.ndarray:
        """Per-device sum of latencies under ``cost_s`` (default: the predicted costs)."""
        cost = self._check_cost(cost_s)
        loads = np.zeros(len(self.devices))
        np.add.at(loads, np.asarray(self.device_of), cost[np.arange(len(self.workloads)), self.device_of])
        return loads

    def makespan_under(self, cost_s: np.ndarray) -> float:
        """The makespan this placement has when the latencies are ``cost_s`` (e.g. measured: realised)."""
        return float(self.loads_s(cost_s).max())

    def timeline(self, cost_s: np.ndarray | None = None) -> pd.DataFrame:
        """One row per workload: device, start and end seconds when each device runs its
        share back to back (a Gantt chart's bars)."""
        cost = self._check_cost(cost_s)
        rows, clock = [], np.zeros(len(self.devices))
        for i, (w, d) in enumerate(zip(self.workloads, self.device_of)):
            rows.append({"workload": w, "device": self.devices[d], "start_s": clock[d], "end_s": clock[d] + cost[i, d]})
            clock[d] += cost[i, d]
        return pd.DataFrame(rows)

    def key(self) -> tuple[int, ...]:
        """Hashable identity of the assignment (placements by two predictors may coincide)."""
        return self.device_of

    def _check_cost(self, cost_s: np.ndarray | None) -> np.ndarray:
        cost = self.cost_s if cost_s is None else np.asarray(cost_s, dtype=np.float64)
        if cost.shape != (len(self.workloads), len(self.devices)):
            raise ValueError(f"cost_s must be [workloads={len(self.workloads)}, devices={len(self.devices)}], "
                             f"got {list(cost.shape)}")
        return cost


# ----------------------------------------------------------------------------- costs


def pool_pressure(workloads: Sequence[PlacementWorkload], device: Device, level: str,
                  batch: Any = None) -> float | None:
    """The pressure (``costmodel.colocation.ColocationFactors.pressure_of``) of a typical neighbour
    of ``device``: every workload of the pool run back to back, timed by ``level`` on the
    device's own model alone. Which workloads a neighbour will run is what the placement
    decides, so the cost of a workload on a device cannot depend on it (the MILP's costs are
    fixed); the pool's rate of memory traffic is what a neighbour runs on average. None when
    the device has no co-location factors measured beside the stream neighbour. ``batch``: the
    pool's traces already featurised (``TraceBatch.from_traces``), when the caller has them."""
    from costmodel.colocation import neighbour_pressure
    from sim.predict.simulator import predict_traces

    if device.colocation is None or not device.colocation.has_stream:
        return None
    traces = [w.trace for w in workloads]
    busy_s = float(predict_traces(device._fitted(), traces if batch is None else batch, [level],
                                  quiet=True)[f"pred_{level}_s"].sum())
    return neighbour_pressure(device.colocation, traces, busy_s)


def contention_inputs(workloads: Sequence[PlacementWorkload], device: Device, level: str
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per workload on ``device``: its seconds alone at ``level``, its sensitivity (the
    time-weighted mean over its kernels of the stream ratio minus 1) and its pressure on a
    neighbour (``ColocationFactors.pressure_of`` over its alone seconds); the inputs of
    ``costmodel.colocation.contended_timeline``. None without factors measured beside the stream."""
    from sim.predict.simulator import predict_trace

    factors = device.colocation
    if factors is None or not factors.has_stream:
        return None
    model = device._fitted()
    alone, sens, pres = np.zeros(len(workloads)), np.zeros(len(workloads)), np.zeros(len(workloads))
    for i, w in enumerate(workloads):
        if not w.trace:
            continue
        seconds = predict_trace(model, w.trace, [level], quiet=True)[level].to_numpy()
        stream = np.array([factors.factor(k.family, float(k.bytes_moved()), pressure=1.0) for k in w.trace])
        alone[i] = float(seconds.sum())
        sens[i] = float((seconds * (stream - 1.0)).sum() / alone[i]) if alone[i] > 0 else 0.0
        pres[i] = factors.pressure_of([float(k.bytes_moved()) for k in w.trace], alone[i]) or 0.0
    return alone, sens, pres


def contended_makespan(placement: "Placement", devices: Sequence[Device], level: str,
                       workloads: Sequence[PlacementWorkload], alone_s: np.ndarray | None = None, *,
                       inputs: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray] | None] | None = None
                       ) -> tuple[float, pd.DataFrame] | None:
    """The makespan of ``placement`` when each device's workloads are slowed, moment by moment,
    by what the other devices run then (``costmodel.colocation.contended_timeline``), from
    ``level``'s predictions on each workload's device; ``alone_s`` [workloads, devices]
    replaces the level's seconds alone (e.g. the measured latencies: the contention model
    alone). ``inputs``: ``contention_inputs`` per device at ``level``, when already computed
    (they do not depend on the placement). With the timeline (workload, device, start_s,
    end_s). None unless every device has factors measured beside the stream."""
    from costmodel.colocation import contended_timeline

    if inputs is None:
        inputs = [contention_inputs(workloads, d, level) for d in devices]
    if any(x is None for x in inputs):
        return None
    idx = np.arange(len(workloads))
    where = np.asarray(placement.device_of)
    alone = np.array([inputs[d][0][i] for i, d in zip(idx, where)]) if alone_s is None else np.asarray(alone_s)[idx, where]
    sens = np.array([inputs[d][1][i] for i, d in zip(idx, where)])
    pres = np.array([inputs[d][2][i] for i, d in zip(idx, where)])
    start, end = contended_timeline(alone, sens, pres, where, len(devices))
    timeline = pd.DataFrame({"workload": [w.name for w in workloads], "device": [devices[d].name for d in where],
                             "start_s": start, "end_s": end, "alone_s": alone, "sensitivity": sens, "pressure": pres})
    return float(np.nanmax(end)) if len(end) else 0.0, timeline


def cost_matrix(workloads: Sequence[PlacementWorkload], devices: Sequence[Device], predict: Predictor) -> np.ndarray:
    """Predicted seconds of every workload on every device, [workloads, devices].

    A level name predicts all workloads at once per distinct cost model
    (``sim.predict.simulator.predict_traces``: every distinct kernel of every trace featurised and
    predicted once, summed per trace; the same sums as ``predict_trace`` per workload), so
    devices sharing a profile's model cost one prediction, not one per workload and device:
    each per-family regression (a random forest of 100 trees) is called once per model
    instead of once per workload and device, which is what kept ``place`` from staying under
    a second beside a CPU hog (``scripts/bench_placement_busy.py``)."""
    cost = np.empty((len(workloads), len(devices)))
    if isinstance(predict, str):
        from sim.predict.simulator import TraceBatch, predict_traces

        batch = TraceBatch.from_traces([w.trace for w in workloads])
        by_model: dict[tuple[int, int], np.ndarray] = {}  # ids of a CostModel and factors (alive for the call) -> column
        for d, dev in enumerate(devices):
            model = dev._fitted()
            key = (id(model), id(dev.colocation))
            if key not in by_model:
                if dev.colocation is None:
                    by_model[key] = predict_traces(model, batch, [predict], quiet=True)[f"pred_{predict}_s"].to_numpy()
                else:  # each family's part of every trace times its factor, beside the pool's pressure
                    from costmodel.colocation import colocated_kernel_times

                    def times(traces: Sequence[Sequence[KernelSpec]], model: CostModel = model) -> dict[str, np.ndarray]:
                        return {predict: predict_traces(model, traces, [predict], quiet=True)[f"pred_{predict}_s"].to_numpy()}

                    pressure = pool_pressure(workloads, dev, predict, batch)
                    by_model[key] = colocated_kernel_times(times, dev.colocation, pressure=pressure)(
                        [w.trace for w in workloads])[predict]
            cost[:, d] = by_model[key]
    else:
        for d, dev in enumerate(devices):
            for i, w in enumerate(workloads):
                value = predict(w, dev)
                seconds = _seconds(value)
                if seconds is None:
                    raise PlacementError(f"predict {predictor_name(predict)!r} must return seconds as a number (finite, "
                                         f">= 0); for workload {w.name!r} on device {dev.name!r} it returned "
                                         f"{type(value).__name__} {value!r}")
                cost[i, d] = seconds
    bad = [(workloads[i].name, devices[d].name, float(cost[i, d])) for i, d in zip(*np.nonzero(~(np.isfinite(cost) & (cost >= 0))))]
    if bad:
        raise PlacementError(f"predicted latencies must be finite seconds >= 0; got (workload, device, value) {bad[:5]}")
    return cost


def predictor_name(predict: Predictor) -> str:
    return predict if isinstance(predict, str) else getattr(predict, "__name__", type(predict).__name__)


# ----------------------------------------------------------------------------- validation


def check_inputs(workloads: Sequence[PlacementWorkload], devices: Sequence[Device], predict: Predictor) -> None:
    """Every error ``place`` can raise about its input, before any solving or running."""
    for kind, items, cls in (("workloads", workloads, PlacementWorkload), ("devices", devices, Device)):
        if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
            raise PlacementError(f"{kind} must be a list of sim.place.placement.{cls.__name__}, got {type(items).__name__}")
    if not workloads:
        raise PlacementError("no workloads to place: give at least one")
    if not devices:
        raise PlacementError("no devices to place on: give at least one")
    for kind, items, cls in (("workloads", workloads, PlacementWorkload), ("devices", devices, Device)):
        for i, x in enumerate(items):
            if not isinstance(x, cls):
                label = getattr(x, "name", x) if not isinstance(x, str) else x
                raise PlacementError(f"{kind}[{i}] ({label!r}) is a {type(x).__name__}, not a sim.place.placement.{cls.__name__}"
                                     f"; build one with sim.place.placement.{cls.__name__}(...)"
                                     + (" or a builder of sim.place.placement_workloads" if cls is PlacementWorkload else
                                        " or Device.from_profile"))
    for i, w in enumerate(workloads):
        if not w.trace:  # a PlacementWorkload refuses an empty trace when built; this catches one changed after
            raise PlacementError(f"workloads[{i}] ({w.name!r}): trace must list at least one kernel descriptor")
    for kind, items in (("workload", workloads), ("device", devices)):
        names = [x.name for x in items]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise PlacementError(f"{kind} names must be unique, repeated: {dup}")
    for dev in devices:
        model = dev._fitted()
        if isinstance(predict, str) and predict not in model.levels:
            raise PlacementError(f"predict={predict!r} is not a level of device {dev.name!r}'s cost model; "
                                 f"allowed: {sorted(model.levels)} or a callable (workload, device) -> seconds")
    if not isinstance(predict, str) and not callable(predict):
        raise PlacementError(f"predict must be a level name or a callable (workload, device) -> seconds, got {predict!r}")
    biggest = max(d.memory_bytes for d in devices)
    for w in workloads:
        if w.memory_bytes > biggest:
            raise PlacementError(f"workload {w.name!r} needs {w.memory_bytes / 2**20:,.1f} MiB, more than any device's "
                                 f"memory (largest: {biggest / 2**20:,.1f} MiB)")
    need, have = sum(w.memory_bytes for w in workloads), sum(d.memory_bytes for d in devices)
    if need > have:
        raise PlacementError(f"the workloads need {need / 2**20:,.1f} MiB together, more than the devices' "
                             f"{have / 2**20:,.1f} MiB")


# ----------------------------------------------------------------------------- solvers


def place(workloads: Sequence[PlacementWorkload], devices: Sequence[Device], predict: Predictor, *, solver: str = "auto",
          exact_max_binaries: int = EXACT_MAX_BINARIES, time_limit_s: float = EXACT_TIME_LIMIT_S) -> Placement:
    """Minimise the makespan of ``workloads`` on ``devices`` with latencies from ``predict``.

    ``solver``: "milp" (exact, HiGHS), "lpt" (greedy) or "auto" (exact when the instance
    has at most ``exact_max_binaries`` workload-device pairs, else LPT).
    """
    _check_solver_options(solver, exact_max_binaries, time_limit_s)
    check_inputs(workloads, devices, predict)
    cost = cost_matrix(workloads, devices, predict)
    return solve(cost, np.array([w.memory_bytes for w in workloads], dtype=np.float64),
                 np.array([d.memory_bytes for d in devices], dtype=np.float64),
                 workloads=tuple(w.name for w in workloads), devices=tuple(d.name for d in devices),
                 predictor=predictor_name(predict), solver=solver, exact_max_binaries=exact_max_binaries,
                 time_limit_s=time_limit_s)


def solve(cost_s: np.ndarray, memory_bytes: np.ndarray, capacity_bytes: np.ndarray, *, workloads: tuple[str, ...],
          devices: tuple[str, ...], predictor: str = "costs", solver: str = "auto",
          exact_max_binaries: int = EXACT_MAX_BINARIES, time_limit_s: float = EXACT_TIME_LIMIT_S) -> Placement:
    """R||Cmax with memory capacities on a ready cost matrix (``place`` without the models).

    The exact solver stops at ``time_limit_s`` with its best placement and the gap to its
    proven bound; LPT's placement is kept where it is no worse, and is returned (with a
    note) when the exact solver found none in time.
    """
    cost, memory, capacity, workloads, devices = check_problem(cost_s, memory_bytes, capacity_bytes,
                                                               workloads=workloads, devices=devices)
    _check_solver_options(solver, exact_max_binaries, time_limit_s)
    time_limit_s = float(time_limit_s)
    n, m = cost.shape
    fits = memory[:, None] <= capacity[None, :]
    started = time.monotonic()
    exact = solver == "milp" or (solver == "auto" and n * m <= exact_max_binaries)
    greedy = _lpt(cost, memory, capacity, fits)
    if exact:
        found = _milp(cost, memory, capacity, time_limit_s)
        elapsed = time.monotonic() - started
        lower = max(simple_lower_bound_s(cost, memory, capacity), found.dual_bound_s)
        if found.device_of is None:  # no incumbent within the limit
            if greedy is None:
                raise PlacementError(f"the exact solver found no placement within time_limit_s={time_limit_s:g} "
                                     f"({found.message}) and LPT cannot fit the workloads into the devices' memory; "
                                     "raise time_limit_s")
            span = _makespan(cost, greedy)
            gap = _gap_pct(span, lower)
            note = (f"the exact solver found no placement within time_limit_s={time_limit_s:g} ({elapsed:.1f} s; "
                    f"HiGHS: {found.message}): LPT's placement instead; gap vs lower bound {gap:.2f}%")
            return Placement(workloads, devices, greedy, cost, predictor, "lpt", span, lower, gap,
                             bool(math.isclose(span, lower, rel_tol=1e-9, abs_tol=1e-15)), note)
        device_of, optimal = found.device_of, found.optimal
        span = _makespan(cost, device_of)
        kept_lpt = greedy is not None and _makespan(cost, greedy) < span - 1e-12  # a time-limited MILP can lose to LPT
        if kept_lpt:
            device_of, optimal, span = greedy, False, _makespan(cost, greedy)
        gap = 0.0 if optimal else _gap_pct(span, lower)
        if optimal:
            note = "proven optimal (HiGHS)"
        else:
            why = (f"time limit {time_limit_s:g} s reached" if found.status == 1 else f"HiGHS stopped ({found.message})")
            note = (f"{why} after {elapsed:.1f} s: best placement found, HiGHS gap {100 * found.mip_gap:.2f}%; "
                    f"gap vs lower bound {gap:.2f}%" + ("; LPT's placement, better than the solver's" if kept_lpt else ""))
        return Placement(workloads, devices, device_of, cost, predictor, "milp", span, lower, gap, optimal, note)
    if greedy is None:
        raise PlacementError("LPT could not fit the workloads into the devices' memory (each device's sum of "
                             "workload memory must stay within its memory_bytes); try solver='milp'")
    lower = lower_bound_s(cost, memory, capacity, time_limit_s=time_limit_s)
    span = _makespan(cost, greedy)
    identical = bool(np.allclose(cost, cost[:, :1]))
    gap = _gap_pct(span, lower)
    note = f"LPT; gap vs lower bound {gap:.2f}%"
    if identical:
        note += f"; identical devices: within {4 / 3 - 1 / (3 * m):.3f}x of optimal (Graham 1969)"
    return Placement(workloads, devices, greedy, cost, predictor, "lpt", span, lower, gap,
                     bool(math.isclose(span, lower, rel_tol=1e-9, abs_tol=1e-15)), note)


def _check_solver_options(solver: object, exact_max_binaries: object, time_limit_s: object) -> None:
    if not isinstance(solver, str) or solver not in SOLVERS:
        raise PlacementError(f"solver must be one of {list(SOLVERS)}, got {solver!r}")
    if not _is_int(exact_max_binaries) or exact_max_binaries < 0:
        raise PlacementError(f"exact_max_binaries must be an integer >= 0, got {exact_max_binaries!r}")
    limit = _seconds(time_limit_s)
    if limit is None or not math.isfinite(limit) or limit <= 0:
        raise PlacementError(f"time_limit_s must be a finite number of seconds > 0, got {time_limit_s!r}")


def _names(field_name: str, names: object) -> tuple[str, ...]:
    if isinstance(names, (str, bytes, Mapping)) or not isinstance(names, Iterable):
        raise PlacementError(f"{field_name} must be a list of names (non-empty strings), got {type(names).__name__}")
    names = tuple(names)
    bad = [x for x in names if not isinstance(x, str) or not x]
    if bad:
        raise PlacementError(f"{field_name} must be non-empty strings, got {bad[:5]}")
    if not names:
        raise PlacementError(f"{field_name} lists no names: give at least one")
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise PlacementError(f"{field_name} must be unique, repeated: {dup}")
    return names


def _numbers(field_name: str, value: object, shape: tuple[int, ...], what: str) -> np.ndarray:
    raw = np.asarray(value)
    if raw.dtype.kind not in "iuf":
        raise PlacementError(f"{field_name} must be an array of numbers, got dtype {raw.dtype} ({type(value).__name__})")
    array = raw.astype(np.float64)
    if array.shape != shape:
        raise PlacementError(f"{field_name} must have shape {list(shape)} ({what}), got {list(array.shape)}")
    return array


def check_problem(cost_s: object, memory_bytes: object, capacity_bytes: object, *, workloads: object,
                  devices: object) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...], tuple[str, ...]]:
    """``solve``'s input checked: names unique, the cost matrix [workloads, devices] of finite
    seconds >= 0, memory finite bytes >= 0 per workload, capacities finite bytes > 0 per
    device. Returns them as float arrays and name tuples; PlacementError naming the field."""
    workloads, devices = _names("workloads", workloads), _names("devices", devices)
    n, m = len(workloads), len(devices)
    cost = _numbers("cost_s", cost_s, (n, m), f"one row per workload name ({n}), one column per device name ({m})")
    bad = np.argwhere(~(np.isfinite(cost) & (cost >= 0)))
    if len(bad):
        shown = [(workloads[i], devices[d], float(cost[i, d])) for i, d in bad[:5]]
        raise PlacementError(f"cost_s must hold finite seconds >= 0; {len(bad)} do not, (workload, device, value): {shown}")
    memory = _numbers("memory_bytes", memory_bytes, (n,), f"one per workload name ({n})")
    bad = np.flatnonzero(~(np.isfinite(memory) & (memory >= 0)))
    if len(bad):
        raise PlacementError(f"memory_bytes must be finite bytes >= 0; (workload, value): "
                             f"{[(workloads[i], float(memory[i])) for i in bad[:5]]}")
    capacity = _numbers("capacity_bytes", capacity_bytes, (m,), f"one per device name ({m})")
    bad = np.flatnonzero(~(np.isfinite(capacity) & (capacity > 0)))
    if len(bad):
        raise PlacementError(f"capacity_bytes must be finite bytes > 0; (device, value): "
                             f"{[(devices[d], float(capacity[d])) for d in bad[:5]]}")
    return cost, memory, capacity, workloads, devices


def _gap_pct(span: float, lower: float) -> float:
    """100 (makespan / lower bound - 1); 0 when both are 0 (nothing to do)."""
    return 100 * (span / lower - 1) if lower > 0 else (0.0 if span == 0 else float("inf"))


def _makespan(cost: np.ndarray, device_of: Sequence[int]) -> float:
    loads = np.zeros(cost.shape[1])
    np.add.at(loads, np.asarray(device_of), cost[np.arange(cost.shape[0]), list(device_of)])
    return float(loads.max())


def _lpt(cost: np.ndarray, memory: np.ndarray, capacity: np.ndarray, fits: np.ndarray) -> tuple[int, ...] | None:
    """Longest first (by the fastest device's time), each to the device where it finishes
    earliest among those with memory left; None if some workload fits nowhere."""
    n, m = cost.shape
    order = sorted(range(n), key=lambda i: (-cost[i].min(), i))
    loads, used = np.zeros(m), np.zeros(m)
    device_of = [0] * n
    for i in order:
        ok = fits[i] & (used + memory[i] <= capacity)
        if not ok.any():
            return None
        finish = np.where(ok, loads + cost[i], np.inf)
        d = int(np.argmin(finish))
        device_of[i] = d
        loads[d] += cost[i, d]
        used[d] += memory[i]
    return tuple(device_of)


def _program(cost: np.ndarray, memory: np.ndarray, capacity: np.ndarray) -> tuple[Any, ...]:
    """(objective, constraints, bounds, scale) of the integer program, costs scaled to O(1);
    sparse rows (a dense [n, n*m] assignment matrix takes gigabytes at a few thousand
    workloads)."""
    from scipy.optimize import Bounds, LinearConstraint
    from scipy.sparse import csr_array

    n, m = cost.shape
    scale = float(cost.mean()) or 1.0  # all-zero costs (e.g. L0 of work without FLOPs)
    p = cost / scale
    nv = n * m + 1  # x_id (row-major: i * m + d), then C
    c = np.zeros(nv)
    c[-1] = 1.0
    cols = np.arange(n * m)
    assign = csr_array((np.ones(n * m), (np.repeat(np.arange(n), m), cols)), shape=(n, nv))
    device_of_col = np.tile(np.arange(m), n)
    load = csr_array((np.concatenate([p.ravel(), -np.ones(m)]),
                      (np.concatenate([device_of_col, np.arange(m)]), np.concatenate([cols, np.full(m, nv - 1)]))),
                     shape=(m, nv))
    mem = csr_array(((memory[:, None] / capacity[None, :]).ravel(), (device_of_col, cols)), shape=(m, nv))
    upper = np.ones(nv)
    upper[:-1] = (memory[:, None] <= capacity[None, :]).astype(float).ravel()
    upper[-1] = np.inf
    constraints = [LinearConstraint(assign, 1.0, 1.0), LinearConstraint(load, -np.inf, 0.0),
                   LinearConstraint(mem, -np.inf, 1.0)]
    return c, constraints, Bounds(np.zeros(nv), upper), scale


@dataclass(frozen=True)
class _MilpResult:
    device_of: tuple[int, ...] | None  # None: no placement found within the limit
    optimal: bool
    mip_gap: float
    dual_bound_s: float  # HiGHS's proven lower bound on the makespan (0 when it has none)
    status: int
    message: str


def _milp(cost: np.ndarray, memory: np.ndarray, capacity: np.ndarray, time_limit_s: float) -> _MilpResult:
    from scipy.optimize import milp

    n, m = cost.shape
    c, constraints, bounds, scale = _program(cost, memory, capacity)
    integrality = np.ones(len(c))
    integrality[-1] = 0
    res = milp(c, constraints=constraints, integrality=integrality, bounds=bounds,
               options={"time_limit": float(time_limit_s), "mip_rel_gap": 1e-9})
    dual = getattr(res, "mip_dual_bound", None)
    dual_s = float(dual) * scale if dual is not None and np.isfinite(dual) and dual > 0 else 0.0
    if res.x is None:
        if res.status == 2:
            raise PlacementError("the workloads do not fit the devices' memory: no placement keeps every device's "
                                 "sum of workload memory within its memory_bytes")
        return _MilpResult(None, False, float("nan"), dual_s, int(res.status), str(res.message))
    x = res.x[:-1].reshape(n, m)
    device_of = tuple(int(np.argmax(row)) for row in x)
    gap = getattr(res, "mip_gap", None)
    return _MilpResult(device_of, bool(res.status == 0), float(gap) if gap is not None and np.isfinite(gap) else
                       float("nan"), dual_s, int(res.status), str(res.message))


def simple_lower_bound_s(cost_s: np.ndarray, memory_bytes: np.ndarray, capacity_bytes: np.ndarray) -> float:
    """A lower bound needing no solver: max(max_i min_d p_id, sum_i min_d p_id / devices),
    each minimum over the devices the workload fits."""
    cost = np.asarray(cost_s, dtype=np.float64)
    fits = np.asarray(memory_bytes)[:, None] <= np.asarray(capacity_bytes)[None, :]
    fastest = np.where(fits, cost, np.inf).min(axis=1)
    fastest = np.where(np.isfinite(fastest), fastest, 0.0)
    return float(max(fastest.max(), fastest.sum() / cost.shape[1]))


def lower_bound_s(cost_s: np.ndarray, memory_bytes: np.ndarray, capacity_bytes: np.ndarray, *,
                  time_limit_s: float = EXACT_TIME_LIMIT_S) -> float:
    """A proven lower bound on the optimal makespan: max(LP relaxation, max_i min_d p_id);
    the LP stops at ``time_limit_s`` (then the bound of ``simple_lower_bound_s``)."""
    from scipy.optimize import milp

    cost = np.asarray(cost_s, dtype=np.float64)
    whole = simple_lower_bound_s(cost, memory_bytes, capacity_bytes)
    c, constraints, bounds, scale = _program(cost, memory_bytes, capacity_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = milp(c, constraints=constraints, integrality=np.zeros(len(c)), bounds=bounds,
                   options={"time_limit": float(time_limit_s)})
    lp = float(res.fun) * scale if res.x is not None and res.status == 0 else 0.0
    return max(lp, whole)
