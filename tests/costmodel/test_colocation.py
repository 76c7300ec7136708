"""costmodel.colocation: a real 2-process measurement of a tiny profile writes colocation.json
(a ratio per kernel, a factor per family, the placement) and keeps the old entry in the
history on re-measure; an unmeasured family's factor is 1.0; bad cores or a world size the
machine cannot place are refused before any process starts; no process outlives a run; the
factors scale kernel times per family and leave nothing else."""

from __future__ import annotations

import json
import multiprocessing
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from tiny_budget import tiny_timing

from costmodel.collectives.workers import usable_cores
from costmodel.colocation import (
    ColocationError, ColocationFactors, colocated_kernel_times, colocated_trace_seconds, load_colocation,
    measure_colocation, resolve_colocation,
)
from costmodel.colocation.store import FILE
from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gemm import GemmSpec
from costmodel.measure.device import fingerprint
from costmodel.store.profile import DeviceProfile

TWO_CORES = len(usable_cores()) >= 2
needs_two = pytest.mark.skipif(not TWO_CORES, reason="the measurement pins two ranks to two cores")


def _rows(specs, seconds):
    return [{"key": s.key(), "round": 0, **s.to_record(), "flops": s.flops(), "bytes_moved": s.bytes_moved(),
             "median_s": t, "iqr_s": t / 50, "noisy": False} for s, t in zip(specs, seconds)]


@pytest.fixture
def profile(tmp_path):
    """A 1-thread cold profile with three GEMMs and three elementwise kernels (tiny sizes)."""
    fp = replace(fingerprint(torch.device("cpu"), "float32", cold_cache=True), threads=1)
    p = DeviceProfile.open(tmp_path / "profiles", fp)
    specs = [GemmSpec(m, 32, 32) for m in (1, 8, 64)] + [ElementwiseSpec("scale", n, "float32") for n in (256, 4096, 65536)]
    p.append_measurements(_rows(specs, [2e-6, 4e-6, 2e-5, 1e-6, 2e-6, 1e-5]))
    return p


def _children():
    return [c for c in multiprocessing.active_children() if c.name.startswith("ep-rank")]


@needs_two
def test_a_real_measurement_writes_factors_and_keeps_history(profile):
    timing = tiny_timing(rounds=2)
    entry = measure_colocation(profile, (0, 1), per_family=2, timing=timing, measure_lock=False, progress=False)
    assert not _children()  # every rank ended
    data = json.loads((profile.path / FILE).read_text())
    assert data["history"] == [] and data["current"]["measured_at"] == entry["measured_at"]
    fams = data["current"]["families"]
    assert set(fams) == {"gemm", "elementwise"}
    for fam, v in fams.items():
        assert len(v["kernels"]) == 2  # smallest and largest by bytes
        assert v["kernels"][0]["bytes_moved"] < v["kernels"][1]["bytes_moved"]
        for k in v["kernels"]:
            assert k["alone_median_s"] > 0 and k["beside_median_s"] > 0
            assert k["ratio"] == pytest.approx(k["beside_median_s"] / k["alone_median_s"])
            assert len(k["round_ratios"]) == 2 and all(c > 0 for c in k["twin_calls"])
        assert v["factor"] == pytest.approx(float(np.median([k["ratio"] for k in v["kernels"]])))
        for k in v["kernels"]:  # and beside the stream neighbour, with the pressure model's twin
            assert k["stream_ratio"] == pytest.approx(k["stream_median_s"] / k["alone_median_s"])
            assert len(k["stream_round_ratios"]) == 2 and 0.0 <= k["pressure_own"] <= 1.0
        assert v["stream_factor"] == pytest.approx(float(np.median([k["stream_ratio"] for k in v["kernels"]])))
    neighbour = data["current"]["stream_neighbour"]
    assert neighbour["alone_bytes_per_s"] > 1e8 and neighbour["private_cache_bytes"] > 0
    assert neighbour["beside_kernels_bytes_per_s_median"] > 0
    assert data["current"]["model_check"]["kernels"] == 4
    assert data["current"]["placement"]["cores"] == [0, 1] and data["current"]["placement"]["world_size"] == 2
    factors = load_colocation(profile)
    assert factors.factor("gemm") == pytest.approx(fams["gemm"]["factor"])
    assert "gemm" in factors.describe() and "cores0-1-w2" in factors.describe()
    assert factors.has_stream and "beside the stream neighbour" in factors.describe()

    measure_colocation(profile, (0, 1), per_family=2, families=["gemm"], timing=timing, measure_lock=False,
                       progress=False)
    again = json.loads((profile.path / FILE).read_text())
    assert len(again["history"]) == 1 and again["history"][0] == data["current"]
    assert set(again["current"]["families"]) == {"gemm"}
    assert load_colocation(profile, cores=(1, 0)) is None  # another placement was never measured
    assert not _children()


