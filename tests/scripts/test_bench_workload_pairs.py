"""scripts/bench_workload_pairs.py: bad options and unknown workloads are refused with the
option named, before anything is built or timed; every default name is a workload it can build."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_workload_pairs.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_workload_pairs", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


@pytest.mark.parametrize("argv, message", [
    (["--calls", "2"], "--calls must be an integer >= 3, got 2"),
    (["--deadline-s", "0"], "--deadline-s must be > 0 seconds, got 0.0"),
])
def test_bad_options_name_the_option(bench, capsys, argv, message):
    with pytest.raises(SystemExit) as err:
        bench.main(argv)
    assert err.value.code == 2 and message in capsys.readouterr().err


def test_an_unknown_workload_is_refused_with_what_the_mix_has(bench):
    with pytest.raises(SystemExit, match="workload 'mlp_huge' is not in default.yaml .*'mlp_skinny_b1'"):
        bench.build("mlp_huge")


def test_the_default_names_are_in_the_mix(bench):
    mix = OmegaConf.load(bench.MIX)
    for name in (*bench.DEFAULT_VICTIMS, *bench.DEFAULT_NEIGHBOURS):
        assert name == "stream" or name in mix
