"""moe_design's pieces: batched trace prediction, decisions per point and region, sample
choice, decision scoring, and the profile-coverage report (on the committed CPU profile,
read only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from costmodel.families.gemm import GemmSpec
from costmodel.model.predictor import CostModel
from costmodel.store.profile import DeviceProfile
from experiments import moe_design
from sim.workloads.moe_layer import DispatchPlan, MoEConfig, moe_trace
from sim.workloads.routing import ZipfRouting, route
from sim.predict.simulator import predict_trace, predict_traces

PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "cpu-intel-r-xeon-r-processor-t2-float32-2862a8a0be"


@pytest.fixture(scope="module")
def model():
    profile = DeviceProfile.load(PROFILE)
    return CostModel.load(profile, allow_stale=True)


def _traces():
    out = []
    for t, s, b in ((32, 0.0, "loop"), (32, 3.0, "padded"), (64, 1.0, "grouped"), (64, 1.0, "loop")):
        cfg = MoEConfig(tokens=t, d_model=256, d_ff=512, num_experts=8, top_k=2, backend=b)
        out.append(moe_trace(cfg, DispatchPlan.from_routing(route(ZipfRouting(s), tokens=t, num_experts=8, top_k=2, seed=1))))
    return out


def test_batched_prediction_equals_one_trace_at_a_time(model):
    traces = _traces()
    batched = predict_traces(model, traces)
    for i, trace in enumerate(traces):
        single = predict_trace(model, trace, quiet=True)
        for lv in ("L0", "L1", "L2", "L3"):
            assert batched.loc[i, f"pred_{lv}_s"] == pytest.approx(single[lv].sum(), rel=1e-9)
        assert batched.loc[i, "kernels"] == len(trace)
        assert batched.loc[i, "flops"] == pytest.approx(sum(s.flops() for s in trace))


def _wide(pred_l3, pred_l0, backends=("loop", "padded", "grouped")):
    rows = []
    for p, (l3, l0) in enumerate(zip(pred_l3, pred_l0)):
        for b, a, z in zip(backends, l3, l0):
            rows.append({"point": p, "backend": b, "pred_L3_s": a, "pred_L0_s": z})
    return pd.DataFrame(rows)


def test_point_decisions_margin_and_l0_ties():
    df = _wide([[2.0, 3.0, 1.0], [1.0, 4.0, 1.5]], [[1.0, 1.1, 1.0], [1.0, 0.5, 1.0]])
    d = moe_design.point_decisions(df, ["loop", "padded", "grouped"]).set_index("point")
    assert d.loc[0, "fastest_L3"] == "grouped" and d.loc[0, "next_L3"] == "loop"
    assert d.loc[0, "margin_L3_pct"] == pytest.approx(100.0)
    assert d.loc[0, "fastest_L0"] == "loop" and d.loc[0, "l0_tie"]  # loop and grouped tie at L0: first listed
    assert d.loc[0, "l0_differs"]
    assert d.loc[1, "fastest_L3"] == "loop" and d.loc[1, "fastest_L0"] == "padded" and not d.loc[1, "l0_tie"]


def test_region_table_takes_the_most_frequent_winner():
    points = pd.DataFrame({"tokens": [8, 8, 8, 16], "num_experts": [4, 4, 4, 4],
                           "fastest_L3": ["grouped", "grouped", "loop", "loop"], "margin_L3_pct": [10.0, 30.0, 5.0, 7.0],
                           "l0_differs": [True, True, False, False], "l0_tie": [True, True, True, False]})
    t = moe_design.region_table(points, "tokens", "num_experts").set_index("tokens")
    assert t.loc[8, "fastest_L3"] == "grouped" and t.loc[8, "fastest_share_pct"] == pytest.approx(200 / 3)
    assert t.loc[8, "median_margin_pct"] == pytest.approx(20.0)  # over the points it wins
    assert t.loc[8, "l0_differs_pct"] == pytest.approx(200 / 3) and t.loc[16, "l0_tie_pct"] == 0


def test_sample_takes_boundary_points_then_spreads_over_regions():
    points = pd.DataFrame({"point": range(12), "region": [f"r{i % 4}" for i in range(12)],
                           "margin_L3_pct": [50, 1, 60, 70, 2, 80, 90, 95, 3, 40, 41, 42],
                           "eligible": [True] * 11 + [False]})
    chosen = moe_design.choose_sample(points, 6, seed=0)
    assert len(chosen) == 6 and 11 not in chosen
    assert {1, 4} <= set(chosen)  # the smallest margins (r1, r0) are taken first
    assert set(points.set_index("point").loc[chosen, "region"]) == {"r0", "r1", "r2", "r3"}  # every region
    assert moe_design.choose_sample(points, 6, seed=0) == chosen  # seeded
    assert moe_design.choose_sample(points, 50, seed=0) == list(range(11))  # all eligible ones when asked for more


def _sample(rows):
    return pd.DataFrame(rows, columns=["point", "backend", "measured_s", "measured_iqr_s", "pred_L3_s", "pred_L0_s"])


def test_decision_scores_count_only_separable_points():
    backends = ["loop", "padded", "grouped"]
    s = _sample([
        # point 0: grouped clearly fastest, predicted right
        (0, "loop", 2.0, 0.01, 2.1, 1.0), (0, "padded", 3.0, 0.01, 3.1, 1.0), (0, "grouped", 1.0, 0.01, 1.1, 1.0),
        # point 1: loop fastest by 25%, predicted grouped: a wrong separable decision
        (1, "loop", 1.0, 0.01, 1.3, 1.0), (1, "padded", 3.0, 0.01, 3.0, 1.0), (1, "grouped", 1.25, 0.01, 1.2, 1.0),
        # point 2: loop and grouped within 2% (inside the noise): not separable, whatever was predicted
        (2, "loop", 1.0, 0.01, 1.5, 1.0), (2, "padded", 3.0, 0.01, 3.0, 1.0), (2, "grouped", 1.02, 0.01, 1.0, 1.0),
        # point 3: a 10% gap, but the IQRs are wider than it: not separable
        (3, "loop", 1.0, 0.2, 1.0, 1.0), (3, "padded", 3.0, 0.01, 3.0, 1.0), (3, "grouped", 1.1, 0.01, 1.2, 1.0),
    ])
    per_point, scores = moe_design.decision_scores(s, backends, noise_pct=5.0)
    assert per_point.set_index("point")["separable"].tolist() == [True, True, False, False]
    assert scores["sampled"] == 4 and scores["separable"] == 2
    assert scores["agree_pct"] == 50.0 and scores["disagreements"] == 1
    assert scores["mean_loss_pct"] == pytest.approx(25.0)  # following L3 at point 1 costs 1.25 vs 1.0
    assert scores["agree_pct_L0"] == 50.0  # L0 ties everywhere: picks loop, right at point 1 only


def _two_passes(rows):
    """rows: (point, backend, pass-0 time, pass-1 time, pred_L3_s); IQRs 1% of the time."""
    passes = [pd.DataFrame({"measured_s": [r[2 + i] for r in rows], "measured_iqr_s": [0.01 * r[2 + i] for r in rows],
                            "round_cv": 0.01, "rounds_timed": 3, "noisy": False}) for i in range(2)]
    timed = moe_design.combine_passes(passes)
    keys = pd.DataFrame([(r[0], r[1], r[4], 1.0) for r in rows], columns=["point", "backend", "pred_L3_s", "pred_L0_s"])
    margin = keys.groupby("point")["pred_L3_s"].transform(lambda t: 100 * (np.sort(t)[1] / np.sort(t)[0] - 1))
    return pd.concat([keys.assign(margin_L3_pct=margin), timed], axis=1)


def test_combine_passes_keeps_each_pass_and_the_median():
    s = _two_passes([(0, "loop", 1.0, 3.0, 1.0), (0, "grouped", 2.0, 2.0, 1.0)])
    assert s["measured_s"].tolist() == [2.0, 2.0] and s["measured_s_pass1"].tolist() == [3.0, 2.0]
    assert s["measured_iqr_s"].tolist() == pytest.approx([0.03, 0.02]) and s["rounds_timed"].tolist() == [6, 6]
    assert s["pass_cv"].iloc[0] == pytest.approx(np.std([1.0, 3.0], ddof=1) / 2.0) and s["pass_cv"].iloc[1] == 0


def test_a_point_is_separable_only_when_every_pass_finds_the_same_fastest():
    s = _two_passes([
        # point 0: grouped fastest by 50% and 40%: separable, L3 right
        (0, "loop", 1.5, 1.4, 2.0), (0, "grouped", 1.0, 1.0, 1.0),
        # point 1: loop fastest by 10% in pass 0, grouped by 10% in pass 1: each pass alone calls it separable
        (1, "loop", 1.0, 1.1, 2.0), (1, "grouped", 1.1, 1.0, 1.0),
        # point 2: loop fastest by 20% then 3% (inside the noise): reproducible, not separable
        (2, "loop", 1.0, 1.0, 1.0), (2, "grouped", 1.2, 1.03, 2.0),
    ])
    per_point, scores = moe_design.decision_scores(s, ["loop", "grouped"], noise_pct=5.0)
    pp = per_point.set_index("point")
    assert pp["separable"].tolist() == [True, False, False] and pp["reproducible"].tolist() == [True, False, True]
    assert pp.loc[1, "fastest_per_pass"] == "loop|grouped" and pp.loc[2, "gap_pct_per_pass"] == "20.0|3.0"
    assert scores["passes"] == 2 and scores["reproducible"] == 2 and scores["separable"] == 1
    assert scores["agree_pct"] == 100.0
    # alone, pass 0 calls points 0-2 separable and L3 (grouped, grouped, loop) right at 0 and 2;
    # pass 1 calls 0 and 1 separable, L3 right at both
    assert scores["single_pass"] == [{"separable": 3, "agree_pct": 66.67}, {"separable": 2, "agree_pct": 100.0}]


def test_decisions_split_by_whether_l3_calls_a_winner():
    s = _two_passes([
        # L3: grouped by 100% (commits), right
        (0, "loop", 1.5, 1.4, 2.0), (0, "grouped", 1.0, 1.0, 1.0),
        # L3: grouped by 2% (a near-tie), wrong: loop is 20% faster in both passes
        (1, "loop", 1.0, 1.0, 1.02), (1, "grouped", 1.2, 1.2, 1.0),
        # L3: loop by 50% (commits), wrong: grouped is 30% faster in both passes
        (2, "loop", 1.3, 1.3, 1.0), (2, "grouped", 1.0, 1.0, 1.5),
    ])
    per_point, scores = moe_design.decision_scores(s, ["loop", "grouped"], noise_pct=5.0)
    assert per_point["committed"].tolist() == [True, False, True]
    assert scores["agree_pct"] == 33.33
    assert scores["committed"] == {"separable": 2, "agree_pct": 50.0, "mean_loss_pct": pytest.approx(30.0)}
    assert scores["near_ties"] == {"separable": 1, "agree_pct": 0.0, "mean_loss_pct": pytest.approx(20.0)}


def test_decision_scores_with_nothing_separable_are_null():
    s = _sample([(0, "loop", 1.0, 0.01, 1.0, 1.0), (0, "grouped", 1.01, 0.01, 2.0, 1.0)])
    _, scores = moe_design.decision_scores(s, ["loop", "grouped"], noise_pct=5.0)
    assert scores["separable"] == 0 and scores["agree_pct"] is None and scores["mean_loss_pct"] is None


def test_coverage_says_when_the_grid_leaves_the_profile(model):
    inside = model.levels["L3"].coverage(pd.DataFrame(DeviceProfile.load(PROFILE).kernels()))
    assert all(f["in_range_pct"] == 100 for f in inside.values())
    from costmodel.model.features import kernel_table

    far = kernel_table([GemmSpec(1 << 20, 4096, 4096), GemmSpec(64, 256, 256)])
    report = moe_design.coverage_summary(model, far, 10)
    assert report["covered"] is False and report["in_range_pct"] == 50.0
    assert "log_m" in report["per_family"]["gemm"]["features_outside"]
    assert report["per_family"]["gemm"]["features_outside"]["log_m"]["queried"][1] == pytest.approx(np.log10(1 << 20), abs=1e-3)


def test_grid_sample_spreads_over_each_family_and_respects_the_limits():
    from costmodel.families.sort import SortSpec
    from sim.predict.calibration import grid_sample_suite

    gemms = [GemmSpec(m, 64, 64) for m in range(1, 101)]  # predicted time grows with m
    sorts = [SortSpec(n) for n in (64, 128, 256, 512)]
    specs = gemms + sorts
    predicted = [1e-6 * m for m in range(1, 101)] + [1e-6, 2e-6, 3e-6, 1.0]  # the last sort is too slow
    suite = grid_sample_suite(specs, predicted, count=20, max_bytes=float("inf"), max_s=0.5)
    chosen = [s for _, s in suite]
    assert all(tag == "design" for tag, _ in suite) and len(set(chosen)) == len(chosen)
    picked_m = sorted(s.m for s in chosen if s.family == "gemm")
    # sqrt weights: gemm gets floor(20 * 10 / (10 + sqrt(3))) = 17, spread from the fastest to the slowest
    assert len(picked_m) == 17 and picked_m[0] == 1 and picked_m[-1] == 100
    assert max(np.diff(picked_m)) <= 7
    assert sorted(s.n for s in chosen if s.family == "sort") == [64, 128, 256]  # at least 3; the 1 s one left out
    small = grid_sample_suite(specs, predicted, count=20, max_bytes=gemms[0].bytes_moved(), max_s=0.5)
    assert {s.family for _, s in small} == {"gemm", "sort"} and all(s.bytes_moved() <= gemms[0].bytes_moved() for _, s in small)
    assert grid_sample_suite(specs, predicted, count=0, max_bytes=1e9, max_s=1) == []


@pytest.mark.parametrize("bad", [-1, 2.5, True, "many"])
def test_bad_calibrate_kernels_names_the_key(bad):
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(Path(__file__).parents[2] / "conf/experiment/moe_design.yaml"))
    cfg["design"]["calibrate_kernels"] = bad
    with pytest.raises(ValueError, match="design.calibrate_kernels must be an integer >= 0"):
        moe_design.check_design(cfg)