def test_an_unmeasured_family_has_factor_one_and_says_so(caplog):
    f = ColocationFactors.constant({"gemm": 1.5})
    assert f.factor("gemm") == 1.5
    with caplog.at_level("WARNING"):
        assert f.factor("scatter") == 1.0
    assert "'scatter' was not measured" in caplog.text
    assert "not measured (1.0): scatter" in f.describe()


def test_no_file_loads_as_none_and_profile_mode_says_why(tmp_path):
    assert load_colocation(tmp_path) is None
    found, how = resolve_colocation("profile", tmp_path, measuring=False)
    assert found is None and "no co-location factors" in how
    with pytest.raises(ColocationError, match=re.escape("ep.colocation must be one of ['measure', 'profile', 'off'], "
                                                        "got 'on'")):
        resolve_colocation("on", tmp_path, measuring=False, field="ep.colocation")


@pytest.mark.parametrize("cores, message", [
    ((0,), "world_size=1 cannot be placed one rank per core; world_size (= len(cores)) must be in [2, "),
    (tuple(range(len(usable_cores()) + 1)), f"world_size={len(usable_cores()) + 1} cannot be placed one rank per "
                                           f"core; world_size (= len(cores)) must be in [2, {len(usable_cores())}]"),
    ((0, 0), "cores must be distinct core ids in "),
    ((0, 999), "cores must be distinct core ids in "),
    ("01", "cores must be a tuple of distinct core ids"),
])
def test_bad_cores_are_refused_before_any_process(profile, cores, message):
    if len(usable_cores()) < 2 and len(cores) == 2:
        pytest.skip("needs two usable cores")
    with pytest.raises(ColocationError, match=re.escape(message)):
        measure_colocation(profile, cores, measure_lock=False, progress=False)
    assert not _children() and not (profile.path / FILE).exists()


def test_factors_scale_each_family_and_nothing_else():
    gemm, ew = GemmSpec(4, 8, 8), ElementwiseSpec("scale", 64, "float32")

    def per_kernel(traces):  # 1 s per gemm, 10 s per elementwise, at two levels
        s = np.array([sum(1.0 if k.family == "gemm" else 10.0 for k in t) for t in traces])
        return {"L2": s, "L3": 2 * s}

    f = ColocationFactors.constant({"gemm": 2.0})
    out = colocated_kernel_times(per_kernel, f)([[gemm, ew, gemm], [ew], []])
    assert out["L2"].tolist() == [2 * 2.0 + 10.0, 10.0, 0.0] and out["L3"].tolist() == [28.0, 20.0, 0.0]
    assert colocated_kernel_times(per_kernel, None) is per_kernel
    one = colocated_trace_seconds([gemm, ew], lambda t: {"L3": float(per_kernel([t])["L3"][0])}, f)
    assert one == {"L3": 2 * 2.0 + 20.0}


def _by_size(ratios_by_bytes):
    """Factors whose gemm kernels were measured at these (bytes, ratio) points."""
    kernels = [{"bytes_moved": float(b), "ratio": float(r)} for b, r in ratios_by_bytes]
    family = float(np.median([r for _, r in ratios_by_bytes]))
    return ColocationFactors(factors={"gemm": family}, placement={"id": "cores0-1-w2"}, measured_at="", source="t",
                             kernels={"gemm": kernels})


