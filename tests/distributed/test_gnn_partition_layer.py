"""The partitioned GNN layer on two gloo processes computes the single-device layer's output,
for each partitioner and several backends and kinds; the per-phase timing is the slowest rank's."""

from __future__ import annotations

import multiprocessing
import re
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from sim.distributed.gnn_partition_layer import PartitionedGNNLayer, run_partition_forward, time_phases
from sim.distributed.graph_partition import plan_graph_partition
from sim.workloads.gnn_layer import GNNConfig, GNNLayer
from sim.workloads.graphs import rmat

N, E, SEED = 96, 480, 3
BASE = GNNConfig(num_nodes=N, in_features=8, out_features=6)
CASES = [  # (partitioner, config)
    ("random", BASE),  # GCN sum, index_add: the norm needs the global out-degrees
    ("metis", BASE),
    ("random", replace(BASE, backend="sparse_csr")),
    ("metis", replace(BASE, backend="sparse_csr", edge_order="dst_sorted")),
    ("metis", replace(BASE, backend="scatter_reduce", kind="sage", aggregation="mean")),
    ("random", replace(BASE, backend="scatter_reduce", aggregation="max")),
]
IDS = [f"{p}-{c.backend}-{c.kind}-{c.aggregation}" for p, c in CASES]


@pytest.fixture(scope="module")
def graph():
    return rmat(N, E, a=0.55, b=None, c=None, d=None, seed=1)


@pytest.fixture(scope="module")
def run(graph):
    """One launch of W=2 processes for every case (each launch costs two torch imports)."""
    cases = [(cfg, plan_graph_partition(graph, N, world_size=2, partitioner=p, feature_width=cfg.in_features,
                                        seed=SEED), graph) for p, cfg in CASES]
    x = np.random.default_rng(0).standard_normal((N, BASE.in_features)).astype(np.float32)
    start = time.monotonic()
    out = run_partition_forward(cases, x, world_size=2, seed=SEED, repeats=3, rounds=2, timeout_s=120)
    return {"cases": cases, "x": x, "out": out, "wall_s": time.monotonic() - start}


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_partitioned_layer_equals_the_single_device_layer(run, graph, case, one_thread):
    cfg, plan, _ = run["cases"][case]
    single = GNNLayer(cfg, seed=SEED)
    single.set_graph(graph)
    reference = single(torch.from_numpy(run["x"]))
    torch.testing.assert_close(torch.from_numpy(run["out"]["outputs"][case]), reference, atol=1e-5, rtol=1e-4)


def test_the_cases_cross_ranks(run):
    for _, plan, _ in run["cases"]:
        assert plan.edge_cut > 0 and (plan.halo_send_rows.sum(axis=1) > 0).all()


def test_phase_times_and_the_slowest_rank_step(run):
    assert multiprocessing.active_children() == []
    for case in run["out"]["timed"]:
        assert len(case) == 2  # rounds
        for ranks in case:
            rank0, rank1 = ranks
            assert rank0["phases_s"].shape == (3, 3) and (rank0["phases_s"] >= 0).all()
            assert rank0["step"].times_s == rank1["step"].times_s  # all_reduce MAX: one number on every rank
            # the step is the slowest rank's: at least each rank's own phases (timed inside it)
            for r in (rank0, rank1):
                assert all(s >= p.sum() * 0.999 for s, p in zip(r["step"].times_s, r["phases_s"]))
            assert all(0 < t < run["wall_s"] for t in rank0["step"].times_s)
            assert rank0["step"].threads == 1 and rank0["cold"] is True


def test_layer_arguments_are_checked_without_a_process_group(graph):
    plan = plan_graph_partition(graph, N, world_size=2, feature_width=8)
    with pytest.raises(ValueError, match=re.escape("rank must be an integer in [0, partition.world_size=2), got 2")):
        PartitionedGNNLayer(BASE, plan, graph, rank=2)
    with pytest.raises(ValueError, match=re.escape("the plan exchanges rows of 4 float32; the layer's input rows are "
                                                   "gnn.in_features=8 float32")):
        PartitionedGNNLayer(BASE, plan_graph_partition(graph, N, world_size=2, feature_width=4), graph, rank=0)
    layer = PartitionedGNNLayer(BASE, plan, graph, rank=1)
    assert layer.layer.cfg.num_nodes == plan.local_nodes(1).size
    torch.testing.assert_close(layer.layer.weight, GNNLayer(BASE, seed=0).weight)
    with pytest.raises(ValueError, match=re.escape("rank 1 input must be [own nodes=48, gnn.in_features=8], got [96, 8]")):
        layer.input_buffer(torch.zeros(N, 8))
    with pytest.raises(RuntimeError, match="time_phases runs inside a process group"):
        time_phases(layer, layer.input_buffer(torch.zeros(48, 8)))
    with pytest.raises(ValueError, match=re.escape("repeats must be an integer in [3, 1000], got 1")):
        time_phases(layer, layer.input_buffer(torch.zeros(48, 8)), repeats=1)
