"""Where each expert lives on W ranks: expert slots, their ranks and their experts.

A *slot* is one copy of one expert's weights on one rank. Three placements:

- ``contiguous``: E slots, rank r holds experts [r*E/W, (r+1)*E/W) (E divisible by W), as
  Megatron-style expert parallelism shards the expert dimension in blocks;
- ``round_robin``: E slots, expert e on rank e mod W;
- ``load_aware``: ``num_slots`` >= E slots (a multiple of W, each rank gets S/W of them),
  after DeepSeek's EPLB (github.com/deepseek-ai/EPLB, ``eplb.py``: ``replicate_experts``
  and ``balanced_packing``): first the heaviest experts get extra replicas, one at a
  time to the expert with the largest load per replica; then the replicas (each carrying
  its expert's load / its replica count) are packed, heaviest first, onto the lightest
  rank that still has a free slot. Two changes from EPLB: a rank that already holds a
  replica of the expert is passed over while another rank with room does not (two copies
  on one rank would split no work across ranks), and an expert gets at most W replicas.
  The loads are the routing's own per-expert counts unless a caller passes others (e.g.
  the previous step's), which is how EPLB is used: placement from load statistics.

DeepSeek-V3 serves with redundant experts placed this way (DeepSeek-AI, "DeepSeek-V3
Technical Report", arXiv:2412.19437, Sec. 3.4: each GPU hosts one redundant expert in
decoding), which is the default here: one slot per rank beyond ceil(E/W).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PLACEMENTS = ("contiguous", "round_robin", "load_aware")


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.int64)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class ExpertPlacement:
    """Slots of one placement. Slot ids are rank-major for ``load_aware`` and equal the
    expert id for ``contiguous`` / ``round_robin``."""

    kind: str  # one of PLACEMENTS
    num_experts: int  # E
    world_size: int  # W
    slot_expert: np.ndarray  # [S] logical expert held by each slot
    slot_rank: np.ndarray  # [S] rank holding each slot

    def __post_init__(self) -> None:
        E, W = self.num_experts, self.world_size
        experts, ranks = np.asarray(self.slot_expert), np.asarray(self.slot_rank)
        if experts.ndim != 1 or experts.shape != ranks.shape or experts.dtype.kind not in "iu" \
                or ranks.dtype.kind not in "iu":
            raise ValueError(f"placement.slot_expert and placement.slot_rank must be integer arrays of one shape [S], "
                             f"got {experts.dtype} {list(experts.shape)} and {ranks.dtype} {list(ranks.shape)}")
        if experts.size and (experts.min() < 0 or experts.max() >= E):
            raise ValueError(f"placement.slot_expert must be in [0, moe.num_experts={E}), "
                             f"got values {experts.min()}..{experts.max()}")
        if ranks.size and (ranks.min() < 0 or ranks.max() >= W):
            raise ValueError(f"placement.slot_rank must be in [0, ep.world_size={W}), got values {ranks.min()}..{ranks.max()}")
        missing = np.setdiff1d(np.arange(E), experts)
        if missing.size:
            raise ValueError(f"placement.slot_expert must hold every expert in [0, moe.num_experts={E}) at least once, "
                             f"missing {missing.tolist()}")

    @property
    def num_slots(self) -> int:
        return int(self.slot_expert.size)

    def slots_of_rank(self, rank: int) -> np.ndarray:
        """Slot ids on ``rank`` in local order (the order of the rank's weight stack)."""
        return np.flatnonzero(self.slot_rank == rank)

    def local_index(self) -> np.ndarray:
        """[S] position of each slot among its rank's slots."""
        out = np.empty(self.num_slots, dtype=np.int64)
        for r in range(self.world_size):
            slots = self.slots_of_rank(r)
            out[slots] = np.arange(slots.size)
        return out

    def max_slots_per_rank(self) -> int:
        return int(np.bincount(self.slot_rank, minlength=self.world_size).max())

    def replica_table(self) -> tuple[np.ndarray, np.ndarray]:
        """([E, max replicas] slot ids padded with -1, [E] replica count), slots ascending."""
        counts = np.bincount(self.slot_expert, minlength=self.num_experts)
        table = np.full((self.num_experts, int(counts.max())), -1, dtype=np.int64)
        for e in range(self.num_experts):
            slots = np.flatnonzero(self.slot_expert == e)
            table[e, : slots.size] = slots
        return table, counts

    def local_slot_table(self) -> np.ndarray:
        """[W, E] the slot of expert e on rank w (the lowest id if several), -1 if none."""
        table = np.full((self.world_size, self.num_experts), -1, dtype=np.int64)
        for s in range(self.num_slots - 1, -1, -1):  # descending, so the lowest id wins
            table[self.slot_rank[s], self.slot_expert[s]] = s
        return table


def check_world_size(world_size: object) -> int:
    if not isinstance(world_size, (int, np.integer)) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"ep.world_size must be an integer >= 1, got {world_size!r}")
    return int(world_size)


