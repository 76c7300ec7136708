"""An expert-parallel plan from a routing: who computes which rows, and the bytes the
dispatch and combine all-to-alls move. Pure computation, no processes.

Setting (GShard, Lepikhin et al., arXiv:2006.16668; DeepSpeed-MoE, Rajbhandari et al.,
arXiv:2201.05596): T tokens are sharded over W ranks in contiguous blocks (rank r holds
tokens [bounds[r], bounds[r+1]), the first T mod W ranks one token more, as
``numpy.array_split``); expert weights live in slots placed by
``sim.distributed.expert_placement``. Each kept (token, expert) assignment of a top-k
routing is sent from its token's rank to one slot of its expert (dispatch), computed
there, and sent back (combine), where the source weights it by the gate and sums.

Which replica (slot) an assignment goes to, when an expert has several:
1. a replica on the token's own rank, if there is one (no bytes cross ranks);
2. otherwise round robin: the n-th such assignment of source rank s to expert e (token
   order) goes to replica (n + s) mod r_e of the expert's r_e replicas (slots ascending);
   the offset s spreads the sources' first picks over the replicas.

Capacity (Switch Transformer, Fedus, Zoph & Shazeer, JMLR 2022, as ``sim.workloads.routing``, per
slot instead of per expert): capacity = ceil(capacity_factor * T * k / S) rows per slot;
a slot keeps its assignments in global token order (earlier tokens claim capacity first;
with contiguous shards that is also source-rank order) and drops the rest. Dropped rows
are not sent: after the count exchange of a real layer every source knows how much room
the earlier sources left. Assignments the routing itself dropped (``Routing.kept``) are
not dispatched either and are counted apart (``routing_dropped``).

Bytes: a dispatched row is d_model elements of the layer's dtype; dispatch matrix
[s, d] = rows source s sends to rank d (diagonal: rows that stay on their rank, a local
copy in ``all_to_all_single``); the combine matrix is its transpose (every row goes back
to its source). Per-rank ``send_bytes`` / ``recv_bytes`` count only other ranks, the
bytes that cross a link.

``balanced`` is the same work spread perfectly: every rank computes the mean rows and
FLOPs and sends / receives the mean off-rank bytes, so a caller predicting both can say
how much of a step is skew.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from costmodel.families.descriptor import DTYPE_BYTES
from sim.distributed.expert_placement import ExpertPlacement, check_world_size, place_experts
from sim.workloads.moe_layer import MoEConfig
from sim.workloads.routing import Routing


@dataclass(frozen=True, eq=False)
class RankLoads:
    """Per-rank work of one step, each a [W] float array."""

    rows: np.ndarray  # expert rows computed on the rank (all its slots)
    expert_flops: np.ndarray  # rows x expert FLOPs per row (2MKN per projection GEMM)
    send_bytes: np.ndarray  # dispatch bytes the rank sends to other ranks (= combine bytes it receives)
    recv_bytes: np.ndarray  # dispatch bytes the rank receives from other ranks (= combine bytes it sends)


@dataclass(frozen=True, eq=False)
class EPPlan:
    """The expert-parallel plan of one routing on ``world_size`` ranks."""

    world_size: int  # W
    placement: ExpertPlacement  # slots: expert and rank of each
    token_bounds: np.ndarray  # [W + 1] rank r holds tokens [bounds[r], bounds[r+1])
    assignment_slot: np.ndarray  # [T, k] slot each assignment is sent to; -1: not dispatched
    slot_rows: np.ndarray  # [S] rows each slot computes (kept)
    slot_dropped: np.ndarray  # [S] assignments each slot dropped over capacity
    capacity_per_slot: int | None  # None: no capacity limit
    routing_dropped: int  # assignments the routing had already dropped (Routing.kept False)
    row_bytes: int  # d_model x element bytes
    dispatch_rows: np.ndarray  # [W, W] rows source s sends to rank d
    dispatch_bytes: np.ndarray  # [W, W] dispatch_rows x row_bytes
    combine_bytes: np.ndarray  # [W, W] dispatch_bytes.T: results back to the source
    actual: RankLoads
    balanced: RankLoads  # the same totals spread evenly over the ranks

    @property
    def dropped(self) -> int:
        """Assignments dropped over slot capacity (not counting ``routing_dropped``)."""
        return int(self.slot_dropped.sum())

    @property
    def recv_bytes(self) -> np.ndarray:
        """[W] dispatch bytes each rank receives from other ranks."""
        return self.actual.recv_bytes

    @property
    def rank_rows(self) -> np.ndarray:
        return self.actual.rows

    @property
    def skew_share(self) -> float:
        """Share of the busiest rank's expert FLOPs beyond a perfectly balanced split
        (0 balanced; 1 - 1/W when one rank computes everything)."""
        busiest = float(self.actual.expert_flops.max())
        return 1.0 - float(self.balanced.expert_flops.max()) / busiest if busiest > 0 else 0.0

    def local_expert_rows(self, rank: int) -> list[tuple[int, int]]:
        """(expert, rows) of each slot on ``rank``, in local slot order."""
        slots = self.placement.slots_of_rank(rank)
        return [(int(self.placement.slot_expert[s]), int(self.slot_rows[s])) for s in slots]


def token_shards(tokens: int, world_size: int) -> np.ndarray:
    """[W + 1] bounds of contiguous token shards, the first T mod W one token longer."""
    W = check_world_size(world_size)
    sizes = np.full(W, tokens // W, dtype=np.int64)
    sizes[: tokens % W] += 1
    return np.concatenate([[0], np.cumsum(sizes)])


def check_ep_capacity_factor(capacity_factor: object) -> float | None:
    if capacity_factor is None:
        return None
    ok = isinstance(capacity_factor, (int, float, np.integer, np.floating)) and not isinstance(capacity_factor, bool)
    if not ok or not (math.isfinite(capacity_factor) and capacity_factor > 0):
        raise ValueError(f"ep.capacity_factor must be a finite number > 0 (such as 1.25) or None for no capacity "
                         f"limit, got {capacity_factor!r}")
    return float(capacity_factor)


def routing_arrays(routing: Routing | np.ndarray, cfg: MoEConfig) -> tuple[np.ndarray, np.ndarray]:
    """(expert ids [T, k] int64, kept [T, k] bool) of a ``Routing`` or an id array, checked
    against the config: shape [moe.tokens, moe.top_k], ids in [0, moe.num_experts)."""
    T, k, E = cfg.tokens, cfg.top_k, cfg.num_experts
    if isinstance(routing, Routing):
        if routing.num_experts != E:
            raise ValueError(f"routing.num_experts must equal moe.num_experts={E}, got {routing.num_experts}")
        ids, kept = np.asarray(routing.expert_ids), np.asarray(routing.kept)
    else:
        ids = np.asarray(routing)
        kept = np.ones(ids.shape, dtype=bool)
    if ids.shape != (T, k):
        raise ValueError(f"routing expert ids must have shape [moe.tokens={T}, moe.top_k={k}], got {list(ids.shape)}")
    if ids.dtype.kind not in "iu":
        raise ValueError(f"routing expert ids must be integers, got dtype {ids.dtype}")
    if kept.shape != (T, k) or kept.dtype != bool:
        raise ValueError(f"routing.kept must be a bool array of shape [{T}, {k}], got {kept.dtype} {list(kept.shape)}")
    bad = np.flatnonzero((ids < 0) | (ids >= E))
    if bad.size:
        t, j = divmod(int(bad[0]), k)
        raise ValueError(f"routing expert ids must be in [0, moe.num_experts={E}), got {int(ids[t, j])} "
                         f"at token {t}, choice {j} ({bad.size} out of range)")
    return ids.astype(np.int64), kept


def rank_within_group(keys: np.ndarray) -> np.ndarray:
    """For each entry, how many earlier entries share its key (``sim.workloads.routing``'s
    rank-within-expert, for any non-negative int keys)."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]) if keys.size else np.array([], int)
    group_start = np.repeat(starts, np.diff(np.r_[starts, keys.size]))
    rank = np.empty(keys.size, dtype=np.int64)
    rank[order] = np.arange(keys.size) - group_start
    return rank


