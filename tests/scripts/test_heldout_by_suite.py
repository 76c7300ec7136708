"""scripts/heldout_by_suite.py: each experiment suite's own kernels (calibration / paired /
design rows) are left out of the fit and predicted, its neighbours and refresh anchors stay
in, bench suites are never a fold, and an unknown suite is refused with the profile's suites."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from gemm_profile import gemm_profile, gemm_row as _row
from script_loader import loaded_script

from costmodel.families.gemm import GemmSpec
from costmodel.store.profile import DeviceProfile


@pytest.fixture(scope="module")
def script():
    yield from loaded_script("heldout_by_suite")


@pytest.fixture
def profile(tmp_path) -> DeviceProfile:
    own = [GemmSpec(int(m), 512, 512) for m in (3, 24, 200)]  # between the grid's K and N
    rows = [_row(s, "moe", "calibration") for s in own]
    rows += [_row(GemmSpec(48, 512, 512), "moe", "heldout_neighbour"), _row(GemmSpec(5, 64, 64), "moe", "refresh_anchor")]
    return gemm_profile(tmp_path / "profiles", rows)


def test_the_suites_own_kernels_are_left_out_and_predicted(script, profile, tmp_path, capsys):
    out = tmp_path / "out"
    assert script.main([str(profile.path), "--out", str(out)]) == 0
    kernels = pd.read_csv(out / "kernels.csv")
    # the three calibration GEMMs, not the neighbour (K=N=512, M=48) nor the refresh anchor
    assert sorted(kernels["key"]) == sorted(GemmSpec(m, 512, 512).key() for m in (3, 24, 200))
    assert set(kernels["suite"]) == {"moe"}  # 'full' is a bench suite: never a fold
    ratio = kernels["pred_L3_s"] / kernels["profiled_s"]
    assert ratio.between(0.5, 2.0).all(), ratio.tolist()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["suites"] == ["moe"] and summary["per_suite"][0]["kernels"] == 3
    assert "[1/1] moe: 3 kernels left out, fitted on" in capsys.readouterr().out


def test_an_unknown_suite_is_refused_naming_the_profiles_suites(script, profile, capsys):
    with pytest.raises(SystemExit) as err:
        script.main([str(profile.path), "--suites", "hf_moe"])
    assert err.value.code == 2
    assert "--suites: ['hf_moe'] not in" in capsys.readouterr().err


def test_tags_pick_which_rows_of_a_suite_are_left_out(script, profile, tmp_path):
    out = tmp_path / "out"
    assert script.main([str(profile.path), "--tags", "heldout_neighbour", "--out", str(out)]) == 0
    kernels = pd.read_csv(out / "kernels.csv")
    assert kernels["key"].tolist() == [GemmSpec(48, 512, 512).key()]  # the neighbour alone, not the calibration rows
    assert json.loads((out / "summary.json").read_text())["tags"] == ["heldout_neighbour"]


def test_tags_no_suite_has_are_refused(script, profile, capsys):
    with pytest.raises(SystemExit) as err:
        script.main([str(profile.path), "--tags", "design"])
    assert err.value.code == 2
    assert "--tags design: suites ['moe'] have no such rows" in capsys.readouterr().err


def test_a_family_only_the_suite_has_is_named_and_skipped_not_a_crash(script, profile, tmp_path, capsys):
    """The one-thread EPYC profile's `placement` suite holds the only `spmm` kernels: leaving them
    out left the fit without the family, and the whole script stopped at that fold."""
    from costmodel.families.softmax import SoftmaxSpec

    sm = [SoftmaxSpec(r, 64) for r in (8, 32)]
    profile.append_measurements([{"key": s.key(), "round": 0, **s.to_record(), "flops": s.flops(),
                                  "bytes_moved": s.bytes_moved(), "median_s": 2e-6 * s.rows, "iqr_s": 1e-8,
                                  "noisy": False, "suite": "moe", "tag": "calibration"} for s in sm])
    out = tmp_path / "out"
    assert script.main([str(profile.path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "moe: not predictable held out, fewer than 3 kernels left of softmax (0 left, 2 of moe's skipped)" in printed
    kernels = pd.read_csv(out / "kernels.csv")
    assert sorted(kernels["key"]) == sorted(GemmSpec(m, 512, 512).key() for m in (3, 24, 200))
