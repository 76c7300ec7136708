"""Graph generators: seeded exact outputs, [2, E] int64, options, skew knobs, edge checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sim.workloads.graphs import barabasi_albert, check_edge_index, check_graph_options, chung_lu, degree_stats, erdos_renyi, finalize, rmat, sbm

EXPECTED = {  # regression values, fixed by seed 1
    "er": (lambda: erdos_renyi(10, 6, seed=1), [[4, 5, 7, 9, 0, 1], [8, 9, 2, 3, 8, 4]]),
    "ba": (lambda: barabasi_albert(6, 12, seed=1),
           [[0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5], [0, 0, 0, 1, 0, 1, 2, 1, 0, 0, 1, 3]]),
    "rmat": (lambda: rmat(16, 6, seed=1), [[15, 11, 7, 3, 7, 5], [7, 3, 5, 7, 15, 5]]),
    "sbm": (lambda: sbm(12, 6, num_blocks=3, seed=1), [[7, 9, 2, 8, 3, 6], [5, 11, 1, 9, 8, 5]]),
    "chung_lu": (lambda: chung_lu(10, 6, seed=1), [[5, 7, 0, 8, 2, 0], [4, 5, 4, 7, 8, 7]]),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_seeded_generators_are_exact(name):
    make, expected = EXPECTED[name]
    ei = make()
    assert ei.dtype == torch.int64 and ei.shape == (2, len(expected[0]))
    assert ei.tolist() == expected
    assert make().tolist() == expected


def test_barabasi_albert_links_only_to_earlier_nodes():
    ei = barabasi_albert(2000, 8000, seed=3)
    assert ei.shape == (2, 8000)
    assert (ei[1] <= ei[0]).all()  # preferential attachment points backwards in time
    assert degree_stats(ei, 2000)["max_over_mean"] > 10  # hubs emerge


def test_rmat_skew_knob_and_uniform_limit():
    uniform = degree_stats(rmat(4096, 40000, a=0.25, b=None, c=None, d=None, seed=0), 4096)
    skewed = degree_stats(rmat(4096, 40000, a=0.65, b=None, c=None, d=None, seed=0), 4096)
    assert uniform["degree_cv"] == pytest.approx(np.sqrt(4096 / 40000), rel=0.15)  # Poisson noise only
    assert skewed["degree_cv"] > 5 * uniform["degree_cv"]
    ei = rmat(1000, 5000, seed=0)  # non power-of-two node count stays in range
    assert int(ei.max()) < 1000
    with pytest.raises(ValueError, match=r"graph.\(a, b, c, d\) must be >= 0 and sum to 1"):
        rmat(16, 10, a=0.9, b=0.2, c=0.1, d=0.1)


def test_chung_lu_exponent_controls_skew():
    low = degree_stats(chung_lu(5000, 50000, exponent=2.1, seed=0), 5000)["degree_cv"]
    high = degree_stats(chung_lu(5000, 50000, exponent=6.0, seed=0), 5000)["degree_cv"]
    assert low > 2 * high
    with pytest.raises(ValueError, match="graph.exponent must be > 2"):
        chung_lu(10, 10, exponent=1.5)


def test_finalize_options():
    src, dst = np.array([0, 1, 1, 2, 2]), np.array([1, 1, 2, 0, 0])
    assert finalize(src, dst, 3, undirected=True).shape == (2, 10)
    assert finalize(src, dst, 3, remove_self_loops=True).tolist() == [[0, 1, 2, 2], [1, 2, 0, 0]]
    assert finalize(src, dst, 3, dedup=True).tolist() == [[0, 1, 1, 2], [1, 1, 2, 0]]


def test_degree_stats_hand_computed():
    ei = torch.tensor([[0, 1, 2, 3], [0, 0, 0, 1]])
    s = degree_stats(ei, 4)
    assert s["mean_degree"] == 1.0 and s["max_degree"] == 3.0 and s["max_over_mean"] == 3.0
    assert s["degree_cv"] == pytest.approx(np.std([3, 1, 0, 0]) / 1.0)
    assert s["degree_gini"] == pytest.approx(0.625)


@pytest.mark.parametrize(
    "edge_index, message",
    [
        (torch.tensor([[0, 5], [1, 2]]), r"values must be in \[0, num_nodes=4\), got values in \[0, 5\]"),
        (torch.tensor([[0, -1], [1, 2]]), r"values must be in \[0, num_nodes=4\)"),
        (torch.tensor([[0, 1, 2]]), r"must have shape \[2, E\], got \[1, 3\]"),
        (torch.tensor([[0.0, 1.0], [1.0, 2.0]]), "must have dtype torch.int64"),
        (torch.zeros(2, 0, dtype=torch.int64), "edge_index is empty"),
        (np.zeros((2, 3), dtype=np.int64), "must be a torch.Tensor"),
    ],
)
def test_bad_edge_index(edge_index, message):
    with pytest.raises(ValueError, match=message):
        check_edge_index(edge_index, 4)


def test_bad_sizes_name_the_field():
    with pytest.raises(ValueError, match="graph.num_edges must be a positive integer"):
        erdos_renyi(10, -3)
    with pytest.raises(ValueError, match=r"graph.num_blocks must be in \[1, num_nodes=2\]"):
        sbm(2, 10, num_blocks=3)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"directed": True}, r"graph.options: unknown option 'directed'; allowed: \['undirected', 'remove_self_loops', 'dedup'\]"),
        ({"dedup": "yes"}, r"graph.options.dedup must be true or false, got 'yes'"),
        ([1, 2], r"graph.options must be a mapping"),
    ],
)
def test_bad_graph_options(options, message):
    with pytest.raises(ValueError, match=message):
        check_graph_options(options)
    assert check_graph_options({"dedup": True}) == {"dedup": True} and check_graph_options(None) == {}
