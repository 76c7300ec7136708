"""Hydra launchers: plugin packages named when missing, measuring jobs never run side by
side on one machine, and real multiruns through joblib and submitit_local (predict-only,
on a copy of the committed CPU profile)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from costmodel import launchers

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf")
PROFILE_ID = "cpu-intel-r-xeon-r-processor-t2-float32-2862a8a0be"  # committed, cold-cache, every family
TINY_DESIGN = ["design.tokens=[16,64]", "design.d_model=[256]", "design.num_experts=[8]", "progress=false",
               f"profile.id={PROFILE_ID}", "measure=false"]


def _sim(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COLUMNS": "200",
           "MOEGNN_MODEL_CACHE": os.environ["MOEGNN_MODEL_CACHE"]}
    return subprocess.run([sys.executable, "-m", "sim", *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=env)


@pytest.fixture(scope="module")
def profile_copy(tmp_path_factory):
    """The committed profile, copied: predict-only runs may refit a stale model, never in the repo."""
    root = tmp_path_factory.mktemp("profiles")
    shutil.copytree(ROOT / "profiles" / PROFILE_ID, root / PROFILE_ID)
    return root


@pytest.mark.parametrize("argv, package", [
    (["-m", "experiment=moe_design", "hydra/launcher=joblib"], "hydra-joblib-launcher"),
    (["hydra/launcher=submitit_slurm"], "hydra-submitit-launcher"),
    (["override hydra/launcher=submitit_local"], "hydra-submitit-launcher"),
    (["hydra/launcher=slurm_node"], "hydra-submitit-launcher"),
])
def test_a_launcher_whose_plugin_is_missing_names_its_package(argv, package, monkeypatch):
    monkeypatch.setattr(launchers, "_installed", lambda module: False)
    message = launchers.missing_plugin_message(argv)
    assert message is not None and f"pip install {package}" in message


def test_installed_or_basic_launchers_pass(monkeypatch):
    assert launchers.missing_plugin_message(["hydra/launcher=joblib", "hydra/launcher=submitit_local"]) is None
    monkeypatch.setattr(launchers, "_installed", lambda module: False)
    assert launchers.missing_plugin_message(["hydra/launcher=basic", "experiment=moe_skew"]) is None


@pytest.fixture
def hydra_job():
    """Set Hydra's job config as a launcher would, for the given overrides."""
    def set_overrides(*overrides: str, mode: RunMode = RunMode.MULTIRUN) -> None:
        with initialize_config_dir(config_dir=CONF, version_base=None):
            cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
        cfg.hydra.mode = mode
        HydraConfig.instance().set_config(cfg)

    yield set_overrides
    HydraConfig.instance().cfg = None


@pytest.mark.parametrize("overrides, refused", [
    (["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], "joblib launcher runs hydra.launcher.n_jobs=2 jobs"),
    (["hydra/launcher=joblib"], "n_jobs=-1"),  # the plugin's default: every core
    (["hydra/launcher=joblib", "hydra.launcher.n_jobs=1"], None),
    (["hydra/launcher=submitit_local"], "submitit_local launcher starts every job at once"),
    (["hydra/launcher=slurm_node"], None),
    ([], None),  # basic launcher: one job after another
])
def test_measuring_jobs_refuse_launchers_that_share_this_machine(overrides, refused, hydra_job):
    hydra_job(*overrides)
    if refused is None:
        launchers.refuse_parallel_measuring("experiment=moe_skew")
    else:
        with pytest.raises(launchers.LauncherError, match=refused):
            launchers.refuse_parallel_measuring("experiment=moe_skew")


def test_a_single_run_ignores_the_configured_launcher(hydra_job):
    hydra_job("hydra/launcher=joblib", "hydra.launcher.n_jobs=2", mode=RunMode.RUN)
    launchers.refuse_parallel_measuring("experiment=moe_skew")  # no -m: runs in this process, alone


def test_slurm_node_is_one_exclusive_node_per_job():
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = compose("config", overrides=["hydra/launcher=slurm_node", "hydra.launcher.partition=gpu"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher") and launcher.partition == "gpu"
    assert launcher.nodes == 1 and launcher.tasks_per_node == 1 and launcher.additional_parameters.exclusive is True


def test_submitit_local_runs_a_two_job_predict_only_multirun(profile_copy, tmp_path):
    done = _sim("-m", "experiment=moe_design", "hydra/launcher=submitit_local", "design.top_k=[1],[2]",
                f"profile.root={profile_copy}", f"hydra.sweep.dir={tmp_path / 'multirun'}", *TINY_DESIGN, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summaries = sorted((tmp_path / "multirun").glob("*_moe_design/summary.json"))
    assert len(summaries) == 2
    top_k = [json.loads(p.read_text())["details"]["grid"]["top_k"] for p in summaries]
    assert top_k == [[1], [2]]
    assert list((tmp_path / "multirun" / ".submitit").iterdir())  # went through submitit, not the basic launcher


def test_joblib_runs_predict_only_jobs_in_parallel_and_refuses_measuring_ones(profile_copy, tmp_path):
    done = _sim("-m", "experiment=moe_design", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "design.top_k=[1],[2]",
                f"profile.root={profile_copy}", f"hydra.sweep.dir={tmp_path / 'predict'}", *TINY_DESIGN, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list((tmp_path / "predict").glob("*_moe_design/summary.json"))) == 2
    refused = _sim("-m", "experiment=mlp_batch", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                   "mlp.batches=[1],[2]", f"profile.root={tmp_path / 'never'}", f"hydra.sweep.dir={tmp_path / 'measure'}",
                   cwd=tmp_path)
    assert refused.returncode != 0
    assert "experiment=mlp_batch measures on this machine" in refused.stderr
    assert not (tmp_path / "never").exists()  # refused before calibrating anything
