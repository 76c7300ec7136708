"""Held-out drift: reference kernels that are never the experiment's own (nor a near twin of
one), a per-family factor from them, and a side score of held-out L3 scaled by it (cold starts
not); the headline stays unscaled."""

from __future__ import annotations

from costmodel.model.cold_start import cold_start_charges_s

from tiny_budget import TINY_TIMING
import numpy as np
import pandas as pd
import pytest

from costmodel.families.gemm import GemmSpec
from costmodel.families.sort import SortSpec
from costmodel.model.features import kernel_table
from experiments.workloads import evaluate_workloads
from sim.predict import heldout_drift
from sim.predict.calibration import calibrated_model
from sim.predict.heldout import fit_heldout
from sim.predict.heldout_drift import MIN_DISTANCE_LOG2, FamilyDrift, HeldOutReference, choose_references, family_drift
from sim.workloads.workload import Workload


def _table(specs, seconds):
    rows = []
    for s, t in zip(specs, seconds):
        rows.append({**s.to_record(), "key": s.key(), "family": s.family, "flops": s.flops(),
                     "bytes_moved": s.bytes_moved(), "median_s": t})
    return pd.DataFrame(rows)


def test_references_are_near_the_heaviest_kernel_but_never_a_twin_of_a_scored_one():
    trace = [GemmSpec(64, 256, 256), GemmSpec(8, 256, 256), SortSpec(4096)]
    candidates = [GemmSpec(m, 256, 256) for m in (2, 4, 16, 32, 48, 56, 72, 96, 128, 256, 1024)]
    table = _table(candidates + [SortSpec(1 << 16)], [1e-3] * len(candidates) + [1e-3])
    predicted = {s.key(): t for s, t in zip(trace, (9e-3, 1e-3, 1e-5))}  # sort: 0.1% of the time
    chosen = choose_references(table, [trace], predicted, per_family=3)
    assert set(chosen["family"]) == {"gemm"}  # sort carries < MIN_FAMILY_SHARE: no references of its own
    ms = sorted(int(m) for m in chosen["m"])
    # nearest to m=64 that differ from m=64 and m=8 by >= sqrt(2) in FLOPs (or bytes): 48 (0.75x),
    # 56 and 72 are twins; 96 (1.5x) is not
    assert ms == [32, 96, 128]
    for m in ms:
        for s in trace[:2]:
            gap = max(abs(np.log2(GemmSpec(m, 256, 256).flops() / s.flops())),
                      abs(np.log2(GemmSpec(m, 256, 256).bytes_moved() / s.bytes_moved())))
            assert gap >= MIN_DISTANCE_LOG2


def test_references_only_from_a_heldout_table_and_in_the_timing_range():
    trace = [GemmSpec(64, 256, 256)]
    with pytest.raises(ValueError, match="held-out table"):
        choose_references(_table(trace, [1e-3]), [trace], {trace[0].key(): 1e-3})
    too_fast = _table([GemmSpec(4, 256, 256)], [1e-6])  # below REFERENCE_TIME_RANGE_S
    assert choose_references(too_fast, [trace], {trace[0].key(): 1e-3}).empty


def test_family_drift_is_the_median_ratio_per_family_and_overall_for_the_rest():
    refs = [HeldOutReference(f"k{i}", fam, GemmSpec(1, 1, 1), pred)
            for i, (fam, pred) in enumerate([("gemm", 1.0), ("gemm", 2.0), ("gemm", 1.0), ("scatter", 4.0)])]
    drift = family_drift(refs, [2.0, 3.0, 1.0, 2.0])  # ratios gemm 2, 1.5, 1; scatter 0.5
    assert drift.by_family == {"gemm": 1.5, "scatter": 0.5}
    assert drift.overall == pytest.approx(1.25) and drift.references == 4
    assert drift.factor("sort") == pytest.approx(1.25) and drift.factor("gemm") == 1.5
    assert FamilyDrift().factor("gemm") == 1.0
    with pytest.raises(ValueError, match="4 references but 3 timings"):
        family_drift(refs, [1.0, 1.0, 1.0])


