"""Bench loop: measures into the profile, resumes, skips too-large shapes, loses nothing."""

from __future__ import annotations

from tiny_budget import tiny_timing
from dataclasses import replace

import pytest
import torch

import costmodel.measure.bench as bench
from costmodel.families.gemm import GemmSpec
from costmodel.families.histogram import HistogramSpec
from costmodel.families.sort import SortSpec
from costmodel.measure.bench import SizeLimits, measure_specs
from costmodel.measure.device import fingerprint
from costmodel.store.profile import DeviceProfile

TIMING = tiny_timing(rounds=2)
LIMITS = SizeLimits(max_flops=1e6, max_bytes=1e8)
SPECS = [("grid", SortSpec(64)), ("grid", HistogramSpec(64, 4)), ("grid", GemmSpec(4, 8, 8)),
         ("grid", GemmSpec(512, 512, 512))]  # the last exceeds max_flops


@pytest.fixture
def profile(tmp_path):
    return DeviceProfile.open(tmp_path, fingerprint(torch.device("cpu"), "float32"))


def _run(profile, **kw):
    return measure_specs(SPECS, profile, device=torch.device("cpu"), timing=TIMING, limits=LIMITS, suite="test",
                         show_progress=False, **kw)


def test_measures_every_round_and_notes_skips(profile):
    result = _run(profile)
    assert result.measured == 3 and len(result.skipped) == 1
    raw = profile.measurements()
    assert len(raw) == 3 * TIMING.rounds and set(raw["round"]) == {0, 1}
    assert "max_flops" in profile.skipped()["reason"].iloc[0]
    kernels = profile.kernels()
    assert set(kernels["family"]) == {"sort", "histogram", "gemm"}
    assert sorted(kernels["flops"]) == sorted(s.flops() for _, s in SPECS[:3])


def test_rerun_resumes_without_duplicates(profile):
    _run(profile)
    again = _run(profile)
    assert again.measured == 0 and again.already == 3
    assert len(profile.measurements()) == 3 * TIMING.rounds


def test_interrupted_run_keeps_what_it_measured(profile, monkeypatch):
    real = bench.measure
    calls = {"n": 0}

    def interrupting(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "measure", interrupting)
    with pytest.raises(KeyboardInterrupt) as stop:
        _run(profile)
    assert isinstance(stop.value, bench.MeasureInterrupted)
    assert len(profile.measurements()) == 2  # flushed on the way out
    assert str(stop.value).startswith("interrupted: this run's 2 measured rows (2 kernels) are saved in")
    assert "of the 4 kernels asked for, 0 are complete and 2 partially measured" in str(stop.value)
    assert "Rerun the same command to resume" in str(stop.value)
    monkeypatch.setattr(bench, "measure", real)
    resumed = _run(profile)  # resumes the rest
    assert len(profile.measurements()) == 3 * TIMING.rounds
    assert (resumed.already, resumed.partial, resumed.measured, resumed.rows) == (0, 2, 3, 4)


def test_counts_distinguish_complete_and_partial_kernels(profile):
    _run(profile)
    more = replace(TIMING, rounds=3)  # a third round asked for: every kernel is now partial
    result = measure_specs(SPECS, profile, device=torch.device("cpu"), timing=more, limits=LIMITS, suite="test",
                           show_progress=False)
    assert (result.already, result.partial, result.measured, result.rows) == (0, 3, 3, 3)
    again = measure_specs(SPECS, profile, device=torch.device("cpu"), timing=more, limits=LIMITS, suite="test",
                          show_progress=False)
    assert (again.already, again.partial, again.measured, again.rows) == (3, 0, 0, 0)


def test_kernels_too_slow_to_repeat_are_skipped_with_a_note(profile):
    slow = SizeLimits(max_flops=1e12, max_bytes=1e12, max_call_s=1e-9)
    result = measure_specs(SPECS[:2], profile, device=torch.device("cpu"), timing=TIMING, limits=slow, suite="test",
                           show_progress=False)
    assert result.measured == 0 and len(result.skipped) == 2
    assert profile.skipped()["reason"].str.contains("max_call_s").all()


def test_each_round_times_the_kernels_in_its_own_seeded_order(profile, monkeypatch):
    orders = [bench.round_order(20, r) for r in range(3)]
    assert all(sorted(o) == list(range(20)) for o in orders)  # a permutation: every kernel once a round
    assert orders[0] != orders[1] != orders[2] and bench.round_order(20, 1) == orders[1]  # differs by round, reproducible
    visited = []
    real = bench.make_runner
    monkeypatch.setattr(bench, "make_runner", lambda spec, *a, **kw: (visited.append(spec), real(spec, *a, **kw))[1])
    specs = [("grid", SortSpec(n)) for n in (16, 32, 64, 128, 256, 512)]
    measure_specs(specs, profile, device=torch.device("cpu"), timing=TIMING, limits=LIMITS, suite="test",
                  show_progress=False)
    expected = [specs[i][1] for r in range(TIMING.rounds) for i in bench.round_order(len(specs), r)]
    assert visited == expected and visited[:6] != [s for _, s in specs]  # not the list's order
