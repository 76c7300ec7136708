"""CostModel persistence (the user's model cache): round trip, fingerprint refusal, a changed
profile refitted, too little data."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gemm import GemmSpec
from costmodel.families.grouped_gemm import GroupedGemmSpec
from costmodel.families.sort import SortSpec
from costmodel.measure.device import ProfileMismatchError, fingerprint
from costmodel.model import predictor
from costmodel.model.features import kernel_table
from costmodel.model.predictor import CostModel
from costmodel.store.profile import DeviceProfile, ProfileError

CEIL = {"peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 1e-6, "ridge_flops_per_byte": 10.0}



@pytest.fixture(autouse=True)
def own_model_cache(tmp_path, monkeypatch):
    """A cache per test: the tiny profiles of these tests have equal contents, so a shared cache
    would answer one test with another's models."""
    monkeypatch.setenv("MOEGNN_MODEL_CACHE", str(tmp_path / "model_cache"))

@pytest.fixture
def profile(tmp_path):
    return DeviceProfile.open(tmp_path, fingerprint(torch.device("cpu"), "float32"))


def test_fit_save_load_predict(fill_gemms, profile):
    fill_gemms(profile, 30)
    model = CostModel.fit_profile(profile, cv_folds=3)
    entry = model.save(profile)
    assert entry is not None and entry.parent != profile.path  # the user's cache, not the profile
    loaded = CostModel.load(profile, expected=profile.fingerprint)
    assert loaded.origin == "cache" and model.origin == "fitted"
    specs = [GemmSpec(7, 64, 64), GemmSpec(300, 64, 64)]
    assert np.allclose(loaded.predict(specs).to_numpy(), model.predict(specs).to_numpy())
    assert list(loaded.predict(specs).columns) == ["L0", "L1", "L2", "L3"]


def test_models_refuse_another_device_and_a_changed_profile_is_refitted(fill_gemms, profile):
    fill_gemms(profile, 30)
    CostModel.fit_profile(profile, cv_folds=3).save(profile)
    with pytest.raises(ProfileMismatchError, match="dtype"):
        CostModel.load(profile, expected=replace(profile.fingerprint, dtype="bfloat16"))
    before = profile.content_hash()
    spec = SortSpec(8)
    profile.append_measurements([{"key": spec.key(), "round": 0, **spec.to_record(), "flops": 0.0,
                                  "bytes_moved": spec.bytes_moved(), "median_s": 1e-6, "iqr_s": 0.0, "noisy": False}])
    with pytest.raises(ProfileError, match="no fitted models"):  # the cache is keyed by the profile's content
        CostModel.load(profile, fit_missing=False)
    refitted = CostModel.load(profile, allow_stale=True)  # allow_stale: accepted, no effect
    assert refitted.origin == "fitted" and refitted.profile_hash == profile.content_hash() != before
    assert "sort" in refitted.meta["families"]
    assert CostModel.load(profile).origin == "cache"


def test_empty_or_tiny_profiles_are_clear_errors(fill_gemms, profile):
    with pytest.raises(ProfileError, match="no ceilings.json"):
        CostModel.fit_profile(profile)
    fill_gemms(profile, 5)
    with pytest.raises(ProfileError, match="at least 10 are needed"):
        CostModel.fit_profile(profile)
    with pytest.raises(ProfileError, match="at least 10 are needed"):  # load fits on a miss: the same error
        CostModel.load(profile)
    with pytest.raises(ProfileError, match="no fitted models"):
        CostModel.load(profile, fit_missing=False)


def test_predict_deduplicates_but_keeps_order_and_repeats(fill_gemms, profile):
    fill_gemms(profile, 30)
    model = CostModel.fit_profile(profile, cv_folds=3)
    a, b = GemmSpec(7, 64, 64), GemmSpec(300, 64, 64)
    once = model.predict([a, b]).to_numpy()
    out = model.predict([b, a, b, b, a])
    assert out.shape == (5, 4)
    assert np.array_equal(out.to_numpy(), once[[1, 0, 1, 1, 0]])
    assert model.predict([]).empty


def test_models_fitted_with_older_kernel_formulas_are_not_used(fill_gemms, profile, monkeypatch):
    fill_gemms(profile, 30)
    CostModel.fit_profile(profile, cv_folds=3).save(profile)
    assert CostModel.load(profile).origin == "cache"
    monkeypatch.setattr(predictor, "MODEL_VERSION", predictor.MODEL_VERSION + 1)  # the code's features changed
    assert CostModel.cached(profile) is None  # MODEL_VERSION is in the cache key
    refitted = CostModel.load(profile, allow_stale=True)  # other features: refitted even where staleness is allowed
    assert refitted.origin == "fitted" and refitted.meta["model_version"] == predictor.MODEL_VERSION
    assert CostModel.load(profile).origin == "cache"