def test_the_factor_follows_the_kernels_bytes_between_the_measured_sizes():
    """Interpolated in log2 bytes between measured kernels, held flat beyond them; the family's
    median without bytes, and with a single measured size."""
    f = _by_size([(1023, 1.0), (2 ** 20 - 1, 1.2), (2 ** 30 - 1, 1.4)])
    assert f.factor("gemm", 1023) == pytest.approx(1.0)
    assert f.factor("gemm", 2 ** 15 - 1) == pytest.approx(1.1)  # log2 15 lies halfway between 10 and 20
    assert f.factor("gemm", 2 ** 25 - 1) == pytest.approx(1.3)
    assert f.factor("gemm", 10) == pytest.approx(1.0) and f.factor("gemm", 2 ** 40) == pytest.approx(1.4)
    assert f.factor("gemm") == pytest.approx(1.2)
    assert _by_size([(4096, 1.3)]).factor("gemm", 10) == pytest.approx(1.3)
    assert "gemm 1.00x at 1.02 kB .. 1.40x at 1.07 GB" in f.describe()


def test_a_trace_is_scaled_kernel_by_kernel_at_its_bytes():
    small, large = GemmSpec(1, 8, 8), GemmSpec(2048, 2048, 2048)
    f = _by_size([(small.bytes_moved(), 1.0), (large.bytes_moved(), 1.5)])

    def seconds_of(trace):  # 1 s per kernel
        return {"L3": float(len(trace))}

    assert colocated_trace_seconds([small, large, large], seconds_of, f) == {"L3": pytest.approx(1.0 + 2 * 1.5)}
    both = colocated_kernel_times(lambda ts: {"L3": np.array([float(len(t)) for t in ts])}, f)([[small], [large]])
    np.testing.assert_allclose(both["L3"], [1.0, 1.5])


def test_kernels_to_measure_span_the_bytes_in_log_steps():
    """Many small kernels and few large ones: the picks reach across the sizes, ends included."""
    from costmodel.colocation.measure import log_spaced

    sizes = np.array([1, 2, 3, 4, 5, 6, 7, 8, 1e3, 1e6, 1e9], dtype=float)
    assert log_spaced(sizes, 4) == [0, 8, 9, 10]
    assert log_spaced(sizes[:2], 4) == [0, 1] and log_spaced(np.array([]), 3) == []


def test_overlapped_seconds_by_hand():
    from costmodel.colocation import overlapped_seconds

    np.testing.assert_allclose(overlapped_seconds([10.0, 10.0], [14.0, 14.0]), [14.0, 14.0])  # side by side throughout
    np.testing.assert_allclose(overlapped_seconds([0.0, 10.0], [0.0, 14.0]), [0.0, 10.0])  # alone throughout
    # rank 1 starts 5 s late: rank 0 runs 5 s alone, both then at 1/1.4 until rank 0's last 5 s take 7 s (t=12);
    # rank 1 has done 5 s of its 10 by then and runs the rest alone (t=17): 12 s each from their own starts
    np.testing.assert_allclose(overlapped_seconds([10.0, 10.0], [14.0, 14.0], [0.0, 5.0]), [12.0, 12.0])
    with pytest.raises(ValueError, match=re.escape("alone_s, colocated_s and start_s must be [W] vectors")):
        overlapped_seconds([1.0, 2.0], [1.0])


# ----------------------------------------------------------------------------- beside different work

def _streamed(points, rate=10e9, cache=2.0**20):
    """Factors whose gemm kernels were measured at these (bytes, twin ratio, stream ratio) points,
    the stream neighbour at ``rate`` bytes/s, a private cache of ``cache`` bytes."""
    kernels = [{"bytes_moved": float(b), "ratio": float(r), "stream_ratio": float(s)} for b, r, s in points]
    return ColocationFactors(factors={"gemm": float(np.median([r for _, r, _ in points]))}, placement={"id": "cores0-1-w2"},
                             measured_at="", source="t", kernels={"gemm": kernels}, stream_bytes_per_s=rate,
                             private_cache_bytes=cache)


