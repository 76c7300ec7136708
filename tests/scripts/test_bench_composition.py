"""scripts/bench_composition.py: which later calls of a small kind the recold hypothesis charges."""

from __future__ import annotations

import pytest
from script_loader import loaded_script

from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gemm import GemmSpec


@pytest.fixture(scope="module")
def script():
    yield from loaded_script("bench_composition")


def test_a_small_kind_is_charged_again_only_after_a_stream_over_a_mebibyte(script):
    act = ElementwiseSpec("silu", 4096)  # 32 KiB moved: small
    add = ElementwiseSpec("add", 4096)
    weights = GemmSpec(4, 1024, 1024)  # 4 MiB of weights streamed: not small
    tiny = GemmSpec(4, 64, 64)  # 16 KiB of weights: small, and its own kind
    trace = [act, add, weights, act, tiny, act, weights, add, add]
    # act: after `weights` (4 MiB) once; then after only `tiny` (16 KiB): not again.
    # add: after both `weights` streams once; the second add follows the first at once.
    assert script.recold_calls(trace) == {script.kind(act): 1, script.kind(add): 1}
