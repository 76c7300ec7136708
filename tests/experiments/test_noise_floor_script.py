"""scripts/noise_floor.py: the cross-run oracle and the within-run floor on hand-made runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "noise_floor.py"


@pytest.fixture(scope="module")
def noise_floor():
    spec = importlib.util.spec_from_file_location("noise_floor", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_run(root: Path, name: str, measured: list[float], pred: list[float]) -> Path:
    d = root / name
    d.mkdir()
    pd.DataFrame({"label": ["loop", "loop"], "param": ["exponent"] * 2, "value": [0.0, 1.0],
                  "measured_s": measured, "pred_L3_s": pred, "round_cv": [0.1, 0.0],
                  "rounds_timed": [3, 3]}).to_csv(d / "results.csv", index=False)
    return d


def test_oracle_uses_the_other_runs_median_and_this_runs_drift(noise_floor, tmp_path):
    dirs = [write_run(tmp_path, "A", [1.0, 2.2], [1.1, 2.2]), write_run(tmp_path, "B", [2.0, 4.0], [2.0, 4.0]),
            write_run(tmp_path, "C", [1.5, 3.0], [1.5, 3.0])]
    table = noise_floor.floor_table(noise_floor.load_runs(dirs), max_limit_pct=15.0).set_index("run")
    # A: B and C give medians 1.75 and 3.5; A's drift is the median of 1/1.75 and 2.2/3.5 = 0.6,
    # so the oracle says 1.05 and 2.1: APEs 5% and 4.545%
    assert table.loc["A", "oracle_max_pct"] == pytest.approx(5.0)
    assert table.loc["A", "oracle_median_pct"] == pytest.approx((5.0 + 100 * 0.1 / 2.2) / 2)
    assert table.loc["A", "L3_max_pct"] == pytest.approx(10.0)
    # within the run: one point with sigma sqrt(pi/2) * 0.1 / sqrt(3), one noiseless
    sigma = (3.141592653589793 / 2) ** 0.5 * 0.1 / 3 ** 0.5
    assert table.loc["A", "floor_max_median_pct"] == pytest.approx(100 * 0.6744898 * sigma, rel=1e-5)
    # L3 is 10% off at the noisy point (2 sigma = 14.5%): within the noise; the other point has no estimate
    assert table.loc["A", "L3_share_beyond_2_sigma"] == 0.0
    assert table.loc["A", "oracle_share_beyond_2_sigma"] == 0.0  # 5% against 14.5%


def test_missing_results_or_columns_are_named(noise_floor, tmp_path):
    with pytest.raises(SystemExit, match="no results.csv"):
        noise_floor.load_runs([tmp_path])
    (tmp_path / "results.csv").write_text("label,value\nloop,0\n")
    with pytest.raises(SystemExit, match="missing column.*param.*measured_s"):
        noise_floor.load_runs([tmp_path])
