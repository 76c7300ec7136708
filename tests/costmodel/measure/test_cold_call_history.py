"""The cold-call overhead a profile predicts with: the median of its recent measurements."""

from __future__ import annotations

import pytest

from costmodel.measure.ceilings import COLD_CALL_HISTORY, cold_call_overhead_from, with_cold_call_overhead


def test_per_op_overhead_is_cold_minus_warm_chain_over_its_ops_and_never_negative():
    assert cold_call_overhead_from([200e-6, 220e-6, 210e-6], [40e-6, 40e-6, 40e-6]) == pytest.approx(17e-6)
    assert cold_call_overhead_from([30e-6], [40e-6]) == 0.0


def test_the_stored_overhead_is_the_median_of_the_recent_measurements():
    ceilings = {"peak_flops_per_s": 1e11, "cold_call_overhead_s": 10e-6, "evidence": {"copy": []}}
    one = with_cold_call_overhead(ceilings, 32e-6, {"paired_at": "t1"})
    # the profile's value from before the history is its first entry: median of 10 and 32
    assert one["cold_call_overhead_s"] == pytest.approx(21e-6)
    assert [h["overhead_s"] for h in one["evidence"]["cold_call_history"]] == [10e-6, 32e-6]
    assert one["evidence"]["copy"] == [] and one["evidence"]["cold_chain"] == {"paired_at": "t1"}
    assert one["peak_flops_per_s"] == 1e11 and ceilings["cold_call_overhead_s"] == 10e-6  # input left as it was
    two = with_cold_call_overhead(one, 15e-6, {"paired_at": "t2"})
    assert two["cold_call_overhead_s"] == pytest.approx(15e-6)  # one slow sitting (32) no longer sets it
    many = two
    for i in range(COLD_CALL_HISTORY + 3):
        many = with_cold_call_overhead(many, 20e-6, {"paired_at": f"n{i}"})
    assert len(many["evidence"]["cold_call_history"]) == COLD_CALL_HISTORY  # only the recent ones
    assert many["cold_call_overhead_s"] == pytest.approx(20e-6)
    fresh = with_cold_call_overhead({}, 12e-6, {})  # a profile without any value yet
    assert fresh["cold_call_overhead_s"] == 12e-6 and len(fresh["evidence"]["cold_call_history"]) == 1
