"""The graph partition plan on hand-computed cases: owners, halos, bytes, cut, balance, bad input."""

from __future__ import annotations

import builtins
import re

import numpy as np
import pytest

from sim.distributed.graph_partition import (
    balanced_send_bytes, plan_graph_partition, random_owner, symmetric_csr,
)
from sim.workloads.graphs import rmat, sbm

# 4 nodes; r0 owns 0, 1 and r1 owns 2, 3. Edges (src -> dst):
# e0 0->1, e1 1->2, e2 2->3, e3 3->0, e4 3->1, e5 0->2
EI = np.array([[0, 1, 2, 3, 3, 0], [1, 2, 3, 0, 1, 2]])
OWNER = np.array([0, 0, 1, 1])


def test_hand_case_halo_bytes_cut_and_loads():
    plan = plan_graph_partition(EI, 4, world_size=2, feature_width=2, owner=OWNER)  # a row: 2 x 4 bytes
    # r0 aggregates e0, e3, e4 (into 1, 0, 1) and needs node 3 from r1;
    # r1 aggregates e1, e2, e5 (into 2, 3, 2) and needs nodes 1, 0 from r0
    assert [ids.tolist() for ids in plan.rank_edge_ids] == [[0, 3, 4], [1, 2, 5]]
    assert [h.tolist() for h in plan.halo[0]] == [[], [3]]
    assert [h.tolist() for h in plan.halo[1]] == [[0, 1], []]
    assert plan.halo_send_rows.tolist() == [[0, 2], [1, 0]]
    assert plan.halo_send_bytes.tolist() == [[0, 16], [8, 0]]
    assert plan.edge_cut == 4 and plan.edge_cut_share == pytest.approx(4 / 6)  # all but e0 and e2
    assert plan.actual.nodes.tolist() == [2.0, 2.0]
    assert plan.actual.edges.tolist() == [3.0, 3.0]
    assert plan.actual.halo_rows.tolist() == [1.0, 2.0]
    assert plan.actual.send_bytes.tolist() == [16.0, 8.0]
    assert plan.actual.recv_bytes.tolist() == [8.0, 16.0]
    assert plan.balanced.send_bytes.tolist() == [12.0, 12.0]
    assert plan.skew_share == 0.0
    assert balanced_send_bytes(plan).tolist() == [[0.0, 12.0], [12.0, 0.0]]


def test_hand_case_local_layout():
    plan = plan_graph_partition(EI, 4, world_size=2, feature_width=2, owner=OWNER)
    assert plan.local_nodes(0).tolist() == [0, 1, 3]  # own, then halo by owner
    assert plan.local_nodes(1).tolist() == [2, 3, 0, 1]
    assert plan.local_edge_index(EI, 0).tolist() == [[0, 2, 2], [1, 0, 1]]  # 0->1, 3->0, 3->1
    assert plan.local_edge_index(EI, 1).tolist() == [[3, 0, 2], [0, 1, 0]]  # 1->2, 2->3, 0->2
    assert plan.send_index(0).tolist() == [0, 1]  # nodes 0, 1 to r1
    assert plan.send_index(1).tolist() == [1]  # node 3 (r1's second own node) to r0
    assert plan.local_index.tolist() == [0, 1, 0, 1]


def test_skew_share_when_one_rank_aggregates_everything():
    owner = np.array([0, 1, 1, 1])  # r0 owns node 0 only; every edge goes into 1, 2 or 3 but e3
    ei = np.array([[0, 0, 0, 1], [1, 2, 3, 2]])
    plan = plan_graph_partition(ei, 4, world_size=2, feature_width=1, owner=owner)
    assert plan.actual.edges.tolist() == [0.0, 4.0]
    assert plan.skew_share == pytest.approx(0.5)  # 1 - 2/4
    assert plan.halo_send_rows.tolist() == [[0, 1], [0, 0]]  # node 0 once, however many edges read it


def test_three_ranks_send_matrix_and_diagonal():
    ei = np.array([[0, 1, 2, 0, 1], [1, 2, 0, 2, 0]])
    plan = plan_graph_partition(ei, 3, world_size=3, feature_width=1, dtype="float64", owner=np.array([0, 1, 2]))
    assert plan.row_bytes == 8
    # r0 needs 2 (e2) and 1 (e4); r1 needs 0 (e0); r2 needs 1 (e1) and 0 (e3)
    assert plan.halo_send_rows.tolist() == [[0, 1, 1], [1, 0, 1], [1, 0, 0]]
    assert np.diag(plan.halo_send_bytes).tolist() == [0, 0, 0]
    assert plan.send_index(0).tolist() == [0, 0]  # node 0 to r1, then to r2


