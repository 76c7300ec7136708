"""experiments.run_provenance: the commit a run measured, whether the code differed, and when."""

from __future__ import annotations

import datetime as dt
import subprocess

import pandas as pd

from experiments.common import predict_only_summary
from experiments.run_provenance import run_provenance


def _git(repo, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_commit_dirty_code_and_profiles_that_are_data(tmp_path):
    repo = tmp_path / "repo"
    (repo / "profiles" / "p").mkdir(parents=True)
    (repo / "results" / "r").mkdir(parents=True)
    (repo / "results" / "r" / "summary.json").write_text("{}\n")
    (repo / "code.py").write_text("x = 1\n")
    (repo / "profiles" / "p" / "measurements.csv").write_text("a\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "first")
    head = _git(repo, "rev-parse", "--short", "HEAD")
    now = dt.datetime(2026, 12, 5, 9, 9, 0, tzinfo=dt.timezone.utc)

    assert run_provenance(repo, now) == {"commit": head, "dirty": False, "finished_at": "2026-12-05T09:09:00+00:00"}
    (repo / "profiles" / "p" / "measurements.csv").write_text("a\nb\n")  # a paired run wrote into the profile
    (repo / "results" / "r" / "summary.json").write_text('{"a": 1}\n')  # a bench script rewrote a committed result
    (repo / "notes.txt").write_text("untracked\n")
    assert run_provenance(repo, now)["dirty"] is False
    (repo / "code.py").write_text("x = 2\n")
    assert run_provenance(repo, now)["dirty"] is True


def test_outside_git_the_commit_is_unknown_not_guessed(tmp_path):
    info = run_provenance(tmp_path)
    assert info["commit"] is None and info["dirty"] is None
    assert dt.datetime.fromisoformat(info["finished_at"]).tzinfo is not None


def test_every_summary_carries_the_run():
    summ = predict_only_summary("x", "cpu", pd.DataFrame({"a": [1]}))
    assert set(summ["details"]["run"]) == {"commit", "dirty", "finished_at"}
