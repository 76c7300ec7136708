"""scripts/bench_l3_averaging.py: each experiment suite's own kernels are predicted held out by
L3 with single forms only and by L3 that may average its best forms, fitted on the same rows;
suites without layer kernels are no fold, and bad input is refused naming the field."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from gemm_profile import gemm_profile, gemm_row
from script_loader import loaded_script

from costmodel.families.gemm import GemmSpec
from costmodel.store.profile import DeviceProfile


@pytest.fixture(scope="module")
def script():
    yield from loaded_script("bench_l3_averaging")


@pytest.fixture
def profile(tmp_path) -> DeviceProfile:
    rows = [gemm_row(GemmSpec(int(m), 512, 512), "moe", "calibration") for m in (3, 24, 200)]
    rows += [gemm_row(GemmSpec(16, 128, 4096), "gemm_stride", "stride_pairs")]  # a bench-style suite: no layer kernels
    return gemm_profile(tmp_path / "profiles", rows)


def test_both_variants_predict_the_suites_own_kernels_from_the_same_rows(script, profile, tmp_path, capsys):
    out = tmp_path / "out"
    assert script.main([str(profile.path), "--out", str(out)]) == 0
    kernels = pd.read_csv(out / "kernels.csv")
    assert sorted(kernels["key"]) == sorted(GemmSpec(m, 512, 512).key() for m in (3, 24, 200))
    for variant in ("single", "averaged"):
        ratio = kernels[f"pred_{variant}_s"] / kernels["profiled_s"]
        assert ratio.between(0.5, 2.0).all(), (variant, ratio.tolist())
    assert not kernels["form_single"].str.startswith("avg:").any()  # single forms only
    assert (kernels["cv_averaged_chosen_pct"] <= kernels["cv_averaged_best_single_pct"]).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["suites"] == ["moe"]  # gemm_stride has no layer kernels, 'full' is the bench
    row = summary["per_suite"][0]
    expected = float((100 * (kernels["pred_averaged_s"] / kernels["profiled_s"] - 1).abs()).median())
    assert row["kernels"] == 3 and row["averaged_median_ape_pct"] == pytest.approx(expected)
    printed = capsys.readouterr().out
    assert "[1/1] moe: 3 kernels left out and predicted both ways" in printed and "pooled median APE: single" in printed
    # the summary is rebuilt from kernels.csv alone, fitting nothing
    (out / "summary.json").unlink()
    assert script.main(["--resummarise", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["per_suite"][0]["averaged_median_ape_pct"] == pytest.approx(expected)


def test_margin_takes_an_average_only_where_cv_puts_it_clearly_ahead(script):
    kernels = pd.DataFrame({"pred_single_s": [1.0, 1.0, 1.0], "pred_averaged_s": [2.0, 2.0, 2.0],
                            "form_single": ["gp", "gp", "gbm"], "form_averaged": ["avg:gp+gbm", "avg:gp+gbm", "gbm"],
                            "cv_averaged_chosen_pct": [9.0, 9.9, 8.0], "cv_averaged_best_single_pct": [10.0, 10.0, 8.0]})
    out = script.with_margin(kernels, margin=0.95)
    assert out["pred_margin_s"].tolist() == [2.0, 1.0, 1.0]  # 10% ahead: the average; 1% ahead: a near tie
    assert out["form_margin"].tolist() == ["avg:gp+gbm", "gp", "gbm"]


@pytest.mark.parametrize("argv, message", [
    (["PROFILE", "--suites", "gemm_stride"], "--suites: ['gemm_stride'] have no layer kernels in"),
    (["PROFILE", "--cv-folds", "1"], "--cv-folds must be >= 2, got 1"),
    ([], "give a profile folder (or --resummarise DIR)"),
    (["--resummarise", "PROFILE"], "--resummarise: "),
])
def test_bad_options_are_refused_naming_the_option(script, profile, argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        script.main([str(profile.path) if a == "PROFILE" else a for a in argv])
    assert err.value.code == 2
    assert message in capsys.readouterr().err


def test_a_folder_that_is_no_profile_is_refused(script, tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        script.main([str(tmp_path)])
    assert err.value.code == 2
    assert "not a profile folder (no measurements.csv)" in capsys.readouterr().err
