"""User errors at the command line: one logged line and exit status 2, never a traceback;
``HYDRA_FULL_ERROR=1`` keeps the traceback for developers; bugs are not hidden."""

from __future__ import annotations

import logging

import pytest
from omegaconf import OmegaConf

from costmodel.cli.bench_command import selected_families
from costmodel.cli.errors import report_user_errors
from costmodel.measure.suite import expand_suite
from costmodel.store.profile import ProfileError


@report_user_errors
def _task(error: BaseException | None) -> str:
    if error is not None:
        raise error
    return "done"


@pytest.mark.parametrize("error", [ValueError("moe.top_k must be in [1, 4],\n got 9"), ProfileError("no profile")])
def test_a_user_error_is_one_logged_line_and_exit_status_2(error, caplog, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as exit_:
        _task(error)
    assert exit_.value.code == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["error: " + " ".join(str(error).split())] and "\n" not in errors[0]


def test_hydra_full_error_keeps_the_traceback(monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ValueError, match="bad"):
        _task(ValueError("bad"))


def test_a_bug_is_not_dressed_as_a_user_error(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(KeyError):
        _task(KeyError("bug"))
    assert _task(None) == "done"


@pytest.mark.parametrize(
    "value, expected",
    [(None, None), ("gemm", ["gemm"]), (["gemm", "sort"], ["gemm", "sort"]),
     (OmegaConf.create({"f": ["sort"]}).f, ["sort"])],
)
def test_bench_families_take_one_name_or_a_list(value, expected):
    assert selected_families(value) == expected


@pytest.mark.parametrize("value", [[], 3, ["gemm", 3]])
def test_bench_families_of_another_type_are_refused(value):
    with pytest.raises(ValueError, match="bench.families must be null"):
        selected_families(value)


def test_bench_families_are_checked_against_the_suite():
    suite = {"name": "mini", "families": ["sort"], "sort": {"n": [8]}}
    kwargs = dict(dtype="float32", scatter_backends=[], memory_bytes=1 << 30)
    assert len(expand_suite(suite, selected=selected_families("sort"), **kwargs)) == 1
    with pytest.raises(ValueError, match=r"bench.families: suite 'mini' has no grid for 'gemm'; it has \['sort'\]"):
        expand_suite(suite, selected=selected_families("gemm"), **kwargs)
