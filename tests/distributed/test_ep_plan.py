"""The expert-parallel plan on hand-computed cases: rows, bytes, replicas, capacity, bad input."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sim.distributed.ep_plan import plan_expert_parallel, token_shards
from sim.distributed.expert_placement import ExpertPlacement, place_experts
from sim.workloads.moe_layer import MoEConfig
from sim.workloads.routing import Routing, ZipfRouting, route

# T=4 tokens, top-2 of E=4; ranks: r0 holds t0, t1 and r1 holds t2, t3
CFG = MoEConfig(tokens=4, d_model=2, d_ff=4, num_experts=4, top_k=2)  # a row: 2 x 4 bytes
IDS = np.array([[0, 1], [0, 2], [0, 3], [2, 0]])
ROW_FLOPS = 2 * 2 * 4 * 3  # 2MKN per row, three SwiGLU projections


def test_token_shards_are_contiguous_and_the_first_ranks_take_the_remainder():
    assert token_shards(4, 2).tolist() == [0, 2, 4]
    assert token_shards(7, 3).tolist() == [0, 3, 5, 7]
    assert token_shards(1, 3).tolist() == [0, 1, 1, 1]


def test_contiguous_rows_and_bytes_by_hand():
    plan = plan_expert_parallel(CFG, IDS, world_size=2, placement="contiguous")
    # experts 0, 1 on r0; 2, 3 on r1. r0 sends t0->0, t0->1, t1->0 home and t1->2 to r1;
    # r1 sends t2->0, t3->0 to r0 and keeps t2->3, t3->2
    assert plan.placement.slot_rank.tolist() == [0, 0, 1, 1]
    assert plan.dispatch_rows.tolist() == [[3, 1], [2, 2]]
    assert plan.dispatch_bytes.tolist() == [[24, 8], [16, 16]]
    assert plan.combine_bytes.tolist() == [[24, 16], [8, 16]]
    assert plan.actual.send_bytes.tolist() == [8.0, 16.0]
    assert plan.recv_bytes.tolist() == [16.0, 8.0]
    assert plan.slot_rows.tolist() == [4, 1, 2, 1]
    assert plan.local_expert_rows(0) == [(0, 4), (1, 1)]
    assert plan.local_expert_rows(1) == [(2, 2), (3, 1)]
    assert plan.rank_rows.tolist() == [5.0, 3.0]
    assert plan.actual.expert_flops.tolist() == [5.0 * ROW_FLOPS, 3.0 * ROW_FLOPS]
    assert plan.balanced.rows.tolist() == [4.0, 4.0]
    assert plan.balanced.expert_flops.tolist() == [4.0 * ROW_FLOPS] * 2
    assert plan.balanced.send_bytes.tolist() == [12.0, 12.0]
    assert plan.skew_share == pytest.approx(0.2)  # 1 - 4/5
    assert plan.dropped == 0 and plan.routing_dropped == 0 and plan.capacity_per_slot is None
    assert plan.assignment_slot.tolist() == IDS.tolist()  # one slot per expert, slot id = expert id


def test_round_robin_places_expert_e_on_rank_e_mod_w():
    plan = plan_expert_parallel(CFG, IDS, world_size=2, placement="round_robin")
    assert plan.placement.slot_rank.tolist() == [0, 1, 0, 1]
    assert plan.dispatch_rows.tolist() == [[3, 1], [3, 1]]
    assert plan.rank_rows.tolist() == [6.0, 2.0]
    assert plan.skew_share == pytest.approx(1 - 4 / 6)


def test_capacity_drops_the_latest_tokens_of_a_full_slot():
    plan = plan_expert_parallel(CFG, IDS, world_size=2, placement="contiguous", capacity_factor=1.0)
    assert plan.capacity_per_slot == 2  # ceil(1.0 * 4 * 2 / 4)
    # expert 0 is chosen by t0, t1, t2, t3: t2 and t3 (both on r1) are dropped and never sent
    assert plan.slot_dropped.tolist() == [2, 0, 0, 0]
    assert plan.dropped == 2
    assert plan.assignment_slot.tolist() == [[0, 1], [0, 2], [-1, 3], [2, -1]]
    assert plan.dispatch_rows.tolist() == [[3, 1], [0, 2]]
    assert plan.slot_rows.tolist() == [2, 1, 2, 1]


def test_load_aware_replicates_the_heaviest_experts_and_keeps_rows_home():
    plan = plan_expert_parallel(CFG, IDS, world_size=2, placement="load_aware", num_slots=6)
    # loads 4, 1, 2, 1: the first extra replica goes to expert 0 (4), the second to expert 2
    # (loads per replica 2, 1, 2, 1; expert 0 already has W=2 replicas); packed heaviest first
    # onto the lightest rank without the expert: r0 gets 0, 2, 1 and r1 gets 0, 2, 3
    assert plan.placement.slot_expert.tolist() == [0, 1, 2, 0, 2, 3]
    assert plan.placement.slot_rank.tolist() == [0, 0, 0, 1, 1, 1]
    assert plan.assignment_slot.tolist() == [[0, 1], [0, 2], [3, 5], [4, 3]]  # every row has a local replica
    assert plan.dispatch_rows.tolist() == [[4, 0], [0, 4]]
    assert plan.actual.send_bytes.tolist() == [0.0, 0.0]
    assert plan.local_expert_rows(1) == [(0, 2), (2, 1), (3, 1)]
    assert plan.skew_share == 0.0


def test_a_replicated_expert_is_split_round_robin_from_a_rank_without_it():
    cfg = MoEConfig(tokens=9, d_model=2, d_ff=4, num_experts=2, top_k=1)
    # expert 0 has replicas on r0 (slot 0) and r2 (slot 1); expert 1 lives on r1 (slot 2)
    place = ExpertPlacement("load_aware", 2, 3, np.array([0, 0, 1]), np.array([0, 2, 1]))
    ids = np.array([[1], [0], [0], [0], [0], [0], [0], [0], [0]])
    plan = plan_expert_parallel(cfg, ids, world_size=3, placement=place)
    # r0 (t0-t2) and r2 (t6-t8) use their own replica; r1's t3, t4, t5 pick replica
    # (n + 1) mod 2 for n = 0, 1, 2: slots 1, 0, 1
    assert plan.assignment_slot[:, 0].tolist() == [2, 0, 0, 1, 0, 1, 1, 1, 1]
    assert plan.dispatch_rows.tolist() == [[2, 1, 0], [1, 0, 2], [0, 0, 3]]
    assert plan.slot_rows.tolist() == [3, 5, 1]


def test_routing_drops_are_not_dispatched_and_counted_apart():
    kept = np.ones((4, 2), dtype=bool)
    kept[3, 1] = False
    routing = Routing(expert_ids=IDS, gates=np.full((4, 2), 0.5, dtype=np.float32), kept=kept, num_experts=4)
    plan = plan_expert_parallel(CFG, routing, world_size=2)
    assert plan.routing_dropped == 1 and plan.dropped == 0
    assert plan.assignment_slot[3].tolist() == [2, -1]
    assert plan.dispatch_rows.tolist() == [[3, 1], [1, 2]]


@pytest.mark.parametrize("placement", ["contiguous", "round_robin", "load_aware"])
def test_every_kept_row_is_dispatched_once_on_a_drawn_routing(placement):
    cfg = MoEConfig(tokens=101, d_model=8, d_ff=16, num_experts=8, top_k=2)
    routing = route(ZipfRouting(1.5), tokens=101, num_experts=8, top_k=2, seed=0)
    plan = plan_expert_parallel(cfg, routing, world_size=4, placement=placement, capacity_factor=1.25)
    assert plan.capacity_per_slot == int(np.ceil(1.25 * 101 * 2 / plan.placement.num_slots))
    assert plan.slot_rows.max() <= plan.capacity_per_slot
    assert plan.dispatch_rows.sum() == plan.slot_rows.sum() == 202 - plan.dropped
    assert plan.dispatch_bytes.sum() == plan.dispatch_rows.sum() * 32
    dispatched = plan.assignment_slot >= 0
    # every dispatched row goes to a slot of the expert the routing chose
    assert (plan.placement.slot_expert[plan.assignment_slot[dispatched]] == routing.expert_ids[dispatched]).all()


def test_load_aware_defaults_to_one_extra_slot_per_rank_and_balances_a_skewed_routing():
    cfg = MoEConfig(tokens=256, d_model=8, d_ff=16, num_experts=8, top_k=2)
    routing = route(ZipfRouting(1.5), tokens=256, num_experts=8, top_k=2, seed=0)
    contiguous = plan_expert_parallel(cfg, routing, world_size=4, placement="contiguous")
    aware = plan_expert_parallel(cfg, routing, world_size=4, placement="load_aware")
    assert aware.placement.num_slots == 12  # 4 x (8/4 + 1)
    assert aware.skew_share < contiguous.skew_share / 2


@pytest.mark.parametrize("kwargs, message", [
    ({"world_size": 0}, "ep.world_size must be an integer >= 1, got 0"),
    ({"world_size": 2.0}, "ep.world_size must be an integer >= 1, got 2.0"),
    ({"world_size": 3}, "moe.num_experts=4 must be divisible by ep.world_size=3 for placement 'contiguous' "
                        "(blocks of E/W experts per rank)"),
    ({"world_size": 2, "placement": "random"},
     "ep.placement must be one of ['contiguous', 'round_robin', 'load_aware'], got 'random'"),
    ({"world_size": 2, "capacity_factor": 0},
     "ep.capacity_factor must be a finite number > 0 (such as 1.25) or None for no capacity limit, got 0"),
    ({"world_size": 2, "capacity_factor": float("inf")},
     "ep.capacity_factor must be a finite number > 0 (such as 1.25) or None for no capacity limit, got inf"),
    ({"world_size": 2, "placement": "load_aware", "num_slots": 5},
     "ep.num_slots must be a multiple of ep.world_size=2 in [moe.num_experts=4, moe.num_experts x "
     "ep.world_size=8], got 5"),
    ({"world_size": 2, "placement": "load_aware", "num_slots": 10},
     "ep.num_slots must be a multiple of ep.world_size=2 in [moe.num_experts=4, moe.num_experts x "
     "ep.world_size=8], got 10"),
    ({"world_size": 2, "placement": "round_robin", "num_slots": 6},
     "ep.num_slots applies to placement 'load_aware' only (round_robin holds each expert once: "
     "moe.num_experts=4 slots), got 6"),
    ({"world_size": 2, "placement": "load_aware", "expert_load": [1, 2, 3]},
     "ep.expert_load must hold moe.num_experts=4 finite loads >= 0, got shape (3,) [1, 2, 3]"),
    ({"world_size": 2, "placement": "load_aware", "expert_load": [1, -2, 3, 4]},
     "ep.expert_load must hold moe.num_experts=4 finite loads >= 0, got shape (4,) [1, -2, 3, 4]"),
])
def test_bad_arguments_name_the_field_and_range(kwargs, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        plan_expert_parallel(CFG, IDS, **kwargs)


@pytest.mark.parametrize("ids, message", [
    (IDS[:3], "routing expert ids must have shape [moe.tokens=4, moe.top_k=2], got [3, 2]"),
    (IDS.astype(float), "routing expert ids must be integers, got dtype float64"),
    (np.array([[0, 1], [0, 4], [0, 3], [-1, 0]]),
     "routing expert ids must be in [0, moe.num_experts=4), got 4 at token 1, choice 1 (2 out of range)"),
])
def test_bad_routing_names_the_field_and_range(ids, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        plan_expert_parallel(CFG, ids, world_size=2)


def test_a_placement_for_another_shape_is_refused():
    place = place_experts("round_robin", num_experts=4, world_size=4)
    with pytest.raises(ValueError, match=re.escape("placement is for 4 experts on 4 ranks; the plan has "
                                                   "moe.num_experts=4, ep.world_size=2")):
        plan_expert_parallel(CFG, IDS, world_size=2, placement=place)


@pytest.mark.parametrize("slot_expert, slot_rank, message", [
    ([0, 1, 2], [0, 1, 0], "placement.slot_expert must hold every expert in [0, moe.num_experts=4) at least once, "
                           "missing [3]"),
    ([0, 1, 2, 4], [0, 1, 0, 1], "placement.slot_expert must be in [0, moe.num_experts=4), got values 0..4"),
    ([0, 1, 2, 3], [0, 1, 0, 2], "placement.slot_rank must be in [0, ep.world_size=2), got values 0..2"),
    ([0, 1, 2, 3], [0, 1, 0], "placement.slot_expert and placement.slot_rank must be integer arrays of one shape [S], "
                              "got int64 [4] and int64 [3]"),
])
def test_a_hand_built_placement_is_checked(slot_expert, slot_rank, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ExpertPlacement("load_aware", 4, 2, np.array(slot_expert), np.array(slot_rank))