def default_num_slots(num_experts: int, world_size: int) -> int:
    """One redundant slot per rank beyond ceil(E/W) (DeepSeek-V3, Sec. 3.4), at most E*W."""
    return min(world_size * (math.ceil(num_experts / world_size) + 1), num_experts * world_size)


def place_experts(
    kind: str,
    *,
    num_experts: int,
    world_size: int,
    num_slots: int | None = None,
    expert_load: np.ndarray | None = None,
) -> ExpertPlacement:
    """The placement ``kind`` of E experts on W ranks; ``num_slots`` and ``expert_load``
    (per-expert loads, e.g. token counts) are for ``load_aware`` only."""
    W = check_world_size(world_size)
    E = int(num_experts)
    if kind not in PLACEMENTS:
        raise ValueError(f"ep.placement must be one of {list(PLACEMENTS)}, got {kind!r}")
    if kind != "load_aware":
        if num_slots is not None and num_slots != E:
            raise ValueError(f"ep.num_slots applies to placement 'load_aware' only ({kind} holds each expert "
                             f"once: moe.num_experts={E} slots), got {num_slots!r}")
        experts = np.arange(E)
        if kind == "contiguous":
            if E % W:
                raise ValueError(f"moe.num_experts={E} must be divisible by ep.world_size={W} for placement "
                                 f"'contiguous' (blocks of E/W experts per rank)")
            ranks = experts // (E // W)
        else:
            ranks = experts % W
        return ExpertPlacement(kind, E, W, _readonly(experts), _readonly(ranks))
    S = default_num_slots(E, W) if num_slots is None else num_slots
    if not isinstance(S, (int, np.integer)) or isinstance(S, bool) or S % W or not E <= S <= E * W:
        raise ValueError(f"ep.num_slots must be a multiple of ep.world_size={W} in [moe.num_experts={E}, "
                         f"moe.num_experts x ep.world_size={E * W}], got {num_slots!r}")
    load = _check_load(expert_load, E)
    replicas = replicate_heaviest(load, int(S), max_replicas=W)
    slot_expert, slot_rank = pack_replicas(load, replicas, W)
    return ExpertPlacement(kind, E, W, _readonly(slot_expert), _readonly(slot_rank))


def _check_load(expert_load: np.ndarray | None, num_experts: int) -> np.ndarray:
    if expert_load is None:
        raise ValueError("ep.expert_load is required for placement 'load_aware' (per-expert loads, e.g. token counts)")
    raw = np.asarray(expert_load)
    load = raw.astype(np.float64) if raw.dtype.kind in "iuf" else None
    if load is None or load.shape != (num_experts,) or not np.all(np.isfinite(load)) or np.any(load < 0):
        raise ValueError(f"ep.expert_load must hold moe.num_experts={num_experts} finite loads >= 0, "
                         f"got shape {raw.shape} {raw.ravel()[:8].tolist()}")
    return load


def replicate_heaviest(load: np.ndarray, num_slots: int, *, max_replicas: int) -> np.ndarray:
    """[E] replica counts summing to ``num_slots``: each extra replica goes to the expert with
    the largest load per replica (EPLB ``replicate_experts``), ties to the lowest id, never
    beyond ``max_replicas``. Bounded: num_slots - E iterations."""
    E = load.size
    counts = np.ones(E, dtype=np.int64)
    for _ in range(num_slots - E):
        per_replica = np.where(counts < max_replicas, load / counts, -np.inf)
        counts[int(np.argmax(per_replica))] += 1
    return counts


def pack_replicas(load: np.ndarray, replicas: np.ndarray, world_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(slot_expert, slot_rank) of the replicas packed on ranks, S/W slots each (EPLB
    ``balanced_packing``): heaviest replica first (load / replica count; ties by expert id),
    onto the lightest rank with a free slot, passing over ranks that already hold the
    expert while one without it has room. Slots are then numbered rank-major, by expert
    id within a rank."""
    E, W = load.size, world_size
    S = int(replicas.sum())
    per_rank = S // W
    items = np.repeat(np.arange(E), replicas)  # one entry per replica
    weight = (load / replicas)[items]
    order = np.lexsort((items, -weight))  # heaviest first, then lowest expert id
    rank_load = np.zeros(W)
    rank_items: list[list[int]] = [[] for _ in range(W)]
    for i in order:  # S iterations of O(W)
        e = int(items[i])
        room = [r for r in range(W) if len(rank_items[r]) < per_rank]
        fresh = [r for r in room if e not in rank_items[r]]
        r = min(fresh or room, key=lambda q: (rank_load[q], q))
        rank_items[r].append(e)
        rank_load[r] += weight[i]
    slot_expert = np.concatenate([np.sort(np.asarray(es, dtype=np.int64)) for es in rank_items])
    slot_rank = np.repeat(np.arange(W), per_rank)
    return slot_expert, slot_rank
