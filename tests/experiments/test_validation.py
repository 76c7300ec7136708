"""Every experiment's ``validate(cfg)``: bad keys named with their range before any work,
no side effects, and a ``-m`` sweep's jobs all checked before the first one runs."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode

import sim.workloads.memory as memory
from costmodel.cli.sweep_check import check_jobs, job_overrides
from experiments.common import validate_experiment
from tests.experiments.test_experiments import CONF, EXPERIMENTS, _cfg

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_validates_its_tiny_config_without_side_effects(name, tmp_path):
    threads = torch.get_num_threads()
    importlib.import_module(f"experiments.{name}").validate(_cfg(name, tmp_path / "profiles", "threads=1"))
    assert torch.get_num_threads() == threads  # validation sets nothing: a sweep validates jobs side by side
    assert not (tmp_path / "profiles").exists()


#: the placement experiment's two devices, the first with memory_bytes set to a bad value
_DEVICES = ("placement.device_sets.homogeneous=[{name:a,threads:1,cores:[0],memory_bytes:%s},"
            "{name:b,threads:1,cores:[1],memory_bytes:null}]")


@pytest.mark.parametrize(
    "name, overrides, message",
    [
        ("moe_skew", ["routing.capacity_factor=big"], r"routing.capacity_factor must be a number > 0 \(such as 1.25\) or null, got 'big'"),
        ("moe_skew", ["routing.capacity_factor=nan"], r"routing.capacity_factor must be a number > 0 .* or null, got nan"),
        ("moe_skew", ["+routing.generator.alpha=2"], r"routing.generator: sim.workloads.routing.ZipfRouting takes no key 'alpha'; "
                                                     r"allowed: \['exponent'\]"),
        ("moe_skew", ["routing.sweep.param=alpha"], r"routing.sweep.param must be one of \['exponent'\]"),
        ("moe_skew", ["routing.sweep.values=[]"], r"routing.sweep.values must list at least one value"),
        ("moe_skew", ["moe.backends=paddd"], r"moe.backend must be one of \['loop', 'padded', 'grouped'\] \(the backends registered in sim/workloads/backends/moe.py\), got 'paddd'"),
        ("moe_skew", ["moe.d_model=1000000", "moe.d_ff=2048", "moe.num_experts=16"], r"the MoE layers of moe_skew .* need at least [\d,.]+ GB .* reduce moe.d_model"),
        ("moe_skew", ["threads=0"], r"threads must be a positive integer \(>= 1\) or null"),
        ("moe_skew", ["timing.min_runs=abc"], r"timing.min_runs must be an integer, got 'abc'"),
        ("moe_skew", ["+timing.repeats=3"], r"timing.repeats must not be set \(timing takes only \[.*'min_runs'.*\]\), got 3"),
        ("moe_skew", ["per_kernel.iterations=0"], r"per_kernel.iterations must be a positive integer"),
        ("moe_skew", ["seed=-1"], r"seed must be a non-negative integer"),
        ("gnn_degree", ["+graph.generator.sizes=[10,20]"], r"graph.generator: sim.workloads.graphs.rmat takes no key 'sizes'; "
                                                           r"allowed: \['a', 'b', 'c', 'd', 'permute'\]"),
        ("gnn_degree", ["+graph.options.directed=true"], r"graph.options: unknown option 'directed'; allowed: "
                                                         r"\['undirected', 'remove_self_loops', 'dedup'\]"),
        ("gnn_degree", ["graph.options.dedup=maybe"], r"graph.options.dedup must be true or false"),
        ("gnn_degree", ["gnn.num_nodes=100000000", "gnn.num_edges=1000000000"], r"GNN layers of gnn_degree .* reduce gnn.num_nodes"),
        ("mlp_batch", ["mlp.d_model=1000000", "mlp.d_hidden=1000000"], r"the MLP of mlp_batch .* reduce mlp.d_model"),
        ("gemm_same_flops", ["gemm.flops_levels=[0.5,2.0]"], r"gemm.flops_levels must be a non-empty list of fractions in \(0, 1\]"),
        ("gemm_same_flops", ["gemm.max_operand_bytes=-5"], r"gemm.max_operand_bytes must be an integer >= 1024"),
        ("flops_spectrum", ["spectrum.moe.tokens=[0]"], r"spectrum.moe.tokens must be a positive integer"),
        ("flops_spectrum", ["spectrum.gnn.skewed_a=1.5"], r"spectrum.gnn.skewed_a must be an R-MAT a in \[0, 1\]"),
        ("roofline", ["roofline.results_globs=[1,2]"], r"roofline.results_globs must be a glob or a list of globs"),
        ("placement", [_DEVICES % "0"], r"placement.device_sets.homogeneous\[0\].memory_bytes \(device 'a'\) must be a "
                                        r"positive integer of bytes, or null .*got 0"),
        ("placement", [_DEVICES % "-5"], r"placement.device_sets.homogeneous\[0\].memory_bytes .*got -5"),
        ("placement", [_DEVICES % "lots"], r"placement.device_sets.homogeneous\[0\].memory_bytes .*got 'lots'"),
        ("placement", ["placement.device_sets.homogeneous=[{name:a,threads:1,cores:[0,0],memory_bytes:null}]"],
         r"placement.device_sets.homogeneous\[0\].cores \(device 'a'\) must be distinct, got \[0, 0\]"),
        ("placement", ["placement.device_sets.homogeneous=[{name:a,threads:1,cores:[x],memory_bytes:null}]"],
         r"placement.device_sets.homogeneous\[0\].cores \(device 'a'\) must be a non-empty list of core ids"),
        ("placement", ["placement.device_sets.homogeneous=[{name:a,threads:true,cores:[0],memory_bytes:null}]"],
         r"placement.device_sets.homogeneous\[0\].threads \(device 'a'\) must be a positive integer, got True"),
        ("placement", ["placement.repeats=true"], r"placement.repeats must be a positive integer, got True"),
        ("placement", ["placement.levels=[L0,L9]"], r"placement.levels must list levels from \['L0', 'L1', 'L2', 'L3'\]"),
        ("placement", ["placement.time_limit_s=nan"], r"placement.time_limit_s must be a finite number of seconds > 0"),
        ("placement", ["placement.exact_max_binaries=true"], r"placement.exact_max_binaries must be an integer >= 0, got True"),
        ("placement", ["+placement._target_=os.getcwd"], r"placement: unknown key\(s\) \['_target_'\]; allowed: "),
        ("placement", ["placement_mix.moe._target_=builtins.dict"],
         r"placement_mix.moe._target_ must be one of \['sim.place.placement_workloads.moe_workload', .*got 'builtins.dict'"),
        ("placement", ["+placement_mix.evil={_target_:os.system,command:ls}"],
         r"placement_mix.evil._target_ must be one of .*got 'os.system'"),
        ("placement", ["+placement_mix.moe._args_=[1]"], r"placement_mix.moe: \['_args_'\] are not arguments of"),
    ],
)
def test_bad_input_is_refused_by_validate_and_by_run_before_any_work(name, overrides, message, tmp_path):
    module = importlib.import_module(f"experiments.{name}")
    cfg = _cfg(name, tmp_path / "profiles", *overrides)
    with pytest.raises(ValueError, match=message):
        module.validate(cfg)
    with pytest.raises(ValueError, match=message):
        module.run(cfg, out_dir=tmp_path / "out")
    assert not (tmp_path / "profiles").exists()  # nothing was calibrated or measured


def test_layers_that_cannot_fit_are_refused_before_calibration(tmp_path, monkeypatch):
    from experiments import moe_skew

    monkeypatch.setattr(memory, "device_memory_bytes", lambda device: 1e4)  # a 10 kB device: the tiny layers need ~150 kB
    with pytest.raises(ValueError, match=r"more than 90% of this cpu device's 0.0 GB; reduce moe.d_model"):
        moe_skew.run(_cfg("moe_skew", tmp_path / "profiles"), out_dir=tmp_path / "out")
    assert not (tmp_path / "profiles").exists()


def test_single_strings_are_one_item_not_letters(tmp_path):
    from experiments import moe_skew

    configs, _, _ = moe_skew.validate(_cfg("moe_skew", tmp_path, "moe.backends=padded"))
    assert [c.backend for c in configs] == ["padded"]


def test_a_single_placement_level_is_one_level_not_letters(tmp_path):
    from experiments import placement

    placement.validate(_cfg("placement", tmp_path, "placement.levels=L3"))  # not ['L', '3']
    assert placement.placement_levels("L3") == ["L3"]


def _multirun_config(*overrides: str):
    hydra = GlobalHydra.instance().hydra
    return hydra.compose_config("config", list(overrides), run_mode=RunMode.MULTIRUN, with_log_configuration=False)


def test_a_sweep_is_expanded_and_every_job_validated(tmp_path):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = _multirun_config("experiment=moe_skew", "moe.num_experts=4", "moe.top_k=1,4,9", "moe.tokens=8,16",
                               f"profile.root={tmp_path}")
        jobs = job_overrides(cfg)
        assert len(jobs) == 6 and ["experiment=moe_skew", "moe.num_experts=4", "moe.top_k=9", "moe.tokens=16",
                                   f"profile.root={tmp_path}"] in jobs
        failures = check_jobs(cfg, validate_experiment)
    assert sorted(tuple(o[2:4]) for o, _ in failures) == [("moe.top_k=9", "moe.tokens=16"), ("moe.top_k=9", "moe.tokens=8")]
    assert all("moe.top_k must be in [1, moe.num_experts=4], got 9" in str(err) for _, err in failures)


def test_a_sweep_over_experiments_validates_each_with_its_own_module(tmp_path):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = _multirun_config("experiment=mlp_batch,moe_skew", "routing.capacity_factor=big", f"profile.root={tmp_path}")
        failures = check_jobs(cfg, validate_experiment)
    assert [o[0] for o, _ in failures] == ["experiment=moe_skew"]  # mlp_batch has no routing to refuse
    assert "routing.capacity_factor must be a number > 0" in str(failures[0][1])


def test_multirun_with_a_bad_later_job_runs_no_job(tmp_path):
    """`python -m sim -m moe.top_k=1,9`: refused up front, one line per bad job, exit status 2."""
    done = subprocess.run(
        [sys.executable, "-m", "sim", "-m", "experiment=moe_skew", "moe.num_experts=4", "moe.top_k=1,9",
         f"profile.root={tmp_path / 'profiles'}", f"hydra.sweep.dir={tmp_path / 'multirun'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-3000:]
    assert "job moe.top_k=9: error: moe.top_k must be in [1, moe.num_experts=4], got 9" in out
    assert "1 of 2 jobs of the sweep have invalid configs" in out and "Traceback" not in out
    assert not (tmp_path / "profiles").exists() and not list((tmp_path / "multirun").glob("*/.hydra"))


def test_a_bad_key_at_the_command_line_is_one_line_and_exit_status_2(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sim", "experiment=moe_skew", "routing.capacity_factor=big",
         f"profile.root={tmp_path / 'profiles'}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    out = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, out[-3000:]
    assert len(out.splitlines()) == 1 and "Traceback" not in out
    assert "error: routing.capacity_factor must be a number > 0" in out and "got 'big'" in out
    assert "error: routing.capacity_factor must be a number > 0" in (tmp_path / "run" / "__main__.log").read_text()
