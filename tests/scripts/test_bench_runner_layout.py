"""bench_runner_layout.py: which runners could alias, the old layout rebuilt, per-kind ratios, bad options."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from script_loader import loaded_script

from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gemm import GemmSpec
from costmodel.families.grouped_gemm import GroupedGemmSpec
from costmodel.measure import runners


@pytest.fixture(scope="module")
def bench():
    yield from loaded_script("bench_runner_layout")


def _inputs(spec):
    return runners._build(spec, torch.device("cpu"), 0)[1]


def test_only_runners_with_two_operands_of_one_dtype_could_alias(bench):
    add, relu = ElementwiseSpec("add", 512), ElementwiseSpec("relu", 512)
    assert bench.can_alias(add, _inputs(add)) and bench.can_alias(GemmSpec(4, 8, 8), _inputs(GemmSpec(4, 8, 8)))
    assert not bench.can_alias(relu, _inputs(relu))  # one dense operand (the scale's [1] tensor is not rotated)
    assert not bench.can_alias(ElementwiseSpec("add", 512, "int64"), _inputs(ElementwiseSpec("add", 512, "int64")))
    prefix = GroupedGemmSpec((3, 0, 5, 0), 8, 16, "grouped_mm")  # a prefix read: always spaced apart
    assert not bench.can_alias(prefix, _inputs(prefix))


def test_the_old_layout_put_both_operands_of_a_copy_on_the_same_bytes(bench):
    spec = ElementwiseSpec("add", 4096)
    inputs = _inputs(spec)
    old = bench.aliased_pool(inputs, torch.device("cpu"))
    now = runners._rotations(inputs, torch.device("cpu"))
    assert all(a.data_ptr() == b.data_ptr() for a, b in old)
    assert all(a.data_ptr() != b.data_ptr() for a, b in now)
    assert len(old) == runners.MAX_ROTATIONS and torch.equal(old[0][0], old[0][1])


def test_kinds_summarise_the_ratio_and_how_stale_the_profile_is(bench):
    rows = pd.DataFrame({"kind": ["elementwise/add"] * 3 + ["gemm"],
                         "now_over_aliased": [1.5, 1.6, 1.0, 1.0], "profiled_over_now": [0.6, 0.7, 1.0, 1.1]})
    kinds = bench.per_kind(rows).set_index("kind")
    assert kinds.loc["elementwise/add", "kernels"] == 3 and kinds.loc["elementwise/add", "now_over_aliased"] == 1.5
    assert kinds.loc["gemm", "profiled_over_now"] == 1.1


def test_sampling_spreads_over_each_kinds_latency_and_skips_kinds_that_cannot_alias(bench):
    specs = [ElementwiseSpec("add", n) for n in (64, 128, 256, 512, 1024)] + [ElementwiseSpec("relu", 64)]
    table = pd.DataFrame({"median_s": [1e-6, 1e-5, 2e-5, 3e-5, 0.1, 1e-5]})
    picked = bench.sample_kernels(table, specs, per_kind=2, min_s=5e-6, max_s=0.05)
    assert [(k, s.numel) for k, s, _ in picked] == [("elementwise/add", 128), ("elementwise/add", 512)]


@pytest.mark.parametrize("argv, message", [
    (["--per-kind", "0"], "--per-kind and --rounds must be >= 1"),
    (["--rounds", "0"], "--per-kind and --rounds must be >= 1"),
    (["--budget-s", "0"], "--budget-s must be > 0"),
    (["--threshold", "1"], "--threshold must be > 1"),
    (["--profile-root", "/nonexistent/x"], "is not a folder of device profiles"),
])
def test_bad_options_are_refused_before_any_timing(bench, argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.parse(argv)
    assert message in capsys.readouterr().err


def test_remeasure_replaces_every_old_row_of_the_chosen_kinds_only(bench, tmp_path):
    from rich.console import Console

    from costmodel.measure.bench import SizeLimits
    from costmodel.measure.device import fingerprint
    from costmodel.measure.timing import TimingConfig
    from costmodel.store.profile import DeviceProfile

    profile = DeviceProfile.open(tmp_path, fingerprint(torch.device("cpu"), "float32"))
    specs = [ElementwiseSpec("add", 256), ElementwiseSpec("mul", 512), ElementwiseSpec("relu", 256)]
    profile.append_measurements([{"key": s.key(), "round": r, **s.to_record(), "median_s": 1e-6, "iqr_s": 1e-8,
                                  "noisy": False, "flops": s.flops(), "bytes_moved": s.bytes_moved(), "suite": "x",
                                  "tag": "grid", "measured_at": "2026-01-01T00:00:00"} for s in specs for r in range(4)])
    done = bench.remeasure(profile, {"elementwise/add", "elementwise/mul"}, torch.device("cpu"),
                           TimingConfig(min_run_time_s=0.01, rounds=2), SizeLimits(max_flops=1e12, max_bytes=1e12),
                           Console(quiet=True))
    rows = profile.measurements().groupby("key").size()
    # add and mul: their two new rounds replace rounds 0-1, and rounds 2-3 of the aliased layout go
    assert done["kernels"] == 2 and done["rows_dropped"] == 4
    assert rows[specs[0].key()] == rows[specs[1].key()] == 2 and rows[specs[2].key()] == 4  # relu untouched
    assert profile.provenance()[-1]["runner_layout"]["kinds"] == ["elementwise/add", "elementwise/mul"]
