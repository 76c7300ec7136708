"""Paired calibration: the layers' kernels timed in their rounds replace the profile's rows,
are never scaled by their own refresh, and move the other rows of their family."""

from __future__ import annotations

from tiny_budget import tiny_timing
import time
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from costmodel.families.gemm import GemmSpec
from costmodel.families.sort import SortSpec
from costmodel.measure.bench import SizeLimits, measure_specs
from costmodel.measure.timing import Measurement, TimingConfig
from costmodel.cli.config_schema import check
from experiments.common import COMMON_CONSTRAINTS, paired_enabled
from experiments.workloads import Pairing, evaluate_workloads
from sim.workloads.workload import Workload
from sim.predict.calibration import calibrated_model
from sim.predict.paired import TAG, KernelJob, distinct_kernels, kernel_jobs, layer_kernel_jobs, paired_order, record_paired

TIMING = tiny_timing(rounds=2)
SUITE = [("grid", GemmSpec(m, 32, 32)) for m in (1, 2, 4, 8, 16, 32)] + [("grid", SortSpec(n)) for n in (512, 1024, 2048, 4096, 8192)]


@pytest.fixture
def rt(tiny_runtime):
    return tiny_runtime(rounds=2)


def _fake(seconds: float) -> Measurement:
    return Measurement(times_s=(seconds,) * 3, number_per_run=1, attempts=1, noisy=False, device="cpu", threads=1)


def _profiled_long_ago(rt):
    """A profile of SUITE whose rows are stamped long before any refresh a test records."""
    profile = rt.open_profile()
    measure_specs(SUITE, profile, device=rt.device, timing=TIMING, limits=SizeLimits(1e9, 1e9), suite="t",
                  show_progress=False)
    file = profile.path / "measurements.csv"
    rows = pd.read_csv(file).assign(measured_at="2000-01-01T00:00:00")
    # every GEMM in one latency decade (regime_of: 10-100 us), whatever this machine measured:
    # drift is scaled per regime, and real timings of these tiny GEMMs straddle 10 us on some hosts
    gemm = rows["family"] == "gemm"
    factor = 2e-5 * (1 + 0.01 * rows.loc[gemm, "m"]) / rows.loc[gemm, "median_s"]
    for col in ("median_s", "mean_s", "iqr_s", "min_s", "max_s"):  # one scale: the rows stay self-consistent
        if col in rows:
            rows.loc[gemm, col] = rows.loc[gemm, col] * factor
    rows.to_csv(file, index=False)
    return profile


def test_distinct_kernels_keep_first_seen_order():
    a, b, c = GemmSpec(1, 2, 3), SortSpec(8), GemmSpec(4, 5, 6)
    assert distinct_kernels([[a, b, a], [c, b]]) == [a, b, c]
    jobs = kernel_jobs([[a, b], [a]], torch.device("cpu"), cold=False)
    assert [j.spec for j in jobs] == [a, b]
    assert callable(jobs[0].build())


def test_paired_rows_replace_the_profile_and_are_not_scaled_by_their_own_refresh(rt):
    profile = _profiled_long_ago(rt)
    before = profile.kernels().set_index("key")["median_s"]
    paired = [GemmSpec(1, 32, 32), GemmSpec(2, 32, 32)]  # two of the six GEMMs, now 2x and 4x their profiled time
    jobs = [KernelJob(s, rt.device, False) for s in paired]
    rounds = [[_fake(2 * before[s.key()])] * 2 for s in paired[:1]] + [[_fake(4 * before[s.key()])] * 2 for s in paired[1:]]
    result = record_paired(profile, jobs, rounds, suite="t")
    assert result.kernels == 2 and result.rows == 4
    assert result.family_ratio == {"gemm": pytest.approx(3.0)}  # median of 2x and 4x
    entry = [e for e in profile.provenance() if e["command"] == "freshness refresh"][-1]
    assert entry["refresh"]["policy"] == "paired" and entry["refresh"]["family_scale"] == {"gemm": pytest.approx(3.0)}
    after = profile.kernels().set_index("key")
    # the paired kernels are exactly what was timed beside the layers (not scaled again)
    assert after.loc[paired[0].key(), "median_s"] == pytest.approx(2 * before[paired[0].key()])
    assert after.loc[paired[1].key(), "median_s"] == pytest.approx(4 * before[paired[1].key()])
    # the other GEMMs follow the family's drift; sort (not paired) is untouched
    other_gemm = GemmSpec(32, 32, 32).key()
    assert after.loc[other_gemm, "median_s"] == pytest.approx(3 * before[other_gemm])
    sort_key = SortSpec(2048).key()
    assert after.loc[sort_key, "median_s"] == pytest.approx(before[sort_key])
    rows = pd.read_csv(profile.path / "measurements.csv")
    assert (rows[rows["key"] == paired[0].key()]["tag"] == TAG).all()
    assert len(rows) == len(SUITE) * TIMING.rounds  # replaced, not appended


