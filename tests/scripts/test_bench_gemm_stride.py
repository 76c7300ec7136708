"""bench_gemm_stride.py: the shapes it times, which are page-strided, neighbour ratios, bad options."""

from __future__ import annotations

import pandas as pd
import pytest
from script_loader import loaded_script


@pytest.fixture(scope="module")
def bench():
    yield from loaded_script("bench_gemm_stride")


def test_the_width_is_bs_row_stride_in_each_layout(bench):
    specs = bench.stride_specs([4], [1536, 2048], 1024, ["nn", "nt"])
    assert [(s.m, s.k, s.n, s.layout) for s in specs] == [
        (4, 1024, 1536, None), (4, 1024, 2048, None), (4, 1536, 1024, "nt"), (4, 2048, 1024, "nt")]
    assert [bench.stride_of(s) for s in specs] == [1536, 2048, 1536, 2048]
    assert [bench.page_strided(s) for s in specs] == [False, True, False, True]


def test_each_strided_width_is_compared_with_its_unstrided_neighbours(bench):
    rows = pd.DataFrame({"m": [4] * 5, "layout": ["nn"] * 5, "stride": [1792, 2048, 2304, 3840, 4096],
                         "page_strided": [False, True, False, False, True],
                         "ns_per_weight": [1.0, 1.3, 1.2, 2.0, 3.0]})
    ratios = bench.neighbour_ratios(rows)
    assert ratios["stride"].tolist() == [2048, 4096]
    assert ratios["ratio"].tolist() == pytest.approx([1.3 / 1.1, 1.5])  # the median of 1.0 and 1.2; the end: one
    summary = bench.per_m(ratios)
    assert summary["widths"].tolist() == [2] and summary["median"].iloc[0] == pytest.approx((1.3 / 1.1 + 1.5) / 2)


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "0"], "--rounds and --other must be >= 1"),
    (["--other", "0"], "--rounds and --other must be >= 1"),
    (["--budget-s", "0"], "--budget-s must be > 0"),
    (["--layouts", "nn,tt"], "--layouts must be among nn, nt"),
    (["--widths", "2048,1024"], "--widths must be distinct and ascending"),
    (["--m", "4,x"], "--m must be comma-separated integers"),
    (["--m", "0"], "--m must be integers >= 1"),
    (["--profile-root", "/nonexistent/x"], "is not a folder of device profiles"),
])
def test_bad_options_are_refused_before_any_timing(bench, argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.parse(argv)
    assert message in capsys.readouterr().err
