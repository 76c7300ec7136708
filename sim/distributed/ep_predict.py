"""The predicted expert-parallel step: per rank a timeline of phases, the step as its slowest rank.

From an ``EPPlan`` (``sim.distributed.ep_plan``) and the layer config, each rank r runs the
kernels ``sim.distributed.ep_layer.EPMoELayer`` runs, grouped in five phases:

1. ``router``: ``gemm`` [T_r, D] x [D, E], ``softmax``, ``topk`` on the rank's token shard;
2. ``dispatch``: the local prep (``sort`` of the A_r dispatched assignments by destination,
   ``histogram``, ``gather`` of token ids, gates and rows), then two all-to-alls: the
   [W x L] row counts (L = most slots on a rank, int64) and the rows (``plan.dispatch_bytes``);
3. ``experts``: the R_r received rows regrouped by local slot (``sort``, ``gather``), the
   config's registered backend's own ``expert_trace`` (``sim.workloads.backends.moe``: loop, padded,
   grouped) over the rank's slots seen as a layer of S_r experts with the rows
   ``plan.local_expert_rows(r)``, and the ``scatter`` (index_copy) back to arrival order;
4. ``combine``: the all-to-all of the results (``plan.combine_bytes``);
5. ``weighted_sum``: ``elementwise`` scale by the gates and ``scatter`` (index_add) into [T_r, D].

Kernel seconds come from a kernel-time function (``cost_model_kernel_times(model)``: the
project's cost model, ``sim.predict.simulator.predict_traces``); collective seconds from a
collective model with ``predict_all_to_all_s(send_bytes [W, W], level) -> [W]`` seconds each
rank spends in the call (``costmodel.collectives``, or a latency-bandwidth model).

**Co-location** (optional ``colocation``, ``costmodel.colocation.ColocationFactors``): the
ranks share one host, so each runs its kernels while the others run theirs; the profile was
measured with one process alone. Every kernel's predicted seconds are multiplied by its
family's measured factor (median of beside / alone, ``costmodel.colocation``), at every
level; the collectives are not (they are measured between the processes already). None
predicts every rank as if it ran alone.

Levels, as the project's (docs/method.md): L0 and L1 are FLOPs-only (FLOPs / peak, FLOPs /
per-family achieved rate) and a collective moves no FLOPs, so it costs 0 s there (the waits
still apply); L2 is the kernels' roofline plus the collective model's ``L2`` (latency +
bytes / bandwidth); L3 the fitted kernel model plus the collective model's ``L3`` (fitted to
its own profile; a model without L3, such as ``make_latency_bandwidth_model``'s what-if,
answers L3 with its L2).

**Wait rule** (bulk-synchronous: a collective is a superstep boundary, Valiant, "A bridging
model for parallel computation", CACM 33(8), 1990; the same rule as the LogGP-style
all-to-all analyses of DeepSpeed-MoE, arXiv:2201.05596, Sec. 5): an all-to-all with uneven
splits cannot finish on any rank before every rank has entered it (each rank receives from
every other). Rank r enters at e_r (when its own prep ends); the call starts for all at
``ready = max_s e_s``; rank r leaves at ``ready + c_r``, c_r the collective model's seconds
for rank r; its wait is ``ready - e_r``. The counts exchange, the rows exchange and the
combine each apply it. Local phases run back to back. The step is the largest end time over
ranks (``step_timing.time_step`` times the slowest rank the same way). The **straggler** is
the rank with the most busy time (compute and collective seconds, waits excluded): the rank
the others waited for. Not modelled: overlap of communication with computation (the real
layer has none), and the time a rank needs to leave a collective after a peer's last byte.

**Skew share** = 1 - step(balanced) / step(actual): the balanced counterpart
(``balanced_rank_work``) keeps the token shards and spreads the same rows, assignments and
bytes over the ranks as evenly as integers allow (``plan.balanced``'s totals), every rank's
rows evenly over the mean number of non-empty local slots, so a uniform routing on a
symmetric placement has a skew share of 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from costmodel.families.descriptor import KernelSpec
from costmodel.model.cold_start import charges_s
from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gather import GatherSpec
from costmodel.families.gemm import GemmSpec
from costmodel.families.histogram import HistogramSpec
from costmodel.families.scatter import ScatterSpec
from costmodel.families.softmax import SoftmaxSpec
from costmodel.families.sort import SortSpec
from costmodel.families.topk import TopkSpec
from sim.workloads.backends.moe import moe_backend
from sim.distributed.ep_plan import EPPlan
from sim.workloads.moe_layer import DispatchPlan, MoEConfig

PHASES = ("router", "dispatch", "experts", "combine", "weighted_sum")
LEVELS = ("L0", "L1", "L2", "L3")
#: levels at which a collective costs nothing (FLOPs-only levels: an all-to-all moves no FLOPs)
FLOPS_ONLY_LEVELS = ("L0", "L1")
COUNT_BYTES = 8  # the counts exchange sends int64

KernelTimes = Callable[[Sequence[Sequence[KernelSpec]]], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class RankWork:
    """What one rank does in one step, enough to write its kernels."""

    tokens: int  # T_r: its token shard
    sent: int  # A_r: assignments it dispatches (every destination, its own included)
    token_hit_cv: float  # CV of how often each of its tokens is dispatched / combined into
    local_rows: tuple[int, ...]  # rows per local slot, local slot order


@dataclass(frozen=True)
class RankTimeline:
    """One rank's predicted step at one level: phase -> (start, end) seconds from the step's
    start, and per phase its compute, wait and collective seconds."""

    phases: dict[str, tuple[float, float]]
    compute_s: dict[str, float]
    wait_s: dict[str, float]
    collective_s: dict[str, float]

    @property
    def end_s(self) -> float:
        return self.phases[PHASES[-1]][1]

    @property
    def busy_s(self) -> float:
        """Seconds computing or in a collective's own time, waits excluded."""
        return float(sum(self.compute_s.values()) + sum(self.collective_s.values()))

    def to_dict(self) -> dict[str, Any]:
        return {p: {"start_s": s, "end_s": e, "compute_s": self.compute_s[p], "wait_s": self.wait_s[p],
                    "collective_s": self.collective_s[p]} for p, (s, e) in self.phases.items()}


