"""The partitioned layer's predicted step on hand cases, with a fake kernel model and a fake
collective model (the interface of ``costmodel.collectives``)."""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from costmodel.families.gather import GatherSpec
from sim.distributed.gnn_partition_predict import (
    compose_step, local_config, predict_partition_step, rank_traces,
)
from sim.distributed.graph_partition import plan_graph_partition
from sim.workloads.gnn_layer import GNNConfig, GraphPlan, gnn_trace

# as in test_graph_partition: r0 owns 0, 1 and r1 owns 2, 3
EI = np.array([[0, 1, 2, 3, 3, 0], [1, 2, 3, 0, 1, 2]])
OWNER = np.array([0, 0, 1, 1])
CFG = GNNConfig(num_nodes=4, in_features=2, out_features=3)


class FakeKernels:
    """L0 = FLOPs / 1 GFLOP/s, L2 = bytes / 1 GB/s, L3 = 2 x L2; a warm profile (no cold-call extra)."""

    fingerprint = SimpleNamespace(cache="warm")
    ceilings: dict = {}

    def predict(self, specs, levels):
        specs = list(specs)
        table = {"L0": [s.flops() / 1e9 for s in specs], "L2": [s.bytes_moved() / 1e9 for s in specs]}
        table["L3"] = [2 * v for v in table["L2"]]
        return pd.DataFrame({lv: table[lv] for lv in levels})


class FakeCollectives:
    """alpha + max(bytes sent, bytes received by the rank) / beta, per rank; levels L2, L3
    (L3 twice alpha)."""

    levels = ("L2", "L3")

    def __init__(self, alpha_s=1e-3, beta=1e6):
        self.alpha_s, self.beta, self.calls = alpha_s, beta, []

    def predict_all_to_all_s(self, send_bytes, level="L3"):
        self.calls.append((np.asarray(send_bytes).tolist(), level))
        off = np.asarray(send_bytes, dtype=float) * (1 - np.eye(len(send_bytes)))
        alpha = self.alpha_s * (2 if level == "L3" else 1)
        return alpha + np.maximum(off.sum(1), off.sum(0)) / self.beta

    def extrapolating(self, send_bytes):
        return "beyond the profiled sizes" if np.asarray(send_bytes).max() > 1e9 else None


def _plan():
    return plan_graph_partition(EI, 4, world_size=2, feature_width=2, owner=OWNER)


def test_rank_traces_are_the_send_gather_and_the_single_device_trace_of_the_local_graph():
    plan = _plan()
    t0, t1 = rank_traces(CFG, plan, EI, 0), rank_traces(CFG, plan, EI, 1)
    # r0 sends own rows 0, 1 (nodes 0, 1) to r1: each read once, ascending
    assert t0["send"] == [GatherSpec(2, 2, 2, 0.0, True, "float32")]
    # r1 sends its own row 1 (node 3) to r0: of its 2 own rows one is read (CV 1)
    assert t1["send"] == [GatherSpec(1, 2, 2, 1.0, True, "float32")]
    local0 = local_config(CFG, plan, 0)
    assert local0.num_nodes == 3  # nodes 0, 1 and halo 3
    import torch

    expected = gnn_trace(local0, GraphPlan.from_edge_index(torch.tensor([[0, 2, 2], [1, 0, 1]]), 3, sorted_by_dst=False))
    assert t0["layer"] == expected
    assert [s.family for s in t0["layer"]] == ["gemm", "gather", "elementwise", "scatter", "elementwise"]


def test_step_is_the_slowest_rank_with_the_all_to_all_starting_at_the_last_send():
    step = compose_step("L3", send_s=[1.0, 3.0], halo_s=[2.0, 1.0], layer_s=[5.0, 1.0])
    assert step.wait_s.tolist() == [2.0, 0.0]
    assert step.end_s.tolist() == [10.0, 5.0]
    assert step.step_s == 10.0 and step.straggler == 0
    assert step.timeline()[0] == [("send", 0.0, 1.0), ("wait", 1.0, 2.0), ("halo", 3.0, 2.0), ("layer", 5.0, 5.0)]


def test_a_rank_whose_twin_has_finished_runs_at_its_alone_speed():
    """Co-located layer phases (alone 2 s and 10 s, 1.5x while both run): the short rank takes
    3 s, the long one 3 s beside it (2 s of its work) and 8 s alone after (measured on EPYC:
    a METIS rank with most of the edges ran at 1.0x of its predicted alone time past its twin)."""
    step = compose_step("L3", send_s=[0.0, 0.0], halo_s=[0.0, 0.0], layer_s=[3.0, 15.0],
                        alone=([0.0, 0.0], [2.0, 10.0]))
    assert step.layer_s.tolist() == pytest.approx([3.0, 11.0])
    even = compose_step("L3", send_s=[0.0, 0.0], halo_s=[0.0, 0.0], layer_s=[15.0, 15.0],
                        alone=([0.0, 0.0], [10.0, 10.0]))
    assert even.layer_s.tolist() == pytest.approx([15.0, 15.0])


