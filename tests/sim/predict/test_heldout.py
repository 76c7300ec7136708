"""Held-out scoring: models refitted without the experiment's kernels, never a lookup of them,
a clear error where the profile is too small, neighbours measured where a family is short."""

from __future__ import annotations

from tiny_budget import TINY_TIMING
import pytest

from costmodel.families.gemm import GemmSpec
from costmodel.families.softmax import SoftmaxSpec
from costmodel.families.sort import SortSpec
from costmodel.families.topk import TopkSpec
from costmodel.model.cold_start import cold_start_s
from costmodel.model.composition import per_call_s
from experiments.workloads import evaluate_workloads
from sim.predict.calibration import calibrated_model
from sim.predict.heldout import (
    MIN_HELDOUT_ROWS, NEIGHBOURS_PER_FAMILY, HeldOutError, fit_heldout, heldout_table, neighbour_specs, neighbour_suite, trace_keys,
    trace_kernels,
)
from sim.workloads.workload import Workload

TIMING = TINY_TIMING
SUITE = [("grid", GemmSpec(m, 32, 32)) for m in (1, 2, 4, 8, 16, 32)] + [("grid", SortSpec(n)) for n in (512, 1024, 2048, 4096, 8192)]
TRACE = [GemmSpec(8, 32, 32), SortSpec(2048), GemmSpec(8, 32, 32)]


@pytest.fixture
def rt(tiny_runtime):
    return tiny_runtime(rounds=1)


@pytest.fixture
def calibrated(rt):
    return calibrated_model(rt, SUITE, suite_name="t", progress=False, refresh="never")


def test_heldout_fit_leaves_out_every_kernel_of_the_traces_and_looks_nothing_up(rt, calibrated):
    held = fit_heldout(rt.open_profile(), calibrated, [TRACE])
    assert held.excluded_kernels == 2 and held.excluded_rows == 2
    assert held.rows == len(SUITE) - 2 and held.family_rows == {"gemm": 5, "sort": 4}
    assert held.model.measured_s == {}  # no lookup at all
    table, _ = heldout_table(rt.open_profile(), trace_keys([TRACE]))
    assert not set(table["key"]) & trace_keys([TRACE])
    # the loaded model looks the profiled kernel up; the held-out one cannot
    gemm = GemmSpec(8, 32, 32)
    assert calibrated.predict([gemm])["L3"].iloc[0] == pytest.approx(calibrated.measured_s[gemm.key()])
    assert gemm.key() not in held.model.measured_s
    assert held.model.ceilings == calibrated.ceilings  # the ceilings as they stood before the run
    assert held.to_dict()["scored"] and held.fit_s >= 0


def test_a_profile_too_small_to_hold_out_names_the_family_and_its_rows(rt, calibrated):
    trace = [GemmSpec(8, 32, 32), SoftmaxSpec(4, 8)]  # no softmax at all in the profile
    with pytest.raises(HeldOutError, match=r"softmax: 0 rows left of 0") as err:
        fit_heldout(rt.open_profile(), calibrated, [trace], what="t")
    assert f"fewer than {MIN_HELDOUT_ROWS}" in str(err.value) and "never falls back" in str(err.value)
    # five of the six gemms in the trace: one row is left, short of three
    with pytest.raises(HeldOutError, match=r"gemm: 1 row left of 6"):
        fit_heldout(rt.open_profile(), calibrated, [[GemmSpec(m, 32, 32) for m in (1, 2, 4, 8, 16)]])


def test_paired_refresh_records_are_ignored_by_the_heldout_table(rt, calibrated):
    from costmodel.measure.freshness import REFRESH_COMMAND

    profile = rt.open_profile()
    profile.add_provenance({"command": REFRESH_COMMAND, "refresh": {
        "at": "2999-01-01T00:00:00", "policy": "paired", "family_scale": {"gemm": 2.0}}})
    scaled = profile.kernels().set_index("key")["median_s"]
    held, _ = heldout_table(profile, set())
    held = held.set_index("key")["median_s"]
    key = GemmSpec(1, 32, 32).key()
    assert scaled[key] == pytest.approx(2 * held[key])


