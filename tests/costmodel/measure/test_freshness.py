"""Freshness: stale families detected per family, refreshed, recorded; older rows follow the drift."""

from __future__ import annotations

from tiny_budget import TINY_TIMING, tiny_timing_section
import numpy as np
import pandas as pd
import pytest

from costmodel.measure import freshness
from costmodel.measure.bench import SizeLimits, measure_specs
from costmodel.measure.freshness import (
    check_freshness, check_policy, check_tolerance, is_stale, pick_references, refresh_entry, refresh_scale,
    regime_of, regime_scales, remeasured_ratios,
    FreshnessReport,
)
from costmodel.families.gemm import GemmSpec
from costmodel.model.features import roofline_time_s
from costmodel.families.histogram import HistogramSpec
from costmodel.families.sort import SortSpec
from costmodel.measure.runtime import Runtime
from sim.predict.calibration import calibrated_model

TIMING = TINY_TIMING
SUITE = [("grid", SortSpec(2048)), ("grid", SortSpec(8192)), ("grid", HistogramSpec(8192, 16)),
         ("grid", GemmSpec(64, 64, 64)), ("grid", GemmSpec(128, 128, 128))] + \
        [("grid", GemmSpec(m, 32, 32)) for m in (1, 2, 4, 8, 16, 32)]


def _cfg(root) -> dict:
    return {"device": "cpu", "dtype": "float32", "threads": None, "allocator": "steady", "seed": 0,
            "profile": {"root": str(root)},
            "timing": tiny_timing_section(max_rel_iqr=0.5),
            "limits": {"cpu": {"max_flops": 1e9, "max_bytes": 1e9}}}


@pytest.mark.parametrize("value,expected", [("auto", "auto"), ("ALWAYS", "always"), (True, "always"),
                                            (False, "never"), (None, "never")])
def test_policy_values(value, expected):
    assert check_policy(value) == expected


@pytest.mark.parametrize("bad", ["sometimes", 3, "true-ish"])
def test_bad_policy_names_the_key_and_choices(bad):
    with pytest.raises(ValueError, match=r"calibration.refresh must be one of \['never', 'auto', 'always'\]"):
        check_policy(bad)


@pytest.mark.parametrize("bad", [0, -0.1, 10, "big", True])
def test_bad_tolerance_names_the_key_and_range(bad):
    with pytest.raises(ValueError, match=r"calibration.tolerance must be a number in \(0, 10\)"):
        check_tolerance(bad)


def test_stale_band_is_symmetric_in_ratio():
    assert not is_stale(1.0, 0.1) and not is_stale(1.1, 0.1) and not is_stale(1 / 1.1, 0.1)
    assert is_stale(1.11, 0.1) and is_stale(0.9, 0.1)  # 0.9 < 1/1.1 = 0.909


def test_references_spread_over_each_family_and_respect_scope():
    kernels = pd.DataFrame({"key": [f"g{i}" for i in range(10)] + ["s0", "s1", "tiny"],
                            "family": ["gemm"] * 10 + ["sort"] * 2 + ["sort"],
                            "median_s": [1e-4 * (i + 1) for i in range(10)] + [1e-3, 2e-3, 1e-7]})
    refs = pick_references(kernels, per_family=3)
    assert refs.groupby("family").size().to_dict() == {"gemm": 3, "sort": 2}  # 'tiny' is below min_s
    assert refs[refs.family == "gemm"]["key"].tolist() == ["g0", "g4", "g9"]  # lowest, middle, highest
    scoped = pick_references(kernels, keys={"g1", "s1"}, per_family=3)
    assert sorted(scoped["key"]) == ["g1", "s1"]


def test_refresh_scale_applies_to_older_rows_of_the_refreshed_family_only():
    rows = pd.DataFrame({"family": ["gemm", "gemm", "sort", "gemm"],
                         "measured_at": ["2026-01-01T00:00:00", "2026-03-01T00:00:00", "2026-01-01T00:00:00",
                                         "2026-05-01T00:00:00"]})
    prov = [{"command": "bench"},
            {"command": "freshness refresh", "refresh": {"at": "2026-02-01T00:00:00", "family_scale": {"gemm": 0.5}}},
            {"command": "freshness refresh", "refresh": {"at": "2026-04-01T00:00:00", "family_scale": {"gemm": 2.0}}}]
    # row 0 precedes both refreshes (0.5 * 2.0), row 1 only the second, sort untouched, row 3 is newer
    assert refresh_scale(rows, prov).tolist() == [1.0, 2.0, 1.0, 1.0]
    assert refresh_scale(rows, prov[:2]).tolist() == [0.5, 1.0, 1.0, 1.0]