def test_a_kernel_whose_rounds_disagree_beyond_the_spread_keeps_its_profiled_rows(rt):
    profile = _profiled_long_ago(rt)
    before = profile.kernels().set_index("key")["median_s"]
    steady, bimodal, new = GemmSpec(1, 32, 32), GemmSpec(2, 32, 32), GemmSpec(3, 32, 32)
    b = before[bimodal.key()]
    rounds = [[_fake(1.5 * before[steady.key()])] * 2, [_fake(b), _fake(20 * b)], [_fake(1e-4), _fake(1e-3)]]
    result = record_paired(profile, [KernelJob(s, rt.device, False) for s in (steady, bimodal, new)], rounds, suite="t")
    # 20x between rounds is two states, not drift: not recorded, not in the family's ratio;
    # a kernel the profile lacks is recorded whatever its spread (nothing better is known)
    assert result.unstable == (bimodal.label(),) and result.rows == 4
    assert result.family_ratio == {"gemm": pytest.approx(1.5)}
    after = profile.kernels().set_index("key")["median_s"]
    assert after[bimodal.key()] == pytest.approx(1.5 * b)  # its old rows, scaled by the family's drift
    assert new.key() in after.index and "kept their profiled rows" in result.describe("t")


def test_record_paired_refuses_mismatched_lengths(rt):
    with pytest.raises(ValueError, match="2 kernels but 1 measurement"):
        record_paired(rt.open_profile(), [KernelJob(GemmSpec(1, 2, 3), rt.device, False)] * 2, [[_fake(1.0)]], suite="t")


def test_evaluate_workloads_with_pairing_refits_and_keeps_the_lookup_beside(rt, gemm_sort_gemm_run):
    model = calibrated_model(rt, SUITE, suite_name="t", progress=False, refresh="never")
    trace = [GemmSpec(8, 32, 32), SortSpec(2048), GemmSpec(8, 32, 32)]
    run = gemm_sort_gemm_run
    pairing = Pairing(rt.open_profile(), "t")
    df = evaluate_workloads(model, [Workload("w", trace, run)], device=rt.device, timing=TIMING,
                            description="t", progress=False, pairing=pairing)
    assert pairing.model is not None and pairing.model.profile_hash == rt.open_profile().content_hash()
    assert pairing.result.kernels == 2  # distinct kernels of the trace
    paired = df.attrs["paired"]
    # without a held-out fit the headline is the replay, and it says so; the lookup is beside it
    assert df.attrs["scoring"] == "replay" and df.attrs["heldout"] == {"scored": False}
    assert set(df.attrs["profile_lookup"]) >= {"median_ape_pct", "p90_ape_pct", "max_ape_pct"}
    assert set(df.attrs["replay"]) >= {"median_ape_pct", "p90_ape_pct", "max_ape_pct"}
    assert df["ape_replay_L3_pct"].to_numpy() == pytest.approx(df["ape_L3_pct"].to_numpy())
    assert df.attrs["profile_drift"] == {}  # paired runs time no separate references
    assert "rounds" not in df.columns
    rows = pd.read_csv(rt.open_profile().path / "measurements.csv")
    assert set(rows[rows["tag"] == TAG]["key"]) == {s.key() for s in trace}
    # the cold-call chain was timed in the same rounds (cold and warm) and stored in the ceilings
    cold_call = paired["cold_call_overhead_s"]
    assert len(cold_call["cold_s"]) == len(cold_call["warm_s"]) == TIMING.rounds
    assert cold_call["now"] == pytest.approx(max(0.0, (np.median(cold_call["cold_s"]) - np.median(cold_call["warm_s"])) / 10))
    ceilings = rt.open_profile().ceilings()
    assert pairing.model.ceilings["cold_call_overhead_s"] == cold_call["now"]  # replay: this run's chain
    # the profile keeps the median of its measurements: the one it had, then this run's
    history = [h["overhead_s"] for h in ceilings["evidence"]["cold_call_history"]]
    assert history == [cold_call["profiled"], cold_call["now"]]
    assert ceilings["cold_call_overhead_s"] == cold_call["stored"] == pytest.approx(np.median(history))
    assert ceilings["evidence"]["cold_chain"]["before_s"] == cold_call["profiled"] == model.ceilings["cold_call_overhead_s"]


def test_cold_chain_is_timed_only_where_the_overhead_applies():
    from types import SimpleNamespace

    from experiments.workloads import cold_chain_jobs

    cold, warm = (SimpleNamespace(fingerprint=SimpleNamespace(cache=c, dtype="float32")) for c in ("cold", "warm"))
    cpu = torch.device("cpu")
    assert len(cold_chain_jobs(cold, cpu, TIMING)) == 2
    assert cold_chain_jobs(cold, cpu, replace(TIMING, cold_cache=False)) == []  # layers timed warm
    assert cold_chain_jobs(warm, cpu, TIMING) == []  # a warm profile
    assert cold_chain_jobs(cold, torch.device("meta"), TIMING) == []  # not a CPU


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_bad_paired_value_names_the_key(bad):
    with pytest.raises(ValueError, match="calibration.paired must be true or false"):
        check({"calibration": {"paired": bad}}, COMMON_CONSTRAINTS)  # the schema every experiment checks once


