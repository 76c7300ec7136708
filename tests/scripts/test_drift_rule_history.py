"""scripts/drift_rule_history.py: a shrunk drift correction scored on hand-made points."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest
from script_loader import loaded_script



@pytest.fixture(scope="module")
def history():
    yield from loaded_script("drift_rule_history")


def points() -> pd.DataFrame:
    # held out 1.0 and 2.0 s; the references say 1.21x (so scaled 1.21 and 2.42); measured 1.1 and 2.2
    return pd.DataFrame({"pred_L3_s": [1.0, 2.0], "pred_heldout_drift_L3_s": [1.21, 2.42],
                         "measured_s": [1.1, 2.2]})


def test_weight_zero_is_the_headline_one_the_side_score_and_a_half_the_square_root(history):
    scores = history.score_weights(points(), weights=(0.0, 0.5, 1.0))
    assert scores["median_ape_w0"] == pytest.approx(100 * (1 - 1 / 1.1))  # 9.09%
    assert scores["median_ape_w1"] == pytest.approx(100 * (1.21 / 1.1 - 1))  # 10%
    assert scores["median_ape_w0.5"] == pytest.approx(0.0, abs=1e-9)  # 1.1 = 1.0 x sqrt(1.21)
    assert scores["reference_drift"] == pytest.approx(1.21) and scores["layer_drift"] == pytest.approx(1.1)


def test_points_without_a_measurement_are_left_out_and_none_left_is_an_error(history):
    df = pd.concat([points(), pd.DataFrame({"pred_L3_s": [5.0], "pred_heldout_drift_L3_s": [5.0],
                                            "measured_s": [np.nan]})], ignore_index=True)
    assert history.score_weights(df)["points"] == 2
    with pytest.raises(ValueError, match="no point with a measurement and both predictions"):
        history.score_weights(df.iloc[2:])


def test_the_shrink_weight_is_least_squares_of_log_drifts_through_the_origin(history):
    ref = np.exp([0.2, -0.1])
    layer = np.exp([0.1, -0.05])  # exactly half of each reference log drift
    assert history.shrink_weight(ref, layer) == pytest.approx(0.5)


def test_the_references_per_family_are_read_off_the_rule(history):
    from sim.predict.heldout_drift import FamilyDrift, REFERENCES_PER_FAMILY
    rule = FamilyDrift().to_dict()["rule"]
    assert history.references_per_family(rule) == REFERENCES_PER_FAMILY
    assert history.references_per_family(rule.replace(f"up to {REFERENCES_PER_FAMILY} ", "up to 3 ")) == 3
    assert history.references_per_family("per family, the median of a few references") is None
