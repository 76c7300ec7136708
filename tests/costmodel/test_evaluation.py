"""Held-out splits never leak a shape; metrics are what they say."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.evaluation import extrapolation_split, heldout_split, metrics
from costmodel.features import kernel_table
from costmodel.kernels import GemmSpec, ScatterSpec
from costmodel.models import shape_groups


def test_metrics_hand_computed():
    m = metrics(np.array([105.0, 190.0, 300.0, 400.0]), np.array([100.0, 200.0, 200.0, 400.0]))
    assert m["median_ape_pct"] == pytest.approx(5.0)  # APEs 5, 5, 50, 0
    assert m["max_ape_pct"] == pytest.approx(50.0)
    assert m["within_10pct"] == pytest.approx(0.75)
    assert m["spearman"] == pytest.approx(0.9487, abs=1e-4)  # ranks 1,2,3,4 vs 1,2.5,2.5,4
    assert m["n_test"] == 4
    assert metrics(np.array([]), np.array([]))["median_ape_pct"] is None


def test_grouped_split_keeps_backends_of_one_shape_together():
    specs = []
    for rows in (100, 200, 400, 800, 1600, 3200, 6400, 12800):
        for backend, reduce in (("index_add", "sum"), ("scatter_reduce", "sum"), ("scatter_reduce", "max")):
            specs.append(ScatterSpec(rows, 8, 50, reduce, backend))
    X = kernel_table(specs)
    groups = shape_groups(X)
    assert len(set(groups)) == 8
    train, test = heldout_split(X, test_size=0.25, seed=0)
    assert len(test) > 0 and not set(groups[train]) & set(groups[test])


def test_extrapolation_split_tests_only_larger_shapes():
    X = kernel_table([GemmSpec(m, 64, 64) for m in range(1, 41)])
    train, test = extrapolation_split(X, quantile=0.8)
    assert X["flops"].iloc[test].min() > X["flops"].iloc[train].max()
    with pytest.raises(ValueError, match="fit.extrapolation_quantile must be in"):
        extrapolation_split(X, quantile=1.5)
