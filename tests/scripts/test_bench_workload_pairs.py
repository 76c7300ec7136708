"""scripts/bench_workload_pairs.py: bad options and unknown workloads are refused with the
option named, before anything is built or timed; every default name is a workload it can build."""

from __future__ import annotations


import pytest
from script_loader import loaded_script
from omegaconf import OmegaConf


@pytest.fixture(scope="module")
def bench():
    yield from loaded_script("bench_workload_pairs")


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
