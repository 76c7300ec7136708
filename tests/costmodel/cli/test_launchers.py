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

from costmodel.cli import launchers

ROOT = Path(__file__).resolve().parents[3]
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
    assert refused.returncode == 2
    assert ("error: 2 of 2 jobs of this sweep measure on this machine (mlp.batches=[1]; mlp.batches=[2]), and the "
            "joblib launcher runs hydra.launcher.n_jobs=2 jobs at once here") in refused.stdout + refused.stderr
    assert "Traceback" not in refused.stdout + refused.stderr
    assert not (tmp_path / "never").exists()  # refused before calibrating anything
    assert not (tmp_path / "measure").exists()  # and before the launcher started any job


# ----------------------------------------------------------------------------- before the sweep starts (issue 28)


def _sweep(*overrides: str):
    """A -m sweep's config, as the launching process's sweep callback sees it."""
    from hydra.core.global_hydra import GlobalHydra

    return GlobalHydra.instance().hydra.compose_config("config", list(overrides), run_mode=RunMode.MULTIRUN,
                                                        with_log_configuration=False)


def _callback_outcome(caplog, *overrides: str) -> tuple[int | None, list[str]]:
    """(exit status or None when the sweep may start, error lines logged) of the sweep callback."""
    import logging

    from costmodel.cli.sweep_check import ValidateSweep

    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = _sweep(*overrides)
        with caplog.at_level(logging.INFO):
            try:
                ValidateSweep("experiments.common.validate_experiment", measures="sim.__main__.job_measures").on_multirun_start(cfg)
            except SystemExit as stop:
                return stop.code, [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    return None, [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


WAYS_OUT = ("Run the sweep with the basic launcher (drop hydra/launcher; jobs run one after another), with "
            "hydra.launcher.n_jobs=1, or one job per node with hydra/launcher=slurm_node; predict-only jobs "
            "(measure=false: moe_design, moe_skew, gnn_degree) may run in parallel.")


def test_a_parallel_sweep_of_measuring_jobs_is_refused_before_any_job(caplog, tmp_path):
    code, errors = _callback_outcome(caplog, "experiment=mlp_batch", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                                     "mlp.batches=[1],[2]", f"profile.root={tmp_path}")
    assert code == 2
    assert errors == [
        "error: 2 of 2 jobs of this sweep measure on this machine (mlp.batches=[1]; mlp.batches=[2]), and the joblib "
        "launcher runs hydra.launcher.n_jobs=2 jobs at once here: jobs timing at once share its cores and time each "
        "other, so no job was run. " + WAYS_OUT]
    assert not list(tmp_path.iterdir())


def test_submitit_local_with_one_measuring_job_among_predict_only_ones_is_refused(caplog, tmp_path):
    code, errors = _callback_outcome(caplog, "experiment=moe_skew", "hydra/launcher=submitit_local", "measure=true,false",
                                     f"profile.root={tmp_path}")
    assert code == 2
    assert errors == [
        "error: 1 of 2 jobs of this sweep measure on this machine (measure=True), and the submitit_local launcher "
        "starts every job at once on this machine: jobs timing at once share its cores and time each other, so no "
        "job was run. " + WAYS_OUT]


@pytest.mark.parametrize("overrides", [
    ["experiment=moe_skew", "measure=false", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],  # predicts only
    ["experiment=mlp_batch", "hydra/launcher=joblib", "hydra.launcher.n_jobs=1"],  # one job at a time
    ["experiment=mlp_batch"],  # the basic launcher: one after another
])
def test_predict_only_or_serial_sweeps_may_start(caplog, tmp_path, overrides):
    assert _callback_outcome(caplog, *overrides, "seed=0,1", f"profile.root={tmp_path}") == (None, [])


@pytest.mark.parametrize("launcher", [["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], []])
def test_measure_false_on_an_experiment_that_always_measures_is_refused_up_front(caplog, tmp_path, launcher):
    code, errors = _callback_outcome(caplog, "experiment=mlp_batch", "measure=true,false", *launcher,
                                     f"profile.root={tmp_path}")
    assert code == 2
    assert errors[0] == ("job measure=False: error: experiment=mlp_batch always measures; measure=false (predict only) "
                         "is supported by gnn_degree, gnn_partition, moe_design, moe_ep, moe_skew")


def test_a_parallel_bench_sweep_is_refused_before_any_job(caplog, tmp_path):
    import logging

    from hydra.core.global_hydra import GlobalHydra

    from costmodel.cli.sweep_check import ValidateSweep

    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = GlobalHydra.instance().hydra.compose_config(
            "bench", ["suite=quick", "bench.families=[sort],[gemm]", "hydra/launcher=submitit_local",
                      f"profile.root={tmp_path}"], run_mode=RunMode.MULTIRUN, with_log_configuration=False)
        with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as stop:
            ValidateSweep("costmodel.cli.bench_command.validate").on_multirun_start(cfg)
    assert stop.value.code == 2
    assert caplog.messages == [
        "error: 2 of 2 jobs of this sweep measure on this machine (bench.families=[sort]; bench.families=[gemm]), and "
        "the submitit_local launcher starts every job at once on this machine: jobs timing at once share its cores and "
        "time each other, so no job was run. " + WAYS_OUT]