def test_predicted_step_by_hand_with_fake_models():
    plan = _plan()
    kernels, coll = FakeKernels(), FakeCollectives()
    out = predict_partition_step(kernels, coll, CFG, plan, EI)
    assert set(out) == {"L0", "L2", "L3"}
    traces = [rank_traces(CFG, plan, EI, r) for r in range(2)]
    by_l2 = [[sum(s.bytes_moved() for s in t[ph]) / 1e9 for ph in ("send", "layer")] for t in traces]
    l2 = out["L2"]
    assert l2.send_s.tolist() == pytest.approx([by_l2[0][0], by_l2[1][0]])
    assert l2.layer_s.tolist() == pytest.approx([by_l2[0][1], by_l2[1][1]])
    # halo bytes [[0, 16], [8, 0]]: both ranks move max(sent, received) = 16 bytes
    assert l2.halo_s.tolist() == pytest.approx([1e-3 + 16e-6, 1e-3 + 16e-6])
    assert out["L3"].halo_s.tolist() == pytest.approx([2e-3 + 16e-6] * 2)
    # L0 has no collective level of its own: the collective model's first (L2)
    assert out["L0"].halo_s.tolist() == l2.halo_s.tolist()
    assert [lv for _, lv in coll.calls[:3]] == ["L2", "L2", "L3"]
    assert coll.calls[0][0] == [[0, 16], [8, 0]]
    end = l2.send_s.max() + l2.halo_s + l2.layer_s
    assert l2.step_s == pytest.approx(end.max()) and l2.straggler == int(np.argmax(end))
    # balanced: mean kernel time, the mean off-rank bytes (12) each way
    assert l2.balanced_step_s == pytest.approx(np.mean([sum(r) for r in by_l2]) + 1e-3 + 12e-6)
    assert l2.skew_share == pytest.approx(max(0.0, 1 - l2.balanced_step_s / l2.step_s))
    assert l2.collective_note is None


def test_a_rank_with_all_the_edges_is_the_straggler_and_the_skew_is_predicted():
    owner = np.array([0, 1, 1, 1])
    ei = np.array([[0, 0, 0, 1, 2, 3, 1], [1, 2, 3, 2, 3, 1, 3]])
    plan = plan_graph_partition(ei, 4, world_size=2, feature_width=2, owner=owner)
    assert plan.actual.edges.tolist() == [0.0, 7.0]
    # rank 0 aggregates nothing: its layer is the transform GEMM and the ReLU over its local rows
    assert [s.family for s in rank_traces(CFG, plan, ei, 0)["layer"]] == ["gemm", "elementwise"]
    assert predict_partition_step(FakeKernels(), FakeCollectives(), CFG, plan, ei)["L2"].straggler == 1
    ei2 = np.concatenate([ei, [[1], [0]]], axis=1)  # one edge into r0
    plan2 = plan_graph_partition(ei2, 4, world_size=2, feature_width=2, owner=owner)
    out = predict_partition_step(FakeKernels(), FakeCollectives(alpha_s=0.0, beta=1e15), CFG, plan2, ei2)
    l2 = out["L2"]
    assert l2.straggler == 1 and l2.layer_s[1] > 3 * l2.layer_s[0]
    work = l2.send_s + l2.layer_s
    assert l2.skew_share == pytest.approx(1 - (work.mean() + l2.halo_s.max()) / l2.step_s) and l2.skew_share > 0.2


def test_extrapolation_note_and_a_plan_for_another_layer_are_reported():
    plan = _plan()
    big = replace(plan, halo_send_bytes=plan.halo_send_bytes * 10**9)
    out = predict_partition_step(FakeKernels(), FakeCollectives(), CFG, big, EI, levels=("L3",))
    assert out["L3"].collective_note == "beyond the profiled sizes"
    with pytest.raises(ValueError, match=re.escape("the plan is for 4 nodes, the layer has gnn.num_nodes=5")):
        rank_traces(replace(CFG, num_nodes=5), plan, EI, 0)
    with pytest.raises(ValueError, match=re.escape("the plan exchanges rows of 2 float32; the layer's input rows are "
                                                   "gnn.in_features=3 float32")):
        rank_traces(replace(CFG, in_features=3), plan, EI, 0)
