"""The expert-parallel layer on two gloo processes computes the single-device layer's output;
the launcher reports failures and never waits past its timeout."""

from __future__ import annotations

import multiprocessing
import re
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from costmodel.families.gemm import GemmSpec
from costmodel.families.sort import SortSpec
from sim.distributed.ep_layer import EPMoELayer, run_ep_forward
from sim.distributed.ep_plan import plan_expert_parallel
from sim.distributed.launch import EPTimeoutError, EPWorkerError, run_ep
from sim.distributed.step_timing import time_step
from sim.workloads.moe_layer import MoEConfig, MoELayer
from sim.workloads.routing import Routing, UniformRouting, ZipfRouting, route

from ep_probes import fail_on_rank_1, sleep  # tests/distributed/ep_probes.py: light for spawned ranks

CFG = MoEConfig(tokens=48, d_model=16, d_ff=32, num_experts=4, top_k=2)
SEED = 3


def _routing(generator) -> Routing:
    return route(generator, tokens=CFG.tokens, num_experts=CFG.num_experts, top_k=CFG.top_k, seed=1)


def _kept_by(plan, routing: Routing) -> Routing:
    """The routing the single-device layer needs to compute what the plan dispatched."""
    return Routing(routing.expert_ids, routing.gates, plan.assignment_slot >= 0, routing.num_experts)


CASES = ["skewed-contiguous", "uniform-round_robin", "skewed-load_aware-drops", "padded-3-experts-round_robin",
         "grouped-load_aware-drops"]


@pytest.fixture(scope="module")
def ep_run():
    """One launch of W=2 processes for every case (each launch costs two torch imports)."""
    skewed, uniform = _routing(ZipfRouting(2.0)), _routing(UniformRouting())
    padded3 = replace(CFG, num_experts=3, backend="padded")  # rank 1 holds one slot, fewer than top_k
    grouped = replace(CFG, backend="grouped")
    uniform3 = route(UniformRouting(), tokens=CFG.tokens, num_experts=3, top_k=CFG.top_k, seed=1)
    cases = [
        (CFG, plan_expert_parallel(CFG, skewed, world_size=2, placement="contiguous"), skewed),
        (CFG, plan_expert_parallel(CFG, uniform, world_size=2, placement="round_robin"), uniform),
        (CFG, plan_expert_parallel(CFG, skewed, world_size=2, placement="load_aware", capacity_factor=1.0), skewed),
        (padded3, plan_expert_parallel(padded3, uniform3, world_size=2, placement="round_robin"), uniform3),
        (grouped, plan_expert_parallel(grouped, skewed, world_size=2, placement="load_aware", capacity_factor=1.0),
         skewed),
    ]
    x = np.random.default_rng(0).standard_normal((CFG.tokens, CFG.d_model)).astype(np.float32)
    start = time.monotonic()
    out = run_ep_forward(cases, x, world_size=2, seed=SEED, time_repeats=3, timeout_s=120)
    return {"cases": cases, "x": x, "out": out, "wall_s": time.monotonic() - start}


