"""The kernel-family registry: every family is whole (descriptor, suite, runner, features,
aten ops in one module), and a new family defined in one place works everywhere."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import pytest
import torch

from costmodel.families import aten_map, descriptor, family_of, register_family, registered, registry
from costmodel.families.columns import column, log10
from costmodel.families.descriptor import KernelSpec, families, from_record
from costmodel.families.registry import grid
from costmodel.measure.runners import make_runner
from costmodel.measure.suite import expand_suite
from costmodel.model.features import COMMON_RANGE_FEATURES, family_features, kernel_table, range_features
from costmodel.model.models import FittedCostModel
from sim.capture.aten_registry import registry_table
from sim.capture.dispatch import capture_trace

CEILINGS = {"peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 1e-6,
            "ridge_flops_per_byte": 10.0}


def test_every_family_is_registered_whole_from_its_own_module():
    assert {f.name for f in registered()} == set(families()) and len(registered()) == 10
    for fam in registered():
        assert fam.module == f"costmodel.families.{fam.name}" == fam.spec.__module__
        assert callable(fam.suite) and callable(fam.build) and callable(fam.features)
        assert fam.range_features and range_features(fam.name) == COMMON_RANGE_FEATURES + fam.range_features
    # every aten entry names a registered family, and each family's module registers at least one op
    table = registry_table()
    assert set(table["family"]) == set(families())


def test_unknown_family_and_double_registration_are_refused():
    with pytest.raises(ValueError, match=r"unknown kernel family 'gemmm'; known families: \['elementwise'"):
        family_of("gemmm")
    with pytest.raises(ValueError, match="kernel family 'gemm' is registered twice"):
        register_family(family_of("gemm").spec, suite=lambda c, x: [], build=lambda *a: None,
                        features=lambda t, c: {})


@pytest.fixture
def restore_registries():
    """A family registered by a test is gone after it: the three registries as they were."""
    saved = dict(descriptor._REGISTRY), dict(registry._FAMILIES), dict(aten_map._ENTRIES)
    yield
    for live, before in zip((descriptor._REGISTRY, registry._FAMILIES, aten_map._ENTRIES), saved):
        live.clear()
        live.update(before)


def test_a_new_family_in_one_place_is_measured_predicted_and_captured(restore_registries):
    # -- the whole definition of a family: descriptor, suite grid, runner, features, aten op
    @dataclasses.dataclass(frozen=True)
    class TraceSpec(KernelSpec):
        """Sum of the diagonal of an [n, n] matrix (``torch.trace``)."""

        family: ClassVar[str] = "toy_trace"
        n: int
        dtype: str = "float32"

        def flops(self) -> float:
            return float(self.n - 1)  # n - 1 adds

        def bytes_moved(self) -> float:
            return float(self.n * self.elem_bytes + self.elem_bytes)  # the diagonal read, one scalar written

    def suite(cfg, ctx):
        return [("grid", TraceSpec(n, ctx.dtype)) for (n,) in grid(cfg, "n")]

    def build(spec, device, gen, seed):
        return torch.trace, (torch.randn(spec.n, spec.n, generator=gen).to(device),)

    def features(t, ceilings):
        return {"log_n": log10(column(t, "n"))}

    @aten_map.register([torch.ops.aten.trace], family="toy_trace", note="a test family")
    def _trace(call):
        return TraceSpec(int(call.args[0].shape[0]), aten_map.dtype_name(call.args[0]))

    register_family(TraceSpec, suite=suite, build=build, features=features, range_features=("log_n",))

    # -- and everything else picks it up
    specs = expand_suite({"name": "t", "families": ["toy_trace"], "toy_trace": {"n": [4, 64]}}, dtype="float32",
                         selected=None, scatter_backends=(), memory_bytes=1 << 30)
    assert [s for _, s in specs] == [TraceSpec(4), TraceSpec(64)]
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(make_runner(TraceSpec(4), seed=0)(), torch.trace(x))
    assert from_record(TraceSpec(64).to_record()) == TraceSpec(64)
    table = kernel_table([TraceSpec(4), TraceSpec(64)])
    feats = family_features(table, "toy_trace", CEILINGS)
    assert np.allclose(feats["log_n"], [np.log10(4), np.log10(64)]) and "log_roofline_s" in feats
    # the range a prediction is trusted in is the family's own declaration (plus FLOPs and bytes)
    model = FittedCostModel(ceilings=CEILINGS).fit(table, [1e-6, 2e-6])
    assert set(model.feature_ranges_["toy_trace"]) == {"log_flops", "log_bytes", "log_n"}
    far = family_features(kernel_table([TraceSpec(4096)]), "toy_trace", CEILINGS)
    assert model._outside("toy_trace", far)["log_n"].all()  # n = 4096 lies beyond the fitted 4..64
    captured = capture_trace(torch.trace, torch.randn(16, 16))
    assert captured.kernels() == [TraceSpec(16)]
    assert "toy_trace" in set(registry_table()["family"])


def test_a_range_feature_the_family_does_not_compute_is_refused(restore_registries):
    @dataclasses.dataclass(frozen=True)
    class NormSpec(KernelSpec):
        family: ClassVar[str] = "toy_norm"
        n: int
        dtype: str = "float32"

        def flops(self) -> float:
            return 2.0 * self.n

        def bytes_moved(self) -> float:
            return float(self.n * self.elem_bytes)

    register_family(NormSpec, suite=lambda c, x: [], build=lambda *a: None,
                    features=lambda t, c: {"log_n": log10(column(t, "n"))}, range_features=("log_numel",))
    with pytest.raises(ValueError, match=r"'toy_norm' declares range features \['log_numel'\]"):
        family_features(kernel_table([NormSpec(8)]), "toy_norm", CEILINGS)