def test_evaluate_workloads_headline_is_heldout_with_lookup_beside(rt, calibrated, gemm_sort_gemm_run):
    run = gemm_sort_gemm_run
    held = fit_heldout(rt.open_profile(), calibrated, [TRACE])
    df = evaluate_workloads(calibrated, [Workload("w", TRACE, run)], device=rt.device, timing=TIMING,
                            description="t", progress=False, heldout=held)
    assert df.attrs["scoring"] == "held-out" and df.attrs["heldout"]["excluded_kernels"] == 2
    lookup = calibrated.predict(TRACE)["L3"].sum()
    # gemm, sort, gemm: two cold starts, and the second GEMM re-cools by the little the sort moved
    cold = cold_start_s(calibrated, "L3", TRACE)
    assert cold == pytest.approx(2 * calibrated.ceilings.get("cold_call_overhead_s", 0) * (calibrated.fingerprint.cache == "cold"),
                                 rel=0.05)
    # and every kernel its cost among other kinds (costmodel.model.composition; the fixture measured the ceilings)
    assert df["pred_lookup_L3_s"].iloc[0] == pytest.approx(lookup + cold + len(TRACE) * per_call_s(calibrated, "L3"))
    assert df["pred_L3_s"].iloc[0] != pytest.approx(df["pred_lookup_L3_s"].iloc[0], rel=1e-9)
    assert set(df.attrs["profile_lookup"]) >= {"median_ape_pct", "p90_ape_pct", "max_ape_pct"}
    assert "replay" not in df.attrs  # not paired


def test_paired_heldout_run_reports_its_kernel_error_by_kind(rt, calibrated, gemm_sort_gemm_run):
    from experiments.common import summary
    from experiments.workloads import Pairing

    held = fit_heldout(rt.open_profile(), calibrated, [TRACE])
    df = evaluate_workloads(calibrated, [Workload("w", TRACE, gemm_sort_gemm_run)], device=rt.device, timing=TIMING,
                            description="t", progress=False, heldout=held, pairing=Pairing(rt.open_profile(), "t"))
    parts = df.attrs["heldout_by_kind"]
    assert parts["all"]["calls"] == 3 and parts["untimed_calls"] == 0
    assert set(parts["kinds"]) <= {"gemm", "sort", "other"} and parts["kinds"]
    assert sum(k["calls"] for k in parts["kinds"].values()) == 3
    assert 0 < parts["all"]["share_of_layers_pct"] and parts["all"]["heldout_over_replay"] > 0
    assert summary("t", "cpu", df)["details"]["heldout_by_kind"] == parts


def test_neighbours_scale_every_size_field_and_skip_invalid_ones():
    near = neighbour_specs(GemmSpec(8, 32, 32))
    assert GemmSpec(4, 16, 16) in near and GemmSpec(16, 64, 64) in near
    assert GemmSpec(4, 32, 32) in near and GemmSpec(8, 32, 64) in near
    assert GemmSpec(8, 32, 32) not in near and len(near) == len(set(near)) == 8
    topk = TopkSpec(4, 4, 4)  # k == cols: scaling k alone up is invalid and left out
    for s in neighbour_specs(topk):
        assert s.k <= s.cols
    assert (4, 4, 8) not in {(s.rows, s.cols, s.k) for s in neighbour_specs(topk)}
    assert TopkSpec(8, 8, 8) in neighbour_specs(topk) and TopkSpec(4, 4, 2) in neighbour_specs(topk)
    suite = neighbour_suite([GemmSpec(8, 32, 32), SortSpec(64)], ["sort"], {SortSpec(128).key()})
    assert {s for _, s in suite} == {SortSpec(16), SortSpec(32), SortSpec(256)}  # one size field: x0.25 to x4
    assert {t for t, _ in suite} == {"heldout_neighbour"}
    many = neighbour_suite([GemmSpec(m, 64, 64) for m in range(1, 60)], ["gemm"], set())
    assert len(many) == NEIGHBOURS_PER_FAMILY


def test_the_heaviest_kernels_get_their_neighbours_first():
    small = [GemmSpec(m, 64, 64) for m in range(1, 60)]
    assert neighbour_specs(GemmSpec(8, 32, 32))[:2] == [GemmSpec(4, 16, 16), GemmSpec(16, 64, 64)]  # together first
    suite = {s for _, s in neighbour_suite(small + [GemmSpec(512, 512, 512)], ["gemm"], set())}
    assert len(suite) == NEIGHBOURS_PER_FAMILY  # the budget holds
    assert {GemmSpec(256, 256, 256), GemmSpec(1024, 1024, 1024)} <= suite  # default weight: bytes moved
    # a weight (roofline seconds in calibration) picks which kernel is heavy
    heavy = GemmSpec(3, 64, 64)
    weighted = {s for _, s in neighbour_suite(small, ["gemm"], set(), weight=lambda s: float(s == heavy))}
    assert {GemmSpec(2, 32, 32), GemmSpec(6, 128, 128)} <= weighted
    assert GemmSpec(2, 32, 32) not in {s for _, s in neighbour_suite(small, ["gemm"], set())}



