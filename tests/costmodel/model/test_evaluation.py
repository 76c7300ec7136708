"""Held-out splits never leak a shape; metrics are what they say."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.model.evaluation import (extrapolation_split, heldout_folds, max_ape_within_prob, metrics,
                                  noise_floor_max_ape_pct)
from costmodel.families.gemm import GemmSpec
from costmodel.families.scatter import ScatterSpec
from costmodel.model.features import kernel_table
from costmodel.model.models import shape_groups


def test_metrics_hand_computed():
    m = metrics(np.array([105.0, 190.0, 300.0, 400.0]), np.array([100.0, 200.0, 200.0, 400.0]))
    assert m["median_ape_pct"] == pytest.approx(5.0)  # APEs 5, 5, 50, 0
    assert m["max_ape_pct"] == pytest.approx(50.0)
    assert m["within_10pct"] == pytest.approx(0.75)
    assert m["spearman"] == pytest.approx(0.9487, abs=1e-4)  # ranks 1,2,3,4 vs 1,2.5,2.5,4
    assert m["n_test"] == 4
    # predicted / measured 1.05, 0.95, 1.5, 1.0: median 1.025; p10 0.965 and p90 1.365 (linear percentiles)
    assert (m["ratio_median"], m["ratio_p10"], m["ratio_p90"]) == pytest.approx((1.025, 0.965, 1.365))
    assert metrics(np.array([]), np.array([]))["median_ape_pct"] is None


def test_noise_floor_of_the_maximum_hand_computed():
    # one point, sigma 10%: P(|N(0, 0.1)| <= 10%) is the one-sigma mass 0.682689...
    assert max_ape_within_prob([0.1], 10.0) == pytest.approx(0.6826895, abs=1e-6)
    # two points: the product of their half-normal CDFs (two-sigma mass x one-sigma mass)
    assert max_ape_within_prob([0.1, 0.2], 20.0) == pytest.approx(0.9544997 * 0.6826895, abs=1e-6)
    # a noiseless point never exceeds; NaN sigmas are left out
    assert max_ape_within_prob([0.0, 0.1, float("nan")], 10.0) == pytest.approx(0.6826895, abs=1e-6)
    # inverted: the median of one half-normal is 0.6745 sigma (the median floor's constant)
    assert noise_floor_max_ape_pct([0.1]) == pytest.approx(6.745, abs=1e-3)
    # thirty points at 6.5%: the maximum's median is 14.79% (checked by 200,000 seeded draws: 14.80%)
    assert noise_floor_max_ape_pct(np.full(30, 0.065)) == pytest.approx(14.795, abs=1e-2)
    assert noise_floor_max_ape_pct(np.full(30, 0.065), 0.9) > noise_floor_max_ape_pct(np.full(30, 0.065), 0.1)
    assert noise_floor_max_ape_pct([0.0, 0.0]) == 0.0
    assert np.isnan(noise_floor_max_ape_pct([]))
    with pytest.raises(ValueError, match="quantile must be in"):
        noise_floor_max_ape_pct([0.1], 1.0)
    with pytest.raises(ValueError, match="limit_pct must be >= 0"):
        max_ape_within_prob([0.1], -1.0)


def test_grouped_split_keeps_backends_of_one_shape_together():
    specs = []
    for rows in (100, 200, 400, 800, 1600, 3200, 6400, 12800):
        for backend, reduce in (("index_add", "sum"), ("scatter_reduce", "sum"), ("scatter_reduce", "max")):
            specs.append(ScatterSpec(rows, 8, 50, reduce, backend))
    X = kernel_table(specs)
    groups = shape_groups(X)
    assert len(set(groups)) == 8
    splits = heldout_folds(X, folds=4, seed=0)
    assert len(splits) == 4
    for train, test in splits:
        assert len(test) > 0 and not set(groups[train]) & set(groups[test])
    # every row is held out exactly once, and each fold gets 2 of the 8 shapes
    tested = np.concatenate([test for _, test in splits])
    assert sorted(tested) == list(range(len(X)))
    assert [len(set(groups[test])) for _, test in splits] == [2, 2, 2, 2]


def test_heldout_folds_leave_small_families_in_training_and_reject_bad_fold_counts():
    X = kernel_table([GemmSpec(m, 64, 64) for m in (1, 2, 4)])  # 3 shapes < MIN_TEST_GROUPS
    assert all(len(test) == 0 and len(train) == 3 for train, test in heldout_folds(X, folds=2, seed=0))
    for bad in (1, 0, 2.5, True):
        with pytest.raises(ValueError, match="fit.heldout_folds must be an integer >= 2"):
            heldout_folds(X, folds=bad, seed=0)


def test_extrapolation_split_tests_only_larger_shapes():
    X = kernel_table([GemmSpec(m, 64, 64) for m in range(1, 41)])
    train, test = extrapolation_split(X, quantile=0.8)
    assert X["flops"].iloc[test].min() > X["flops"].iloc[train].max()
    with pytest.raises(ValueError, match="fit.extrapolation_quantile must be in"):
        extrapolation_split(X, quantile=1.5)
