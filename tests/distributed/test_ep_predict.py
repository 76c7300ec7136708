"""The predicted expert-parallel step on hand cases: phases, the wait rule, the max over ranks,
the straggler, the skew share, and L2 with a latency-bandwidth all-to-all."""

from __future__ import annotations

import numpy as np
import pytest

from sim.distributed.ep_collectives import LatencyBandwidthAllToAll, fit_latency_bandwidth, off_rank_bytes, whatif_model
from sim.distributed.ep_plan import plan_expert_parallel
from sim.distributed.ep_predict import (
    PHASES, actual_rank_work, balanced_bytes, balanced_rank_work, ep_rank_kernels, predict_ep_step, rank_timelines,
)
from costmodel.families.gemm import GemmSpec
from sim.workloads.moe_layer import MoEConfig

# the plan tests' hand case: T=4, top-2 of E=4 on W=2, 8-byte rows
CFG = MoEConfig(tokens=4, d_model=2, d_ff=4, num_experts=4, top_k=2)
IDS = np.array([[0, 1], [0, 2], [0, 3], [2, 0]])
ALPHA, BETA = 1e-4, 1e6


def flops_times(traces):
    """A fake kernel model: 1 us per kernel plus FLOPs / 1 MFLOP/s at every level."""
    per = np.array([sum(1e-6 + s.flops() / 1e6 for s in t) for t in traces])
    return {lv: per.copy() for lv in ("L0", "L1", "L2", "L3")}


class FakeCollectives:
    """The collective model's interface: a fixed number of seconds per rank per call."""

    levels = ("L2", "L3")

    def __init__(self, seconds):
        self.seconds = np.asarray(seconds, dtype=float)
        self.calls = []

    def predict_all_to_all_s(self, send_bytes, level="L3"):
        self.calls.append((np.asarray(send_bytes).copy(), level))
        return self.seconds.copy()

    def extrapolating(self, send_bytes):
        return None


def test_the_wait_rule_by_hand():
    # rank 0 computes 1 s before the all-to-all, rank 1 3 s: rank 0 waits 2 s, both leave at 3 + c_r
    compute = [{"router": 1.0, "experts": 2.0}, {"router": 3.0, "experts": 0.5}]
    colls = {"dispatch": [np.array([0.1, 0.2])], "combine": [np.array([0.3, 0.3])]}
    r0, r1 = rank_timelines(compute, colls)
    assert r0.phases["router"] == (0.0, 1.0) and r1.phases["router"] == (0.0, 3.0)
    assert r0.wait_s["dispatch"] == pytest.approx(2.0) and r1.wait_s["dispatch"] == 0.0
    assert r0.phases["dispatch"] == pytest.approx((1.0, 3.1)) and r1.phases["dispatch"] == pytest.approx((3.0, 3.2))
    # experts: rank 0 until 5.1, rank 1 until 3.7; the combine starts for both at 5.1
    assert r1.wait_s["combine"] == pytest.approx(1.4) and r0.wait_s["combine"] == 0.0
    assert r0.end_s == pytest.approx(5.4) and r1.end_s == pytest.approx(5.4)
    assert r0.busy_s == pytest.approx(3.4) and r1.busy_s == pytest.approx(4.0)
    assert list(r0.phases) == list(PHASES)


def test_co_located_work_is_slowed_only_while_the_other_rank_is_busy():
    """Experts alone 1 s and 4 s, co-located 2 s and 8 s (2x): rank 0 finishes at 2 s, rank 1
    has done 1 s of its work by then and runs the other 3 s alone: 5 s, not 8."""
    alone = [{"experts": 1.0}, {"experts": 4.0}]
    r0, r1 = rank_timelines([{"experts": 2.0}, {"experts": 8.0}], {}, alone_s=alone)
    assert r0.compute_s["experts"] == pytest.approx(2.0) and r1.compute_s["experts"] == pytest.approx(5.0)
    same = rank_timelines([{"experts": 2.0}, {"experts": 8.0}], {})
    assert same[1].compute_s["experts"] == pytest.approx(8.0)  # without alone_s: as given


