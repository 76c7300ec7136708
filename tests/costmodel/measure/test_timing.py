"""Timing harness: Measurement statistics, run counts, noise detection, config errors."""

from __future__ import annotations

import itertools
import time

import pytest

from costmodel.measure.timing import Measurement, TimingConfig, measure


def test_measurement_statistics_are_exact():
    m = Measurement(times_s=(1.0, 2.0, 3.0, 4.0, 100.0), number_per_run=10, attempts=1, noisy=False,
                    device="cpu", threads=1)
    assert m.median_s == 3.0
    assert m.iqr_s == pytest.approx(4.0 - 2.0)
    assert m.rel_iqr == pytest.approx(2.0 / 3.0)
    assert m.mean_s == pytest.approx(22.0)
    summary = m.summary()
    assert summary["runs"] == 5 and summary["number_per_run"] == 10 and summary["median_s"] == 3.0


def test_measure_returns_a_measurement_with_enough_runs(tiny_timing):
    calls = []
    m = measure(lambda: calls.append(1), config=TimingConfig(min_run_time_s=0.005, min_runs=4, retries=0))
    assert isinstance(m, Measurement)
    assert len(m.times_s) >= 4 and m.number_per_run >= 1
    assert len(calls) >= 4 * m.number_per_run  # every timed call really ran
    assert m.median_s > 0 and m.device == "cpu"


def test_noisy_measurement_is_retried_then_flagged():
    # a bimodal kernel: IQR/median far above 5%. Both modes are longer than the shortest timed
    # block (1.25 ms here), so every block is one call: with 0.5 ms calls a block of two held
    # one of each, every block summed the same, and the noise it tests for averaged away
    durations = itertools.cycle([0.0015, 0.006])

    def flaky():
        time.sleep(next(durations))

    m = measure(flaky, config=TimingConfig(min_run_time_s=0.02, min_runs=4, retries=2, max_rel_iqr=0.05))
    assert m.noisy is True
    assert m.attempts == 3


def test_clean_measurement_is_not_retried():
    m = measure(lambda: time.sleep(0.001), config=TimingConfig(min_run_time_s=0.01, min_runs=3, retries=2,
                                                               max_rel_iqr=0.9))
    assert m.attempts == 1 and m.noisy is False


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"min_run_time_s": 0}, "timing.min_run_time_s must be > 0"),
        ({"min_runs": 2}, "timing.min_runs must be >= 3"),
        ({"max_rel_iqr": 1.5}, r"timing.max_rel_iqr must be in \(0, 1\)"),
        ({"retries": -1}, "timing.retries must be >= 0"),
        ({"rounds": 0}, "timing.rounds must be >= 1"),
        ({"layer_min_calls": 0}, "timing.layer_min_calls must be >= 1"),
    ],
)
def test_bad_timing_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TimingConfig(**kwargs)


def test_layer_timing_with_cache_eviction_times_single_calls():
    calls = []
    cfg = TimingConfig(min_run_time_s=0.01, min_runs=4, retries=0, cpu_evict_bytes=1 << 16, cpu_evict_max_calls=9)
    m = measure(lambda: (calls.append(1), time.sleep(0.002)), config=cfg, evict_cpu_cache=True)
    assert m.number_per_run == 1  # one call per sample: each starts after an eviction
    assert 4 <= len(m.times_s) <= 9 and len(calls) == len(m.times_s) + 1  # + the warm-up call
    assert all(t >= 0.002 for t in m.times_s)
    # layer_min_calls (default 15) asks for more calls than cpu_evict_max_calls allows: capped at 9
    assert len(m.times_s) == 9


def test_layer_calls_are_split_over_rounds_and_honoured():
    cfg = TimingConfig(min_run_time_s=1e-4, min_runs=3, retries=0, rounds=3, layer_min_calls=13, cpu_evict_bytes=1 << 16)
    assert cfg.per_round().layer_min_calls == 5  # ceil(13 / 3)
    m = measure(lambda: time.sleep(0.001), config=cfg.per_round(), evict_cpu_cache=True)  # past the time budget at once
    assert len(m.times_s) == 5


def test_evict_caches_writes_a_buffer_of_the_configured_size():
    import torch

    from costmodel.measure import timing

    timing.evict_caches(torch.device("cpu"), TimingConfig(cpu_evict_bytes=1 << 20))
    buf = timing._EVICT_BUFFERS[("cpu", 1 << 20)]
    assert buf.numel() * buf.element_size() == 1 << 20 and int(buf.abs().sum()) == 0
