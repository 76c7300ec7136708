"""Cost-model levels: formulas, sklearn protocol, L3 learning, clipping, errors."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone

from costmodel.families.gather import GatherSpec
from costmodel.families.gemm import GemmSpec
from costmodel.model.features import kernel_table, roofline_time_s
from costmodel.model.models import (L3_CANDIDATES, AveragedForms, ExtrapolationWarning, FamilyAchievedRate,
                                    FittedCostModel, FlopsOverPeak, Roofline, make_form)

CEIL = {"peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 1e-6, "ridge_flops_per_byte": 10.0,
        "parallel_units": 2, "device_kind": "cpu"}


def _gemms(ms, k=256, n=256):
    return kernel_table([GemmSpec(int(m), k, n) for m in ms])


def test_l0_and_l2_formulas():
    X = kernel_table([GemmSpec(100, 100, 100), GatherSpec(1000, 10, 50)])
    l0 = FlopsOverPeak(ceilings=CEIL).fit(X).predict(X)
    assert l0.tolist() == pytest.approx([2e6 / 1e11, 0.0])
    l2 = Roofline(ceilings=CEIL).fit(X).predict(X)
    gemm_bytes = 4 * 3 * 100 * 100
    assert l2[0] == pytest.approx(max(2e6 / 1e11, gemm_bytes / 1e10) + 1e-6)
    assert l2[1] == pytest.approx((2 * 1000 * 10 * 4 + 1000 * 8) / 1e10 + 1e-6)


def test_l1_uses_family_median_rate_and_bytes_for_flopless_kernels():
    X = kernel_table([GemmSpec(10, 10, 10), GemmSpec(20, 10, 10), GatherSpec(100, 4, 10)])
    y = np.array([2000 / 1e9, 4000 / 4e9, 1e-6])
    model = FamilyAchievedRate().fit(X, y)
    assert model.rate_["gemm"] == pytest.approx(np.median([1e9, 4e9]))
    assert model.rate_["gather"] == pytest.approx(X["bytes_moved"].iloc[2] / 1e-6)
    assert model.predict(X)[2] == pytest.approx(1e-6)


def test_models_follow_the_sklearn_protocol():
    for model in (FlopsOverPeak(ceilings=CEIL), Roofline(ceilings=CEIL), FittedCostModel(ceilings=CEIL, cv_folds=3)):
        params = model.get_params()
        assert clone(model).get_params().keys() == params.keys()
        assert not [a for a in vars(model) if a.endswith("_")]  # nothing fitted before fit


def _synthetic(ms):
    X = _gemms(ms)
    roof = roofline_time_s(X["flops"].to_numpy(), X["bytes_moved"].to_numpy(), CEIL)
    efficiency = 0.2 + 0.7 * np.tanh(np.asarray(ms) / 200.0)  # smooth in M
    return X, roof / efficiency


def test_l3_learns_a_smooth_efficiency_and_clips_extrapolation():
    train_m = np.unique(np.geomspace(1, 2048, 40).round())
    X, y = _synthetic(train_m)
    model = FittedCostModel(ceilings=CEIL, cv_folds=3).fit(X, y)
    assert model.chosen_["gemm"] in ("gp", "gbm", "ridge2", "trend_gbm")
    test_m = np.array([3, 37, 150, 700, 1500])
    Xt, yt = _synthetic(test_m)
    ape = np.abs(model.predict(Xt) - yt) / yt
    assert np.median(ape) < 0.05
    with pytest.warns(ExtrapolationWarning) as caught:
        far = model.predict(_gemms([10**6]))
    assert any("log_m" in str(w.message) and "outside the fitted range" in str(w.message) for w in caught)
    lo, hi = model.target_range_["gemm"]
    roof = roofline_time_s(*(_gemms([10**6])[c].to_numpy() for c in ("flops", "bytes_moved")), CEIL)
    assert 10**lo * roof[0] <= far[0] <= 10**hi * roof[0]  # bounded efficiency, never a runaway


def test_unknown_family_and_unfitted_family_errors():
    X, y = _synthetic(np.arange(1, 30))
    model = FittedCostModel(ceilings=CEIL, cv_folds=3).fit(X, y)
    with pytest.raises(ValueError, match="fitted without families \\['gather'\\]"):
        model.predict(kernel_table([GatherSpec(10, 4, 4)]))
    bad = X.copy()
    bad.loc[0, "family"] = "conv"
    with pytest.raises(ValueError, match="unknown families \\['conv'\\]"):
        model.predict(bad)
    with pytest.raises(TypeError, match="kernel table"):
        model.predict(np.zeros((2, 2)))


def test_prediction_is_vectorised_and_fast_enough_to_matter():
    X, y = _synthetic(np.unique(np.geomspace(1, 2048, 30).round()))
    model = FittedCostModel(ceilings=CEIL, cv_folds=3).fit(X, y)
    big = pd.concat([X] * 2000, ignore_index=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # in-range queries warn about nothing
        out = model.predict(big)
    assert out.shape == (len(big),) and np.isfinite(out).all()


def test_grouped_features_handle_ragged_expert_counts_and_padding():
    from costmodel.model.features import family_features, kernel_table
    from costmodel.families.grouped_gemm import GroupedGemmSpec

    specs = [GroupedGemmSpec((4, 0, 2, 2), 8, 8, impl="grouped_mm"), GroupedGemmSpec((6, 2), 8, 8, impl="padded_bmm")]
    f = family_features(kernel_table(specs), "grouped_gemm", CEIL)
    # row 0 executes (4, 0, 2, 2): 3 non-empty of 4 experts, 8 tokens, CV = std/mean = sqrt(2)/2
    assert f["log_nonempty"].tolist()[0] == pytest.approx(np.log10(3))
    assert f["log_total_tokens"].tolist()[0] == pytest.approx(np.log10(8))
    assert f["tokens_cv"].tolist()[0] == pytest.approx(np.sqrt(2) / 2)
    assert f["padding_waste"].tolist()[0] == pytest.approx(1 - 8 / 16)
    # row 1 is a padded bmm: it executes max_n = 6 rows for both experts, uniform groups
    assert f["log_experts"].tolist()[1] == pytest.approx(np.log10(2))
    assert f["log_total_tokens"].tolist()[1] == pytest.approx(np.log10(12))
    assert f["tokens_cv"].tolist()[1] == pytest.approx(0.0)
    assert f["padding_waste"].tolist()[1] == pytest.approx(1 - 8 / 12)


def test_l3_extrapolates_a_measured_trend_beyond_the_fitted_range():
    """Efficiency that keeps rising with size (a power law in M): trees alone would predict
    the largest measured efficiency for a larger kernel; the extrapolator, chosen on the
    larger training kernels, carries the slope on."""
    def power_law(ms):
        X = _gemms(ms, k=64, n=64)
        roof = roofline_time_s(X["flops"].to_numpy(), X["bytes_moved"].to_numpy(), CEIL)
        return X, roof / (0.05 * np.asarray(ms, float) ** 0.3)

    X, y = power_law(np.unique(np.geomspace(1, 512, 48).round()))
    model = FittedCostModel(ceilings=CEIL, cv_folds=3, candidates=("gbm", "extra_trees", "trend_gbm")).fit(X, y)
    assert model.extrapolator_["gemm"] != "same"
    assert set(model.extrapolation_cv_median_ape_pct_["gemm"]) == {"same", "ridge1", "trend_gbm", "trend_extra_trees",
                                                                   "edge", "roofline"}
    Xt, yt = power_law([1024])
    with pytest.warns(ExtrapolationWarning):
        predicted = model.predict(Xt)
    flat = yt[0] * (1024 / 512) ** 0.3  # the largest measured efficiency (M = 512) held flat: 23% too slow
    assert abs(predicted[0] - yt[0]) / yt[0] < 0.08
    assert abs(predicted[0] - yt[0]) < 0.5 * abs(flat - yt[0])


def test_l3_keeps_a_saturated_efficiency_flat_beyond_the_fitted_range():
    """Efficiency that rises and then saturates (a GEMM at its peak): the larger training
    kernels show no slope, so no trend form may carry the small kernels' slope on; a near
    tie with the in-range winner keeps the winner (``EXTRAPOLATOR_MARGIN``)."""
    def saturating(ms):
        X = _gemms(ms, k=64, n=64)
        roof = roofline_time_s(X["flops"].to_numpy(), X["bytes_moved"].to_numpy(), CEIL)
        return X, roof / (0.05 * np.minimum(np.asarray(ms, float), 64) ** 0.5)

    X, y = saturating(np.unique(np.geomspace(1, 512, 48).round()))
    model = FittedCostModel(ceilings=CEIL, cv_folds=3, candidates=("gbm", "extra_trees")).fit(X, y)
    scores = model.extrapolation_cv_median_ape_pct_["gemm"]
    assert model.extrapolator_["gemm"] in {"same", "edge"}
    assert scores["ridge1"] > 2 * min(scores["same"], scores["edge"])  # the small kernels' slope, carried on
    Xt, yt = saturating([2048])
    with pytest.warns(ExtrapolationWarning):
        predicted = model.predict(Xt)
    assert abs(predicted[0] - yt[0]) / yt[0] < 0.05


def test_edge_and_roofline_extrapolators_are_constants_in_log_efficiency():
    from costmodel.model.models import ROOFLINE_FEATURE, EdgeEfficiency, RooflineEfficiency

    F = np.zeros((10, ROOFLINE_FEATURE + 1))
    F[:, ROOFLINE_FEATURE] = np.arange(10)  # sizes 0..9: the top 10% is the last row only
    t = np.arange(10) * -0.1
    assert EdgeEfficiency().fit(F, t).predict(F[:2]).tolist() == pytest.approx([-0.9, -0.9])
    assert EdgeEfficiency(top_share=0.3).fit(F, t).predict(F[:1]).tolist() == pytest.approx([-0.8])
    assert RooflineEfficiency().fit(F, t).predict(F[:3]).tolist() == [0.0, 0.0, 0.0]


def test_trend_plus_residual_names_its_residual_options():
    from costmodel.model.models import TrendPlusResidual

    with pytest.raises(ValueError, match=r"residual must be one of \['extra_trees', 'gbm'\], got 'forest'"):
        TrendPlusResidual(residual="forest").fit(np.zeros((4, 1)), np.zeros(4))


def test_an_average_of_forms_is_the_mean_of_their_log_efficiencies():
    rng = np.random.default_rng(3)
    F = rng.normal(size=(40, 3))
    t = F[:, 0] - 0.5 * F[:, 1] ** 2 + 0.01 * rng.normal(size=40)
    avg = AveragedForms(("gp", "ridge2")).fit(F, t)
    alone = [L3_CANDIDATES[f]().fit(F, t).predict(F[:5]) for f in ("gp", "ridge2")]
    assert avg.predict(F[:5]) == pytest.approx((alone[0] + alone[1]) / 2)
    assert isinstance(make_form("avg:gp+ridge2"), AveragedForms) and make_form("avg:gp+ridge2").forms == ("gp", "ridge2")
    assert type(make_form("gbm")) is type(L3_CANDIDATES["gbm"]())
    with pytest.raises(ValueError, match="at least two of"):
        AveragedForms(("gp",)).fit(F, t)
    with pytest.raises(ValueError, match="at least two of"):
        AveragedForms(("gp", "lasso")).fit(F, t)


def test_l3_scores_averages_of_its_best_forms_and_keeps_the_lowest_cv_error():
    X, y = _synthetic(np.unique(np.geomspace(1, 2048, 40).round()))
    model = FittedCostModel(ceilings=CEIL, cv_folds=3, averaged_top=(2, 3)).fit(X, y)
    scores = model.cv_median_ape_pct_["gemm"]
    singles = sorted((n for n in scores if not n.startswith("avg:")), key=scores.get)
    assert len(singles) == 6
    # the averages of the best two and three singles are scored, named by their forms in rank order
    assert "avg:" + "+".join(singles[:2]) in scores and "avg:" + "+".join(singles[:3]) in scores
    assert model.chosen_["gemm"] == min(scores, key=scores.get)
    plain = FittedCostModel(ceilings=CEIL, cv_folds=3).fit(X, y)  # the default: single forms only
    assert not any(n.startswith("avg:") for n in plain.cv_median_ape_pct_["gemm"])
    assert plain.cv_median_ape_pct_["gemm"] == pytest.approx({n: scores[n] for n in singles})


@pytest.mark.parametrize("top", [(1,), (2, 0), (2.5,)])
def test_l3_averaged_top_below_two_is_refused(top):
    X, y = _synthetic(np.arange(1, 30))
    with pytest.raises(ValueError, match=r"averaged_top: forms per average, each an integer >= 2, got"):
        FittedCostModel(ceilings=CEIL, cv_folds=3, averaged_top=top).fit(X, y)


def test_l3_averages_of_more_forms_than_candidates_are_skipped():
    X, y = _synthetic(np.unique(np.geomspace(1, 2048, 40).round()))
    model = FittedCostModel(ceilings=CEIL, cv_folds=3, candidates=("gp", "ridge2"), averaged_top=(2, 3)).fit(X, y)
    assert sorted(model.cv_median_ape_pct_["gemm"]) == sorted(["gp", "ridge2", "avg:" + "+".join(
        sorted(("gp", "ridge2"), key=model.cv_median_ape_pct_["gemm"].get))])
