"""Device profile: atomic rows, resume without duplicates, fingerprints never mixed."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from costmodel.device import ProfileMismatchError, fingerprint
from costmodel.profile import DeviceProfile, ProfileError


def _row(key: str, round_: int, median: float) -> dict:
    return {"key": key, "round": round_, "family": "sort", "n": 4, "dtype": "int64", "median_s": median,
            "iqr_s": 0.1 * median, "noisy": False, "flops": 0.0, "bytes_moved": 96.0}


@pytest.fixture
def profile(tmp_path):
    return DeviceProfile.open(tmp_path, fingerprint(torch.device("cpu"), "float32"))


def test_rows_are_deduplicated_by_kernel_and_round(profile):
    assert profile.append_measurements([_row("a", 0, 1.0), _row("a", 1, 3.0)]) == 2
    assert profile.append_measurements([_row("a", 0, 99.0), _row("b", 0, 2.0)]) == 1  # a/0 kept, b/0 added
    raw = profile.measurements()
    assert len(raw) == 3 and raw.loc[raw["key"] == "a", "median_s"].tolist() == [1.0, 3.0]
    assert profile.measured_rounds() == {("a", 0), ("a", 1), ("b", 0)}
    profile.append_measurements([_row("a", 0, 5.0)], replace=True)
    assert sorted(profile.measurements().query("key == 'a'")["median_s"]) == [3.0, 5.0]


def test_kernels_combine_rounds(profile):
    profile.append_measurements([_row("a", 0, 1.0), _row("a", 1, 3.0), _row("a", 2, 2.0), _row("b", 0, 5.0)])
    k = profile.kernels().set_index("key")
    assert k.loc["a", "median_s"] == 2.0 and k.loc["a", "rounds"] == 3
    assert k.loc["a", "round_cv"] == pytest.approx(0.5)  # std(1,3,2) / mean = 1 / 2
    assert k.loc["b", "rounds"] == 1 and k.loc["b", "round_cv"] == 0.0


def test_another_fingerprint_is_refused(profile, tmp_path):
    other = replace(profile.fingerprint, threads=profile.fingerprint.threads + 7)
    folder = profile.path
    (folder / "fingerprint.json").write_text((folder / "fingerprint.json").read_text().replace(
        f'"threads": {profile.fingerprint.threads}', f'"threads": {other.threads}'))
    with pytest.raises(ProfileMismatchError, match="threads"):
        DeviceProfile.open(tmp_path, profile.fingerprint)
    with pytest.raises(ProfileMismatchError, match="threads"):
        DeviceProfile.load(folder, expected=profile.fingerprint)


def test_missing_and_corrupted_profiles_are_clear_errors(profile, tmp_path):
    with pytest.raises(ProfileError, match="run `python -m costmodel bench` first"):
        DeviceProfile.open(tmp_path / "empty", profile.fingerprint, create=False)
    (profile.path / "measurements.csv").write_text("key,family\n\"unterminated\n")
    with pytest.raises(ProfileError, match="corrupted"):
        profile.measurements()
    (profile.path / "measurements.csv").write_text("key,round,family,median_s\na,0,sort,-1\n")
    with pytest.raises(ProfileError, match="median_s must be a positive number"):
        profile.measurements()


def test_content_hash_changes_with_data(profile):
    before = profile.content_hash()
    profile.append_measurements([_row("a", 0, 1.0)])
    assert profile.content_hash() != before
