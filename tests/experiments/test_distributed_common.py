"""The gains and straggler counts the multi-process experiments report, on hand-made rows."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.distributed_common import straggler_summary, variant_gains


def _rows(measured: bool = True) -> pd.DataFrame:
    rows = [  # point 0: the variant is 25% faster measured, 50% predicted at L3; point 1 lacks the baseline
        {"point": 0, "backend": "b", "value": 1.0, "kind": "new", "pred_L0_s": 1.0, "pred_L2_s": 0.0, "pred_L3_s": 1.0,
         "measured_s": 3.0},
        {"point": 0, "backend": "b", "value": 1.0, "kind": "old", "pred_L0_s": 1.0, "pred_L2_s": 0.0, "pred_L3_s": 2.0,
         "measured_s": 4.0},
        {"point": 1, "backend": "b", "value": 2.0, "kind": "new", "pred_L0_s": 1.0, "pred_L2_s": 1.0, "pred_L3_s": 1.0,
         "measured_s": 1.0},
    ]
    frame = pd.DataFrame(rows)
    return frame if measured else frame.drop(columns="measured_s")


def test_variant_gain_is_one_minus_the_step_ratio_measured_and_per_level():
    (gain,) = variant_gains(_rows(), "kind", "new", "old")
    assert gain["point"] == 0 and gain["measured_gain"] == pytest.approx(0.25)
    assert gain["predicted_gain_L3"] == pytest.approx(0.5) and gain["predicted_gain_L0"] == pytest.approx(0.0)
    assert "predicted_gain_L2" not in gain  # a baseline predicted at 0 s has no ratio
    assert gain["sign_agrees_L3"] is True


def test_predict_only_rows_give_predicted_gains_only():
    (gain,) = variant_gains(_rows(measured=False), "kind", "new", "old", levels=("L3",))
    assert set(gain) == {"point", "value", "backend", "predicted_gain_L3"}


def test_straggler_summary_counts_only_clear_points():
    df = pd.DataFrame({"straggler_clear": [True, True, False], "straggler_pred": [0, 1, 1],
                       "straggler_measured": [0, 0, 0]})
    assert straggler_summary(df, "r") == {"points": 3, "clear_points": 2, "agree": 1, "rule": "r"}