@pytest.fixture
def one_thread():
    """The reference on one thread, as each rank runs: tiny GEMMs on a 2-thread pool of a busy
    2-core host took 37 ms each (threads waiting for each other), 1000x their work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("case", range(len(CASES)), ids=CASES)
def test_ep_layer_equals_the_single_device_layer(ep_run, case, one_thread):
    cfg, plan, routing = ep_run["cases"][case]
    reference = MoELayer(cfg, seed=SEED)(torch.from_numpy(ep_run["x"]), _kept_by(plan, routing))
    torch.testing.assert_close(torch.from_numpy(ep_run["out"]["outputs"][case]), reference)


def test_the_cases_are_what_they_claim(ep_run):
    skewed, uniform, aware, padded3, _ = (plan for _, plan, _ in ep_run["cases"])
    assert skewed.rank_rows.max() / skewed.rank_rows.mean() > 1.3  # Zipf(2) on contiguous blocks
    assert uniform.skew_share < 0.1
    assert aware.placement.num_slots == 6 and aware.dropped > 0  # replicas and capacity drops
    assert (aware.dispatch_rows * (1 - np.eye(2, dtype=int))).sum() > 0  # rows cross ranks
    assert [len(padded3.local_expert_rows(r)) for r in (0, 1)] == [2, 1]


def test_step_time_is_the_slowest_rank_on_every_rank(ep_run):
    rank0, rank1 = ep_run["out"]["steps"]
    assert len(rank0.times_s) == 3 and rank0.times_s == rank1.times_s  # all_reduce MAX: one number
    assert all(0 < t < ep_run["wall_s"] for t in rank0.times_s)
    assert rank0.spec["world_size"] == 2 and rank0.spec["backend"] == "gloo" and rank0.threads == 1


def test_the_launch_says_how_ranks_were_pinned(ep_run):
    import os

    cores = sorted(os.sched_getaffinity(0))
    expected = (f"rank r pinned to core {cores[:2]}[r]" if len(cores) >= 2
                else f"not pinned: {len(cores)} cores available for world_size=2")
    assert ep_run["out"]["note"] == expected


def test_a_failing_rank_is_reported_and_its_blocked_peer_terminated():
    start = time.monotonic()
    with pytest.raises(EPWorkerError, match=r"(?s)^rank 1 of world_size=2 failed:\n.*ValueError: rank 1 broke on purpose"):
        run_ep(2, fail_on_rank_1, timeout_s=60)
    assert time.monotonic() - start < 45  # not the 60 s gloo timeout of the blocked rank 0
    assert multiprocessing.active_children() == []


def test_the_launcher_never_waits_past_its_timeout():
    start = time.monotonic()
    with pytest.raises(EPTimeoutError, match=re.escape("ranks [0, 1] of world_size=2 gave no result within "
                                                       "timeout_s=0.5; every process was terminated")):
        run_ep(2, sleep, (30.0,), timeout_s=0.5)
    assert time.monotonic() - start < 0.5 + 5.0  # the deadline, then terminate and join
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("world_size, timeout_s, message", [
    (0, 10, "ep.world_size must be an integer in [1, 64], got 0"),
    (65, 10, "ep.world_size must be an integer in [1, 64], got 65"),
    (2, 0, "timeout_s must be in (0, 3600] seconds, got 0"),
    (2, 4000, "timeout_s must be in (0, 3600] seconds, got 4000"),
])
def test_launcher_arguments_are_checked_before_any_process_starts(world_size, timeout_s, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        run_ep(world_size, sleep, (0.0,), timeout_s=timeout_s)


def test_a_lambda_is_refused_because_spawned_processes_import_fn_by_name():
    with pytest.raises(ValueError, match=r"^fn must be a module-level function \(spawned processes import it by name\)"):
        run_ep(1, lambda rank, world_size: rank, timeout_s=10)


def test_layer_arguments_are_checked_without_a_process_group():
    routing = _routing(UniformRouting())
    plan = plan_expert_parallel(CFG, routing, world_size=2)
    with pytest.raises(ValueError, match=re.escape("rank must be an integer in [0, ep.world_size=2), got 2")):
        EPMoELayer(CFG, plan, routing, rank=2)
    layer = EPMoELayer(CFG, plan, routing, rank=1)
    assert layer.experts.projections[0].shape == (2, 16, 32)  # experts 2 and 3 only
    assert layer.experts.cfg.num_experts == 2
    torch.testing.assert_close(layer.experts.projections[2][0], MoELayer(CFG, seed=0).projections[2][2])
    with pytest.raises(ValueError, match=re.escape("rank 1 input must be [shard tokens=24, d_model=16], got [48, 16]")):
        layer(torch.zeros(48, 16))


def test_the_routing_tensors_move_with_the_weights():
    """NCCL takes device tensors: ``.to(device)`` (or ``device=``) must move the routing cache
    with the weights; the meta device stands in for a GPU here."""
    routing = _routing(ZipfRouting(2.0))
    plan = plan_expert_parallel(CFG, routing, world_size=2)
    for layer in (EPMoELayer(CFG, plan, routing, rank=0).to("meta"), EPMoELayer(CFG, plan, routing, rank=0, device="meta")):
        tensors = dict(layer.named_parameters()) | dict(layer.named_buffers())
        assert {"_key", "_token", "_gate"} <= set(tensors)
        assert {t.device.type for t in tensors.values()} == {"meta"}
        with pytest.raises(ValueError, match=re.escape("rank 0 input is on cpu, the layer on meta")):
            layer(torch.zeros(24, 16))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"repeats": 2}, ValueError, "repeats must be an integer in [3, 1000], got 2"),
    ({"warmup": -1}, ValueError, "warmup must be an integer in [0, 100], got -1"),
    ({}, RuntimeError, "time_step runs inside a process group (sim.distributed.launch.run_ep)"),
])
def test_step_timing_arguments(kwargs, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        time_step(lambda: None, **kwargs)


def test_rank_replay_times_each_ranks_own_kernels_inside_the_ranks():
    """``run_ep_phases(replay=...)``: every rank returns one positive median per distinct kernel
    of its own phases (``ep_rank_kernels``), nothing else, for every case."""
    from dataclasses import asdict

    from costmodel.measure.timing import TimingConfig
    from sim.distributed.ep_layer import run_ep_phases
    from sim.distributed.ep_predict import PHASES, ep_rank_kernels

    skewed = _routing(ZipfRouting(2.0))
    grouped = replace(CFG, backend="grouped")
    cases = [(grouped, plan_expert_parallel(grouped, skewed, world_size=2, placement="contiguous"), skewed)]
    x = np.random.default_rng(0).standard_normal((CFG.tokens, CFG.d_model)).astype(np.float32)
    quick = TimingConfig(min_run_time_s=0.005, min_runs=3, retries=0, cold_cache=False)
    refs = [GemmSpec(4, 16, 16), SortSpec(64)]  # held-out drift references: timed in every rank, every round
    out = run_ep_phases(cases, x, world_size=2, seed=SEED, warmup=0, repeats=3, timeout_s=120, replay=asdict(quick),
                        references=refs)
    assert len(out["reference_s"]) == 2 and all(len(r) == 2 and min(r) > 0 for r in out["reference_s"])
    per_rank = out["cases"][0]["kernel_s"]
    assert len(per_rank) == 2
    for r, seconds in enumerate(per_rank):
        kernels = ep_rank_kernels(grouped, cases[0][1])[r]
        assert set(seconds) == {s.key() for p in PHASES for s in kernels[p]}
        assert all(v > 0 for v in seconds.values())


def test_references_need_the_replay_timing():
    from sim.distributed.ep_layer import ep_phase_worker

    with pytest.raises(ValueError, match="^references are timed with the replay's timing: pass replay too$"):
        ep_phase_worker(0, 2, [], np.zeros((1, 1)), references=[GemmSpec(4, 16, 16)])
