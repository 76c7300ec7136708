"""Routing generators: seeded exact outputs, top-k without replacement, capacity, metrics."""

from __future__ import annotations

import numpy as np
import pytest

from sim.workloads.routing import (
    DirichletRouting, HotExpertRouting, RoundRobinRouting, UniformRouting, ZipfRouting, gini, imbalance_metrics, route,
)


def test_seeded_routing_is_exact_and_reproducible():
    a = route(ZipfRouting(1.0), tokens=6, num_experts=4, top_k=2, seed=7)
    b = route(ZipfRouting(1.0), tokens=6, num_experts=4, top_k=2, seed=7)
    assert a.expert_ids.tolist() == b.expert_ids.tolist()
    assert a.expert_ids.tolist() == [[0, 3], [2, 0], [2, 1], [0, 1], [2, 1], [3, 0]]  # regression: seed 7
    assert np.allclose(a.gates.sum(axis=1), 1.0)


@pytest.mark.parametrize("gen", [UniformRouting(), ZipfRouting(3.0), DirichletRouting(0.1), HotExpertRouting(0.25, 0.9)])
def test_top_k_is_without_replacement(gen):
    r = route(gen, tokens=500, num_experts=8, top_k=3, seed=0)
    assert r.expert_ids.shape == (500, 3)
    assert all(len(set(row)) == 3 for row in r.expert_ids.tolist())
    assert r.expert_counts().sum() == 1500 and r.expert_counts().max() <= 500


def test_concentration_knobs_concentrate():
    cvs = [route(ZipfRouting(s), tokens=4000, num_experts=16, top_k=1, seed=1).metrics()["cv"] for s in (0, 1, 3)]
    assert cvs[0] < cvs[1] < cvs[2]
    hot = route(HotExpertRouting(0.125, 0.9), tokens=4000, num_experts=16, top_k=1, seed=1).expert_counts()
    assert hot[:2].sum() / 4000 == pytest.approx(0.9, abs=0.03)


def test_round_robin_is_exactly_balanced():
    r = route(RoundRobinRouting(), tokens=64, num_experts=8, top_k=2, seed=0)
    assert r.expert_counts().tolist() == [16] * 8
    assert r.metrics()["cv"] == 0.0 and r.metrics()["norm_entropy"] == pytest.approx(1.0)


def test_capacity_drops_past_capacity_in_token_order():
    r = route(ZipfRouting(4.0), tokens=100, num_experts=4, top_k=1, seed=0, capacity_factor=1.0)
    assert r.expert_counts().max() <= 25  # ceil(1.0 * 100 * 1 / 4)
    dropped_tokens = np.where(~r.kept[:, 0])[0]
    kept_on_0 = np.where(r.kept[:, 0] & (r.expert_ids[:, 0] == 0))[0]
    assert kept_on_0.max() < dropped_tokens[r.expert_ids[dropped_tokens, 0] == 0].min()  # first come, first served
    assert r.metrics()["dropped_share"] == pytest.approx((~r.kept).mean())


def test_imbalance_metrics_hand_computed():
    m = imbalance_metrics(np.array([0, 0, 0, 4]))
    assert m["max_over_mean"] == 4.0 and m["experts_used"] == 1
    assert m["gini"] == pytest.approx(0.75) and m["norm_entropy"] == pytest.approx(0.0)
    assert m["cv"] == pytest.approx(np.sqrt(3))
    assert gini(np.array([5, 5, 5])) == 0.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tokens=8, num_experts=4, top_k=5), r"moe.top_k must be in \[1, moe.num_experts=4\], got 5"),
        (dict(tokens=0, num_experts=4, top_k=1), "moe.tokens must be a positive integer"),
        (dict(tokens=8, num_experts=4, top_k=1, capacity_factor=0.0), "routing.capacity_factor must be > 0"),
        (dict(tokens=8, num_experts=4, top_k=1, capacity_factor="big"),
         r"routing.capacity_factor must be > 0 \(a number such as 1.25\) or null .*got 'big'"),
        (dict(tokens=8, num_experts=4, top_k=1, capacity_factor=float("inf")), "routing.capacity_factor must be > 0"),
        (dict(tokens=8, num_experts=4, top_k=1, capacity_factor=True), "routing.capacity_factor must be > 0"),
    ],
)
def test_bad_routing_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        route(UniformRouting(), seed=0, **kwargs)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ZipfRouting(-1.0), r"routing.exponent must be in \[0, 50\]"),
        (lambda: DirichletRouting(0.0), r"routing.concentration must be in \[0.001, 1e6\]"),
        (lambda: HotExpertRouting(0.0, 0.5), r"routing.hot_fraction must be in \(0, 1\]"),
        (lambda: HotExpertRouting(0.5, 1.0), r"routing.hot_share must be in \[0, 1\)"),
    ],
)
def test_bad_concentration(make, message):
    with pytest.raises(ValueError, match=message):
        make()
