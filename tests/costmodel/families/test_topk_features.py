"""Top-k's features follow ATen's CPU selection switch (partial sort when k*64 <= cols)."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.families.topk import TopkSpec, uses_partial_sort
from costmodel.model.features import family_features, kernel_table

CPU = {"device_kind": "cpu", "peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 1e-6,
       "ridge_flops_per_byte": 10.0, "parallel_units": 2}


@pytest.mark.parametrize(("cols", "k", "partial"), [
    (64, 1, 1.0),   # 1*64 <= 64: the k-heap
    (60, 1, 0.0),   # 64 > 60: nth_element (the router of a 60-expert layer)
    (128, 2, 1.0),  # 128 <= 128
    (128, 3, 0.0),  # 192 > 128
    (256, 8, 0.0),  # DeepSeek-V3's router: 256 experts, k=8
])
def test_the_partial_sort_switch_is_atens_k_times_64_rule(cols, k, partial):
    t = kernel_table([TopkSpec(4, cols, k)])
    assert uses_partial_sort(t, "cpu")[0] == partial
    assert uses_partial_sort(t, "cuda")[0] == 0.0  # CUDA's radix select has no such switch


def test_the_switch_reaches_the_model_features_on_the_cpu_only():
    t = kernel_table([TopkSpec(2, 64, 1), TopkSpec(2, 60, 1), TopkSpec(3, 256, 8)])
    np.testing.assert_array_equal(family_features(t, "topk", CPU)["partial_sort"].to_numpy(), [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(
        family_features(t, "topk", {**CPU, "device_kind": "cuda"})["partial_sort"].to_numpy(), [0.0, 0.0, 0.0])
