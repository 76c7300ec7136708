"""Fixtures of the costmodel tests: a profile filled with synthetic GEMM rows."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from costmodel.families.gemm import GemmSpec
CEIL = {"peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 1e-6, "ridge_flops_per_byte": 10.0}


@pytest.fixture
def fill_gemms() -> Callable:
    """``fill(profile, n)``: up to ``n`` GEMMs (M on a log grid 1..1024, K = N = 64) at 50 GFLOP/s
    plus 10 us each, one round, and ``CEIL`` as the ceilings."""

    def fill(profile, n: int) -> None:
        rows = []
        for m in np.unique(np.geomspace(1, 1024, n).round().astype(int)):
            spec = GemmSpec(int(m), 64, 64)
            rows.append({"key": spec.key(), "round": 0, **spec.to_record(), "flops": spec.flops(),
                         "bytes_moved": spec.bytes_moved(), "median_s": 1e-5 + spec.flops() / 5e10, "iqr_s": 1e-7,
                         "noisy": False})
        profile.append_measurements(rows)
        profile.write_ceilings(CEIL)

    return fill