def test_timeline_phases_and_step_on_the_hand_plan():
    plan = plan_expert_parallel(CFG, IDS, world_size=2, placement="contiguous")
    cm = FakeCollectives([1e-6, 2e-6])
    pred = predict_ep_step(CFG, plan, flops_times, cm)
    kernels = ep_rank_kernels(CFG, plan)
    local = [{p: float(flops_times([kernels[r][p]])["L3"][0]) for p in PHASES} for r in range(2)]
    # hand timeline: router and dispatch prep are equal on both ranks (2 tokens, 4 assignments each)
    assert local[0]["router"] == local[1]["router"] and local[0]["dispatch"] == local[1]["dispatch"]
    # rank 0 computes 5 rows (expert 0: 4, expert 1: 1), rank 1 3 rows: rank 0 is the straggler
    assert local[0]["experts"] > local[1]["experts"]
    # counts exchange: both enter at t_e and leave at t_e + c_r (1 us, 2 us); the rows exchange
    # starts when the later one (rank 1) enters it: t_e + 2 us, and ends at + c_r again
    t_e = local[0]["router"] + local[0]["dispatch"]
    r0, r1 = pred.timelines["L3"]
    assert r0.phases["dispatch"][1] == pytest.approx(t_e + 2e-6 + 1e-6)
    assert r1.phases["dispatch"][1] == pytest.approx(t_e + 2e-6 + 2e-6)
    assert r0.wait_s["dispatch"] == pytest.approx(1e-6) and r1.wait_s["dispatch"] == 0.0
    combine_start = max(r0.phases["experts"][1], r1.phases["experts"][1])
    assert r1.wait_s["combine"] == pytest.approx(combine_start - r1.phases["experts"][1]) and r1.wait_s["combine"] > 0
    assert pred.step_s("L3") == pytest.approx(max(combine_start + c + local[r]["weighted_sum"]
                                                  for r, c in enumerate((1e-6, 2e-6))))
    assert pred.step_s("L3") == max(t.end_s for t in pred.timelines["L3"])
    assert pred.straggler("L3") == 0
    # FLOPs-only levels: collectives cost nothing, the waits remain
    assert all(t.collective_s["dispatch"] == 0 for t in pred.timelines["L0"])
    assert pred.timelines["L0"][1].wait_s["combine"] > 0
    levels_asked = {lv for _, lv in cm.calls}
    assert levels_asked == {"L2", "L3"}
    sent = [m for m, _ in cm.calls if m.sum() == plan.dispatch_bytes.sum() and (m == plan.dispatch_bytes).all()]
    assert sent, "the rows all-to-all is predicted on the plan's dispatch bytes"


def test_skew_share_is_zero_for_a_balanced_routing():
    # every expert gets 2 rows; both ranks send 2 rows home and 2 away: actual == balanced
    ids = np.array([[0, 2], [1, 3], [0, 2], [1, 3]])
    plan = plan_expert_parallel(CFG, ids, world_size=2, placement="contiguous")
    assert [w.local_rows for w in actual_rank_work(plan)] == [(2, 2), (2, 2)]
    assert actual_rank_work(plan) == balanced_rank_work(plan)
    pred = predict_ep_step(CFG, plan, flops_times, LatencyBandwidthAllToAll(ALPHA, BETA, 2))
    for lv in ("L0", "L2", "L3"):
        assert pred.skew_share(lv) == pytest.approx(0.0, abs=1e-12)


def test_skew_share_of_the_skewed_hand_plan():
    plan = plan_expert_parallel(CFG, IDS, world_size=2, placement="round_robin")  # rows 6 and 2
    pred = predict_ep_step(CFG, plan, flops_times, LatencyBandwidthAllToAll(ALPHA, BETA, 2))
    assert [sum(w.local_rows) for w in balanced_rank_work(plan)] == [4, 4]
    for lv in ("L0", "L3"):
        assert 0 < pred.skew_share(lv) < 1
        assert pred.skew_share(lv) == pytest.approx(1 - pred.balanced_step_s[lv] / pred.step_s(lv))


