"""costmodel.model.committee: the L3 forms part outside their data and agree inside it; a
family without rows is measured first; picks respect the budget and spread out; bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from costmodel.families.gather import GatherSpec
from costmodel.families.gemm import GemmSpec
from costmodel.model.committee import Committee, pick_by_spread
from costmodel.model.features import kernel_table, roofline_time_s

CEIL = {"peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 1e-6, "ridge_flops_per_byte": 10.0,
        "parallel_units": 2, "device_kind": "cpu"}


def gemms(ms) -> pd.DataFrame:
    """GEMMs (M x 256 x 256) whose efficiency rises smoothly with M, as measured seconds."""
    X = kernel_table([GemmSpec(int(m), 256, 256) for m in ms])
    roof = roofline_time_s(X["flops"].to_numpy(), X["bytes_moved"].to_numpy(), CEIL)
    efficiency = 0.2 + 0.7 * np.tanh(np.asarray(ms, dtype=float) / 200.0)
    return X.assign(median_s=roof / efficiency)


@pytest.fixture(scope="module")
def committee() -> Committee:
    return Committee(CEIL).fit(gemms(np.unique(np.geomspace(1, 256, 24).round())))


def test_the_forms_agree_inside_their_data_and_part_far_outside_it(committee):
    spread = committee.spread(gemms([64, 96, 1 << 16]))
    assert spread[0] < 0.05 and spread[1] < 0.05  # decades: inside, every form fits the smooth curve
    assert spread[2] > 3 * max(spread[0], spread[1])


def test_a_family_the_committee_never_saw_is_the_most_uncertain_and_is_picked_first(committee):
    candidates = pd.concat([gemms([96, 1 << 16]), kernel_table([GatherSpec(1000, 64, 500)])], ignore_index=True)
    spread = committee.spread(candidates)
    assert np.isinf(spread[2]) and np.isfinite(spread[:2]).all()
    assert pick_by_spread(committee, candidates, 1) == [1, 2]  # one per family; the far GEMM parts the forms more
    assert pick_by_spread(committee, candidates.iloc[[0, 1]].reset_index(drop=True), 1) == [1]


def test_picks_keep_the_budget_and_a_duplicate_of_a_pick_waits_for_everything_else(committee):
    far = gemms([1 << 16])
    candidates = pd.concat([far, far, gemms([96, 160])], ignore_index=True)
    first_two = pick_by_spread(committee, candidates, 2)
    assert len(first_two) == 2 and 0 in first_two and 1 not in first_two  # the twin is damped to nothing
    assert sorted(pick_by_spread(committee, candidates, 10)) == [0, 1, 2, 3]  # no more than there are


@pytest.mark.parametrize("call, message", [
    (lambda c, t: pick_by_spread(c, t, 0), "budget_per_family must be >= 1, got 0"),
    (lambda c, t: pick_by_spread(c, t, 2, radius=0.0), "radius must be > 0"),
    (lambda c, t: Committee(CEIL, forms=("gbm",)), "forms: at least two of"),
    (lambda c, t: Committee(CEIL, forms=("gbm", "svm")), "got ['gbm', 'svm']"),
])
def test_bad_input_is_named(committee, call, message):
    with pytest.raises(ValueError) as err:
        call(committee, gemms([64]))
    assert message in str(err.value)
