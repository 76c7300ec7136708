"""Fitted models live in the user's model cache, never in a profile folder (shared data):
a pickle planted in a profile is never loaded by any loading path, an unsafe cache is
refused, a cache hit avoids the refit, and predicting from a read-only profile writes
nothing into it."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import joblib
import numpy as np
import pytest
import torch

from costmodel.families.gemm import GemmSpec
from costmodel.measure.allocator import configure_allocator
from costmodel.measure.device import fingerprint
from costmodel.model.predictor import CostModel, MODEL_VERSION
from costmodel.store import model_cache
from costmodel.store.model_cache import ModelCacheWarning
from costmodel.store.profile import DeviceProfile




@pytest.fixture(autouse=True)
def own_model_cache(tmp_path, monkeypatch):
    """A cache per test: the tiny profiles of these tests have equal contents, so a shared cache
    would answer one test with another's models."""
    monkeypatch.setenv("MOEGNN_MODEL_CACHE", str(tmp_path / "model_cache"))

class Planted:
    """What an attacker pickles: unpickling it calls ``open(marker, "w")``, creating the marker."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def make_profile(fill_gemms):
    """``make_profile(root)``: a tiny profile of this process's CPU (as
    ``load_cost_model(device="cpu")`` fingerprints it), 30 synthetic GEMMs."""

    def make(root) -> DeviceProfile:
        configure_allocator("steady")
        profile = DeviceProfile.open(root, fingerprint(torch.device("cpu"), "float32"))
        fill_gemms(profile, 30)
        return profile

    return make


def _plant(profile: DeviceProfile, marker) -> None:
    """A models.joblib that runs code when unpickled, and a models.json that vouches for it,
    as the code before the model cache wrote them."""
    joblib.dump({"levels": Planted(marker), "ceilings": Planted(marker), "measured_s": {}}, profile.path / "models.joblib")
    (profile.path / "models.json").write_text(json.dumps({
        "profile_hash": profile.content_hash(), "fingerprint": profile.fingerprint.to_dict(),
        "model_version": MODEL_VERSION, "fitted_at": "2024-01-01T00:00:00", "n_rows": 30, "families": ["gemm"],
        "l3_form": {"gemm": "residual"}, "l3_cv_median_ape_pct": {"gemm": 1.0}, "sklearn": "1.0",
    }))


def _snapshot(folder) -> dict[str, tuple[int, int, str]]:
    """Every file under ``folder`` (hidden ones too): size, mtime, content hash."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            st = path.stat()
            out[str(path.relative_to(folder))] = (st.st_size, st.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def test_planting_works_as_an_attack(tmp_path):
    """The planted pickle really runs its code when unpickled (so the tests below prove something)."""
    marker = tmp_path / "pwned"
    joblib.dump(Planted(marker), tmp_path / "x.joblib")
    joblib.load(tmp_path / "x.joblib")
    assert marker.exists()


def test_no_loading_path_unpickles_a_profile_folders_models(make_profile, tmp_path):
    from costmodel.cli import fleet
    from costmodel.measure.runtime import Runtime
    from sim.api import load_cost_model, load_stored_cost_model
    from sim.predict.calibration import fitted_model
    from sim.place.placement import Device

    root = tmp_path / "profiles"
    profile = make_profile(root)
    marker = tmp_path / "pwned"
    _plant(profile, marker)

    with pytest.warns(ModelCacheWarning, match="ignoring .*models.joblib"):
        model = CostModel.load(profile, expected=profile.fingerprint)
    assert model.origin == "fitted" and not isinstance(model.levels, Planted)
    assert CostModel.load(profile).origin == "cache"
    stored = load_stored_cost_model(profile.path)
    api = load_cost_model(device="cpu", dtype="float32", profile_root=root)
    assert api.fingerprint == stored.fingerprint == profile.fingerprint
    device = Device.from_profile("cpu0", root, profile.fingerprint, memory_bytes=2**30)
    assert device.model is not None
    rt = Runtime.from_cfg({"device": "cpu", "dtype": "float32", "threads": None, "allocator": "steady", "seed": 0,
                           "profile": {"root": str(root)}, "timing": {"cold_cache": True},
                           "limits": {"cpu": {"max_flops": 1e9, "max_bytes": 1e9}}})
    # what every experiment with measure=false (and profile.id=...) predicts with
    assert fitted_model(rt).levels and fitted_model(rt, profile_id=profile.path.name).levels
    devices, skipped = fleet.load_fleet(root)
    assert not skipped and devices[0].model is not None
    assert not marker.exists(), "a pickle in the profile folder was loaded"
    assert (profile.path / "models.joblib").exists()  # left as it was: ignored, not deleted


def test_a_world_writable_cache_folder_is_refused(make_profile, tmp_path, monkeypatch):
    profile = make_profile(tmp_path / "profiles")
    cache = tmp_path / "shared_cache"
    cache.mkdir()
    cache.chmod(0o777)
    monkeypatch.setenv(model_cache.ENV, str(cache))
    marker = tmp_path / "pwned"
    name = model_cache.entry_name(profile.fingerprint.id, profile.content_hash(), MODEL_VERSION)
    joblib.dump(Planted(marker), cache / name)  # someone else's entry under the right name
    with pytest.warns(ModelCacheWarning, match="writable by group or others"):
        model = CostModel.load(profile)
    assert model.origin == "fitted" and not marker.exists()
    assert [p.name for p in cache.iterdir()] == [name]  # nothing written there either
    with pytest.warns(ModelCacheWarning, match="writable by group or others"):
        assert model.save(profile) is None


def test_an_unsafe_cache_entry_is_refused_and_a_new_cache_is_private(make_profile, tmp_path, monkeypatch):
    profile = make_profile(tmp_path / "profiles")
    cache = tmp_path / "a" / "cache"
    monkeypatch.setenv(model_cache.ENV, str(cache))
    entry = CostModel.fit_profile(profile, cv_folds=3).save(profile)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700 and stat.S_IMODE(entry.stat().st_mode) == 0o600
    marker = tmp_path / "pwned"
    joblib.dump(Planted(marker), entry)
    entry.chmod(0o666)  # an entry others could have written
    with pytest.warns(ModelCacheWarning, match="entry .* writable by group or others"):
        assert CostModel.cached(profile) is None
    assert not marker.exists()
    if os.getuid() == 0:  # an entry another user owns (only root can make one here)
        entry.chmod(0o600)
        os.chown(entry, 12345, 12345)
        with pytest.warns(ModelCacheWarning, match="owned by uid 12345"):
            assert CostModel.cached(profile) is None
        assert not marker.exists()
    entry.unlink()
    os.symlink(tmp_path / "elsewhere.joblib", entry)  # a link is never followed
    joblib.dump(Planted(marker), tmp_path / "elsewhere.joblib")
    with pytest.warns(ModelCacheWarning, match="cannot be opened safely"):
        assert CostModel.cached(profile) is None
    assert not marker.exists()


def test_a_cache_hit_avoids_the_refit(make_profile, tmp_path, monkeypatch):
    profile = make_profile(tmp_path / "profiles")
    calls = []
    fit = CostModel.fit_profile.__func__

    def counting(cls, *args, **kwargs):
        calls.append(1)
        return fit(cls, *args, **kwargs)

    monkeypatch.setattr(CostModel, "fit_profile", classmethod(counting))
    first = CostModel.load(profile)
    second = CostModel.load(profile)
    assert len(calls) == 1 and (first.origin, second.origin) == ("fitted", "cache")
    specs = [GemmSpec(7, 64, 64), GemmSpec(300, 64, 64)]
    assert np.allclose(first.predict(specs).to_numpy(), second.predict(specs).to_numpy())
    assert second.meta["model_version"] == MODEL_VERSION and second.profile_hash == profile.content_hash()


def test_predicting_from_a_read_only_profile_writes_nothing_into_it(make_profile, tmp_path):
    from costmodel.measure.runtime import Runtime
    from sim.api import load_stored_cost_model
    from sim.predict.calibration import fitted_model

    root = tmp_path / "profiles"
    profile = make_profile(root)
    for path in [profile.path, *profile.path.iterdir()]:
        path.chmod(path.stat().st_mode & ~0o222)
    before = _snapshot(profile.path)
    try:
        model = load_stored_cost_model(profile.path)
        assert model.origin == "fitted" and CostModel.load(profile).origin == "cache"
        rt = Runtime.from_cfg({"device": "cpu", "dtype": "float32", "threads": None, "allocator": "steady", "seed": 0,
                               "profile": {"root": str(root)}, "timing": {"cold_cache": True},
                               "limits": {"cpu": {"max_flops": 1e9, "max_bytes": 1e9}}})
        assert fitted_model(rt, profile_id=profile.path.name).origin == "cache"
        assert _snapshot(profile.path) == before
    finally:
        profile.path.chmod(0o755)