def test_profile_kernels_follow_current_byte_formulas(profile):
    spec = GroupedGemmSpec((4, 0, 0, 4), 16, 32, "grouped_mm")
    profile.append_measurements([{"key": spec.key(), "round": 0, **spec.to_record(), "flops": spec.flops(),
                                  "bytes_moved": 1.0, "median_s": 1e-5, "iqr_s": 0.0, "noisy": False}])
    row = profile.kernels().iloc[0]
    assert row["bytes_moved"] == spec.bytes_moved() == 4 * (8 * 16 + 2 * 16 * 32 + 8 * 32)


def test_layer_predictions_add_one_cold_start_per_kind_at_its_first_kernel(fill_gemms, profile):
    from sim.predict.simulator import predict_trace, predict_traces

    fill_gemms(profile, 30)
    profile.write_ceilings({**CEIL, "cold_call_overhead_s": 5e-5})
    model = CostModel.fit_profile(profile, cv_folds=3)
    trace = [GemmSpec(7, 64, 64), GemmSpec(300, 64, 64), GemmSpec(7, 64, 64)]
    in_layer, bare = predict_trace(model, trace), model.predict(trace)
    # only the first GEMM starts the kind cold; the others find its code warm
    assert np.allclose(in_layer["L3"] - bare["L3"], [5e-5, 0.0, 0.0])
    assert np.allclose(in_layer["L2"] - bare["L2"], [5e-5, 0.0, 0.0])
    assert np.allclose(in_layer["L0"], bare["L0"]) and np.allclose(in_layer["L1"], bare["L1"])
    # a batch of traces charges each trace its own kinds, as predict_trace does
    traces = [trace, trace[:2], trace[1:2]]
    batch = predict_traces(model, traces)
    for i, t in enumerate(traces):
        assert batch["pred_L3_s"].iloc[i] == pytest.approx(float(predict_trace(model, t)["L3"].sum()), rel=1e-12)
    assert (batch["pred_L3_s"] - [float(model.predict(t)["L3"].sum()) for t in traces]).tolist() == \
        pytest.approx([5e-5, 5e-5, 5e-5])
    # with a re-cooling curve a later GEMM pays again for what another kind streamed since the last one
    # (GEMMs back to back stream nothing in between: their code stays in use)
    adds = [ElementwiseSpec("add", int(n)) for n in np.geomspace(2**10, 2**20, 12).round()]
    profile.append_measurements([{"key": a.key(), "round": 0, **a.to_record(), "flops": a.flops(), "bytes_moved": a.bytes_moved(),
                                  "median_s": 1e-6 + a.bytes_moved() / 1e10, "iqr_s": 0.0, "noisy": False} for a in adds])
    profile.write_ceilings({**CEIL, "cold_call_overhead_s": 5e-5, "recold_fraction_by_mib": {"1": 1.0}}, replace=True)
    model = CostModel.fit_profile(profile, cv_folds=3)
    assert np.allclose(predict_trace(model, trace)["L3"] - model.predict(trace)["L3"], [5e-5, 0.0, 0.0])
    add = ElementwiseSpec("add", 2**16)  # reads two inputs, writes one: 3 * 2**16 * 4 bytes = 0.75 MiB
    streamed = [GemmSpec(7, 64, 64), add, GemmSpec(7, 64, 64)]
    assert np.allclose(predict_trace(model, streamed)["L3"] - model.predict(streamed)["L3"], [5e-5, 5e-5, 5e-5 * 0.75])
    traces = [*traces, streamed]
    batch = predict_traces(model, traces)
    for i, t in enumerate(traces):
        assert batch["pred_L3_s"].iloc[i] == pytest.approx(float(predict_trace(model, t)["L3"].sum()), rel=1e-12)
    warm = replace(model, fingerprint=replace(model.fingerprint, cache="warm"))
    assert np.allclose(predict_trace(warm, trace)["L3"], bare["L3"])


def test_l3_of_a_measured_kernel_is_its_measurement_and_the_regression_elsewhere(fill_gemms, profile):
    fill_gemms(profile, 30)
    rows = profile.kernels().set_index("key")["median_s"]
    model = CostModel.fit_profile(profile, cv_folds=3)
    model.save(profile)
    measured = [s for s in (GemmSpec(int(m), 64, 64) for m in range(1, 1025)) if s.key() in rows.index][:5]
    unseen = GemmSpec(3, 64, 65)  # not in the profile
    for m in (model, CostModel.load(profile, expected=profile.fingerprint)):  # fitted or loaded alike
        pred = m.predict(measured + [unseen])
        assert pred["L3"].iloc[:5].tolist() == pytest.approx([rows[s.key()] for s in measured])
        regression = m.levels["L3"].predict(kernel_table([unseen]))[0]
        assert pred["L3"].iloc[5] == pytest.approx(regression)
    # a kernel table without keys is the regression everywhere (what held-out errors evaluate)
    table = kernel_table(measured)
    assert model.predict_table(table)["L3"].tolist() == pytest.approx(model.levels["L3"].predict(table).tolist())
    with pytest.raises(ValueError, match="2 keys for 5 kernel-table rows"):
        model.predict_table(table, keys=["a", "b"])