@pytest.fixture
def rt(tmp_path):
    return Runtime.from_cfg(_cfg(tmp_path))


def _scale_profile_times(profile, factor: float) -> None:
    """Make the stored profile say every kernel took ``factor`` times as long (a stale profile)."""
    file = profile.path / "measurements.csv"
    frame = pd.read_csv(file)
    for col in ("median_s", "iqr_s", "mean_s", "min_s", "std_s"):
        if col in frame:
            frame[col] = frame[col] * factor
    frame.to_csv(file, index=False)


def test_a_profile_off_by_3x_is_stale_in_every_family(rt, busy_guard_aside):
    profile = rt.open_profile()
    measure_specs(SUITE, profile, device=rt.device, timing=TIMING, limits=SizeLimits(1e9, 1e9), suite="t",
                  show_progress=False)
    _scale_profile_times(profile, 3.0)
    report = check_freshness(profile.kernels(), device=rt.device, timing=TIMING, tolerance=0.5)
    assert set(report.family_ratio) == {"gemm", "sort", "histogram"}
    assert report.stale_families == ["gemm", "histogram", "sort"]
    assert all(r < 0.67 for r in report.family_ratio.values()), report.family_ratio  # ~1/3 each
    assert check_freshness(profile.kernels(), device=rt.device, timing=TIMING, policy="never").family_ratio == {}


def test_calibration_refreshes_stale_families_and_records_it(rt, busy_guard_aside):
    profile = rt.open_profile()
    first = calibrated_model(rt, SUITE, suite_name="t", progress=False, refresh="never")
    assert first.freshness["refreshed"] is False and first.freshness["note"].startswith("not checked")
    _scale_profile_times(profile, 3.0)
    model = calibrated_model(rt, SUITE, suite_name="t", progress=False, refresh="auto", tolerance=0.5)
    fresh = model.freshness
    assert fresh["refreshed"] and fresh["stale_families"] == ["gemm", "histogram", "sort"]
    assert fresh["refreshed_kernels"] == len(SUITE)
    entry = [e for e in profile.provenance() if e["command"] == "freshness refresh"][-1]
    assert set(entry["refresh"]["family_scale"]) == {"gemm", "histogram", "sort"} and "beyond" in entry["reason"]
    # every kernel was re-measured after the refresh: no row is scaled, and the 3x is gone
    kernels = profile.kernels()
    assert "refresh_scale" not in kernels or (kernels["refresh_scale"] == 1.0).all()
    assert model.profile_hash == profile.content_hash()  # refitted on the refreshed data


def test_rows_not_remeasured_follow_the_family_drift(rt):
    profile = rt.open_profile()
    measure_specs(SUITE, profile, device=rt.device, timing=TIMING, limits=SizeLimits(1e9, 1e9), suite="t",
                  show_progress=False)
    before = profile.kernels().set_index("key")["median_s"]
    hash_before = profile.content_hash()
    report = FreshnessReport(policy="auto", tolerance=0.1, family_ratio={"sort": 0.5}, family_kernels={"sort": 2})
    entry = refresh_entry(report, ["sort"], reason="test")
    entry["refresh"]["at"] = "9999-01-01T00:00:00"  # every stored row is older
    profile.add_provenance(entry)
    after = profile.kernels().set_index("key")
    sort_keys = [s.key() for _, s in SUITE if s.family == "sort"]
    other = [s.key() for _, s in SUITE if s.family != "sort"]
    assert after.loc[sort_keys, "median_s"].tolist() == pytest.approx((before[sort_keys] * 0.5).tolist())
    assert after.loc[other, "median_s"].tolist() == pytest.approx(before[other].tolist())
    assert profile.content_hash() != hash_before  # a fitted model sees the refresh as new data


