"""CostModel persistence: round trip, fingerprint refusal, staleness, too little data."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from costmodel.device import ProfileMismatchError, fingerprint
from costmodel.features import kernel_table
from costmodel.kernels import GemmSpec, GroupedGemmSpec, SortSpec
from costmodel.predictor import MODEL_VERSION, CostModel, ModelVersionError, StaleModelError
from costmodel.profile import DeviceProfile, ProfileError

CEIL = {"peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 1e-6, "ridge_flops_per_byte": 10.0}


def _fill(profile, n):
    rows = []
    for i, m in enumerate(np.unique(np.geomspace(1, 1024, n).round().astype(int))):
        spec = GemmSpec(int(m), 64, 64)
        rows.append({"key": spec.key(), "round": 0, **spec.to_record(), "flops": spec.flops(),
                     "bytes_moved": spec.bytes_moved(), "median_s": 1e-5 + spec.flops() / 5e10, "iqr_s": 1e-7,
                     "noisy": False})
    profile.append_measurements(rows)
    profile.write_ceilings(CEIL)


@pytest.fixture
def profile(tmp_path):
    return DeviceProfile.open(tmp_path, fingerprint(torch.device("cpu"), "float32"))


def test_fit_save_load_predict(profile):
    _fill(profile, 30)
    model = CostModel.fit_profile(profile, cv_folds=3)
    model.save(profile)
    loaded = CostModel.load(profile, expected=profile.fingerprint)
    specs = [GemmSpec(7, 64, 64), GemmSpec(300, 64, 64)]
    assert np.allclose(loaded.predict(specs).to_numpy(), model.predict(specs).to_numpy())
    assert list(loaded.predict(specs).columns) == ["L0", "L1", "L2", "L3"]


def test_models_refuse_another_device_and_report_staleness(profile):
    _fill(profile, 30)
    CostModel.fit_profile(profile, cv_folds=3).save(profile)
    with pytest.raises(ProfileMismatchError, match="dtype"):
        CostModel.load(profile, expected=replace(profile.fingerprint, dtype="bfloat16"))
    spec = SortSpec(8)
    profile.append_measurements([{"key": spec.key(), "round": 0, **spec.to_record(), "flops": 0.0,
                                  "bytes_moved": spec.bytes_moved(), "median_s": 1e-6, "iqr_s": 0.0, "noisy": False}])
    with pytest.raises(StaleModelError, match="refit"):
        CostModel.load(profile)
    assert CostModel.load(profile, allow_stale=True).levels


def test_empty_or_tiny_profiles_are_clear_errors(profile):
    with pytest.raises(ProfileError, match="no ceilings.json"):
        CostModel.fit_profile(profile)
    _fill(profile, 5)
    with pytest.raises(ProfileError, match="at least 10 are needed"):
        CostModel.fit_profile(profile)
    with pytest.raises(ProfileError, match="no fitted models"):
        CostModel.load(profile)


def test_predict_deduplicates_but_keeps_order_and_repeats(profile):
    _fill(profile, 30)
    model = CostModel.fit_profile(profile, cv_folds=3)
    a, b = GemmSpec(7, 64, 64), GemmSpec(300, 64, 64)
    once = model.predict([a, b]).to_numpy()
    out = model.predict([b, a, b, b, a])
    assert out.shape == (5, 4)
    assert np.array_equal(out.to_numpy(), once[[1, 0, 1, 1, 0]])
    assert model.predict([]).empty


def test_models_fitted_with_older_kernel_formulas_are_stale(profile):
    _fill(profile, 30)
    CostModel.fit_profile(profile, cv_folds=3).save(profile)
    meta_file = profile.path / "models.json"
    meta = json.loads(meta_file.read_text())
    meta["model_version"] = MODEL_VERSION - 1
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(StaleModelError, match=f"v{MODEL_VERSION - 1}.*v{MODEL_VERSION}"):
        CostModel.load(profile)
    # other features than this code computes: unusable even where staleness is allowed
    with pytest.raises(ModelVersionError, match="refit"):
        CostModel.load(profile, allow_stale=True)


def test_profile_kernels_follow_current_byte_formulas(profile):
    spec = GroupedGemmSpec((4, 0, 0, 4), 16, 32, "grouped_mm")
    profile.append_measurements([{"key": spec.key(), "round": 0, **spec.to_record(), "flops": spec.flops(),
                                  "bytes_moved": 1.0, "median_s": 1e-5, "iqr_s": 0.0, "noisy": False}])
    row = profile.kernels().iloc[0]
    assert row["bytes_moved"] == spec.bytes_moved() == 4 * (8 * 16 + 2 * 16 * 32 + 8 * 32)


def test_layer_predictions_add_the_cold_call_overhead_per_kernel(profile):
    from sim.simulator import predict_trace

    _fill(profile, 30)
    profile.write_ceilings({**CEIL, "cold_call_overhead_s": 5e-5})
    model = CostModel.fit_profile(profile, cv_folds=3)
    trace = [GemmSpec(7, 64, 64), GemmSpec(300, 64, 64)]
    in_layer, bare = predict_trace(model, trace), model.predict(trace)
    assert np.allclose(in_layer["L3"] - bare["L3"], 5e-5) and np.allclose(in_layer["L2"] - bare["L2"], 5e-5)
    assert np.allclose(in_layer["L0"], bare["L0"]) and np.allclose(in_layer["L1"], bare["L1"])
    warm = replace(model, fingerprint=replace(model.fingerprint, cache="warm"))
    assert np.allclose(predict_trace(warm, trace)["L3"], bare["L3"])


def test_l3_of_a_measured_kernel_is_its_measurement_and_the_regression_elsewhere(profile):
    _fill(profile, 30)
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
