"""Shared fixtures: tiny timing budgets and throw-away profile roots."""

from __future__ import annotations

import pytest
from tiny_budget import TINY_TIMING

from costmodel.measure.timing import TimingConfig


@pytest.fixture
def tiny_timing() -> TimingConfig:
    return TINY_TIMING


@pytest.fixture(autouse=True)
def private_measuring_lock(tmp_path_factory, monkeypatch):
    """Tests take their own measuring lock, not the machine-wide one: a bench running on this
    machine must not make the test suite wait (nor the suite's tiny timings block it)."""
    import costmodel.store.locks as locks

    path = tmp_path_factory.getbasetemp() / "measuring.lock"
    monkeypatch.setattr(locks, "default_measure_lock_path", lambda: path)
    return path


@pytest.fixture(scope="session", autouse=True)
def private_model_cache(tmp_path_factory):
    """Fitted models go to a cache of this test session (``costmodel.store.model_cache``), never to
    the user's real one; one folder per session, so a committed profile is fitted once. Set
    for the whole session (module fixtures too); subprocesses with their own environment
    pass ``os.environ["MOEGNN_MODEL_CACHE"]`` on."""
    path = tmp_path_factory.getbasetemp() / "model_cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOEGNN_MODEL_CACHE", str(path))
        yield path


@pytest.fixture
def busy_guard_aside(monkeypatch):
    """The freshness check's busy guard set aside. The guard has its own tests (a bounded CPU
    hog, tests/costmodel/measure/test_freshness.py); a test about what a refresh does must not
    turn into the guard's (rightful) refusal when the machine is busy with other work (a
    microsecond kernel read at 15x in a transient of the full suite, or other processes' CPU
    time)."""
    import costmodel.measure.freshness as freshness

    monkeypatch.setattr(freshness, "BUSY_RATIO", float("inf"))
    monkeypatch.setattr(freshness, "BUSY_OTHER_CORES", float("inf"))
