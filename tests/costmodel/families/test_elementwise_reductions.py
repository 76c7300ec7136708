"""Reductions along a dimension: descriptor checks, FLOPs and bytes, the aten mapping (which
dims, inner or outer), the runner's result, the suite grid and the reduced-extent feature."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from costmodel.families.aten_map import OpCall
from costmodel.families.elementwise import ElementwiseSpec, build, suite
from costmodel.families.registry import SuiteContext
from costmodel.model.features import family_features, kernel_table

aten = torch.ops.aten
CPU = {"device_kind": "cpu", "peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 1e-6,
       "ridge_flops_per_byte": 10.0, "parallel_units": 2}


def test_flops_and_bytes_count_every_input_element_and_each_output_once():
    s = ElementwiseSpec("reduce_inner", 4096, "float32", 64)  # [64, 64] summed along its rows
    assert s.out_numel == 64 and s.flops() == 4096
    assert s.bytes_moved() == (4096 + 64) * 4
    assert ElementwiseSpec("add", 4096).bytes_moved() == 3 * 4096 * 4  # the other ops as before


def test_an_op_without_the_field_keeps_the_key_rows_had_before_it_existed():
    assert "reduced" not in ElementwiseSpec("add", 512).key()
    assert "reduced=8" in ElementwiseSpec("reduce_outer", 512, "float32", 8).key()


@pytest.mark.parametrize("kwargs, message", [
    ({"op": "reduce_inner", "numel": 64}, "reduced must be an integer >= 1 dividing numel=64 for op reduce_inner, got None"),
    ({"op": "reduce_outer", "numel": 64, "reduced": 5}, "dividing numel=64 for op reduce_outer, got 5"),
    ({"op": "reduce_outer", "numel": 64, "reduced": 0}, "got 0"),
    ({"op": "add", "numel": 64, "reduced": 8}, "reduced is only for the ops ['reduce_inner', 'reduce_outer'], got reduced=8 with op add"),
])
def test_bad_reductions_are_refused_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match="ElementwiseSpec.reduced") as err:
        ElementwiseSpec(**kwargs)
    assert message in str(err.value)


def _mapped(func, *args):
    from costmodel.families.elementwise import _reduction

    return _reduction(OpCall(func, args, {}, func(*args)))


def test_the_mapping_tells_inner_from_outer_and_counts_the_reduced_elements():
    x = torch.randn(50, 4, 16)
    assert _mapped(aten.sum.dim_IntList, x, [-1]) == ElementwiseSpec("reduce_inner", 3200, "float32", 16)
    assert _mapped(aten.amax.default, x, [1, 2]) == ElementwiseSpec("reduce_inner", 3200, "float32", 64)
    assert _mapped(aten.sum.dim_IntList, x, [0]) == ElementwiseSpec("reduce_outer", 3200, "float32", 50)  # bias grad
    assert _mapped(aten.sum.default, x) == ElementwiseSpec("reduce_inner", 3200, "float32", 3200)  # all of it
    # norm's p comes before its dim: the schema's own "dim" argument is read, not argument 1
    assert _mapped(aten.linalg_vector_norm.default, x, 2, [-1]) == ElementwiseSpec("reduce_inner", 3200, "float32", 16)
    assert _mapped(aten.max.dim, x, 1) == ElementwiseSpec("reduce_outer", 3200, "float32", 4)
    # the last dim of a transposed (non-contiguous) tensor is strided through memory
    assert _mapped(aten.mean.dim, x.transpose(0, 2), [-1]).op == "reduce_outer"


@pytest.mark.parametrize("op, dim", [("reduce_inner", -1), ("reduce_outer", 0)])
def test_the_runner_sums_along_the_dimension_it_names(op, dim):
    spec = ElementwiseSpec(op, 96, "float32", 8)
    run, inputs = build(spec, torch.device("cpu"), torch.Generator().manual_seed(0), 0)
    x = inputs[0]
    expected = x.view(12, 8).sum(-1) if dim == -1 else x.view(8, 12).sum(0)
    torch.testing.assert_close(run(*inputs), expected)
    assert run(*inputs).numel() == spec.out_numel


def test_the_suite_keeps_the_reduced_extents_that_divide_numel():
    ctx = SuiteContext(dtype="float32", scatter_backends=(), memory_bytes=1 << 30)
    specs = [s for _, s in suite({"op": ["reduce_inner", "relu"], "numel": [64, 96], "reduced": [8, 32]}, ctx)]
    assert [(s.op, s.numel, s.reduced) for s in specs] == [
        ("reduce_inner", 64, 8), ("reduce_inner", 64, 32), ("reduce_inner", 96, 8), ("reduce_inner", 96, 32),
        ("relu", 64, None), ("relu", 96, None)]
    with pytest.raises(ValueError, match="missing the list 'reduced'"):
        suite({"op": ["reduce_outer"], "numel": [64]}, ctx)


def test_the_reduced_extent_is_a_feature_and_1_for_every_other_op():
    t = kernel_table([ElementwiseSpec("reduce_inner", 4096, "float32", 64), ElementwiseSpec("add", 4096)])
    np.testing.assert_allclose(family_features(t, "elementwise", CPU)["log_reduced"].to_numpy(), [np.log10(64), 0.0])
    old = kernel_table([ElementwiseSpec("add", 4096)]).drop(columns=["reduced"], errors="ignore")
    assert family_features(old, "elementwise", CPU)["log_reduced"].tolist() == [0.0]
