"""Seeded index generators: exact outputs, requested skew realised."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.families.indices import (
    counts_cv, exponent_for_cv, index_for_cv, index_for_share, min_cv_for_share, zipf_index, zipf_probabilities,
)


def test_zipf_index_is_seeded_and_exact():
    a = zipf_index(8, 5, 1.0, sorted=False, seed=3)
    b = zipf_index(8, 5, 1.0, sorted=False, seed=3)
    assert a.dtype == np.int64 and a.tolist() == b.tolist()
    assert a.tolist() == [1, 2, 4, 4, 2, 4, 1, 4]  # regression: fixed by seed 3
    assert zipf_index(8, 5, 1.0, sorted=True, seed=3).tolist() == sorted(a.tolist())


def test_zipf_probabilities():
    p = zipf_probabilities(3, 1.0)
    assert p == pytest.approx(np.array([1, 1 / 2, 1 / 3]) / (11 / 6))
    assert zipf_probabilities(4, 0.0) == pytest.approx(np.full(4, 0.25))


@pytest.mark.parametrize("cv", [0.0, 0.5, 2.0, 6.0])
def test_index_for_cv_realises_the_requested_skew(cv):
    index, realised = index_for_cv(200_000, 5_000, cv, sorted=False, seed=0)
    assert realised == pytest.approx(counts_cv(index, 5_000))
    assert realised == pytest.approx(cv, abs=0.08 + 0.05 * cv)


def test_exponent_grows_with_cv_and_is_zero_below_noise_floor():
    assert exponent_for_cv(1000, 1000, 0.5) == 0.0  # floor sqrt(N/E) = 1
    assert 0 < exponent_for_cv(100_000, 1000, 1.0) < exponent_for_cv(100_000, 1000, 4.0)


@pytest.mark.parametrize("cv, share", [(5.8, 0.38), (3.8, 0.6), (2.0, 0.8)])
def test_index_for_share_reads_the_requested_share_with_the_requested_skew(cv, share):
    index, realised_cv, realised_share = index_for_share(200_000, 20_000, cv, share, seed=1)
    assert realised_cv == pytest.approx(counts_cv(index, 20_000)) == pytest.approx(cv, rel=0.05)
    assert realised_share == pytest.approx(np.unique(index).size / 20_000) == pytest.approx(share, abs=0.02)


def test_min_cv_for_share_and_bad_share():
    assert min_cv_for_share(1.0) == 0.0 and min_cv_for_share(0.25) == pytest.approx(3 ** 0.5)
    with pytest.raises(ValueError, match=r"read share must be in \(0, 1\]"):
        index_for_share(100, 10, 1.0, 0.0)
