"""GEMM's features say whether B is stored [K, N] with rows a multiple of 4 KiB apart (a B
stored [N, K] and passed transposed, as nn.Linear's, showed no such step and is not flagged)."""

from __future__ import annotations

import numpy as np

from costmodel.families.gemm import GemmSpec
from costmodel.model.features import family_features, kernel_table

CPU = {"device_kind": "cpu", "peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 1e-6,
       "ridge_flops_per_byte": 10.0, "parallel_units": 2}


def _strided(*specs):
    return family_features(kernel_table(list(specs)), "gemm", CPU)["b_rows_page_strided"].to_numpy()


def test_row_major_b_with_rows_a_multiple_of_4_kib_apart_is_flagged():
    # float32: 1024 elements are 4 KiB; 3072 are 12 KiB; 1536 are 6 KiB, not a multiple
    np.testing.assert_array_equal(
        _strided(GemmSpec(4, 1536, 1024), GemmSpec(4, 1024, 3072), GemmSpec(4, 1024, 1536),
                 GemmSpec(4, 1024, 2048, layout="tn")),
        [1, 1, 0, 1])


def test_a_transposed_b_is_not_flagged_whatever_its_stride():
    np.testing.assert_array_equal(_strided(GemmSpec(4, 1024, 2048, layout="nt"), GemmSpec(4, 1536, 1024, layout="tt")),
                                  [0, 0])


def test_the_stride_in_bytes_counts_the_element_size():
    # bfloat16: 2048 elements are 4 KiB, 1024 only 2 KiB
    np.testing.assert_array_equal(_strided(GemmSpec(4, 64, 2048, "bfloat16"), GemmSpec(4, 64, 1024, "bfloat16")),
                                  [1, 0])
