"""experiment=moe_design refuses bad ``design.*`` input before any work, naming the
``design.*`` key the user typed and its allowed range (issue 28), and a ``-m`` sweep with
such a job is refused before its first job runs."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
from hydra import initialize_config_dir
from omegaconf import OmegaConf

from costmodel.cli.sweep_check import ValidateSweep, check_jobs
from experiments import moe_design
from experiments.common import validate_experiment
from tests.experiments.test_validation import _multirun_config

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf")
BASE = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/experiment/moe_design.yaml"))


def _cfg(**design):
    cfg = copy.deepcopy(BASE)
    cfg["design"].update(design)
    return cfg


@pytest.mark.parametrize("design, message", [
    ({"expert": "foo"}, "design.expert must be one of ['swiglu', 'mlp'], got 'foo'"),
    ({"expert": ["swiglu"]}, "design.expert must be one of ['swiglu', 'mlp'], got ['swiglu']"),
    ({"expert": None}, "design.expert must be one of ['swiglu', 'mlp'], got None"),
    ({"capacity_factor": -1}, "design.capacity_factor must be a finite number > 0 (such as 1.25) or null for no "
                              "capacity limit, got -1"),
    ({"capacity_factor": float("inf")}, "design.capacity_factor must be a finite number > 0 (such as 1.25) or null "
                                        "for no capacity limit, got inf"),
    ({"capacity_factor": True}, "design.capacity_factor must be a finite number > 0 (such as 1.25) or null for no "
                                "capacity limit, got True"),
    ({"capacity_factor": "big"}, "design.capacity_factor must be a finite number > 0 (such as 1.25) or null for no "
                                 "capacity limit, got 'big'"),
    ({"top_k": [16], "num_experts": [8]}, "design.top_k=16 exceeds every design.num_experts ([8]); top_k must be in "
                                          "[1, max(design.num_experts)=8]"),
    ({"top_k": [1, 16, 32], "num_experts": [4, 8]}, "design.top_k=[16, 32] exceeds every design.num_experts ([4, 8]); "
                                                    "top_k must be in [1, max(design.num_experts)=8]"),
    ({"regions": [["tokens", "num_experts"], ["tokens", "num_experts"]]},
     "design.regions lists ['tokens', 'num_experts'] twice; each pair of columns may appear once"),
    ({"regions": [["tokens", "tokens"]]},
     "design.regions entry ['tokens', 'tokens'] names 'tokens' twice; a region is a pair of two different columns "
     "among ['tokens', 'd_model', 'num_experts', 'top_k', 'routing', 'generator']"),
    ({"regions": []}, "design.regions must list at least one pair of columns"),
    ({"ffn_mult": True}, "design.ffn_mult must be a positive integer (>= 1), got True"),
    ({"anchor": {"tokens": 32, "d_model": 1024, "num_experts": 4, "top_k": 8}},
     "design.anchor.top_k must be in [1, design.anchor.num_experts=4], got 8"),
    ({"anchor": {"tokens": 0, "d_model": 1024, "num_experts": 4, "top_k": 1}},
     "design.anchor.tokens must be a positive integer (>= 1), got 0"),
    ({"anchor": {"tokens": 32, "d_model": 1024, "num_experts": 4}},
     "design.anchor must be a mapping with exactly the keys ['tokens', 'd_model', 'num_experts', 'top_k'], got "
     "{'tokens': 32, 'd_model': 1024, 'num_experts': 4}"),
])
def test_bad_design_names_the_design_key_and_its_range(design, message):
    with pytest.raises(ValueError) as err:
        moe_design.check_design(_cfg(**design))
    assert str(err.value) == message


def test_pairs_with_top_k_above_num_experts_are_counted_and_left_out():
    assert moe_design.check_top_k([1, 2, 4], [2, 8]) == 1  # (k=4, E=2) left out; k=4 still fits E=8
    assert moe_design.check_top_k([1, 2], [2, 8]) == 0
    spec = moe_design.check_design(_cfg(top_k=[1, 4], num_experts=[2, 8], tokens=[8], d_model=[32],
                                        routings=BASE["design"]["routings"][:1]))
    assert spec["skipped_pairs"] == 1
    df, _, _ = moe_design.build_grid({**spec, "routings": spec["routings"][:1]}, "float32", seed=0)
    assert sorted(set(zip(df["top_k"], df["num_experts"]))) == [(1, 2), (1, 8), (4, 8)]


def test_single_values_are_one_item():
    spec = moe_design.check_design(_cfg(tokens=16, backends="loop"))
    assert spec["tokens"] == [16] and spec["backends"] == ["loop"]


def test_a_sweep_with_a_bad_design_expert_is_refused_before_job_0(tmp_path, caplog):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = _multirun_config("experiment=moe_design", "design.expert=swiglu,foo", "measure=false",
                               f"profile.root={tmp_path}")
        failures = check_jobs(cfg, validate_experiment)
        assert [(o[1], str(e)) for o, e in failures] == [
            ("design.expert=foo", "design.expert must be one of ['swiglu', 'mlp'], got 'foo'")]
        with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as stop:
            ValidateSweep("experiments.common.validate_experiment", measures="sim.__main__.job_measures").on_multirun_start(cfg)
    assert stop.value.code == 2
    assert "job design.expert=foo: error: design.expert must be one of ['swiglu', 'mlp'], got 'foo'" in caplog.messages
    assert "error: 1 of 2 jobs of the sweep have invalid configs (listed above); no job was run" in caplog.messages
    assert not list(tmp_path.iterdir())  # nothing calibrated, no profile folder
