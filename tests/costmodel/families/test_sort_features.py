"""Sort's features follow ATen's CPU path switch (FBGEMM radix sort for >= 32,768 integer keys)."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.families.sort import SortSpec, uses_radix_sort
from costmodel.model.features import family_features, kernel_table

CPU = {"device_kind": "cpu", "peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 1e-6,
       "ridge_flops_per_byte": 10.0, "parallel_units": 2}


@pytest.mark.parametrize(("n", "dtype", "radix"), [
    (32767, "int64", 0.0),    # one key below GRAIN_SIZE: std::stable_sort
    (32768, "int64", 1.0),    # GRAIN_SIZE keys: radix
    (1048576, "int32", 1.0),  # any integer width
    (1048576, "float32", 0.0),  # floating-point keys never take the radix path
    (16, "int64", 0.0),       # a small MoE dispatch
])
def test_the_radix_switch_is_atens_integer_keys_at_grain_size_rule(n, dtype, radix):
    t = kernel_table([SortSpec(n, dtype)])
    assert uses_radix_sort(t, "cpu")[0] == radix
    assert uses_radix_sort(t, "cuda")[0] == 0.0  # CUDA sorts by radix at every size: no switch


def test_the_switch_reaches_the_model_features_on_the_cpu_only():
    t = kernel_table([SortSpec(49152), SortSpec(24576), SortSpec(65536, "float32")])
    np.testing.assert_array_equal(family_features(t, "sort", CPU)["radix_sort"].to_numpy(), [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(
        family_features(t, "sort", {**CPU, "device_kind": "cuda"})["radix_sort"].to_numpy(), [0.0, 0.0, 0.0])