def plan_expert_parallel(
    cfg: MoEConfig,
    routing: Routing | np.ndarray,
    *,
    world_size: int,
    placement: str | ExpertPlacement = "contiguous",
    capacity_factor: float | None = None,
    num_slots: int | None = None,
    expert_load: np.ndarray | None = None,
) -> EPPlan:
    """Plan one MoE layer of ``cfg`` under ``routing`` on ``world_size`` ranks.

    ``placement``: a kind from ``expert_placement.PLACEMENTS`` or a built placement;
    ``num_slots`` and ``expert_load`` are for ``load_aware`` (default: E + one slot per
    rank, the routing's kept per-expert counts)."""
    W = check_world_size(world_size)
    cf = check_ep_capacity_factor(capacity_factor)
    ids, kept_in = routing_arrays(routing, cfg)
    T, k, E = cfg.tokens, cfg.top_k, cfg.num_experts
    if isinstance(placement, ExpertPlacement):
        if placement.num_experts != E or placement.world_size != W:
            raise ValueError(f"placement is for {placement.num_experts} experts on {placement.world_size} ranks; "
                             f"the plan has moe.num_experts={E}, ep.world_size={W}")
        place = placement
    else:
        if placement == "load_aware" and expert_load is None:
            expert_load = np.bincount(ids[kept_in], minlength=E)
        place = place_experts(placement, num_experts=E, world_size=W, num_slots=num_slots, expert_load=expert_load)
    S = place.num_slots

    bounds = token_shards(T, W)
    src = np.repeat(np.repeat(np.arange(W), np.diff(bounds)), k)  # source rank of each flat assignment
    expert = ids.reshape(-1)
    live = kept_in.reshape(-1)

    slot = place.local_slot_table()[src, expert]  # rule 1: a replica on the token's own rank
    remote = live & (slot < 0)
    if remote.any():  # rule 2: round robin over the expert's replicas, offset by the source rank
        table, counts = place.replica_table()
        n = rank_within_group(src[remote] * E + expert[remote])
        pick = (n + src[remote]) % counts[expert[remote]]
        slot[remote] = table[expert[remote], pick]
    slot[~live] = -1

    capacity = None
    slot_dropped = np.zeros(S, dtype=np.int64)
    if cf is not None:
        capacity = math.ceil(cf * T * k / S)
        sent = np.flatnonzero(slot >= 0)  # token-major: earlier tokens claim capacity first
        over = sent[rank_within_group(slot[sent]) >= capacity]
        slot_dropped = np.bincount(slot[over], minlength=S)
        slot[over] = -1

    dispatched = slot >= 0
    slot_rows = np.bincount(slot[dispatched], minlength=S)
    dest = place.slot_rank[slot[dispatched]]
    dispatch_rows = np.bincount(src[dispatched] * W + dest, minlength=W * W).reshape(W, W)
    row_bytes = cfg.d_model * DTYPE_BYTES[cfg.dtype]
    dispatch_bytes = dispatch_rows * row_bytes
    off_rank = dispatch_bytes * (1 - np.eye(W, dtype=np.int64))
    rows = np.bincount(place.slot_rank, weights=slot_rows, minlength=W)
    flops_per_row = cfg.useful_flops(1) - cfg.useful_flops(0)  # the expert GEMMs of one row
    actual = RankLoads(rows=rows, expert_flops=rows * flops_per_row,
                       send_bytes=off_rank.sum(axis=1).astype(np.float64),
                       recv_bytes=off_rank.sum(axis=0).astype(np.float64))
    balanced = RankLoads(**{f: np.full(W, getattr(actual, f).mean()) for f in
                            ("rows", "expert_flops", "send_bytes", "recv_bytes")})
    return EPPlan(
        world_size=W, placement=place, token_bounds=bounds, assignment_slot=slot.reshape(T, k),
        slot_rows=slot_rows, slot_dropped=slot_dropped, capacity_per_slot=capacity,
        routing_dropped=int((~live).sum()), row_bytes=row_bytes, dispatch_rows=dispatch_rows,
        dispatch_bytes=dispatch_bytes, combine_bytes=dispatch_bytes.T.copy(), actual=actual, balanced=balanced,
    )
