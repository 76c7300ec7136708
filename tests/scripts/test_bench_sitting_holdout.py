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


def test_references_read_a_sittings_drift_and_every_count_is_scored_on_the_same_groups(bench):
    """A sitting whose gemm kernels all ran 1.25x the fit (no scatter): any K references read
    1.25 and the corrected rest is exact; a group too small for the largest K is left out for all."""
    big = pd.DataFrame({"sitting": "s1", "family": "gemm", "measured_s": np.full(30, 1.25), "scaled_s": np.ones(30)})
    small = pd.DataFrame({"sitting": "s1", "family": "sort", "measured_s": np.full(12, 2.0), "scaled_s": np.ones(12)})
    trials = bench.reference_trials(pd.concat([big, small], ignore_index=True), [3, 8], draws=5)
    assert set(trials["family"]) == {"gemm"}  # sort: 12 < 8 + MIN_SCORED
    assert sorted(trials["references"].unique()) == [3, 8] and len(trials) == 10
    assert np.allclose(trials["drift"], 1.25)
    assert np.allclose(trials["uncorrected_median_ape_pct"], 20.0) and np.allclose(trials["corrected_median_ape_pct"], 0.0)
    assert np.allclose(trials["uncorrected_bias_pct"], 20.0) and np.allclose(trials["corrected_bias_pct"], 0.0)
    summary = bench.summarize_references(trials).set_index("references")
    assert summary.loc[3, "groups"] == 1 and summary.loc[3, "scored_per_draw"] == 27 and summary.loc[3, "draws"] == 5
    assert summary.loc[8, "scored_per_draw"] == 22 and summary.loc[8, "ape_improved_share"] == 1.0


def test_references_are_drawn_from_the_sitting_and_never_scored(bench):
    """Two references at 2x and the rest exact: with K = all-but-MIN_SCORED drawn at random, the
    drift is the references' median, so it is read off the drawn kernels only."""
    measured = np.ones(10)
    measured[:2] = 2.0
    df = pd.DataFrame({"sitting": "s", "family": "gemm", "measured_s": measured, "scaled_s": np.ones(10)})
    trials = bench.reference_trials(df, [1], draws=200, seed=3)
    # a draw of one 2x kernel reads drift 2 and leaves one 2x kernel among nine scored
    hit = trials["drift"] == 2.0
    assert 0 < hit.sum() < 200 and np.allclose(trials.loc[~hit, "drift"], 1.0)
    assert np.allclose(trials.loc[hit, "uncorrected_median_ape_pct"], 0.0)
    assert np.allclose(trials.loc[hit, "corrected_median_ape_pct"], 100.0)


def test_nearest_references_score_a_kernels_near_twins_and_read_the_drift_outside_them(bench):
    """20 pairs of near twins (0.1 octave apart), pairs 2 octaves apart, pair p measured at 1 + p^2
    times its prediction: a draw scores the drawn kernel's pair only, and its references are the
    nearest pairs around it (within two pairs), never its twin."""
    octave = np.array([2 * p + 0.1 * j for p in range(20) for j in (0, 1)])
    pair = np.repeat(np.arange(20), 2)
    df = pd.DataFrame({"sitting": "s", "family": "gemm", "bytes_moved": 2.0 ** (10 + octave),
                       "flops": 2.0 ** (12 + octave), "measured_s": 1.0 + pair ** 2, "scaled_s": 1.0})
    trials = bench.reference_trials(df, [2, 4], draws=50, seed=1, pick="nearest")
    assert len(trials) == 100 and (trials["scored"] == 2).all()
    q2 = trials["uncorrected_median_ape_pct"] / (100 - trials["uncorrected_median_ape_pct"])  # the scored pair, squared
    q = np.round(np.sqrt(q2))
    assert np.allclose(q2, q ** 2) and q.nunique() > 10
    assert (trials["drift"] != 1 + q ** 2).all()
    assert ((trials["drift"] >= 1 + np.maximum(q - 2, 0) ** 2) & (trials["drift"] <= 1 + (q + 2) ** 2)).all()
    with pytest.raises(ValueError, match="pick must be one of"):
        bench.reference_trials(df, [2], draws=1, pick="farthest")


@pytest.mark.parametrize("argv, message", [
    (["--references", "3,x"], "--references must be comma-separated integers >= 1"),
    (["--references", "0,3"], "--references must be comma-separated integers >= 1"),
    (["--draws", "0"], "--draws must be an integer >= 1"),
    (["--pick", "farthest"], "--pick: invalid choice"),
    (["--last", "0"], "--last must be an integer >= 1"),
])
def test_bad_options_are_refused_naming_the_option(bench, tmp_path, argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        bench.main([str(tmp_path), *argv])
    assert err.value.code == 2 and message in capsys.readouterr().err