@dataclass
class EPStepPrediction:
    """Per level: every rank's timeline, the step, the straggler, the balanced step and the skew share."""

    timelines: dict[str, list[RankTimeline]]
    balanced_step_s: dict[str, float]
    collective_extrapolating: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def step_s(self, level: str) -> float:
        return max(t.end_s for t in self.timelines[level])

    def straggler(self, level: str) -> int:
        busy = [t.busy_s for t in self.timelines[level]]
        return int(np.argmax(busy))

    def skew_share(self, level: str) -> float:
        step = self.step_s(level)
        return 1.0 - self.balanced_step_s[level] / step if step > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {lv: {"step_s": self.step_s(lv), "straggler": self.straggler(lv),
                     "balanced_step_s": self.balanced_step_s[lv], "skew_share": self.skew_share(lv),
                     "ranks": [t.to_dict() for t in tl]}
                for lv, tl in self.timelines.items()}


# ----------------------------------------------------------------------------- work and traces


def _hit_cv(hits: np.ndarray) -> float:
    hits = hits.astype(np.float64)
    return round(float(hits.std() / hits.mean()), 3) if hits.size and hits.mean() > 0 else 0.0


def actual_rank_work(plan: EPPlan) -> list[RankWork]:
    """Each rank's tokens, dispatched assignments and local rows, from the plan."""
    k = plan.assignment_slot.shape[1]
    out = []
    for r in range(plan.world_size):
        lo, hi = (int(b) for b in plan.token_bounds[r:r + 2])
        sent = plan.assignment_slot[lo:hi] >= 0
        out.append(RankWork(tokens=hi - lo, sent=int(sent.sum()), token_hit_cv=_hit_cv(sent.sum(axis=1)) if k else 0.0,
                            local_rows=tuple(n for _, n in plan.local_expert_rows(r))))
    return out


