"""The config schema (``costmodel.cli.config_schema``): constraints as data, one ``check``,
one error format ("<dotted.field> must be <constraint in words>, got <value!r>"), every
experiment's ``CONSTRAINTS`` declared beside the shared ones, and the config checked once
per ``python -m sim`` job, at the entry point."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from costmodel.cli.config_schema import (
    BASE_CONSTRAINTS, Interval, Keys, ListOf, Names, Options, Rule, at_most, check, describe,
)
from experiments.common import COMMON_CONSTRAINTS

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf")
EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))

#: one format: the dotted field, what it must be, the value as repr
ONE_FORMAT = re.compile(r"^(?P<field>[\w.\[\]]+) must (be|not be set) .+, got .+$", re.S)

SCHEMA = {
    "moe.tokens": Interval(int, 1, None),
    "moe.num_experts": Interval(int, 1, None),
    "moe.top_k": at_most("moe.num_experts"),
    "moe.expert": Options(["swiglu", "mlp"]),
    "moe.backends": Names(what="backend"),
    "routing.capacity_factor": [Interval(float, 0, None, closed="neither"), None],
    "calibration.tolerance": Interval(float, 0, 10, closed="neither"),
    "progress": bool,
    "levels": ListOf(Options(["L0", "L3"])),
    "timing": [Keys(["rounds"]), None],
    "gnn.graphs.*.nodes": Interval(int, 2, 100),
    "profile.id": Rule(lambda v, cfg: v is None or cfg.get("measure") is False, "null with measure=true"),
}
GOOD = {"moe": {"tokens": 8, "num_experts": 4, "top_k": 2, "expert": "mlp", "backends": ["loop"]},
        "routing": {"capacity_factor": None}, "calibration": {"tolerance": 0.1}, "progress": True,
        "levels": ["L3"], "timing": {"rounds": 3}, "gnn": {"graphs": {"a": {"nodes": 10}}},
        "profile": {"id": None}, "measure": True}


def _with(path: str, value):
    cfg = importlib.import_module("copy").deepcopy(GOOD)
    node = cfg
    *parents, last = path.split(".")
    for key in parents:
        node = node[key]
    node[last] = value
    return cfg


def test_a_good_config_passes():
    check(GOOD, SCHEMA)


@pytest.mark.parametrize("path, value, message", [
    # an out-of-range int
    ("moe.tokens", 0, "moe.tokens must be a positive integer (>= 1), got 0"),
    # a wrong option
    ("moe.expert", "gelu", "moe.expert must be one of ['swiglu', 'mlp'], got 'gelu'"),
    # a wrong type (a bool is not an integer; a string is not a number; a list is not a bool)
    ("moe.tokens", True, "moe.tokens must be a positive integer (>= 1), got True"),
    ("calibration.tolerance", "tight", "calibration.tolerance must be a number in (0, 10), got 'tight'"),
    ("progress", [1], "progress must be true or false, got [1]"),
    # a nested field and a wildcard one
    ("gnn.graphs.a.nodes", 1000, "gnn.graphs.a.nodes must be an integer in [2, 100], got 1000"),
    # a float that is not finite, or null allowed beside a range
    ("routing.capacity_factor", float("nan"), "routing.capacity_factor must be a number > 0 or null, got nan"),
    # a list of options, and names
    ("levels", ["L0", "L9"], "levels must be a non-empty list, each one of ['L0', 'L3'], got ['L0', 'L9']"),
    ("moe.backends", 3, "moe.backends must be a backend or a list of backends, got 3"),
    # a cross-field rule, worded with the other field's value
    ("moe.top_k", 9, "moe.top_k must be in [1, moe.num_experts=4], got 9"),
    ("profile.id", "other", "profile.id must be null with measure=true, got 'other'"),
    # an unknown key is named itself
    ("timing.repeats", 3, "timing.repeats must not be set (timing takes only ['rounds']), got 3"),
])
def test_every_bad_value_is_one_line_in_one_format(path, value, message):
    with pytest.raises(ValueError) as err:
        check(_with(path, value), SCHEMA)
    assert str(err.value) == message
    assert ONE_FORMAT.match(str(err.value))


def test_a_missing_field_is_left_to_the_yaml_defaults():
    check({"moe": {"tokens": 4}}, SCHEMA)


def test_constraints_read_as_words():
    assert describe(Interval(int, 0, None)) == "a non-negative integer (>= 0)"
    assert describe([Interval(int, 1, None), None]) == "a positive integer (>= 1) or null"
    assert describe(Interval(float, 0, 1, closed="right")) == "a number in (0, 1]"


def _cfg(name: str, *overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=[f"experiment={name}", f"+tiny={name}", "+timing_budget=tiny",
                                            "progress=false", *overrides])


@pytest.mark.parametrize("overrides, message", [
    (["seed=-1"], "seed must be a non-negative integer (>= 0), got -1"),                      # base key, out of range
    (["allocator=fast"], "allocator must be one of ['steady', 'system'], got 'fast'"),        # base key, wrong option
    (["progress=3"], "progress must be true or false, got 3"),                                # shared key, wrong type
    (["calibration.tolerance=20"], "calibration.tolerance must be a number in (0, 10) (0.1 = 10% either way), got 20"),
    (["limits.cpu.max_bytes=0"], "limits.cpu.max_bytes must be a number > 0, got 0"),         # nested base key
    (["calibration.neighbours=gp"], "calibration.neighbours must be one of ['committee', 'bytes'], got 'gp'"),
    (["moe.num_experts=4", "moe.top_k=9"], "moe.top_k must be in [1, moe.num_experts=4], got 9"),  # experiment's rule
    (["moe.d_ff=-3"], "moe.d_ff must be a positive integer (>= 1), got -3"),                  # experiment's key
])
def test_an_experiment_config_is_checked_against_base_common_and_its_own_constraints(overrides, message, tmp_path):
    from experiments import moe_skew

    with pytest.raises(ValueError) as err:
        moe_skew.validate(_cfg("moe_skew", f"profile.root={tmp_path}", *overrides))
    assert str(err.value) == message


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_declares_its_constraints_or_shares_the_common_ones(name):
    module = importlib.import_module(f"experiments.{name}")
    constraints = getattr(module, "CONSTRAINTS", {})
    assert isinstance(constraints, dict)
    assert not set(constraints) & set(BASE_CONSTRAINTS)  # base keys are declared once, in the shared schema
    assert not set(constraints) & (set(COMMON_CONSTRAINTS) - {"routing.capacity_factor"})


def _count_validations(monkeypatch, name: str):
    """Run ``python -m sim``'s task function on a composed config, counting each validation
    entry point; ``run`` is the module's own, its first measuring call stopped."""
    from costmodel.measure import runtime
    from experiments import common

    module = importlib.import_module(f"experiments.{name}")
    entry = importlib.import_module("sim.__main__")
    calls = {"validate": 0, "check_common": 0, "check_cfg": 0, "run": 0, "plan_given": 0}

    def counting(key, fn):
        def wrapper(*args, **kwargs):
            calls[key] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(module, "validate", counting("validate", module.validate))
    monkeypatch.setattr(module, "check_common", counting("check_common", common.check_common))
    monkeypatch.setattr(runtime, "check_cfg", counting("check_cfg", runtime.check_cfg))
    real_run = module.run

    def run(cfg, out_dir=None, *, plan=None):
        calls["run"] += 1
        calls["plan_given"] += plan is not None
        return real_run(cfg, out_dir, plan=plan)

    monkeypatch.setattr(module, "run", run)

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    for attr in ("calibrated_model", "fitted_model"):
        if hasattr(module, attr):
            monkeypatch.setattr(module, attr, stop)
    return entry, module, calls, Stop


