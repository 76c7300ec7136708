"""scripts/bench_sitting_holdout.py: a later sitting predicted from earlier rows, as measured and scaled."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest
from script_loader import loaded_script

from costmodel.families.gemm import GemmSpec



@pytest.fixture(scope="module")
def bench():
    yield from loaded_script("bench_sitting_holdout")


def test_only_refreshes_recorded_before_the_sitting_and_not_paired_ones_scale(bench):
    prov = [{"command": "freshness refresh", "refresh": {"at": "2026-12-01T09:00:00", "policy": "auto"}},
            {"command": "freshness refresh", "refresh": {"at": "2026-12-01T09:30:00", "policy": "paired"}},
            {"command": "bench"},
            {"command": "freshness refresh", "refresh": {"at": "2026-12-01T11:00:00", "policy": "auto"}}]
    kept = bench.refresh_records_before(prov, "2026-12-01T10:00:00")
    assert [e["refresh"]["at"] for e in kept] == ["2026-12-01T09:00:00"]


def _row(spec: GemmSpec, seconds: float, at: str) -> dict:
    return {"key": spec.key(), "round": 0, **spec.to_record(), "tag": "grid", "flops": spec.flops(),
            "bytes_moved": spec.bytes_moved(), "median_s": seconds, "iqr_s": 0.01 * seconds, "noisy": False,
            "measured_at": at}


def test_a_refresh_that_halved_the_old_rows_predicts_the_later_sitting_and_the_rows_as_measured_do_not(bench):
    """Old rows measured at 2x the machine's later speed; a refresh recorded between the two
    sittings says so (0.5): the scaled fit predicts the later sitting, the unscaled one 2x."""
    ceilings = {"peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 1e-6, "ridge_flops_per_byte": 10.0}

    def truth(s: GemmSpec) -> float:  # a machine at half its roofline
        return 2 * max(s.flops() / 1e11, s.bytes_moved() / 1e10) + 1e-6

    old = [GemmSpec(m, k, 256) for m in (8, 16, 32, 64, 128) for k in (64, 128, 256, 512, 1024, 2048)]
    new = [GemmSpec(m, k, 256) for m in (24, 96) for k in (96, 384, 1536)]
    raw = pd.DataFrame([_row(s, 2 * truth(s), "2026-12-01T10:00:00") for s in old]
                       + [_row(s, truth(s), "2026-12-02T10:00:00") for s in new])
    prov = [{"command": "freshness refresh", "refresh": {"at": "2026-12-01T12:00:00", "policy": "auto",
                                                         "family_scale": {"gemm": 0.5}}}]
    raw["sitting"] = bench.segments(raw["measured_at"], prov)
    later = sorted(raw["sitting"].unique())[-1]
    out = bench.predict_sitting(raw, later, prov, ceilings)
    assert sorted(out["key"]) == sorted(s.key() for s in new)
    assert np.median(out["scaled_s"] / out["measured_s"]) == pytest.approx(1.0, rel=0.1)
    assert np.median(out["as_measured_s"] / out["measured_s"]) == pytest.approx(2.0, rel=0.1)


def test_a_refresh_during_a_sitting_starts_a_segment_a_gap_of_half_an_hour_a_sitting(bench):
    at = pd.Series(["2026-12-01T10:00:00", "2026-12-01T10:10:00", "2026-12-01T10:25:00", "2026-12-01T10:29:00",
                    "2026-12-01T11:30:00", ""])
    prov = [{"refresh": {"at": "2026-12-01T10:20:00"}}, {"command": "bench"}]
    assert bench.segments(at, prov).tolist() == ["2026-12-01T10:00:00", "2026-12-01T10:00:00", "2026-12-01T10:25:00",
                                                 "2026-12-01T10:25:00", "2026-12-01T11:30:00", ""]