def test_l2_with_a_latency_bandwidth_model_equals_the_hand_formula():
    plan = plan_expert_parallel(CFG, IDS, world_size=2, placement="contiguous")
    # dispatch bytes [[24, 8], [16, 16]]: rank 0 sends 8 off-rank and receives 16; rank 1 the reverse
    cm = LatencyBandwidthAllToAll(ALPHA, BETA, 2)
    assert off_rank_bytes(plan.dispatch_bytes).tolist() == [24.0, 24.0]
    pred = predict_ep_step(CFG, plan, lambda traces: {lv: np.zeros(len(traces)) for lv in ("L0", "L1", "L2", "L3")}, cm)
    counts = 2 * 8 + 2 * 8  # L=2 int64 counts to the other rank and from it
    t_counts, t_rows = ALPHA + counts / BETA, ALPHA + 24 / BETA
    for t in pred.timelines["L2"]:
        assert t.collective_s["dispatch"] == pytest.approx(t_counts + t_rows)
        assert t.collective_s["combine"] == pytest.approx(ALPHA + 24 / BETA)
        assert t.wait_s["dispatch"] == 0 and t.wait_s["combine"] == 0
    assert pred.step_s("L2") == pytest.approx(3 * ALPHA + (counts + 48) / BETA)
    assert pred.step_s("L0") == 0.0


def test_balanced_bytes_keeps_the_totals():
    m = np.array([[24, 8], [16, 16]])
    b = balanced_bytes(m)
    assert b.tolist() == [[20.0, 12.0], [12.0, 20.0]]
    assert b.sum() == m.sum() and np.trace(b) == np.trace(m)


def test_latency_bandwidth_fit_recovers_alpha_and_beta():
    samples = [(np.full((2, 2), float(b)), ALPHA + 2 * b / BETA) for b in (1e3, 1e4, 1e5, 1e6)]
    fit = fit_latency_bandwidth(samples, 2)
    assert fit.alpha_s == pytest.approx(ALPHA, rel=1e-6) and fit.beta_bytes_per_s == pytest.approx(BETA, rel=1e-6)
    assert fit.extrapolating(np.full((2, 2), 1e8)) is not None and fit.extrapolating(np.full((2, 2), 1e5)) is None
    wide = whatif_model(fit, 8)
    assert wide.world_size == 8 and wide.alpha_s == pytest.approx(ALPHA, rel=1e-6)
    assert "extrapolated to W=8" in wide.extrapolating(np.full((8, 8), 1e4))


@pytest.mark.parametrize("backend", ["loop", "padded", "grouped"])
def test_every_backend_writes_its_expert_kernels_from_its_own_trace(backend):
    from dataclasses import replace

    from sim.workloads.backends.moe import moe_backend

    cfg = replace(CFG, backend=backend)
    plan = plan_expert_parallel(cfg, IDS, world_size=2, placement="contiguous")
    kernels = ep_rank_kernels(cfg, plan)
    families = [s.family for s in kernels[0]["experts"]]
    assert families[0] == "sort" and families[-1] == "scatter"
    assert kernels[0]["combine"] == []  # the combine phase is its all-to-all only
    assert moe_backend(backend).name == backend


def test_a_colocation_factor_of_two_doubles_the_experts_phase_while_both_ranks_run_and_nothing_else():
    from dataclasses import replace

    from costmodel.colocation import ColocationFactors

    cfg = replace(CFG, backend="grouped")  # grouped_gemm runs only in the experts phase
    plan = plan_expert_parallel(cfg, IDS, world_size=2, placement="contiguous")
    cm = FakeCollectives([1e-6, 2e-6])
    twice = ColocationFactors.constant({"grouped_gemm": 2.0})
    alone = predict_ep_step(cfg, plan, flops_times, cm)
    beside = predict_ep_step(cfg, plan, flops_times, cm, colocation=twice)
    kernels = ep_rank_kernels(cfg, plan)
    first = int(np.argmin([t.phases["experts"][1] for t in beside.timelines["L3"]]))  # the rank done first
    for r in range(2):
        a, b = alone.timelines["L3"][r], beside.timelines["L3"][r]
        grouped = float(flops_times([[s for s in kernels[r]["experts"] if s.family == "grouped_gemm"]])["L3"][0])
        assert grouped > 0
        if r == first:  # its twin busy throughout: its grouped GEMMs twice
            assert b.compute_s["experts"] == pytest.approx(a.compute_s["experts"] + grouped)
        else:  # slowed while the first rank runs, alone after it
            assert a.compute_s["experts"] < b.compute_s["experts"] < a.compute_s["experts"] + grouped
        for p in PHASES:
            assert b.collective_s[p] == a.collective_s[p]  # collectives untouched
            if p != "experts":
                assert b.compute_s[p] == pytest.approx(a.compute_s[p])

    def experts_gemm_times(traces):  # only the grouped GEMMs cost time: the experts phase is them alone
        per = np.array([sum(s.flops() / 1e6 for s in t if s.family == "grouped_gemm") for t in traces])
        return {lv: per.copy() for lv in ("L0", "L1", "L2", "L3")}

    alone = predict_ep_step(cfg, plan, experts_gemm_times, cm)
    beside = predict_ep_step(cfg, plan, experts_gemm_times, cm, colocation=twice)
    for lv in ("L0", "L3"):
        short, long_ = sorted(range(2), key=lambda r: alone.timelines[lv][r].compute_s["experts"])
        a_s, a_l = (alone.timelines[lv][r].compute_s["experts"] for r in (short, long_))
        assert beside.timelines[lv][short].compute_s["experts"] == pytest.approx(2 * a_s)  # beside its twin throughout
        assert beside.timelines[lv][long_].compute_s["experts"] == pytest.approx(2 * a_s + (a_l - a_s))  # alone after
        for a, b in zip(alone.timelines[lv], beside.timelines[lv]):
            assert a.compute_s["experts"] > 0
            assert {p: b.compute_s[p] for p in PHASES if p != "experts"} == \
                   {p: a.compute_s[p] for p in PHASES if p != "experts"}
            assert b.collective_s == a.collective_s
    assert beside.meta["colocation"] == {"grouped_gemm": 2.0}