def test_remeasured_ratios_are_new_over_profiled_and_their_median_per_family():
    before = pd.DataFrame({"key": ["a", "b", "c", "d"], "family": ["gemm", "gemm", "gemm", "sort"],
                           "median_s": [1.0, 2.0, 4.0, 10.0]})
    raw = pd.DataFrame({"key": ["a", "a", "b", "c", "d", "d"],
                        "measured_at": ["2026-01-02T00:00:00", "2026-01-02T00:00:01", "2026-01-02T00:00:00",
                                        "2025-12-31T00:00:00", "2026-01-02T00:00:00", None],
                        "median_s": [2.0, 4.0, 5.0, 400.0, 5.0, 999.0]})
    # a: median(2, 4) / 1 = 3; b: 5 / 2 = 2.5; c measured before the refresh: not counted;
    # d: its unstamped row is not the refresh's, 5 / 10 = 0.5
    ratios = remeasured_ratios(before, raw, ["a", "b", "c", "d"], since="2026-01-01T00:00:00")
    assert ratios["ratio"].to_dict() == pytest.approx({"a": 3.0, "b": 2.5, "d": 0.5})
    assert ratios["regime"].to_dict() == {"a": 0, "b": 0, "d": 1}  # 1 s, 2 s: decade 0; 10 s: decade 1
    family, regime = regime_scales(ratios)
    assert family == pytest.approx({"gemm": 2.75, "sort": 0.5}) and regime == {"gemm": {"0": 2.75}, "sort": {"1": 0.5}}
    assert remeasured_ratios(before, raw, ["zz"], since="2026-01-01T00:00:00").empty


def test_a_refresh_records_what_it_re_measured_not_the_quick_checks_ratio(rt, busy_guard_aside, monkeypatch):
    import sim.predict.calibration as calibration

    profile = rt.open_profile()
    calibrated_model(rt, SUITE, suite_name="t", progress=False, refresh="never")
    _scale_profile_times(profile, 3.0)
    real = calibration.check_freshness

    def transient(*args, **kwargs):  # the check caught a 200x hiccup of one family
        report = real(*args, **kwargs)
        report.family_ratio["sort"] = 200.0
        return report

    monkeypatch.setattr(calibration, "check_freshness", transient)
    model = calibrated_model(rt, SUITE, suite_name="t", progress=False, refresh="auto", tolerance=0.5)
    entry = [e for e in profile.provenance() if e["command"] == "freshness refresh"][-1]
    scale = entry["refresh"]["family_scale"]
    assert set(scale) == {"gemm", "histogram", "sort"}
    assert 0.1 < scale["sort"] < 0.7, scale  # ~1/3: the re-measured kernels against the 3x profile, not 200
    assert model.freshness["refresh_scale"] == scale and model.freshness["family_ratio"]["sort"] == 200.0


def test_a_refresh_scales_older_rows_only_in_the_latency_regimes_it_re_measured():
    # one family, two regimes: 30 us MoE-sized scatters and 3 ms GNN-sized ones
    rows = pd.DataFrame({"family": ["scatter"] * 3 + ["gemm"],
                         "median_s": [3e-5, 3e-3, 3.5e-3, 3e-5],
                         "measured_at": ["2026-01-01T00:00:00"] * 4})
    assert regime_of(rows["median_s"]).tolist() == [-5, -3, -3, -5]
    # a GNN run re-measured its millisecond scatters at 0.5x: the MoE-sized row is left alone
    prov = [{"command": "freshness refresh",
             "refresh": {"at": "2026-02-01T00:00:00", "family_scale": {"scatter": 0.5},
                         "regime_scale": {"scatter": {"-3": 0.5}}}}]
    assert refresh_scale(rows, prov).tolist() == [1.0, 0.5, 0.5, 1.0]
    # a later refresh finds each row's regime on its time as scaled so far (3 ms x 0.5 = 1.5 ms:
    # still -3) and applies that regime's ratio
    prov.append({"command": "freshness refresh",
                 "refresh": {"at": "2026-03-01T00:00:00", "family_scale": {"scatter": 2.0},
                             "regime_scale": {"scatter": {"-5": 2.0, "-3": 3.0}}}})
    assert refresh_scale(rows, prov).tolist() == [2.0, 1.5, 1.5, 1.0]


# ----------------------------------------------------------------------------- sittings (epochs)


def test_rows_measured_within_the_gap_form_one_sitting_named_by_its_first_row():
    from costmodel.measure.freshness import EPOCH_GAP_S, measurement_epochs

    assert EPOCH_GAP_S == 1800
    stamps = ["2026-01-01T10:20:00", "2026-01-01T10:00:00", "2026-01-01T10:29:59", None,
              "2026-01-01T11:00:00", "2026-01-02T00:00:00"]
    # 10:00, 10:20 and 10:29:59 are under 30 min apart; 11:00 is 30 min 1 s after 10:29:59
    first = "2026-01-01T10:00:00/2026-01-01T10:29:59"
    assert measurement_epochs(stamps).tolist() == [first, first, first, "", "2026-01-01T11:00:00/2026-01-01T11:00:00",
                                                   "2026-01-02T00:00:00/2026-01-02T00:00:00"]
    assert measurement_epochs([]).tolist() == []


