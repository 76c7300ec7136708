"""The cold start a cold layer pays: once per kind (code path and dtype) at its first kernel,
and at a later kernel the share its re-cooling curve gives for the MiB streamed since."""

from types import SimpleNamespace

import numpy as np
import pytest

from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gemm import GemmSpec
from costmodel.families.grouped_gemm import GroupedGemmSpec
from costmodel.model.cold_start import (
    cold_start_charges_s, cold_start_kind, cold_start_per_kind_s, cold_start_s, distinct_kinds, first_of_kind, kernel_kind,
    mib_since_kind, recold_curve,
)

CURVE = {"16": 0.5, "1": 0.1, "64": 1.2}  # out of order, as a JSON file may hold it


def stub(cache: str = "cold", overhead_s: float = 2e-5, curve: dict | None = None) -> SimpleNamespace:
    ceilings = {"cold_call_overhead_s": overhead_s, **({"recold_fraction_by_mib": curve} if curve is not None else {})}
    return SimpleNamespace(fingerprint=SimpleNamespace(cache=cache), ceilings=ceilings)


def test_a_kind_is_the_code_path_and_the_dtype():
    assert kernel_kind(ElementwiseSpec("mul", 8)) == "elementwise/mul"
    assert cold_start_kind(ElementwiseSpec("mul", 8)) == "elementwise/mul/float32"
    assert cold_start_kind(GemmSpec(4, 8, 8, "float64")) == "gemm/float64"
    assert cold_start_kind(GroupedGemmSpec((1, 2), 8, 8, "grouped_mm")) == "grouped_gemm/grouped_mm/float32"


def test_each_kind_is_charged_once_at_its_first_kernel():
    trace = [GemmSpec(4, 8, 8), ElementwiseSpec("mul", 8), GemmSpec(16, 8, 8), ElementwiseSpec("add", 8),
             ElementwiseSpec("mul", 64), GemmSpec(4, 8, 8, "float64")]
    assert first_of_kind(cold_start_kind(s) for s in trace).tolist() == [True, True, False, True, False, True]
    assert distinct_kinds(trace) == 4
    charges = cold_start_charges_s(stub(), "L3", trace)
    assert charges.tolist() == pytest.approx([2e-5, 2e-5, 0.0, 2e-5, 0.0, 2e-5])
    assert charges.sum() == pytest.approx(4 * 2e-5)  # a layer of 600 GEMMs would pay the same 2e-5 as one


@pytest.mark.parametrize("level", ["L0", "L1"])
def test_flops_only_levels_a_warm_profile_and_an_empty_trace_pay_nothing(level):
    trace = [GemmSpec(4, 8, 8), ElementwiseSpec("mul", 8)]
    assert cold_start_per_kind_s(stub(), level) == 0.0
    assert not cold_start_charges_s(stub(), level, trace).any()
    assert not cold_start_charges_s(stub(cache="warm"), "L3", trace).any()
    assert cold_start_per_kind_s(stub(), "L2") == 2e-5
    assert cold_start_charges_s(stub(), "L3", []).shape == (0,) and distinct_kinds([]) == 0
    assert np.asarray(first_of_kind([])).dtype == bool


def test_a_later_call_pays_the_curve_at_the_mib_streamed_since_its_kind_last_ran():
    small, big = ElementwiseSpec("mul", 8), GemmSpec(1, 1024, 2048)
    # the GEMM moves 4 * (1 * 1024 + 1024 * 2048 + 1 * 2048) bytes = 8.01171875 MiB
    assert big.bytes_moved() / 2**20 == pytest.approx(8.01171875)
    trace = [small, big, small, small, big]
    since = mib_since_kind(trace)
    assert np.isnan(since[[0, 1]]).all()
    # the second GEMM follows two muls of 3 * 8 * 4 = 96 bytes each (two inputs read, one output written)
    assert since[2:].tolist() == pytest.approx([8.01171875, 0.0, 2 * 96 / 2**20])
    charges = cold_start_charges_s(stub(curve=CURVE), "L3", trace)
    # 8.01 MiB lies between 1 MiB (0.1) and 16 MiB (0.5): 0.1 + 0.4 * 7.01171875 / 15 = 0.286979...
    assert charges.tolist() == pytest.approx([2e-5, 2e-5, 2e-5 * 0.28697916666, 0.0, 2e-5 * 0.1 * since[4]])
    assert cold_start_s(stub(curve=CURVE), "L3", trace) == pytest.approx(charges.sum())
    # beyond the largest size: the last fraction; without a curve: first calls only
    far = [small, GemmSpec(64, 2048, 8192), small]
    assert cold_start_charges_s(stub(curve=CURVE), "L2", far)[2] == pytest.approx(2e-5 * 1.2)
    assert cold_start_charges_s(stub(), "L3", trace).tolist() == pytest.approx([2e-5, 2e-5, 0, 0, 0])
    assert cold_start_charges_s(stub(curve={}), "L3", trace).tolist() == pytest.approx([2e-5, 2e-5, 0, 0, 0])


def test_the_curve_starts_at_zero_sorted_and_is_charged_only_where_first_calls_are():
    mib, fraction = recold_curve(stub(curve=CURVE), "L3")
    assert mib.tolist() == [0.0, 1.0, 16.0, 64.0] and fraction.tolist() == [0.0, 0.1, 0.5, 1.2]
    assert recold_curve(stub(curve=CURVE), "L1") is None
    assert recold_curve(stub(cache="warm", curve=CURVE), "L3") is None
    assert recold_curve(stub(overhead_s=0.0, curve=CURVE), "L3") is None  # CUDA: the chain measures 0


def test_a_batch_of_traces_finds_each_kernels_mib_since_as_each_trace_alone_does():
    from sim.predict.simulator import TraceBatch

    rng = np.random.default_rng(0)
    pool = [ElementwiseSpec("mul", 8), ElementwiseSpec("add", 4096), GemmSpec(4, 64, 64), GemmSpec(16, 256, 128),
            GemmSpec(4, 64, 64, "float64")]
    traces = [[pool[i] for i in rng.integers(0, len(pool), size=n)] for n in (0, 1, 7, 12, 30)]
    got = TraceBatch.from_traces(traces).mib_since_kind()
    want = np.concatenate([mib_since_kind(t) for t in traces])
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert got[~np.isnan(got)] == pytest.approx(want[~np.isnan(want)])
    assert (~np.isnan(want)).sum() > 20  # repeats within traces, so the test compares real distances
