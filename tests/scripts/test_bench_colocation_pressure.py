"""scripts/bench_colocation_pressure.py's alternative co-location reading (nothing timed): a
kernel's twin factor read at its own memory traffic instead of its bytes."""

from __future__ import annotations

import re

import pytest
from script_loader import loaded_script

from costmodel.colocation import ColocationFactors


@pytest.fixture(scope="module")
def bench():
    yield from loaded_script("bench_colocation_pressure")


def _by_traffic():
    """gemm kernels measured at own pressures 0 (two in the private cache), 0.5 and 1.0, the stream
    neighbour at 10 GB/s, a private cache of 1 MiB."""
    kernels = [{"bytes_moved": 1024.0, "alone_median_s": 1e-6, "ratio": 1.02},  # in the cache: p 0
               {"bytes_moved": 4096.0, "alone_median_s": 2e-6, "ratio": 1.00},  # in the cache: p 0
               {"bytes_moved": 50e6, "alone_median_s": 1e-2, "ratio": 1.30},  # 5 GB/s: p 0.5
               {"bytes_moved": 100e6, "alone_median_s": 1e-2, "ratio": 1.50}]  # 10 GB/s: p 1
    return ColocationFactors(factors={"gemm": 1.16}, placement={"id": "cores0-1-w2"}, measured_at="", source="t",
                             kernels={"gemm": kernels}, stream_bytes_per_s=10e9, private_cache_bytes=2.0**20)


def test_the_twin_factor_follows_the_kernels_own_pressure(bench):
    """With its seconds alone, a kernel's twin factor is read at its own pressure (bytes beyond the
    private cache per second over the stream's rate): the in-cache kernels pooled at p 0 by their
    median (1.01), linear between measured pressures, held at the ends; bytes alone say otherwise."""
    f, read = _by_traffic(), bench.factor_by_own_pressure
    # 8 MB in 4 ms = 2 GB/s: p 0.2, 1.01 + (1.30 - 1.01) x 0.2 / 0.5
    assert read(f, "gemm", 8e6, 4e-3) == pytest.approx(1.01 + 0.29 * 0.4)
    assert read(f, "gemm", 8e6, 1e-3) == pytest.approx(1.30 + 0.20 * 0.6)  # 8 GB/s: p 0.8
    assert read(f, "gemm", 8e6, 1e-4) == pytest.approx(1.50)  # faster than the stream: p held at 1
    assert read(f, "gemm", 512e3, 1e-6) == pytest.approx(1.01)  # inside the private cache: p 0
    # the same 8 MB by bytes alone: between 4 kB (1.00) and 50 MB (1.30) in log2 bytes
    assert f.factor("gemm", 8e6) != pytest.approx(read(f, "gemm", 8e6, 4e-3))
    with pytest.raises(ValueError, match=re.escape("alone_s must be seconds >= 0, got -1.0")):
        read(f, "gemm", 8e6, -1.0)
    # without the stream measured there is no pressure: the bytes curve
    plain = ColocationFactors(factors=f.factors, placement=f.placement, measured_at="", source="t", kernels=f.kernels)
    assert read(plain, "gemm", 8e6, 4e-3) == pytest.approx(plain.factor("gemm", 8e6))
