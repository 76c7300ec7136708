"""Shared fixtures: tiny timing budgets and throw-away profile roots."""

from __future__ import annotations

import pytest

from costmodel.timing import TimingConfig

#: fast enough for unit tests; these tests check behaviour, never speed
TINY_TIMING = TimingConfig(min_run_time_s=0.003, min_runs=3, retries=0, rounds=1)


@pytest.fixture
def tiny_timing() -> TimingConfig:
    return TINY_TIMING