@pytest.mark.parametrize("measure", ["true", "false"])
def test_a_python_m_sim_job_validates_its_config_once(monkeypatch, tmp_path, measure):
    entry, _, calls, Stop = _count_validations(monkeypatch, "moe_skew")
    cfg = _cfg("moe_skew", f"profile.root={tmp_path / 'profiles'}", f"measure={measure}", "measure_lock.mode=off",
               f"hydra.run.dir={tmp_path / 'run'}")
    with pytest.raises(Stop):  # stopped at the first measuring (or predicting) call, after every check
        entry.main(cfg)
    assert calls == {"validate": 1, "check_common": 1, "check_cfg": 1, "run": 1, "plan_given": 1}
    assert not (tmp_path / "profiles").exists()


def test_run_called_from_python_validates_first(monkeypatch, tmp_path):
    _, module, calls, Stop = _count_validations(monkeypatch, "moe_skew")
    with pytest.raises(Stop):
        module.run(_cfg("moe_skew", f"profile.root={tmp_path / 'profiles'}", "measure=false"), tmp_path / "out")
    assert calls == {"validate": 1, "check_common": 1, "check_cfg": 1, "run": 1, "plan_given": 0}


def test_a_bad_config_fails_at_the_entry_point_before_run(monkeypatch, tmp_path):
    from costmodel.cli import errors

    entry, _, calls, _ = _count_validations(monkeypatch, "moe_skew")
    refused = []
    monkeypatch.setattr(errors, "exit_for_user_error", lambda err: refused.append(str(err)))
    entry.main(_cfg("moe_skew", f"profile.root={tmp_path}", "measure=false", "moe.tokens=0"))
    assert refused == ["moe.tokens must be a positive integer (>= 1), got 0"]
    assert calls["validate"] == 1 and calls["run"] == 0
