"""The gains and straggler counts the multi-process experiments report, on hand-made rows; the
collective backend of a predicted device and the all-to-all of a stated link, by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from types import SimpleNamespace

import numpy as np

from experiments.distributed_common import (
    collective_backend, gain_summary, round_columns, stated_link_model, straggler_summary, variant_gains,
)


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
    assert gain["within_tolerance_L3"] is False and "measured_gain_se" not in gain  # 25 points off; no rounds


def test_the_measured_gains_noise_comes_from_its_rounds():
    """Per-round gains 1 - new/old: 0.25, 0.20, 0.30, standard deviation (ddof 1) 0.05, so se = 0.05 /
    sqrt(3); L3's 0.5 is 25 points off: outside 5 points and outside 2 se."""
    df = _rows()
    for kind, rounds in (("new", [3.0, 3.2, 2.8]), ("old", [4.0, 4.0, 4.0])):
        for col, v in round_columns(rounds).items():
            df.loc[(df["point"] == 0) & (df["kind"] == kind), col] = v
    (gain,) = variant_gains(df, "kind", "new", "old")
    assert gain["measured_gain_rounds"] == pytest.approx([0.25, 0.2, 0.3])
    assert gain["measured_gain_se"] == pytest.approx(0.05 / 3 ** 0.5)
    assert gain["within_tolerance_L3"] is False and gain["within_noise_L3"] is False
    df.loc[(df["point"] == 0) & (df["kind"] == "new"), "measured_round2_s"] = 0.4  # a wild round: se 0.28
    (wild,) = variant_gains(df, "kind", "new", "old")
    assert wild["measured_gain_se"] > 0.125 and wild["within_noise_L3"] is True  # 25 points inside 2 se
    assert gain_summary([gain, wild]) == {"points": 2, "tolerance": 0.05, "within_tolerance_L3": 0, "sign_agrees_L3": 2,
                                         "within_noise_L3": 1,
                                         "median_two_se": pytest.approx(gain["measured_gain_se"] + wild["measured_gain_se"])}


def test_predict_only_rows_give_predicted_gains_only():
    (gain,) = variant_gains(_rows(measured=False), "kind", "new", "old", levels=("L3",))
    assert set(gain) == {"point", "value", "backend", "predicted_gain_L3"}


def test_straggler_summary_counts_only_clear_points():
    df = pd.DataFrame({"straggler_clear": [True, True, False], "straggler_pred": [0, 1, 1],
                       "straggler_measured": [0, 0, 0]})
    assert straggler_summary(df, "r") == {"points": 3, "clear_points": 2, "agree": 1, "rule": "r"}


def test_the_collective_backend_follows_the_predicted_device():
    assert collective_backend(SimpleNamespace(device_kind="cpu")) == "gloo"
    assert collective_backend(SimpleNamespace(device_kind="cuda")) == "nccl"
    with pytest.raises(ValueError, match="no collective backend is known for device kind 'tpu'"):
        collective_backend(SimpleNamespace(device_kind="tpu"))


def test_a_stated_link_is_alpha_plus_bytes_moved_over_its_bandwidth():
    cm, how = stated_link_model({"latency_us": 10.0, "bandwidth_gb_per_s": 100.0}, 4, "nccl", "ep")
    send = np.full((4, 4), 1e6)  # 1 MB to every rank: 3 MB sent and 3 MB received off the rank
    # 10 us + (3e6 + 3e6) B / 1e11 B/s = 10 us + 60 us
    np.testing.assert_allclose(cm.predict_all_to_all_s(send, level="L2"), [70e-6] * 4, rtol=1e-9)
    assert how == ("a stated link (ep.link, not measured): alpha 10 us, 100 GB/s moved per rank (sent + received), "
                   "nccl W=4")