def test_paired_is_on_by_default():
    assert paired_enabled({}) is True and paired_enabled({"calibration": {"paired": False}}) is False


def test_paired_order_puts_each_layer_beside_the_kernels_it_first_uses():
    a, b, c = GemmSpec(1, 32, 32), GemmSpec(2, 32, 32), SortSpec(512)
    # jobs: layers 0, 1; one reference (2); kernels a, b, c at 3, 4, 5 (first-seen order)
    assert [s for s in distinct_kernels([[a, b], [b, c]])] == [a, b, c]
    assert paired_order([[a, b], [b, c]], 3) == [0, 3, 4, 1, 5, 2]


class _SleepJob:
    """A job whose n-th timing round sleeps ``durations_s[n]`` a call (``build`` runs once a round)."""

    def __init__(self, durations_s: list[float]):
        self.durations_s, self.built = durations_s, 0

    def build(self):
        seconds = self.durations_s[min(self.built, len(self.durations_s) - 1)]
        self.built += 1
        return lambda: time.sleep(seconds)


def test_extra_rounds_retime_only_the_noisy_watched_jobs_with_their_companions():
    from experiments.common import measure_interleaved

    noisy = _SleepJob([0.002, 0.030, 0.002, 0.002, 0.002, 0.002])  # round CV (2,30,2 ms) ~1.5, then (2,30,2,2) ~1.5
    quiet, kernel_of_noisy, kernel_of_quiet = _SleepJob([0.004]), _SleepJob([0.001]), _SleepJob([0.001])
    jobs = [noisy, quiet, kernel_of_noisy, kernel_of_quiet]
    timing = TimingConfig(min_run_time_s=0.003, min_runs=3, retries=0, rounds=3, layer_min_calls=1,
                          extra_rounds=2, max_round_cv=0.5)
    out = measure_interleaved(jobs, device=torch.device("cpu"), timing=timing, description="t", progress=False,
                              evict=[False] * 4, watch=[0, 1], companions={0: [2], 1: [3]})
    assert [o["rounds_timed"] for o in out] == [5, 3, 5, 3]  # two extra rounds, each with the noisy job's kernel
    assert [j.built for j in jobs] == [5, 3, 5, 3]
    # the median of five rounds shrugs off the slow one: their mean is 7.6 ms; a sleep overruns, never underruns
    # (CI once slept 1.5 ms for 1 ms, so the bound leaves 4 ms of scheduling overrun, not 50% of the sleep)
    assert 0.002 <= out[0]["measured_s"] < 0.006
    none = measure_interleaved([_SleepJob([0.001, 0.006, 0.001])], device=torch.device("cpu"),
                               timing=replace(timing, extra_rounds=0), description="t", progress=False, evict=[False])
    assert none[0]["rounds_timed"] == 3  # extra_rounds=0: the planned rounds only


def test_layer_kernel_jobs_number_the_kernels_as_paired_order_does():
    a, b, c = GemmSpec(1, 32, 32), GemmSpec(2, 32, 32), SortSpec(512)
    assert layer_kernel_jobs([[a, b, a], [b, c]], 3) == {0: [3, 4], 1: [4, 5]}


@pytest.mark.parametrize(("key", "value", "message"), [("extra_rounds", -1, "timing.extra_rounds must be >= 0"),
                                                       ("max_round_cv", 0.0, r"timing.max_round_cv must be in \(0, 1\)")])
def test_bad_extra_round_settings_name_the_key(key, value, message):
    with pytest.raises(ValueError, match=message):
        TimingConfig(**{key: value})


def test_measure_interleaved_alternates_direction_and_returns_job_order():
    from experiments.common import measure_interleaved

    calls: list[int] = []
    jobs = [lambda i=i: calls.append(i) for i in range(3)]
    timing = TimingConfig(min_run_time_s=0.001, min_runs=3, retries=0, rounds=3, layer_min_calls=1)
    out = measure_interleaved(jobs, device=torch.device("cpu"), timing=timing, description="t", progress=False,
                              evict=[False] * 3, order=[2, 0, 1])
    runs = [j for k, j in enumerate(calls) if k == 0 or calls[k - 1] != j]  # each timing is a run of calls
    assert runs == [2, 0, 1, 0, 2, 0, 1]  # forwards, backwards (1 and 2 twice in a row), forwards
    assert len(out) == 3 and all(o["measured_s"] > 0 for o in out)
    with pytest.raises(ValueError, match="order must be a permutation of the 3 job indices"):
        measure_interleaved(jobs, device=torch.device("cpu"), timing=timing, description="t", progress=False,
                            order=[0, 0, 1])
