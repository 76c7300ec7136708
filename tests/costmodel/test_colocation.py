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
    assert data["current"]["placement"]["cores"] == [0, 1] and data["current"]["placement"]["world_size"] == 2
    factors = load_colocation(profile)
    assert factors.factor("gemm") == pytest.approx(fams["gemm"]["factor"])
    assert "gemm" in factors.describe() and "cores0-1-w2" in factors.describe()

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
