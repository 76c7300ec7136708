"""Device profile: atomic rows, resume without duplicates, fingerprints never mixed."""

from __future__ import annotations

import os
import stat
from dataclasses import replace

import pytest
import torch

from costmodel.families.sort import SortSpec
from costmodel.measure.device import ProfileMismatchError, fingerprint
from costmodel.store.profile import DeviceProfile, ProfileError

SIZES = {"a": 4, "b": 8, "c": 16}


def _row(name: str, round_: int, median: float) -> dict:
    spec = SortSpec(SIZES[name])
    return {"key": spec.key(), "round": round_, **spec.to_record(), "median_s": median, "iqr_s": 0.1 * median,
            "noisy": False, "flops": 0.0, "bytes_moved": spec.bytes_moved()}


def _key(name: str) -> str:
    return SortSpec(SIZES[name]).key()


@pytest.fixture
def profile(tmp_path):
    return DeviceProfile.open(tmp_path, fingerprint(torch.device("cpu"), "float32"))


def test_rows_are_deduplicated_by_kernel_and_round(profile):
    assert profile.append_measurements([_row("a", 0, 1.0), _row("a", 1, 3.0)]) == 2
    assert profile.append_measurements([_row("a", 0, 99.0), _row("b", 0, 2.0)]) == 1  # a/0 kept, b/0 added
    raw = profile.measurements()
    assert len(raw) == 3 and raw.loc[raw["key"] == _key("a"), "median_s"].tolist() == [1.0, 3.0]
    assert profile.measured_rounds() == {(_key("a"), 0), (_key("a"), 1), (_key("b"), 0)}
    profile.append_measurements([_row("a", 0, 5.0)], replace=True)
    assert sorted(profile.measurements().query(f"key == '{_key('a')}'")["median_s"]) == [3.0, 5.0]
    # replace="key": a re-measurement supersedes every older round of its kernels, not only its own rounds
    profile.append_measurements([_row("a", 0, 7.0)], replace="key")
    assert profile.measurements().query(f"key == '{_key('a')}'")["median_s"].tolist() == [7.0]
    assert profile.measured_rounds() == {(_key("a"), 0), (_key("b"), 0)}
    with pytest.raises(ValueError, match="replace must be False, True or 'key'"):
        profile.append_measurements([_row("a", 0, 7.0)], replace="round")


def test_kernels_combine_rounds(profile):
    profile.append_measurements([_row("a", 0, 1.0), _row("a", 1, 3.0), _row("a", 2, 2.0), _row("b", 0, 5.0)])
    k = profile.kernels().set_index("key")
    assert k.loc[_key("a"), "median_s"] == 2.0 and k.loc[_key("a"), "rounds"] == 3
    assert k.loc[_key("a"), "round_cv"] == pytest.approx(0.5)  # std(1,3,2) / mean = 1 / 2
    assert k.loc[_key("b"), "rounds"] == 1 and k.loc[_key("b"), "round_cv"] == 0.0


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
    (profile.path / "measurements.csv").write_text("key,family\na,sort\n")
    with pytest.raises(ProfileError, match=r"measurements.csv:1: missing columns \['round', 'median_s'\]"):
        profile.measurements()


def test_content_hash_changes_with_data(profile):
    before = profile.content_hash()
    profile.append_measurements([_row("a", 0, 1.0)])
    assert profile.content_hash() != before


def test_profile_root_that_is_a_file_is_a_clear_error(tmp_path):
    (tmp_path / "root").write_text("not a folder")
    fp = fingerprint(torch.device("cpu"), "float32")
    for root in (tmp_path / "root", tmp_path / "root" / "deeper"):
        for create in (True, False):
            with pytest.raises(ProfileError, match=r"profile.root=.*root(/deeper)? cannot be a folder: .*root is a file"):
                DeviceProfile.open(root, fp, create=create)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_root_is_refused_before_any_work(tmp_path):
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o555)
    try:
        with pytest.raises(ProfileError, match=r"cannot create this device's profile: profile.root=.* is not writable"):
            DeviceProfile.open(root, fingerprint(torch.device("cpu"), "float32"))
    finally:
        root.chmod(0o755)


def test_unwritable_profile_folder_is_a_clear_error(profile, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(profile.path))

    monkeypatch.setattr("costmodel.store.profile.tempfile.mkstemp", refuse)
    with pytest.raises(ProfileError, match=r"cannot measure here: profile folder .* is not writable \(Permission denied"):
        profile.require_writable("measure here")


def test_written_files_keep_the_umask_read_bits(profile):
    old = os.umask(0o022)
    try:
        profile.append_measurements([_row("a", 0, 1.0)])
        profile.add_provenance({"command": "test"})
    finally:
        os.umask(old)
    for name in ("measurements.csv", "provenance.json"):
        assert stat.S_IMODE((profile.path / name).stat().st_mode) == 0o644