def test_random_partition_is_seeded_and_balanced():
    a, b = random_owner(10, 3, seed=7), random_owner(10, 3, seed=7)
    assert a.tolist() == b.tolist() and np.bincount(a).tolist() == [4, 3, 3]
    assert random_owner(10, 3, seed=8).tolist() != a.tolist()
    g = rmat(1000, 8000, seed=0)
    plan = plan_graph_partition(g, 1000, world_size=2, partitioner="random", feature_width=8, seed=1)
    assert plan.actual.nodes.tolist() == [500.0, 500.0]
    assert 0.4 < plan.edge_cut_share < 0.6  # about 1 - 1/W of the edges cross


def test_metis_cuts_fewer_edges_than_random_on_a_block_graph():
    g = sbm(400, 4000, num_blocks=2, p_in=0.95, p_out=0.05, seed=0)
    metis = plan_graph_partition(g, 400, world_size=2, partitioner="metis", feature_width=8, seed=0)
    again = plan_graph_partition(g, 400, world_size=2, partitioner="metis", feature_width=8, seed=0)
    rand = plan_graph_partition(g, 400, world_size=2, partitioner="random", feature_width=8, seed=0)
    assert metis.owner.tolist() == again.owner.tolist()  # seeded
    assert metis.edge_cut < rand.edge_cut / 3
    assert abs(metis.actual.nodes[0] - 200) <= 200 * 0.03 + 1  # METIS' default imbalance
    # every edge is aggregated by exactly one rank, every halo row is sent once per needing rank
    assert sorted(np.concatenate(metis.rank_edge_ids).tolist()) == list(range(g.shape[1]))
    assert metis.halo_send_rows.sum() == sum(h.size for hs in metis.halo for h in hs)


def test_symmetric_csr_merges_directions_loops_and_duplicates():
    xadj, adjncy = symmetric_csr(np.array([[0, 1, 1, 2], [1, 0, 1, 0]]), 3)
    assert xadj.tolist() == [0, 2, 3, 4]
    assert adjncy.tolist() == [1, 2, 0, 0]


def test_missing_pymetis_names_the_partitioner_and_the_install(monkeypatch):
    real_import = builtins.__import__

    def no_pymetis(name, *args, **kwargs):
        if name == "pymetis":
            raise ImportError("No module named 'pymetis'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pymetis)
    with pytest.raises(ImportError, match=re.escape("partition.partitioner='metis' needs pymetis") + ".*"
                       + re.escape("install it with `pip install pymetis`")):
        plan_graph_partition(EI, 4, world_size=2, partitioner="metis", feature_width=2)


@pytest.mark.parametrize("kwargs, message", [
    ({"partitioner": "spectral"}, "partition.partitioner must be one of ['random', 'metis'], got 'spectral'"),
    ({"world_size": 0}, "partition.world_size must be an integer in [1, num_nodes=4], got 0"),
    ({"world_size": 5}, "partition.world_size must be an integer in [1, num_nodes=4], got 5"),
    ({"world_size": True}, "partition.world_size must be an integer in [1, num_nodes=4], got True"),
    ({"feature_width": 0}, "partition.feature_width must be a positive integer (>= 1), got 0"),
    ({"feature_width": -3}, "partition.feature_width must be a positive integer (>= 1), got -3"),
    ({"dtype": "int3"}, "dtype must be one of"),
    ({"owner": np.array([0, 0, 2, 1])}, "owner must hold num_nodes=4 ranks in [0, 2), got shape (4,)"),
])
def test_bad_arguments_name_the_field_and_range(kwargs, message):
    args = {"world_size": 2, "feature_width": 2, **kwargs}
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        plan_graph_partition(EI, 4, **args)


def test_bad_edge_index_is_refused():
    with pytest.raises(ValueError, match=re.escape("edge_index values must be in [0, num_nodes=4), got values in [0, 4]")):
        plan_graph_partition(np.array([[0, 4], [1, 2]]), 4, world_size=2, feature_width=1)
    with pytest.raises(ValueError, match=re.escape("edge_index must be an integer array of shape [2, E]")):
        plan_graph_partition(np.zeros((3, 2), dtype=np.int64), 4, world_size=2, feature_width=1)