def _spread(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` integers as even as possible, the larger ones first."""
    base, extra = divmod(int(total), parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def balanced_rank_work(plan: EPPlan) -> list[RankWork]:
    """The same work spread evenly over the ranks (the shards kept; rows, assignments and the
    token hit CV spread or averaged; each rank's rows evenly over the mean number of
    non-empty local slots, in a rank of the mean slot count)."""
    actual = actual_rank_work(plan)
    W = plan.world_size
    rows = _spread(sum(sum(a.local_rows) for a in actual), W)
    sent = _spread(sum(a.sent for a in actual), W)
    nonempty = max(1, int(round(np.mean([sum(1 for n in a.local_rows if n) for a in actual]))))
    slots = max(nonempty, int(round(np.mean([len(a.local_rows) for a in actual]))))
    cv = round(float(np.mean([a.token_hit_cv for a in actual])), 3)
    out = []
    for r in range(W):
        filled = _spread(rows[r], nonempty) if rows[r] else [0] * nonempty
        out.append(RankWork(tokens=actual[r].tokens, sent=sent[r], token_hit_cv=cv,
                            local_rows=tuple(filled + [0] * (slots - nonempty))))
    return out


def balanced_bytes(matrix: np.ndarray) -> np.ndarray:
    """[W, W] with the same diagonal total and the same off-diagonal total, each spread evenly."""
    m = np.asarray(matrix, dtype=np.float64)
    W = m.shape[0]
    diag = np.trace(m)
    off = m.sum() - diag
    out = np.full((W, W), off / (W * (W - 1)) if W > 1 else 0.0)
    np.fill_diagonal(out, diag / W)
    return out


def local_layer_config(cfg: MoEConfig, slots: int) -> MoEConfig:
    """The rank's slots as a layer of S_r experts (as ``ep_layer.LocalExperts``)."""
    n = max(slots, 1)
    return replace(cfg, num_experts=n, top_k=min(cfg.top_k, n))


def rank_phase_kernels(cfg: MoEConfig, work: RankWork, *, world_size: int, slots_per_rank: int
                       ) -> dict[str, list[KernelSpec]]:
    """The kernels of each local phase of one rank (collectives apart), as ``EPMoELayer``
    runs them; kernels over zero rows are not run and not listed."""
    D, E, k, dt = cfg.d_model, cfg.num_experts, cfg.top_k, cfg.dtype
    T, A = work.tokens, work.sent
    R = int(sum(work.local_rows))
    out: dict[str, list[KernelSpec]] = {p: [] for p in PHASES}
    if T:
        out["router"] = [GemmSpec(T, D, E, dt), SoftmaxSpec(T, E, dt), TopkSpec(T, E, min(k, E), dt)]
    if A:
        out["dispatch"] = [SortSpec(A, "int64"), HistogramSpec(A, world_size * slots_per_rank),
                           GatherSpec(A, 1, A, 0.0, False, "int64"), GatherSpec(A, 1, A, 0.0, False, dt),
                           GatherSpec(A, D, T, work.token_hit_cv, False, dt)]
        out["weighted_sum"] = [ElementwiseSpec("scale", A * D, dt),
                               ScatterSpec(A, D, T, "sum", "index_add", work.token_hit_cv, False, dt)]
    if R:
        counts = tuple(int(n) for n in work.local_rows)
        local_cfg = local_layer_config(cfg, len(counts))
        local_plan = DispatchPlan(counts=counts, assignments=R, token_hit_cv=0.0,
                                  padded_rows=len(counts) * max(counts))
        out["experts"] = [SortSpec(R, "int64"), GatherSpec(R, D, R, 0.0, False, dt),
                          *moe_backend(cfg.backend).expert_trace(local_cfg, local_plan),
                          ScatterSpec(R, D, R, "copy", "index_copy", 0.0, False, dt)]
    return out


def ep_rank_kernels(cfg: MoEConfig, plan: EPPlan, *, balanced: bool = False) -> list[dict[str, list[KernelSpec]]]:
    """Every rank's phase kernels of the plan (or of its balanced counterpart)."""
    work = balanced_rank_work(plan) if balanced else actual_rank_work(plan)
    L = plan.placement.max_slots_per_rank()
    return [rank_phase_kernels(cfg, w, world_size=plan.world_size, slots_per_rank=L) for w in work]


def ep_traces(cfg: MoEConfig, plan: EPPlan) -> list[list[KernelSpec]]:
    """One kernel trace per rank (actual and balanced), for held-out fits and calibration."""
    return [[s for p in PHASES for s in ranks[p]] for b in (False, True) for ranks in ep_rank_kernels(cfg, plan, balanced=b)]


# ----------------------------------------------------------------------------- timeline


def cost_model_kernel_times(model: Any, levels: Sequence[str] = LEVELS, *,
                            l3_factor: Callable[[str], float] | None = None) -> KernelTimes:
    """Kernel seconds per trace from the project's cost model (``sim.predict.simulator.predict_traces``:
    each distinct kernel predicted once, cold-call overhead included at L2 / L3 of a cold profile).
    ``l3_factor`` (family -> factor: the held-out drift of ``sim.predict.heldout_drift``) multiplies
    each kernel's L3, not its kind's cold start (``heldout_drift.drift_scaled_l3``)."""
    from sim.predict.heldout_drift import drift_scaled_l3  # noqa: PLC0415
    from sim.predict.simulator import predict_trace, predict_traces  # noqa: PLC0415

    def times(traces: Sequence[Sequence[KernelSpec]]) -> dict[str, np.ndarray]:
        scaled = l3_factor is not None and "L3" in levels
        rest = [lv for lv in levels if not (scaled and lv == "L3")]  # L3 once, per kernel, when scaled
        df = predict_traces(model, [list(t) for t in traces], rest, quiet=True)
        out = {lv: df[f"pred_{lv}_s"].to_numpy(dtype=np.float64) for lv in rest}
        if scaled:
            out["L3"] = np.array([float(drift_scaled_l3(model, list(t), predict_trace(model, list(t), ["L3"], quiet=True),
                                                        l3_factor).sum()) if len(t) else 0.0 for t in traces])
        return out

    return times


def rank_replay_kernel_times(per_rank_s: Sequence[Mapping[str, float]], fallback: KernelTimes,
                             level: str = "L3", per_kind_s: float = 0.0,
                             recold: tuple[np.ndarray, np.ndarray] | None = None, per_call_s: float = 0.0) -> KernelTimes:
    """Kernel seconds as each rank measured its own kernels inside its process (rank replay,
    ``ep_layer.ep_phase_worker(replay=...)``): at ``level`` a trace's seconds are the sum of
    its kernels' in-rank medians (keyed by ``KernelSpec.key()``) plus ``per_call_s`` per kernel
    (the host's cost among other kinds, ``costmodel.model.composition``), ``per_kind_s`` per
    distinct kernel kind and, with the profile's ``recold`` curve, each later call's re-cooling
    share (the cold start the cost model charges a cold layer, ``costmodel.model.cold_start``,
    so replay and lookup compose alike); other levels and kernels no
    rank measured (the balanced counterpart's) come from ``fallback``. The traces arrive
    rank-major, ``len(PHASES)`` per rank (``_level_timelines``), so trace i is rank
    ``i // len(PHASES)``'s. A composition check, not a prediction: the kernels were timed on
    the very ranks being scored."""
    W = len(per_rank_s)

    def times(traces: Sequence[Sequence[KernelSpec]]) -> dict[str, np.ndarray]:
        out = {lv: np.asarray(v, dtype=np.float64).copy() for lv, v in fallback(traces).items()}
        if len(traces) != W * len(PHASES):
            return out
        for i, trace in enumerate(traces):
            seconds = per_rank_s[i // len(PHASES)]
            keys = [s.key() for s in trace]
            if all(k in seconds for k in keys):
                out[level][i] = (float(sum(seconds[k] for k in keys)) + per_call_s * len(trace)
                                 + float(charges_s(per_kind_s, recold, trace).sum()))
        return out

    return times


def _collective(cm: Any, send_bytes: np.ndarray, level: str) -> np.ndarray:
    W = send_bytes.shape[0]
    if level in FLOPS_ONLY_LEVELS:
        return np.zeros(W)
    levels = tuple(getattr(cm, "levels", (level,)))
    asked = level if level in levels else levels[-1]  # an L2-only what-if model answers L3 with its L2
    out = np.asarray(cm.predict_all_to_all_s(np.asarray(send_bytes, dtype=np.float64), level=asked), dtype=np.float64)
    if out.shape != (W,):
        raise ValueError(f"the collective model returned shape {list(out.shape)} for a [{W}, {W}] all-to-all; "
                         f"expected [{W}] seconds, one per rank")
    return out


def rank_timelines(compute_s: Sequence[Mapping[str, float]], collectives: Mapping[str, Sequence[np.ndarray]],
                   alone_s: Sequence[Mapping[str, float]] | None = None) -> list[RankTimeline]:
    """The wait rule of the module docstring, over ranks: ``compute_s[r][phase]`` the rank's
    local seconds per phase (first in the phase), ``collectives[phase]`` the [W] seconds of
    each all-to-all that ends the phase, in order. ``alone_s`` (the same seconds as measured
    alone, where ``compute_s`` is co-located): a phase's local work lasts as
    ``costmodel.colocation.overlapped_seconds`` says, slowed only while another rank is busy."""
    W = len(compute_s)
    clock = np.zeros(W)
    phases: list[dict[str, tuple[float, float]]] = [{} for _ in range(W)]
    comp: list[dict[str, float]] = [{} for _ in range(W)]
    wait: list[dict[str, float]] = [{} for _ in range(W)]
    coll: list[dict[str, float]] = [{} for _ in range(W)]
    for p in PHASES:
        start = clock.copy()
        local = np.array([float(compute_s[r].get(p, 0.0)) for r in range(W)])
        if alone_s is not None:
            from costmodel.colocation import overlapped_seconds  # noqa: PLC0415

            local = overlapped_seconds([float(alone_s[r].get(p, 0.0)) for r in range(W)], local, clock)
        clock = clock + local
        waited, spent = np.zeros(W), np.zeros(W)
        for c in collectives.get(p, ()):
            ready = clock.max()  # nobody leaves an all-to-all before everybody entered it
            waited += ready - clock
            spent += c
            clock = ready + c
        for r in range(W):
            phases[r][p] = (float(start[r]), float(clock[r]))
            comp[r][p], wait[r][p], coll[r][p] = float(local[r]), float(waited[r]), float(spent[r])
    return [RankTimeline(phases[r], comp[r], wait[r], coll[r]) for r in range(W)]


def _level_timelines(kernels: list[dict[str, list[KernelSpec]]], comm: Mapping[str, Sequence[np.ndarray]],
                     kernel_times: KernelTimes, collective_model: Any, levels: Sequence[str],
                     colocation: Any = None) -> dict[str, list[RankTimeline]]:
    W = len(kernels)
    traces = [kernels[r][p] for r in range(W) for p in PHASES]
    alone_seconds = kernel_times(traces)
    seconds = alone_seconds
    if colocation is not None:
        from costmodel.colocation import colocated_kernel_times  # noqa: PLC0415

        seconds = colocated_kernel_times(kernel_times, colocation)(traces)
    out = {}
    for lv in levels:
        per = np.asarray(seconds[lv], dtype=np.float64).reshape(W, len(PHASES))
        compute = [{p: float(per[r, i]) for i, p in enumerate(PHASES)} for r in range(W)]
        alone = None
        if colocation is not None:
            solo = np.asarray(alone_seconds[lv], dtype=np.float64).reshape(W, len(PHASES))
            alone = [{p: float(solo[r, i]) for i, p in enumerate(PHASES)} for r in range(W)]
        colls = {p: [_collective(collective_model, b, lv) for b in mats] for p, mats in comm.items()}
        out[lv] = rank_timelines(compute, colls, alone_s=alone)
    return out


def predict_ep_step(cfg: MoEConfig, plan: EPPlan, kernel_times: KernelTimes, collective_model: Any, *,
                    levels: Sequence[str] = LEVELS, colocation: Any = None) -> EPStepPrediction:
    """The predicted step of ``plan`` (and of its balanced counterpart) at every level;
    ``colocation`` (``ColocationFactors`` or None): each kernel times its family's factor at
    its bytes while another rank is busy too (``rank_timelines``' ``alone_s``)."""
    W = plan.world_size
    L = plan.placement.max_slots_per_rank()
    counts = np.full((W, W), float(L * COUNT_BYTES))
    actual = {"dispatch": [counts, plan.dispatch_bytes.astype(np.float64)], "combine": [plan.combine_bytes.astype(np.float64)]}
    even = {"dispatch": [counts, balanced_bytes(plan.dispatch_bytes)], "combine": [balanced_bytes(plan.combine_bytes)]}
    timelines = _level_timelines(ep_rank_kernels(cfg, plan), actual, kernel_times, collective_model, levels, colocation)
    bal = _level_timelines(ep_rank_kernels(cfg, plan, balanced=True), even, kernel_times, collective_model, levels,
                           colocation)
    extrapolating = None
    if hasattr(collective_model, "extrapolating"):
        notes = [collective_model.extrapolating(m) for m in (plan.dispatch_bytes, plan.combine_bytes, counts)]
        extrapolating = "; ".join(n for n in notes if n) or None
    return EPStepPrediction(timelines=timelines, balanced_step_s={lv: max(t.end_s for t in tl) for lv, tl in bal.items()},
                            collective_extrapolating=extrapolating,
                            meta={"world_size": W, "slots_per_rank": L, "backend": cfg.backend,
                                  "colocation": None if colocation is None else colocation.to_dict()["factors"]})
