"""The cold-call overhead a profile predicts with (the median of its recent measurements) and its re-cooling curve."""

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


def test_the_recold_fraction_is_each_sizes_extra_over_the_full_evictions():
    from costmodel.measure.ceilings import recold_fraction_from

    warm, evicted = [10e-6, 10e-6, 12e-6], [110e-6, 110e-6, 90e-6]  # medians 10 and 110 us: 100 us for a full eviction
    got = recold_fraction_from(warm, evicted, {1: [20e-6, 20e-6, 30e-6], 64: [130e-6, 130e-6, 130e-6], 4: [5e-6] * 3})
    assert got == pytest.approx({"1": 0.1, "64": 1.2, "4": 0.0})  # faster than warm: 0, not negative
    assert recold_fraction_from(warm, warm, {1: [20e-6]}) == {}  # an eviction that costs nothing: no curve


def test_the_recold_chain_refuses_bad_sizes_and_gives_cuda_no_curve():
    import torch

    from costmodel.measure.ceilings import measure_recold_fraction, with_recold_fraction
    from costmodel.measure.timing import TimingConfig

    with pytest.raises(ValueError, match=r"recold sizes must be > 0 MiB and reps >= 3, got sizes \[0, 4\]"):
        measure_recold_fraction(torch.device("cpu"), "float32", TimingConfig(), sizes_mib=(0, 4))
    with pytest.raises(ValueError, match="reps 2"):
        measure_recold_fraction(torch.device("cpu"), "float32", TimingConfig(), reps=2)
    assert measure_recold_fraction(torch.device("meta"), "float32", TimingConfig())["recold_fraction_by_mib"] == {}
    got = measure_recold_fraction(torch.device("cpu"), "float32", TimingConfig(cpu_evict_bytes=8 << 20), sizes_mib=(1,), reps=3)
    assert set(got["recold_fraction_by_mib"]) <= {"1"} and set(got["evidence"]["after_mib_s"]) == {"1"}
    ceilings = with_recold_fraction({"peak_flops_per_s": 1.0, "evidence": {"copy": []}}, got)
    assert ceilings["recold_fraction_by_mib"] == got["recold_fraction_by_mib"] and ceilings["evidence"]["copy"] == []
    assert ceilings["evidence"]["recold_chain"]["reps"] == 3
