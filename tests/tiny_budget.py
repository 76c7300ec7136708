"""The tiny timing budget every test shares, read from the one copy in
``conf/timing_budget/tiny.yaml`` (the CPU dry run of ``scripts/gpu_check.sh`` and the Hydra
entry points select the same file as ``+timing_budget=tiny``). Importable from any test
module: pytest puts ``tests/`` on ``sys.path`` for its rootdir conftest."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from costmodel.measure.timing import TimingConfig

TINY_BUDGET_YAML = Path(__file__).resolve().parents[1] / "conf" / "timing_budget" / "tiny.yaml"

#: the tiny budget as the config section (a dict, for Runtime.from_cfg-style configs)
TINY_TIMING_SECTION: dict[str, Any] = dict(yaml.safe_load(TINY_BUDGET_YAML.read_text())["timing"])

#: fast enough for unit tests; these tests check behaviour, never speed
TINY_TIMING = TimingConfig(**TINY_TIMING_SECTION)


def tiny_timing(**changes: Any) -> TimingConfig:
    """The tiny budget with a few fields changed (``rounds=2`` for a test about rounds)."""
    return replace(TINY_TIMING, **changes)


def tiny_timing_section(**changes: Any) -> dict[str, Any]:
    """The tiny budget as a config section with a few keys changed or added."""
    return {**TINY_TIMING_SECTION, **changes}