def test_a_kernel_the_traces_run_often_outweighs_a_larger_one_run_once():
    # moe_ep's shape: a 4-row expert GEMM the loops run hundreds of times, 64-row ones once
    small, large = GemmSpec(4, 1024, 2048), [GemmSpec(m, 2048, 4096) for m in range(40, 70)]
    traces = [[small] * 300, large]
    assert trace_kernels(traces) == [small] * 300 + large
    once = {s for _, s in neighbour_suite(list(dict.fromkeys(trace_kernels(traces))), ["gemm"], set())}
    weighted = {s for _, s in neighbour_suite(trace_kernels(traces), ["gemm"], set())}
    near_small = set(neighbour_specs(small))
    assert len(near_small) == 8 and len(near_small & once) == 2  # counted once: two, by the spread over bytes
    assert near_small <= weighted and len(weighted) == NEIGHBOURS_PER_FAMILY  # by the time it carries: all eight

def test_the_half_not_around_the_heaviest_kernels_is_whatever_pick_rest_chooses(rt, calibrated):
    from sim.predict.calibration import neighbour_picker

    small = [GemmSpec(m, 64, 64) for m in range(1, 60)] + [GemmSpec(512, 512, 512)]
    asked = []

    def last_ones(candidates, n):
        asked.append((len(candidates), n))
        return candidates[-n:]
    by_bytes = {s for _, s in neighbour_suite(small, ["gemm"], set())}
    picked = neighbour_suite(small, ["gemm"], set(), pick_rest=last_ones)
    heavy_n = NEIGHBOURS_PER_FAMILY // 2
    assert len(picked) == NEIGHBOURS_PER_FAMILY and asked[0][1] == NEIGHBOURS_PER_FAMILY - heavy_n
    assert {GemmSpec(256, 256, 256), GemmSpec(1024, 1024, 1024)} <= {s for _, s in picked}  # the heavy half stays
    assert {s for _, s in picked} != by_bytes
    # the calibration's picker: a committee on the profile, or None (spread over bytes)
    table, _ = heldout_table(rt.open_profile(), set())
    ceilings = rt.open_profile().ceilings()
    assert neighbour_picker("bytes", table, ceilings, {"gemm"}) is None
    assert neighbour_picker("committee", table, None, {"gemm"}) is None  # no ceilings measured yet
    pick = neighbour_picker("committee", table, ceilings, {"gemm", "sort"})
    candidates = [GemmSpec(m, 32, 32) for m in (3, 5, 64, 4096)]
    chosen = pick(candidates, 2)
    assert len(chosen) == 2 and set(chosen) <= set(candidates) and pick([], 3) == []
    with pytest.raises(ValueError, match=r"calibration.neighbours must be one of \['committee', 'bytes'\], got 'gp'"):
        neighbour_picker("gp", table, ceilings, {"gemm"})


def test_calibration_measures_neighbours_of_short_families(rt):
    trace = [GemmSpec(8, 32, 32), SoftmaxSpec(4, 8)]
    model = calibrated_model(rt, SUITE + [("grid", SoftmaxSpec(4, 8))], suite_name="t", progress=False,
                             refresh="never", heldout=trace)
    table, _ = heldout_table(rt.open_profile(), trace_keys([trace]))
    assert (table["family"] == "softmax").sum() >= MIN_HELDOUT_ROWS
    held = fit_heldout(rt.open_profile(), model, [trace])
    assert held.family_rows["softmax"] >= MIN_HELDOUT_ROWS


def test_calibration_measures_neighbours_of_every_traced_family_never_the_traced_kernels(rt):
    """gemm has five kernels besides the trace's: not short, and still its neighbours are
    measured (the freshness check needs current rows around every traced family)."""
    trace = [GemmSpec(8, 32, 32), SortSpec(3000)]
    calibrated_model(rt, SUITE, suite_name="t", progress=False, refresh="never", heldout=trace)
    rows = rt.open_profile().measurements()
    near = rows[rows["tag"] == "heldout_neighbour"]
    assert set(near["family"]) == {"gemm", "sort"}
    assert {GemmSpec(16, 64, 64).key(), SortSpec(1500).key(), SortSpec(750).key()} <= set(near["key"])
    assert GemmSpec(16, 32, 32).key() not in set(near["key"])  # a suite kernel already: not measured twice
    assert not ({s.key() for s in trace} & set(near["key"]))


def test_roofline_weight_is_the_kernels_roofline_seconds():
    from sim.predict.calibration import roofline_weight

    assert roofline_weight(None) is None and roofline_weight({"overhead_s": 1e-6}) is None
    ceilings = {"peak_flops_per_s": 1e9, "bandwidth_bytes_per_s": 1e9, "overhead_s": 1e-6}
    gemm = GemmSpec(8, 32, 32)  # 16384 FLOPs; (8*32 + 32*32 + 8*32) * 4 bytes = 6144 bytes
    assert roofline_weight(ceilings)(gemm) == pytest.approx(max(gemm.flops(), gemm.bytes_moved()) / 1e9 + 1e-6)
