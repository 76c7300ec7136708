"""scripts/noise_floor.py: the cross-run oracle and the within-run floor on hand-made runs."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from script_loader import loaded_script



@pytest.fixture(scope="module")
def noise_floor():
    yield from loaded_script("noise_floor")


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
    table = noise_floor.floor_table(noise_floor.load_runs(dirs), max_limit_pct=15.0)
    table = table.assign(run=[Path(r).name for r in table["run"]]).set_index("run")
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
    # phase-blind: the medians 1.75 and 3.5 as they are, against 1.0 and 2.2: APEs 75% and 59.09%
    assert table.loc["A", "blind_max_pct"] == pytest.approx(75.0)
    assert table.loc["A", "blind_median_pct"] == pytest.approx((75.0 + 100 * 1.3 / 2.2) / 2)
    # C sits at the other two's median (1.5 = median of 1.0, 2.0): the blind oracle is exact there
    assert table.loc["C", "blind_max_pct"] == pytest.approx(100 * abs(3.1 - 3.0) / 3.0)


def test_missing_results_or_columns_are_named(noise_floor, tmp_path):
    with pytest.raises(noise_floor.BadInput, match="no results.csv"):
        noise_floor.load_runs([tmp_path])
    (tmp_path / "results.csv").write_text("label,value\nloop,0\n")
    with pytest.raises(noise_floor.BadInput, match="missing column.*param.*measured_s"):
        noise_floor.load_runs([tmp_path])


# ----------------------------------------------------------------------------- bad input (issue 28)


def _run_rows(measured: list, **extra) -> pd.DataFrame:
    n = len(measured)
    return pd.DataFrame({"label": ["loop"] * n, "param": ["exponent"] * n, "value": [float(i) for i in range(n)],
                         "measured_s": measured, "pred_L3_s": [1.0] * n, "round_cv": [0.1] * n,
                         "rounds_timed": [3] * n, **extra})


@pytest.mark.parametrize("column, value, shown", [
    ("measured_s", 0.0, "0.0"), ("measured_s", -1.0, "-1.0"), ("measured_s", float("nan"), "nan"),
    ("measured_s", float("inf"), "inf"), ("measured_s", "fast", "'fast'"), ("pred_L3_s", 0.0, "0.0"),
    ("round_cv", -0.5, "-0.5"), ("rounds_timed", 0, "0"), ("rounds_timed", 2.5, "2.5"),
])
def test_values_out_of_range_name_the_file_column_and_line(noise_floor, tmp_path, column, value, shown):
    df = _run_rows([1.0, 2.0, 3.0])
    df[column] = df[column].astype(object)
    df.loc[1, column] = value
    (tmp_path / "r").mkdir()
    df.to_csv(tmp_path / "r" / "results.csv", index=False)
    with pytest.raises(noise_floor.BadInput, match=rf"r/results.csv: column {column} must be .* 1 row\(s\) are not: "
                                         rf"line 3: {re.escape(shown)}$"):
        noise_floor.load_runs([tmp_path / "r"])


@pytest.mark.parametrize("text, message", [
    ("", "is empty"),
    ("label,param,value,measured_s,pred_L3_s,round_cv\n", "has a header but no rows"),
])
def test_an_empty_or_header_only_file_is_named(noise_floor, tmp_path, text, message):
    (tmp_path / "results.csv").write_text(text)
    with pytest.raises(noise_floor.BadInput, match=f"results.csv: {message}"):
        noise_floor.load_runs([tmp_path])


def test_exact_duplicate_rows_count_once_and_conflicting_ones_are_refused(noise_floor, tmp_path, capsys):
    (tmp_path / "r").mkdir()
    df = _run_rows([1.0, 2.0])
    pd.concat([df, df.iloc[[1]]]).to_csv(tmp_path / "r" / "results.csv", index=False)
    runs = noise_floor.load_runs([tmp_path / "r"])
    assert len(runs[str(tmp_path / "r")]) == 2
    assert "dropped 1 exact duplicate row(s) (lines [4])" in capsys.readouterr().err
    other = df.iloc[[1]].assign(measured_s=5.0)
    pd.concat([df, other]).to_csv(tmp_path / "r" / "results.csv", index=False)
    with pytest.raises(noise_floor.BadInput, match=r"repeats with different values on lines \[3, 4\]"):
        noise_floor.load_runs([tmp_path / "r"])


def test_runs_in_folders_of_the_same_name_stay_apart(noise_floor, tmp_path, capsys):
    dirs = []
    for lab, m in (("a", 1.0), ("b", 2.0), ("c", 1.5)):
        (tmp_path / lab).mkdir()
        dirs.append(write_run(tmp_path / lab, "moe_v1", [m, 2 * m], [m, 2 * m]))
    runs = noise_floor.load_runs(dirs + [dirs[0]])  # the first given twice: counted once
    assert list(runs) == [str(d) for d in dirs]
    assert "counted once" in capsys.readouterr().err
    table = noise_floor.floor_table(runs, max_limit_pct=15.0)
    assert len(table) == 3 and table["oracle_points"].tolist() == [2, 2, 2]


@pytest.mark.parametrize("args, message", [
    (["--max-limit", "nan"], "--max-limit must be a finite percentage > 0, got nan"),
    (["--max-limit", "inf"], "--max-limit must be a finite percentage > 0, got inf"),
    (["--max-limit", "-5"], "--max-limit must be a finite percentage > 0, got -5"),
    (["--median-limit", "-1"], "--median-limit must be a finite percentage > 0, got -1"),
    (["--median-limit", "0"], "--median-limit must be a finite percentage > 0, got 0"),
    (["--p90-limit", "nan"], "--p90-limit must be a finite percentage > 0, got nan"),
])
def test_limits_must_be_finite_and_positive(noise_floor, tmp_path, monkeypatch, capsys, args, message):
    run = write_run(tmp_path, "A", [1.0, 2.0], [1.0, 2.0])
    monkeypatch.setattr("sys.argv", ["noise_floor.py", str(run), *args])
    with pytest.raises(SystemExit) as stop:
        noise_floor.main()
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"noise_floor.py: error: {message}\n"


@pytest.mark.parametrize("text, message", [
    ("", "results.csv: is empty (no header, no rows); give a run directory whose experiment finished"),
    ("label,param,value,measured_s,pred_L3_s,round_cv\n",
     "results.csv: has a header but no rows; give a run directory whose experiment finished"),
    ("label,param,value,measured_s,pred_L3_s,round_cv\nloop,exponent,0,fast,1e-3,0.1\n",
     "results.csv: column measured_s must be a finite number > 0 in every row; 1 row(s) are not: line 2: 'fast'"),
    ("label,param,value,measured_s,pred_L3_s,round_cv\nloop,exponent,0,1e-3,1e-3,lots\n",
     "results.csv: column round_cv must be a finite number >= 0 in every row; 1 row(s) are not: line 2: 'lots'"),
])
def test_the_command_line_names_a_bad_results_file_in_one_line_with_exit_status_2(
        noise_floor, tmp_path, monkeypatch, capsys, text, message):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.csv").write_text(text)
    monkeypatch.setattr("sys.argv", ["noise_floor.py", str(tmp_path / "run")])
    with pytest.raises(SystemExit) as stop:
        noise_floor.main()
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"noise_floor.py: error: {tmp_path / 'run'}/{message}\n"


def test_an_out_path_that_is_a_file_is_refused_before_any_work(noise_floor, tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path, "A", [1.0, 2.0], [1.0, 2.0])
    (tmp_path / "taken").write_text("")
    monkeypatch.setattr(noise_floor, "floor_table", lambda *a: pytest.fail("computed before refusing --out"))
    monkeypatch.setattr("sys.argv", ["noise_floor.py", str(run), "--out", str(tmp_path / "taken" / "sub")])
    with pytest.raises(SystemExit) as stop:
        noise_floor.main()
    assert stop.value.code == 2
    assert capsys.readouterr().err == (f"noise_floor.py: error: --out {tmp_path / 'taken' / 'sub'} must be a folder "
                                       f"(created if missing), but {tmp_path / 'taken'} is a file\n")


def _git(repo: Path, *args: str) -> None:
    import os
    import subprocess
    dated = {"GIT_AUTHOR_DATE": "2020-01-01T12:00:00", "GIT_COMMITTER_DATE": "2020-01-01T12:00:00"}
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True, env={**os.environ, **dated})


def test_history_takes_every_committed_version_and_keys_a_sweep_without_labels(noise_floor, tmp_path):
    repo = tmp_path / "repo"
    folder = repo / "results" / "cpu" / "moe_ep"
    folder.mkdir(parents=True)
    _git(repo, "init", "-q")
    for measured in (1.0, 2.0):
        pd.DataFrame({"point": [0, 0], "value": [0.0, 0.0], "placement": ["contiguous", "eplb"],
                      "backend": ["loop", "loop"], "measured_s": [measured, measured / 2],
                      "pred_L3_s": [1.0, 0.5], "round_cv": [0.1, 0.1]}).to_csv(folder / "results.csv", index=False)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"run {measured}")
    dirs = noise_floor.history_runs(folder, tmp_path / "out")
    assert len(dirs) == 2 and all(d.name.startswith("moe_ep@") for d in dirs)
    runs = noise_floor.load_runs(dirs)
    newest = runs[str(dirs[0])]
    assert list(newest.index) == [("contiguous/loop", "value", 0.0), ("eplb/loop", "value", 0.0)]
    assert newest["measured_s"].tolist() == [2.0, 1.0]  # newest first
    with pytest.raises(noise_floor.BadInput, match="holds no version of .* committed since 2021-01-01"):
        noise_floor.history_runs(folder, tmp_path / "none", since="2021-01-01")