def test_a_refresh_scales_each_sitting_it_re_measured_by_its_own_ratio():
    rows = pd.DataFrame({"family": ["gather"] * 4 + ["gemm"],
                         "median_s": [3e-3, 3.5e-3, 3e-3, 3e-3, 3e-3],
                         "measured_at": ["2026-01-01T00:00:00", "2026-01-01T00:10:00",  # sitting A
                                         "2026-01-01T05:00:00",  # sitting B
                                         "2026-02-02T00:00:00",  # after the refresh
                                         "2026-01-01T00:00:00"]})
    prov = [{"command": "freshness refresh",
             "refresh": {"at": "2026-02-01T00:00:00", "family_scale": {"gather": 0.5},
                         "regime_scale": {"gather": {"-3": 0.5}},
                         "epoch_scale": {"gather": {"2026-01-01T00:00:00/2026-01-01T00:10:00": 0.25}}}}]
    # A takes its own 0.25; B, which the refresh re-measured nothing of, its regime's 0.5;
    # the newer row and the other family nothing
    assert refresh_scale(rows, prov).tolist() == [0.25, 0.25, 0.5, 1.0, 1.0]


def test_a_sitting_ratio_against_the_rows_as_measured_replaces_earlier_scales():
    rows = pd.DataFrame({"family": ["gemm"] * 3, "median_s": [1e-3] * 3,
                         "measured_at": ["2026-01-01T00:00:00", "2026-01-01T00:05:00", "2026-01-01T09:00:00"]})
    prov = [{"command": "freshness refresh",
             "refresh": {"at": "2026-01-05T00:00:00", "family_scale": {"gemm": 2.0}}},
            {"command": "freshness refresh",
             "refresh": {"at": "2026-01-06T00:00:00", "family_scale": {"gemm": 1.5},
                         "sitting_scale": {"gemm": {"2026-01-01T00:00:00/2026-01-01T00:05:00": 0.25}}}}]
    # the first sitting: 0.25 in place of 2.0 (not 0.5); the other: 2.0 then the family's 1.5
    assert refresh_scale(rows, prov).tolist() == [0.25, 0.25, 3.0]
    later = prov + [{"command": "freshness refresh", "refresh": {"at": "2026-01-07T00:00:00",
                                                                 "family_scale": {"gemm": 2.0}}}]
    assert refresh_scale(rows, later).tolist() == [0.5, 0.5, 6.0]  # a later relative refresh multiplies on


def test_epoch_anchors_cover_every_older_sitting_never_a_scored_kernel():
    from costmodel.measure.freshness import ANCHORS_PER_EPOCH, epoch_anchors, key_epochs

    raw = pd.DataFrame({"key": [f"a{i}" for i in range(6)] + ["b0", "b1", "c0", "c1", "z"],
                        "measured_at": ["2026-01-01T00:00:00"] * 6 + ["2026-01-03T00:00:00"] * 2
                        + ["2026-01-05T00:00:00"] * 2 + ["2026-01-01T00:00:01"]})
    kernels = pd.DataFrame({"key": raw["key"], "family": ["gather"] * 10 + ["sort"],
                            "median_s": [1e-4 * (i + 1) for i in range(11)]})
    # sitting c is covered by the refresh's own re-measured kernels; b has one of them only
    picked = epoch_anchors(key_epochs(raw), kernels, ["gather"], covered=["c0", "c1", "b1"], exclude=["a0"])
    assert sorted(picked) == sorted(["a1", "a3", "a5", "b0", "b1"])  # a: 3 spread over a1..a5; b: both
    assert len([k for k in picked if k.startswith("a")]) == ANCHORS_PER_EPOCH
    assert "z" not in picked  # another family
    assert epoch_anchors(key_epochs(raw.iloc[:0]), kernels, ["gather"], covered=[]) == []


OLDER_SITTING = [("grid", GemmSpec(m, 128, 128)) for m in (16, 32, 64, 96, 128, 192, 256)]  # tens of us
SUITE_SITTING = [("grid", GemmSpec(m, 256, 256)) for m in (256, 384, 512)]


