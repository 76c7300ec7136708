"""A bench script's runtime: conf/base.yaml's timing and limits with the script's own threads,
device and profile root."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from costmodel.measure.runtime import Runtime

BASE_YAML = Path(__file__).resolve().parents[3] / "conf" / "base.yaml"


def test_the_scripts_threads_and_profile_root_replace_base_yamls(tmp_path):
    before = torch.get_num_threads()
    try:
        rt = Runtime.from_base_yaml(BASE_YAML, threads=1, profile_root=tmp_path / "profiles")
        assert rt.profile_root == tmp_path / "profiles" and rt.fingerprint.threads == 1
        assert rt.device.type == "cpu" and rt.timing.rounds >= 1  # the rest is base.yaml's
    finally:
        torch.set_num_threads(before)


def test_a_bad_thread_count_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match="threads"):
        Runtime.from_base_yaml(BASE_YAML, threads=0, profile_root=tmp_path)
