"""The cold start a cold layer pays: once per kind (code path and dtype), at its first kernel."""

from types import SimpleNamespace

import numpy as np
import pytest

from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gemm import GemmSpec
from costmodel.families.grouped_gemm import GroupedGemmSpec
from costmodel.model.cold_start import (
    cold_start_charges_s, cold_start_kind, cold_start_per_kind_s, distinct_kinds, first_of_kind, kernel_kind,
)


def stub(cache: str = "cold", overhead_s: float = 2e-5) -> SimpleNamespace:
    return SimpleNamespace(fingerprint=SimpleNamespace(cache=cache), ceilings={"cold_call_overhead_s": overhead_s})


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