def test_a_neighbours_pressure_counts_only_its_traffic_beyond_the_private_cache():
    f = _streamed([(1023, 1.0, 1.0), (2**20 - 1, 1.1, 1.4)], rate=10e9, cache=2.0**20)
    mib = 2.0**20
    # 0.5 MiB stays in the neighbour's own cache; 4 + 6 MiB stream: 10 MiB in 2 ms = 5.24 GB/s of 10 GB/s
    assert f.pressure_of([0.5 * mib, 4 * mib, 6 * mib], 2e-3) == pytest.approx(10 * mib / 2e-3 / 10e9)
    assert f.pressure_of([4 * mib, 6 * mib], 1e-4) == 1.0  # faster than the stream: held at 1
    assert f.pressure_of([0.5 * mib], 1e-6) == 0.0 and f.pressure_of([], 0.0) == 0.0
    with pytest.raises(ColocationError, match=re.escape("busy_s must be seconds >= 0, got -1")):
        f.pressure_of([mib], -1)
    with pytest.raises(ColocationError, match=re.escape("bytes_moved must be >= 0 per kernel")):
        f.pressure_of([-1.0], 1.0)
    assert _by_size([(1023, 1.0)]).pressure_of([4 * mib], 1.0) is None  # measured without the stream
    from costmodel.colocation import neighbour_pressure

    trace = [GemmSpec(512, 512, 512)]  # 3 MiB moved
    assert neighbour_pressure(f, [trace, trace], 1e-3) == pytest.approx(2 * trace[0].bytes_moved() / 1e-3 / 10e9)
    assert neighbour_pressure(None, [trace], 1.0) is None


def test_the_factor_beside_a_neighbour_runs_from_alone_to_the_stream_with_its_pressure():
    """1 + (stream ratio - 1) x pressure, the stream ratio interpolated in log2 bytes; no pressure
    gives the twin's ratio; factors measured without the stream ignore the pressure."""
    f = _streamed([(1023, 1.0, 1.0), (2**20 - 1, 1.1, 1.4)])
    big = 2**20 - 1
    assert f.factor("gemm", big, pressure=0.0) == pytest.approx(1.0)
    assert f.factor("gemm", big, pressure=0.5) == pytest.approx(1.2)
    assert f.factor("gemm", big, pressure=1.0) == pytest.approx(1.4)
    assert f.factor("gemm", 2**15 - 1, pressure=1.0) == pytest.approx(1.2)  # stream ratio halfway in log2 bytes
    assert f.factor("gemm", big) == pytest.approx(1.1)  # the twin
    assert _by_size([(1023, 1.0), (big, 1.1)]).factor("gemm", big, pressure=1.0) == pytest.approx(1.1)
    for bad in (-0.1, 1.5, "high"):
        with pytest.raises(ColocationError, match=re.escape(f"pressure must be a number in [0, 1], got {bad!r}")):
            f.factor("gemm", big, pressure=bad)
    assert "beside the stream neighbour (10.0 GB/s alone; private cache 1.05 MB): gemm 1.00-1.40x" in f.describe()

    def seconds_of(trace):  # 1 s per kernel
        return {"L3": float(len(trace))}

    small, large = GemmSpec(1, 8, 8), GemmSpec(2048, 2048, 2048)  # 576 B; 48 MiB: beyond the largest measured size
    assert colocated_trace_seconds([small, large], seconds_of, f) == {"L3": pytest.approx(1.0 + 1.1)}
    both = colocated_kernel_times(lambda ts: {"L3": np.array([float(len(t)) for t in ts])}, f, pressure=0.5)
    np.testing.assert_allclose(both([[small], [large]])["L3"], [1.0, 1.2])


def test_the_model_check_compares_the_modelled_twin_with_the_measured_one():
    """A kernel's twin has the kernel's own pressure: its bytes over its alone time over the stream's rate."""
    from costmodel.colocation.measure import model_check

    mib = 2.0**20
    entry = {"stream_neighbour": {"alone_bytes_per_s": 10e9, "private_cache_bytes": mib},
             "families": {"gemm": {"factor": 1.0, "kernels": [
                 # 1 KiB: inside the private cache, pressure 0, modelled 1.0 against 1.02 measured
                 {"bytes_moved": 1024.0, "alone_median_s": 1e-6, "ratio": 1.02, "stream_ratio": 1.1},
                 # 50 MB in 10 ms = 5 GB/s: pressure 0.5, modelled 1 + 0.6 x 0.5 = 1.3 against 1.25 measured
                 {"bytes_moved": 50e6, "alone_median_s": 1e-2, "ratio": 1.25, "stream_ratio": 1.6}]}}}
    check = model_check(entry)
    k = entry["families"]["gemm"]["kernels"]
    assert k[0]["pressure_own"] == 0.0 and k[1]["pressure_own"] == pytest.approx(0.5)
    assert k[1]["twin_ratio_modelled"] == pytest.approx(1.3)
    assert check["kernels"] == 2 and check["max_abs_diff"] == pytest.approx(0.05)
    assert check["median_abs_diff"] == pytest.approx((0.02 + 0.05) / 2)
    assert check["median_abs_diff_unity"] == pytest.approx((0.02 + 0.25) / 2)
    assert check["median_abs_diff_stream"] == pytest.approx((0.08 + 0.35) / 2)
    big = check["beyond_private_cache"]
    assert big["kernels"] == 1 and big["median_abs_diff"] == pytest.approx(0.05)


