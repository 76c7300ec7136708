"""Host costs measured on their own: the per-op cost of a sequence over each op alone, and views warm and cold."""

import pytest
import torch

from costmodel.measure.host_costs import host_costs_from, interleaved_ops, measure_host_costs, view_chain, with_host_costs
from costmodel.measure.timing import TimingConfig


def test_the_costs_are_per_op_differences_of_medians_and_never_negative():
    got = host_costs_from([1e-6, 2e-6, 3e-6, 4e-6], 14e-6, [10e-6, 12e-6, 11e-6], [60e-6, 90e-6, 100e-6], 10)
    assert got["interleave_overhead_s"] == pytest.approx((14e-6 - 10e-6) / 4)
    assert got["view_op_s"] == pytest.approx(1.1e-6) and got["view_cold_overhead_s"] == pytest.approx((90e-6 - 11e-6) / 10)
    faster = host_costs_from([5e-6, 5e-6], 8e-6, [10e-6], [9e-6], 10)  # a sequence faster than its parts: no charge
    assert faster["interleave_overhead_s"] == 0.0 and faster["view_cold_overhead_s"] == 0.0


def test_the_ops_run_alone_and_the_views_launch_no_kernel():
    ops = interleaved_ops(torch.device("cpu"), "float32")
    assert len(ops) == 10 and all(op() is not None for op in ops)
    chain, n = view_chain(torch.device("cpu"), "float32")
    a, b, rest = chain()
    assert n == 10 and a.shape == (64, 256) and b.shape == (64, 256) and len(rest) == 6
    base = a._base if a._base is not None else a
    assert all(t._base is base or t._base is base._base for t in (b, *rest))  # every one a view of the same tensor


def test_a_tiny_measurement_gives_every_ceiling_with_its_evidence_and_cuda_pays_nothing():
    got = measure_host_costs(torch.device("cpu"), "float32",
                             TimingConfig(min_run_time_s=0.01, rounds=1, cpu_evict_bytes=4 << 20), reps=3)
    assert {"interleave_overhead_s", "view_op_s", "view_cold_overhead_s"} <= set(got)
    assert got["view_op_s"] > 0 and got["interleave_overhead_s"] >= 0 and got["view_cold_overhead_s"] >= 0
    assert got["evidence"]["reps"] == 3 and len(got["evidence"]["alone_s"]) == 10
    stored = with_host_costs({"peak_flops_per_s": 1.0, "evidence": {"copy": []}}, got)
    assert stored["view_op_s"] == got["view_op_s"] and stored["evidence"]["copy"] == []
    assert stored["evidence"]["host_costs"]["views"] == 10 and "evidence" not in stored["evidence"]["host_costs"]
    meta = measure_host_costs(torch.device("meta"), "float32", TimingConfig())
    assert meta["interleave_overhead_s"] == meta["view_op_s"] == meta["view_cold_overhead_s"] == 0.0
    with pytest.raises(ValueError, match="host-cost reps must be >= 3, got 2"):
        measure_host_costs(torch.device("cpu"), "float32", TimingConfig(), reps=2)
