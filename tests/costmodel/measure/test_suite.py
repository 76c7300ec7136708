"""Suites expand to validated descriptors; count helpers keep their promises."""

from __future__ import annotations

from collections import Counter

import pytest
from omegaconf import OmegaConf

from costmodel.families.descriptor import families
from costmodel.families.scatter import scatter_backends_available
from costmodel.measure.suite import capped_power_law_counts, equal_flops_trio, expand_suite, power_law_counts


def _suite(name):
    return OmegaConf.to_container(OmegaConf.load(f"conf/suite/{name}.yaml"))


def test_quick_suite_covers_every_family_with_150_kernels():
    specs = expand_suite(_suite("quick"), dtype="float32", selected=None, scatter_backends=scatter_backends_available(),
                         memory_bytes=16 << 30)
    per_family = Counter(s.family for _, s in specs)
    assert set(per_family) == set(families())
    assert len(specs) >= 150 - 8 * ("torch_scatter" not in scatter_backends_available())
    assert len({s.key() for _, s in specs}) == len(specs)
    assert [t for t, _ in specs if t.startswith("trio:")] == ["trio:balanced", "trio:medium-skinny", "trio:tall-skinny"]


def test_family_selection_and_errors():
    suite = _suite("quick")
    kw = dict(dtype="float32", scatter_backends=("index_add",), memory_bytes=16 << 30)
    assert {s.family for _, s in expand_suite(suite, selected=["sort"], **kw)} == {"sort"}
    with pytest.raises(ValueError, match="bench.families: unknown family 'conv'"):
        expand_suite(suite, selected=["conv"], **kw)
    suite["gemm"]["m"] = [-4]
    with pytest.raises(ValueError, match="GemmSpec.m must be a positive integer"):
        expand_suite(suite, selected=["gemm"], **kw)


def test_count_helpers():
    assert power_law_counts(10, 4, 0.0) == (3, 3, 2, 2)
    counts = power_law_counts(1000, 8, 2.0)
    assert sum(counts) == 1000 and list(counts) == sorted(counts, reverse=True)
    capped = capped_power_law_counts(2048, 16, 8.0, 1024)
    assert sum(capped) == 2048 and max(capped) == 1024
    with pytest.raises(ValueError, match="cannot place"):
        capped_power_law_counts(100, 2, 1.0, 10)


def test_equal_flops_trio_has_equal_flops():
    trio = dict(equal_flops_trio(2.0 * 2**30, "float32"))
    flops = [s.flops() for s in trio.values()]
    assert max(flops) / min(flops) < 1.05
    assert trio["tall-skinny"].m == 1 and trio["medium-skinny"].m == 32