def test_reading_never_changes_a_file(profile):
    profile.append_measurements([_row("a", 0, 1.0), _row("b", 0, 2.0)])
    file = profile.path / "measurements.csv"
    with file.open("a") as f:
        f.write("garbage,row\n")
    before = file.read_bytes()
    assert len(profile.measurements()) == 2 and len(profile.rejected()) == 1
    profile.kernels(), profile.measured_rounds(), profile.content_hash()
    assert file.read_bytes() == before


def test_a_write_moves_rejected_rows_aside_and_they_are_measured_again(profile):
    profile.append_measurements([_row("a", 0, 1.0), _row("b", 0, 2.0)])
    file = profile.path / "measurements.csv"
    text = file.read_text()
    file.write_text(text[: text.rindex(",False,")])  # the last row (b) cut mid-row
    assert profile.measured_rounds() == {(_key("a"), 0)}  # so a bench measures b again
    assert profile.append_measurements([_row("b", 0, 2.5)]) == 1
    assert sorted(profile.measurements()["median_s"]) == [1.0, 2.5] and profile.rejected() == []
    rejected = (profile.path / "rejected.csv").read_text()
    assert "line" in rejected and "cut short" in rejected and _key("b") in rejected


def test_skipped_and_provenance_merge_and_survive_corruption(profile):
    profile.record_skipped([{"key": "k1", "family": "gemm", "reason": "too big"}])
    profile.record_skipped([{"key": "k2", "family": "gemm", "reason": "too slow"},
                            {"key": "k1", "family": "gemm", "reason": "out of memory"}])
    assert dict(zip(profile.skipped()["key"], profile.skipped()["reason"])) == {"k1": "out of memory", "k2": "too slow"}
    profile.add_provenance({"command": "one"})
    (profile.path / "provenance.json").write_text("[{\"command\": \"o")  # cut mid-write by an older version
    with pytest.raises(ProfileError, match="provenance.json is corrupted"):
        profile.provenance()
    profile.add_provenance({"command": "two"})
    assert [r["command"] for r in profile.provenance()] == ["two"]
    assert len(list(profile.path.glob("provenance.json.corrupted-*"))) == 1


def test_ceilings_written_first_are_kept_unless_replaced(profile):
    assert profile.write_ceilings({"peak_flops_per_s": 1.0}, replace=False) == {"peak_flops_per_s": 1.0}
    assert profile.write_ceilings({"peak_flops_per_s": 2.0}, replace=False) == {"peak_flops_per_s": 1.0}
    assert profile.write_ceilings({"peak_flops_per_s": 3.0}) == profile.ceilings() == {"peak_flops_per_s": 3.0}


UPDATER = """
import sys, time
from costmodel.store.profile import DeviceProfile
profile = DeviceProfile.load(sys.argv[1])  # the folder itself: its fingerprint is the test's, whatever this process's
def bump(c):
    time.sleep(0.01)  # widen the window between read and write
    return {**c, "n": c.get("n", 0) + 1}
for _ in range(15):
    profile.update_ceilings(bump)
"""


def test_update_ceilings_loses_no_update_of_concurrent_writers(profile):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", UPDATER, str(profile.path)], cwd=root, env=env,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    assert profile.ceilings()["n"] == 30  # read-modify-write under one lock: 2 x 15 increments, none lost
    before, after = profile.update_ceilings(lambda c: {**c, "n": c["n"] + 1})
    assert (before["n"], after["n"], profile.ceilings()["n"]) == (30, 31, 31)


def test_temp_files_of_a_killed_writer_are_removed_by_the_next_writer(profile):
    stale = profile.path / ".measurements.csv.abc123.tmp"
    stale.write_text("half a file")
    profile.append_measurements([_row("a", 0, 1.0)])
    assert not stale.exists()


def test_dropping_replaced_rows_keeps_newer_rows_and_never_empties_a_kernel(profile):
    old = [{**_row(n, r, 1.0), "measured_at": "2026-12-01T10:00:00"} for n in ("a", "b") for r in (0, 1, 2)]
    profile.append_measurements(old + [{**_row("c", 0, 1.0), "measured_at": "2026-12-01T10:00:00"}])
    profile.append_measurements([{**_row("a", 0, 2.0), "measured_at": "2026-12-07T11:00:00"}], replace=True)
    # a: its round 0 re-measured, rounds 1-2 from before go; b and c were not re-measured: kept whole
    assert profile.drop_measurements({_key("a"), _key("b")}, measured_before="2026-12-07T11:00:00") == 2
    raw = profile.measurements()
    assert raw.loc[raw["key"] == _key("a"), "median_s"].tolist() == [2.0]
    assert (raw["key"] == _key("b")).sum() == 3 and (raw["key"] == _key("c")).sum() == 1
    assert profile.drop_measurements({_key("a")}, measured_before="2026-12-07T11:00:00") == 0
