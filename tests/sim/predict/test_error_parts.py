"""The held-out error's kernel part by kernel kind, on a hand-computed case."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gemm import GemmSpec
from costmodel.families.sort import SortSpec
from costmodel.families.topk import TopkSpec
from sim.predict.error_parts import describe, heldout_error_parts, kernel_kind, timed_kernels

GEMM, SORT, ADD, TOPK = GemmSpec(8, 32, 32), SortSpec(2048), ElementwiseSpec("add", 4096), TopkSpec(4, 4, 1)
#: what the stub held-out model predicts per kernel (before the cold-call overhead predict_trace adds)
PREDICTED_S = {GEMM: 2e-6, SORT: 10e-6, ADD: 1e-6, TOPK: 0.2e-6}
COLD_CALL_S = 5e-6


class StubModel(SimpleNamespace):
    def predict(self, trace, levels):
        return pd.DataFrame({lv: [PREDICTED_S[s] for s in trace] for lv in levels})


MODEL = StubModel(fingerprint=SimpleNamespace(cache="cold"), ceilings={"cold_call_overhead_s": COLD_CALL_S})


def test_kinds_name_the_family_and_the_field_that_picks_the_op():
    assert kernel_kind(ElementwiseSpec("add", 8)) == "elementwise/add"
    assert kernel_kind(GEMM) == "gemm" and kernel_kind(SORT) == "sort"


def test_parts_weight_each_kernel_by_its_calls_and_leave_out_the_cold_call_overhead():
    traces = [[GEMM, SORT, GEMM, TOPK], [GEMM, ADD]]  # ADD is not timed
    timed = {GEMM: 1e-6, SORT: 20e-6, TOPK: 0.1e-6}
    parts = heldout_error_parts(traces, MODEL, timed, layers_measured_s=100e-6)
    gemm, sort, other = parts["kinds"]["gemm"], parts["kinds"]["sort"], parts["kinds"]["other"]
    # gemm: 3 calls, held out 3 x 2 us against 3 x 1 us timed beside the layers
    assert gemm["calls"] == 3 and gemm["heldout_s"] == pytest.approx(6e-6) and gemm["replay_s"] == pytest.approx(3e-6)
    assert gemm["heldout_over_replay"] == 2.0 and gemm["share_of_layers_pct"] == 3.0
    assert sort["heldout_over_replay"] == 0.5 and sort["share_of_layers_pct"] == 20.0
    # topk holds 0.1 of 23.1 us replayed (< 1%): pooled as "other"
    assert "topk" not in parts["kinds"] and other["calls"] == 1 and other["heldout_over_replay"] == 2.0
    whole = parts["all"]
    assert whole["calls"] == 5 and whole["heldout_s"] == pytest.approx(16.2e-6)
    assert whole["heldout_over_replay"] == pytest.approx(16.2 / 23.1, abs=1e-3)
    assert parts["untimed_calls"] == 1
    assert list(parts["kinds"]) == ["sort", "gemm", "other"]  # by replayed seconds
    assert "0.70x over all kinds" in describe(parts) and "sort 0.50x (20% of the layers)" in describe(parts)
    assert gemm["heldout_over_profiled"] is None and gemm["profiled_calls"] == 0  # no profiled seconds given


def test_the_profiled_seconds_split_regression_from_drift():
    traces = [[GEMM, SORT, GEMM, TOPK], [GEMM, ADD]]
    timed = {GEMM: 1e-6, SORT: 20e-6, TOPK: 0.1e-6}
    parts = heldout_error_parts(traces, MODEL, timed, 100e-6, profiled_s={GEMM.key(): 0.5e-6})  # sort never profiled
    gemm, sort = parts["kinds"]["gemm"], parts["kinds"]["sort"]
    # held out 2 us where the profile says 0.5 us (regression 4x); timed now 1 us (drift 2x)
    assert gemm["profiled_calls"] == 3 and gemm["heldout_over_profiled"] == 4.0 and gemm["replay_over_profiled"] == 2.0
    assert sort["profiled_calls"] == 0 and sort["heldout_over_profiled"] is None
    assert parts["all"]["profiled_calls"] == 3 and parts["all"]["heldout_over_profiled"] == 4.0
    line = describe(parts)
    assert "gemm 2.00x (regression 4.00x, drift 2.00x; 3% of the layers)" in line and "[" not in line
    assert "sort 0.50x (20% of the layers)" in line


def test_nothing_timed_and_bad_input():
    assert heldout_error_parts([[ADD]], MODEL, {}, 1.0) == {"kinds": {}, "all": None, "untimed_calls": 1}
    assert "no kernel" in describe({"kinds": {}, "all": None})
    with pytest.raises(ValueError, match="layers_measured_s must be > 0"):
        heldout_error_parts([[GEMM]], MODEL, {GEMM: 1e-6}, 0.0)
    jobs = [SimpleNamespace(spec=GEMM), SimpleNamespace(spec=SORT)]
    assert timed_kernels(jobs, [{"measured_s": 1e-6}, {"measured_s": 2e-6}]) == {GEMM: 1e-6, SORT: 2e-6}
    with pytest.raises(ValueError, match="2 kernel jobs but 1 timings"):
        timed_kernels(jobs, [{"measured_s": 1e-6}])