def _two_sittings(profile, rt, *, older_factor: float, suite_factor: float) -> None:
    """Measure ``OLDER_SITTING`` and ``SUITE_SITTING`` now, then make the stored profile say the
    older ones were measured on 2026-01-01, ``older_factor`` times slower than now, and the
    suite's ``suite_factor`` times."""
    measure_specs(OLDER_SITTING + SUITE_SITTING, profile, device=rt.device, timing=TIMING,
                  limits=SizeLimits(1e9, 1e9), suite="t", show_progress=False)
    file = profile.path / "measurements.csv"
    frame = pd.read_csv(file)
    is_old = frame["key"].isin({s.key() for _, s in OLDER_SITTING})
    frame.loc[is_old, "measured_at"] = "2026-01-01T00:00:00"
    for col in ("median_s", "iqr_s", "mean_s", "min_s", "std_s"):
        if col in frame:
            frame[col] = frame[col] * is_old.map({True: older_factor, False: suite_factor})
    frame.to_csv(file, index=False)


def test_the_check_finds_a_stale_sitting_that_the_suite_kernels_do_not_show(rt, busy_guard_aside):
    """The suite's kernels were calibrated a minute ago (ratio ~1), the family's rows of an
    older sitting are 4x slow: the check times that sitting too and calls the family stale."""
    profile = rt.open_profile()
    older, suite = OLDER_SITTING, SUITE_SITTING
    _two_sittings(profile, rt, older_factor=4.0, suite_factor=1.0)
    keys = [s.key() for _, s in suite]
    alone = check_freshness(profile.kernels(), device=rt.device, timing=TIMING, tolerance=0.5, keys=keys)
    assert alone.sitting_ratio == {}
    report = check_freshness(profile.kernels(), device=rt.device, timing=TIMING, tolerance=0.5, keys=keys,
                             measurements=profile.measurements(), exclude=[older[0][1].key()])
    span = "2026-01-01T00:00:00/2026-01-01T00:00:00"
    assert report.sitting_ratio["gemm"][span] < 0.5, report.sitting_ratio  # ~1/4
    assert report.stale_families == ["gemm"] and "sittings beyond tolerance: gemm 2026-01-01T00:00:00" in report.describe()
    assert report.checked_kernels == len(suite) + 2  # the suite's three and two of the older sitting (not the excluded)


def test_a_refresh_gives_an_older_sitting_its_own_ratio(rt, busy_guard_aside):
    """Two sittings of one family at different speeds (rows 6x and 2.5x the machine): the
    refresh re-measures the suite's kernels (the 1.6x sitting) and anchors of the other, and
    each sitting's rows that were not re-measured follow their own ratio."""
    profile = rt.open_profile()
    suite = SUITE_SITTING
    old_keys = {s.key() for _, s in OLDER_SITTING}
    _two_sittings(profile, rt, older_factor=6.0, suite_factor=2.5)
    model = calibrated_model(rt, suite, suite_name="t", progress=False, refresh="auto", tolerance=0.3)
    assert model.freshness["refreshed"], model.freshness
    entry = [e for e in profile.provenance() if e["command"] == "freshness refresh"][-1]["refresh"]
    by_epoch = entry["sitting_scale"]["gemm"]
    older_span = "2026-01-01T00:00:00/2026-01-01T00:00:00"
    assert older_span in by_epoch, by_epoch
    suite_ratio = [r for span, r in by_epoch.items() if span != older_span]
    assert by_epoch[older_span] < 0.3, by_epoch  # ~1/6, not the suite's ~1/2.5
    assert all(by_epoch[older_span] < 0.8 * r for r in suite_ratio), by_epoch
    kernels = profile.kernels().set_index("key")
    raw = profile.measurements()
    not_remeasured = [k for k in old_keys if (raw["key"] == k).sum() == (raw[raw["key"] == k]["round"].nunique())
                      and (raw[raw["key"] == k]["measured_at"].astype(str) < entry["at"]).all()]
    ceilings = profile.ceilings()
    for k in not_remeasured:  # scaled by the older sitting's own ratio, never below its roofline
        row = raw[raw["key"] == k].iloc[0]
        roof = float(roofline_time_s(np.array([row["flops"]]), np.array([row["bytes_moved"]]), ceilings)[0])
        floor = roof / row["median_s"] if row["median_s"] >= roof else 0.0
        assert kernels.loc[k, "refresh_scale"] == pytest.approx(max(by_epoch[older_span], floor))
    assert not_remeasured  # 7 older kernels, 3 re-measured as anchors


# ----------------------------------------------------------------------------- busy machine