def test_family_drift_reads_the_references_against_the_model_and_keeps_the_row_ratio_beside():
    # profiled rows 1, 2, 4; the held-out model expects 2, 2, 2 there: measured 2, 3, 4
    refs = [HeldOutReference(f"k{i}", "gemm", GemmSpec(1, 1, 1), row, None, 2.0) for i, row in enumerate((1.0, 2.0, 4.0))]
    drift = family_drift(refs, [2.0, 3.0, 4.0])
    assert drift.by_family == {"gemm": 1.5}  # 1, 1.5, 2 against the model
    assert drift.vs_profiled_row == {"gemm": 1.5} and drift.to_dict()["vs_profiled_row"] == {"gemm": 1.5}
    drift = family_drift(refs, [2.0, 2.0, 2.0])
    assert drift.by_family == {"gemm": 1.0} and drift.vs_profiled_row == {"gemm": 1.0}  # rows: 2, 1, 0.5
    drift = family_drift(refs, [1.0, 2.0, 8.0])
    assert drift.by_family == {"gemm": 1.0} and drift.vs_profiled_row == {"gemm": 1.0}
    drift = family_drift(refs[:1], [3.0])
    assert drift.by_family == {"gemm": 1.5} and drift.vs_profiled_row == {"gemm": 3.0}
    assert drift.to_dict()["per_reference"] == [  # every reference's three seconds, for later rules
        {"key": "k0", "family": "gemm", "measured_now_s": 3.0, "model_s": 2.0, "profiled_s": 1.0}]


TIMING = TINY_TIMING


def test_heldout_predictions_are_scaled_by_the_references_drift(tiny_runtime, monkeypatch):
    rt = tiny_runtime(rounds=1)
    suite = [("grid", GemmSpec(m, 32, 32)) for m in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)]
    model = calibrated_model(rt, suite, suite_name="t", progress=False, refresh="never")
    trace = [GemmSpec(8, 32, 32), GemmSpec(8, 32, 32)]
    held = fit_heldout(rt.open_profile(), model, [trace])
    monkeypatch.setattr(heldout_drift, "REFERENCE_TIME_RANGE_S", (0.0, 1.0))
    timed = []

    def make_run(spec):
        return lambda: timed.append(spec.key())

    held.references = heldout_drift.build_references(held, [trace], rt.device, cold=False, make_run=make_run)
    assert 1 <= len(held.references) <= heldout_drift.REFERENCES_PER_FAMILY
    assert GemmSpec(8, 32, 32).key() not in {r.key for r in held.references}
    for r in held.references:  # the regression's surface at the reference, not its profiled row looked up
        surface = held.model.predict_table(kernel_table([r.spec]), ["L3"])["L3"].iloc[0]
        assert r.model_s == pytest.approx(surface) and r.model_s != r.profiled_s
    df = evaluate_workloads(model, [Workload("w", trace, lambda: None)], device=rt.device, timing=TIMING,
                            description="t", progress=False, heldout=held)
    assert set(timed) == {r.key for r in held.references}  # timed in the rounds, never the trace's kernel
    factor = held.drift.factor("gemm")
    extra = float(cold_start_charges_s(model, "L3", trace).sum())
    raw = df["pred_L3_s"].iloc[0]  # the headline: held out, not scaled
    assert df["pred_heldout_drift_L3_s"].iloc[0] == pytest.approx((raw - extra) * factor + extra)
    assert df.attrs["heldout"]["drift"]["references"] == len(held.references)
    assert set(df.attrs["heldout_drift_scaled"]) >= {"median_ape_pct", "p90_ape_pct"}
    assert df.attrs["scoring"] == "held-out"
    # an EP rank's phases are scaled the same way (sim.distributed.ep_predict, experiment=moe_ep's side score)
    from sim.distributed.ep_predict import cost_model_kernel_times

    ep = cost_model_kernel_times(held.model, l3_factor=held.drift.factor)([trace, []])
    assert ep["L3"][0] == pytest.approx(df["pred_heldout_drift_L3_s"].iloc[0]) and ep["L3"][1] == 0.0
    assert ep["L2"][0] == pytest.approx(cost_model_kernel_times(held.model)([trace])["L2"][0])  # L3 only


def test_drift_scales_each_kernels_l3_by_its_family_but_not_its_cold_start(monkeypatch):
    import costmodel.model.cold_start as cold_start

    trace = [GemmSpec(8, 32, 32), SortSpec(64), GemmSpec(8, 32, 32)]
    monkeypatch.setattr(cold_start, "cold_start_charges_s", lambda model, level, t: np.array([1.0, 2.0, 0.0]))
    pred = pd.DataFrame({"family": ["gemm", "sort", "gemm"], "L3": [5.0, 3.0, 4.0]})
    scaled = heldout_drift.drift_scaled_l3(None, trace, pred, {"gemm": 2.0, "sort": 0.5}.get)
    assert scaled.tolist() == [1.0 + 4.0 * 2.0, 2.0 + 1.0 * 0.5, 4.0 * 2.0]
    assert heldout_drift.drift_scaled_l3(None, [], pred.iloc[0:0], {"gemm": 2.0}.get).size == 0
