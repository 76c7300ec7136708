"""Elementwise's features say whether its data are integers (other vector kernels)."""

from __future__ import annotations

import numpy as np

from costmodel.families.elementwise import ElementwiseSpec
from costmodel.model.features import family_features, kernel_table

CPU = {"device_kind": "cpu", "peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 1e-6,
       "ridge_flops_per_byte": 10.0, "parallel_units": 2}


def test_integer_data_is_told_apart_from_floating_point():
    t = kernel_table([ElementwiseSpec("floordiv", 64, "int64"), ElementwiseSpec("scale", 64, "int32"),
                      ElementwiseSpec("scale", 64, "float32")])
    np.testing.assert_array_equal(family_features(t, "elementwise", CPU)["int_dtype"].to_numpy(), [1, 1, 0])
