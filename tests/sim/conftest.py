"""Fixtures of the sim tests: a runtime on this CPU with a throw-away profile root."""

from __future__ import annotations

from tiny_budget import tiny_timing_section
from typing import Callable

import pytest

from costmodel.measure.runtime import Runtime


@pytest.fixture
def tiny_runtime(tmp_path) -> Callable[..., Runtime]:
    """``tiny_runtime(rounds=...)``: a CPU float32 runtime with tiny timing budgets and its
    profile root in the test's tmp_path."""

    def make(rounds: int = 1) -> Runtime:
        return Runtime.from_cfg({
            "device": "cpu", "dtype": "float32", "threads": None, "allocator": "steady", "seed": 0,
            "profile": {"root": str(tmp_path)},
            "timing": tiny_timing_section(rounds=rounds, max_rel_iqr=0.5),
            "limits": {"cpu": {"max_flops": 1e9, "max_bytes": 1e9}}})

    return make


@pytest.fixture
def gemm_sort_gemm_run() -> Callable[[], None]:
    """A real run of the trace [gemm(8, 32, 32), sort(2048), gemm(8, 32, 32)] (the held-out
    and paired scoring tests time it as a layer)."""
    import torch

    a, b = torch.randn(8, 32), torch.randn(32, 32)
    keys = torch.randint(0, 100, (2048,))

    def run() -> None:
        a @ b
        torch.sort(keys)
        a @ b

    return run
