"""A stored fingerprint must be the one its id names: a fingerprint.json edited to claim
another device (an H100 with 64 threads over a CPU's numbers) is refused, by
``DeviceProfile`` and by ``python -m costmodel fleet``, and so is a profile folder not
named by its fingerprint's id."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from costmodel.cli import fleet
from costmodel.measure.device import Fingerprint, InconsistentFingerprintError, ProfileMismatchError
from costmodel.store.profile import DeviceProfile, ProfileError

ROOT = Path(__file__).resolve().parents[3]
WARM = "cpu-intel-r-xeon-r-processor-t2-float32-b3d5410f1a"  # a committed profile


def _lying_copy(root: Path) -> Path:
    """The committed profile with fingerprint.json edited to an H100 of 64 threads, its id kept."""
    dst = root / WARM
    shutil.copytree(ROOT / "profiles" / WARM, dst)
    file = dst / "fingerprint.json"
    data = json.loads(file.read_text())
    data.update(device_kind="cuda", device_name="NVIDIA H100 80GB HBM3", threads=64)
    file.write_text(json.dumps(data))
    return dst


def test_every_committed_profile_is_consistent():
    for file in sorted((ROOT / "profiles").glob("*/fingerprint.json")):
        fp = DeviceProfile.load(file.parent).fingerprint
        assert fp.id == file.parent.name == json.loads(file.read_text())["id"]


def test_a_round_trip_keeps_the_fingerprint_and_an_old_file_without_id_is_read():
    fp = DeviceProfile.load(ROOT / "profiles" / WARM).fingerprint
    assert Fingerprint.from_stored(fp.to_dict()) == fp
    no_id = {k: v for k, v in fp.to_dict().items() if k != "id"}
    assert Fingerprint.from_stored(no_id) == fp


def test_an_edited_fingerprint_is_refused_naming_the_file(tmp_path):
    dst = _lying_copy(tmp_path)
    with pytest.raises(InconsistentFingerprintError, match=rf"{dst / 'fingerprint.json'}: stored id '{WARM}' is not "
                                                            r"the id its fields give \('cuda-nvidia-h100"):
        DeviceProfile.load(dst)
    assert issubclass(InconsistentFingerprintError, ProfileMismatchError)


@pytest.mark.parametrize("change, message", [
    ({"threads": True}, "threads must be a positive integer, got True"),
    ({"threads": 0}, "threads must be a positive integer, got 0"),
    ({"device_kind": "tpu"}, "device_kind must be 'cpu' or 'cuda'"),
    ({"device_name": 5}, "device_name must be a non-empty string"),
    ({"colour": "red"}, r"unknown fingerprint field\(s\) \['colour'\]"),
])
def test_a_malformed_fingerprint_is_a_corrupted_profile(tmp_path, change, message):
    dst = tmp_path / WARM
    shutil.copytree(ROOT / "profiles" / WARM, dst)
    file = dst / "fingerprint.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **change}))
    with pytest.raises(ProfileError, match=f"fingerprint.json is corrupted: .*{message}"):
        DeviceProfile.load(dst)


def test_the_fleet_lists_neither_a_lying_nor_a_renamed_profile(tmp_path):
    root = tmp_path / "root"
    lying = _lying_copy(root / "lab-a")
    renamed = root / "lab-b" / "my-fast-gpu"
    shutil.copytree(ROOT / "profiles" / WARM, renamed)
    with pytest.raises(InconsistentFingerprintError):
        fleet.load_device(lying)
    with pytest.raises(ProfileError, match=r"my-fast-gpu: the folder's name is not its fingerprint's id "
                                           rf"'{WARM}'"):
        fleet.load_device(renamed)
    with pytest.raises(fleet.FleetError, match="all 2 were skipped"):  # neither is counted as a device
        fleet.load_fleet(root)