def test_the_conditions_of_a_round_rotate():
    from costmodel.colocation.rank import conditions

    assert [conditions(r, True) for r in range(4)] == [
        ("alone", "beside", "stream"), ("beside", "stream", "alone"), ("stream", "alone", "beside"),
        ("alone", "beside", "stream")]
    assert [conditions(r, False) for r in range(2)] == [("alone", "beside"), ("beside", "alone")]


def test_a_contended_timeline_slows_each_workload_by_what_runs_beside_it_then():
    """Device 0 runs a (2 s alone, sensitivity 0.5) then b (1 s, insensitive); device 1 runs c
    (1 s alone, pressure 1, sensitivity 0). a progresses at 1/1.5 while c runs (1 s: 2/3 done),
    then at full speed: ends at 1 + 4/3; b after it. c is never slowed."""
    from costmodel.colocation import contended_timeline

    start, end = contended_timeline([2.0, 1.0, 1.0], [0.5, 0.0, 0.0], [0.0, 0.0, 1.0], [0, 0, 1], 2)
    np.testing.assert_allclose(end, [1 + 4 / 3, 2 + 4 / 3, 1.0])
    np.testing.assert_allclose(start, [0.0, 1 + 4 / 3, 0.0])
    # pressures of several neighbours add up, held at 1 (rate 1/2 for the neighbours' 1 s, then alone: 1.5 s);
    # one neighbour of 0.7 gives rate 1/1.7 (0.588 done in 1 s, the rest alone: 1.412 s)
    _, end3 = contended_timeline([1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.7, 0.7], [0, 1, 2], 3)
    assert end3[0] == pytest.approx(1.5)
    _, end2 = contended_timeline([1.0, 1.0], [1.0, 0.0], [0.0, 0.7], [0, 1], 2)
    assert end2[0] == pytest.approx(1.0 + (1.0 - 1.0 / 1.7))
    _, alone = contended_timeline([3.0], [1.0], [1.0], [0], 2)
    assert alone[0] == pytest.approx(3.0)
    # a workload never starts before it is ready: device 0 idles from 1 s to 3 s, then runs its second
    start_r, end_r = contended_timeline([1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0, 0], 1, ready_s=[0.0, 3.0])
    np.testing.assert_allclose(start_r, [0.0, 3.0])
    np.testing.assert_allclose(end_r, [1.0, 4.0])
    with pytest.raises(ValueError, match="one entry per workload"):
        contended_timeline([1.0], [0.1, 0.2], [0.0], [0], 1)
    with pytest.raises(ValueError, match=re.escape("device_of in [0, 2)")):
        contended_timeline([1.0], [0.1], [0.0], [2], 2)


def test_the_measurement_also_picks_the_family_most_streaming_kernel(profile):
    """Beside the kernels spanning the bytes (the ends, with 2 per family), the one moving the most
    bytes per profiled second beyond the private cache joins, once."""
    from costmodel.colocation.measure import pick_kernels

    def picked(cache):
        return {f: [s.label() for s, _ in ks] for f, ks in pick_kernels(profile, per_family=2,
                                                                        private_cache_bytes=cache).items()}

    by_bytes = picked(None)
    assert by_bytes["gemm"] == ["gemm(m=1, k=32, n=32)", "gemm(m=64, k=32, n=32)"]
    # beyond 5000 B: m=8 (6144 B in 4 us, 1.5 GB/s) and m=64 (20480 B in 20 us, 1.0 GB/s): m=8 joins
    assert picked(5000.0)["gemm"] == by_bytes["gemm"] + ["gemm(m=8, k=32, n=32)"]
    # beyond 1000 B the most streaming is m=1 (4352 B in 2 us), already picked: nothing joins
    assert picked(1000.0)["gemm"] == by_bytes["gemm"]
