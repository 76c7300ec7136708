"""bench_in_situ.py: ops timed inside a call, matched to their kernels, grouped by kind."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from script_loader import loaded_script

from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gemm import GemmSpec
from costmodel.measure.timing import TimingConfig
from sim.capture.dispatch import CapturedOp

TIMING = TimingConfig(cold_cache=True, cpu_evict_bytes=1 << 20)


@pytest.fixture(scope="module")
def bench():
    yield from loaded_script("bench_in_situ")


def op(index: int, kind: str, spec=None, aten: str = "aten.x", bytes_moved: float = 0.0) -> CapturedOp:
    return CapturedOp(index, aten, kind, "forward", (), (), (), (), bytes_moved, spec)


def test_each_op_gets_its_kind_first_call_and_the_mib_its_layer_streamed_since_the_kind_last_ran(bench):
    mul, gemm = ElementwiseSpec("mul", 8), GemmSpec(1, 1024, 256)
    ops = [op(0, "kernel", mul, bytes_moved=96), op(1, "view", aten="aten.t.default"),
           op(2, "kernel", gemm, bytes_moved=2**20), op(3, "kernel", mul, bytes_moved=96), op(4, "kernel", mul, bytes_moved=96)]
    in_situ = np.array([30e-6, 4e-6, 500e-6, 25e-6, 6e-6])
    table = bench.op_table(ops, in_situ, {mul: 5e-6, gemm: 480e-6})
    assert table.op_kind.tolist() == ["kernel", "view", "kernel", "kernel", "kernel"]
    assert table.kind.tolist() == ["elementwise/mul/float32", "aten.t.default", "gemm/float32",
                                   "elementwise/mul/float32", "elementwise/mul/float32"]
    assert table.first_of_kind.tolist() == [True, None, True, False, False]  # a view has no kernel kind
    # the second mul follows the GEMM, 4 * (1 * 1024 + 1024 * 256 + 1 * 256) bytes = 1.0048828125 MiB
    # (its descriptor's, as the cost model counts); the third follows the second mul directly
    assert table.bytes_since_kind_mib.iloc[3] == pytest.approx(1.0048828125) and table.bytes_since_kind_mib.iloc[4] == 0.0
    kinds = bench.kind_table(table).set_index("kind")
    assert kinds.loc["elementwise/mul/float32", "calls"] == 3
    assert kinds.loc["elementwise/mul/float32", "in_situ_ms"] == pytest.approx(0.061)
    assert kinds.loc["elementwise/mul/float32", "runner_ms"] == pytest.approx(0.015)
    assert kinds.loc["elementwise/mul/float32", "first_extra_us"] == pytest.approx(25.0)
    assert kinds.loc["elementwise/mul/float32", "later_extra_us"] == pytest.approx((20.0 + 1.0) / 2)
    assert np.isnan(kinds.loc["gemm/float32", "later_extra_us"])
    assert "aten.t.default" not in kinds.index  # views are host work, not a kernel kind


def test_every_op_of_a_call_is_timed_and_a_call_that_changes_its_ops_is_refused(bench):
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    ops, seconds = bench.timed_ops(lambda: (a @ b).relu().t(), reps=3, timing=TIMING)
    assert [o.aten_op for o in ops] == ["aten.mm.default", "aten.relu.default", "aten.t.default"]
    assert ops[0].kind == "kernel" and ops[2].kind == "view"
    assert seconds.shape == (3,) and (seconds > 0).all()
    flip = itertools.cycle([True, False])
    with pytest.raises(ValueError, match="call 2 dispatched 1 ops where call 1 dispatched 2"):
        bench.timed_ops(lambda: (a @ b).relu() if next(flip) else a @ b, reps=3, timing=TIMING)


@pytest.mark.parametrize("argv, message", [
    (["--backends", "loop", "--reps", "2"], "--reps must be >= 3"),
    ([], "name at least one case"),
    (["--backends", "loop,fast"], r"--backends takes names from \['grouped', 'loop', 'padded'\], got 'fast'"),
    (["--modules", "gat,nope"], "--modules takes names from .*got 'nope'"),
    (["--hf", "mixtral/fast"], "--hf takes model/impl"),
])
def test_bad_options_are_refused_before_any_timing(bench, argv, message, tmp_path):
    with pytest.raises(SystemExit, match=message):
        bench.main([*argv, "--out", str(tmp_path)])


def test_the_recold_table_bins_small_later_calls_and_sets_the_models_charge_beside(bench):
    ops = pd.DataFrame({
        "op_kind": ["kernel"] * 5 + ["view"], "first_of_kind": [True, False, False, False, False, False],
        "bytes_moved": [96, 96, 96, 96, 8 << 20, 0], "bytes_since_kind_mib": [None, 0.25, 30.0, 30.0, 30.0, None],
        "in_situ_s": [30e-6, 12e-6, 25e-6, 35e-6, 1e-3, 4e-6], "runner_s": [5e-6, 5e-6, 5e-6, 5e-6, 1e-3, None]})
    model = SimpleNamespace(fingerprint=SimpleNamespace(cache="cold"),
                            ceilings={"cold_call_overhead_s": 20e-6, "recold_fraction_by_mib": {"1": 0.2, "64": 1.0}})
    table = bench.recold_table(ops, model).set_index("mib_since")
    assert table.calls.tolist() == [1, 2]  # the first call and the 8 MiB kernel are not small later calls
    assert table.measured_extra_us.tolist() == pytest.approx([7.0, 25.0])
    # 0.25 MiB: 0.2 * 0.25 of 20 us; 30 MiB: (0.2 + 0.8 * 29 / 63) of 20 us
    assert table.model_recold_us.tolist() == pytest.approx([1.0, 20e-6 * (0.2 + 0.8 * 29 / 63) * 1e6])
