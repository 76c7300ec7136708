"""A predict-only run (``measure=false``: ``sim.predict.calibration.fitted_model``) writes nothing
into a profile folder, even one holding models an older version of this code saved there
(models.json / models.joblib of another content): the models are refitted in memory and
cached in the user's model cache; a read-only profile is no error (issue 28)."""

from __future__ import annotations

import hashlib
import json

import joblib
import pytest
import torch

import costmodel.store.profile as profile_module
from costmodel.measure.allocator import configure_allocator
from costmodel.measure.device import fingerprint
from costmodel.measure.runtime import Runtime
from costmodel.store.profile import DeviceProfile


def _snapshot(folder) -> dict[str, tuple[int, int, str]]:
    """Every entry under ``folder`` (hidden ones too): size, mtime, content hash (files)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        st = path.stat()
        out[str(path.relative_to(folder))] = (st.st_size, st.st_mtime_ns,
                                              hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "")
    return out


def test_predict_only_on_a_read_only_profile_with_stale_models_writes_nothing(fill_gemms, tmp_path, monkeypatch):
    from sim.predict.calibration import fitted_model

    monkeypatch.setenv("MOEGNN_MODEL_CACHE", str(tmp_path / "model_cache"))  # empty: every load below fits first
    root = tmp_path / "profiles"
    configure_allocator("steady")
    profile = DeviceProfile.open(root, fingerprint(torch.device("cpu"), "float32"))
    fill_gemms(profile, 30)
    # what older code left beside the measurements: models of another profile content
    joblib.dump({"levels": {}, "ceilings": {}}, profile.path / "models.joblib")
    (profile.path / "models.json").write_text(json.dumps({"profile_hash": "stale", "model_version": 1}))
    for path in [profile.path, *profile.path.iterdir()]:
        path.chmod(path.stat().st_mode & ~0o222)

    def read_only(*args, **kwargs):  # this test may run as root, whom chmod does not stop
        raise PermissionError(13, "Permission denied (read-only profile in this test)")

    monkeypatch.setattr(profile_module, "atomic_write_bytes", read_only)
    monkeypatch.setattr(profile_module, "file_lock", read_only)
    before = _snapshot(root)
    rt = Runtime.from_cfg({"device": "cpu", "dtype": "float32", "threads": None, "allocator": "steady", "seed": 0,
                           "profile": {"root": str(root)}, "timing": {"cold_cache": True},
                           "limits": {"cpu": {"max_flops": 1e9, "max_bytes": 1e9}}})
    try:
        own = fitted_model(rt)  # this device's profile (profile.id null)
        assert own.origin == "fitted" and own.meta["n_rows"] == len(profile.kernels()) == 27
        assert fitted_model(rt, profile_id=profile.path.name).origin == "cache"  # profile.id=<folder>
        assert _snapshot(root) == before
        assert list((tmp_path / "model_cache").iterdir())  # the fit went to the user's cache instead
    finally:
        for path in [profile.path, *profile.path.iterdir()]:
            path.chmod(path.stat().st_mode | 0o200)