def test_busy_reason_names_other_processes_and_wild_ratios():
    from costmodel.measure.freshness import BUSY_OTHER_CORES, BUSY_RATIO, busy_reason

    assert busy_reason({"gemm": 1.3, "sort": 0.8}, 0.1) == ""
    assert busy_reason({"gemm": 1.3}, None) == ""  # nothing known of other processes: the ratios decide
    assert "other processes used 1.20 cores" in busy_reason({"gemm": 1.0}, 1.2)
    text = busy_reason({"softmax": 1284.0, "gather": 480.0, "gemm": 1.1, "sort": 0.05, "scatter": 3.9}, 0.0)
    assert f"ratios beyond {BUSY_RATIO:g}x" in text and "softmax 1.28e+03x" in text and "sort 0.05x" in text
    assert "gemm" not in text and "scatter" not in text and BUSY_OTHER_CORES < 1


def test_other_cpu_cores_subtracts_this_process():
    from costmodel.measure.freshness import other_cpu_cores

    assert other_cpu_cores((100.0, 10.0), (104.0, 11.0), 2.0) == pytest.approx(1.5)  # 4 s busy, 1 s ours, over 2 s
    assert other_cpu_cores(None, (1.0, 1.0), 1.0) is None and other_cpu_cores((1.0, 1.0), (1.0, 1.0), 0.0) is None


def test_a_refresh_under_a_cpu_hog_is_refused_and_records_nothing(tmp_path):
    """A bounded synthetic hog (two busy-looping processes for at most 20 s, killed after the
    check) makes the freshness check report a busy machine and refresh nothing."""
    import subprocess
    import sys

    from costmodel.measure.freshness import cpu_seconds

    if cpu_seconds() is None:
        pytest.skip("needs /proc/stat")
    rt = Runtime.from_cfg(_cfg(tmp_path))
    calibrated_model(rt, SUITE, suite_name="t", progress=False, refresh="never")
    before = rt.open_profile().measurements()
    hog = "import time\nend = time.time() + 20\nwhile time.time() < end: pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(2)]
    try:
        model = calibrated_model(rt, SUITE, suite_name="t", progress=False, refresh="always")
    finally:
        for p in hogs:
            p.kill()
            p.wait(timeout=10)
    report = model.freshness
    assert report["busy"] and "other processes used" in report["busy"]
    assert report["stale_families"] == [] and not report["refreshed"]
    after = rt.open_profile().measurements()
    assert len(after) == len(before)  # no row recorded under that load
    assert not [e for e in rt.open_profile().provenance() if e.get("command") == "freshness refresh"]


def test_a_refresh_never_scales_a_row_past_its_roofline():
    """Bounded per row: a row that respected the roofline as measured is scaled at most down to
    it; a row that beat it (cache-resident) keeps its scale; no ceilings, no bound."""
    from costmodel.store.profile import roofline_bounded

    ceilings = {"peak_flops_per_s": 1e12, "bandwidth_bytes_per_s": 1e10, "overhead_s": 0.0}
    rows = pd.DataFrame({"flops": [0.0, 0.0, 1e9], "bytes_moved": [1e9, 1e9, 1e3],   # roofs 0.1, 0.1, 1e-3 s
                         "median_s": [0.2, 0.05, 0.004]})
    scale = np.array([0.2, 0.5, 0.5])
    bounded = roofline_bounded(rows, scale, ceilings)
    assert bounded.tolist() == pytest.approx([0.5, 0.5, 0.5])  # 0.2 s -> 0.1 s at most; 0.05 beat it; 4 ms -> 2 ms ok
    assert roofline_bounded(rows, scale, None).tolist() == scale.tolist()
    assert roofline_bounded(rows, np.array([2.0, 1.0, 1.0]), ceilings).tolist() == [2.0, 1.0, 1.0]  # slower: untouched


def test_threads_null_is_the_start_up_default_even_after_a_run_that_set_one(tmp_path):
    """A Hydra sweep runs its jobs in one process: gnn_partition (threads: 1) then gnn_degree
    (threads: null) measured gnn_degree with one thread, into the one-thread profile."""
    import torch
    from costmodel.measure.runtime import DEFAULT_THREADS

    if DEFAULT_THREADS < 2:
        pytest.skip("one thread by default: a run that sets one cannot be told apart")
    try:
        assert Runtime.from_cfg({**_cfg(tmp_path), "threads": 1}).fingerprint.threads == 1
        rt = Runtime.from_cfg(_cfg(tmp_path))
        assert torch.get_num_threads() == DEFAULT_THREADS == rt.fingerprint.threads
    finally:
        torch.set_num_threads(DEFAULT_THREADS)