def test_rank_replay_sums_each_ranks_own_kernel_seconds_plus_one_cold_start_per_kind():
    from costmodel.model.cold_start import cold_start_kind
    from sim.distributed.ep_predict import rank_replay_kernel_times

    plan = plan_expert_parallel(CFG, IDS, world_size=2, placement="contiguous")
    kernels = ep_rank_kernels(CFG, plan)
    # rank 0's kernels all take 1 ms, rank 1's 2 ms, as if each rank had timed its own
    per_rank = [{s.key(): 1e-3 * (r + 1) for p in PHASES for s in kernels[r][p]} for r in range(2)]
    times = rank_replay_kernel_times(per_rank, flops_times, per_kind_s=1e-5)
    traces = [kernels[r][p] for r in range(2) for p in PHASES]
    got = times(traces)
    for i, trace in enumerate(traces):
        r = i // len(PHASES)
        kinds = len({cold_start_kind(s) for s in trace})
        assert got["L3"][i] == pytest.approx(len(trace) * 1e-3 * (r + 1) + kinds * 1e-5)
        assert got["L2"][i] == pytest.approx(flops_times([trace])["L2"][0])  # other levels: the fallback
    # the experts phase repeats its GEMM kind: one cold start, not one per kernel
    assert len({cold_start_kind(s) for s in kernels[1]["experts"]}) < len(kernels[1]["experts"])
    # a trace with a kernel its rank did not time falls back at L3 too
    alien = [list(traces[0]) + [GemmSpec(3, 5, 7)]] + traces[1:]
    assert times(alien)["L3"][0] == pytest.approx(flops_times(alien)["L3"][0])
    pred = predict_ep_step(CFG, plan, times, FakeCollectives([1e-6, 2e-6]))
    assert pred.timelines["L3"][1].compute_s["experts"] == pytest.approx(
        len(kernels[1]["experts"]) * 2e-3 + len({cold_start_kind(s) for s in kernels[1]["experts"]}) * 1e-5)
    # with the profile's re-cooling curve each later kernel of a kind adds its share, as the cost model's own
    from costmodel.model.cold_start import charges_s

    curve = (np.array([0.0, 1.0]), np.array([0.0, 0.5]))
    recooled = rank_replay_kernel_times(per_rank, flops_times, per_kind_s=1e-5, recold=curve)(traces)
    experts = kernels[1]["experts"]
    i = traces.index(experts)
    assert recooled["L3"][i] == pytest.approx(len(experts) * 2e-3 + float(charges_s(1e-5, curve, experts).sum()))
    assert recooled["L3"][i] > got["L3"][i]  # its GEMMs repeat with data streamed between them
    # the per-call cost among other kinds (costmodel.model.composition): once per kernel, as the cost model adds it
    hosted = rank_replay_kernel_times(per_rank, flops_times, per_kind_s=1e-5, recold=curve, per_call_s=3e-6)(traces)
    assert hosted["L3"][i] == pytest.approx(recooled["L3"][i] + len(experts) * 3e-6)
