"""Shape grids per kernel family: a suite config (conf/suite/*.yaml) -> descriptors.

A suite names, per family, lists of values whose cartesian product is measured, plus
optional log-uniform random shapes (seeded) so that held-out evaluation meets shapes that
are not on any grid line. Index skews are asked for as a CV; the descriptor records the
CV the generated index really has (``realised_cv``), so the model learns from the truth.
``equal_flops_trio`` builds the article's balanced / medium-skinny / tall-skinny GEMMs of
equal 2MKN, sized to the device's memory. Each family expands its own section (its
``suite`` function in ``costmodel.families.<family>``); this module checks the suite's
family list and merges the result.

Everything is expanded and validated before anything is measured, so a bad size or name
fails at once with the field named.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from costmodel.families import family_of
from costmodel.families.gemm import equal_flops_trio, trio_flops  # noqa: F401 (re-exported)
from costmodel.families.grouped_gemm import capped_power_law_counts, power_law_counts  # noqa: F401 (re-exported)
from costmodel.families.descriptor import KernelSpec, families
from costmodel.families.registry import SuiteContext


def expand_suite(
    suite: Mapping[str, Any],
    *,
    dtype: str,
    selected: Iterable[str] | None,
    scatter_backends: Iterable[str],
    memory_bytes: int,
) -> list[tuple[str, KernelSpec]]:
    """(tag, descriptor) pairs for the selected families of a suite, validated."""
    known = families()
    in_suite = [f for f in suite["families"] if f in suite]
    for f in suite["families"]:
        if f not in known:
            raise ValueError(f"suite {suite.get('name')!r} lists unknown family {f!r}; known: {list(known)}")
    chosen = list(in_suite if selected is None else selected)
    for f in chosen:
        if f not in known:
            raise ValueError(f"bench.families: unknown family {f!r}; allowed: {list(known)}")
        if f not in in_suite:
            raise ValueError(f"bench.families: suite {suite.get('name')!r} has no grid for {f!r}; it has {in_suite}")

    ctx = SuiteContext(dtype=dtype, scatter_backends=tuple(scatter_backends), memory_bytes=int(memory_bytes))
    out: list[tuple[str, KernelSpec]] = []
    for family in chosen:
        out += family_of(family).suite(suite[family], ctx)
    # one row per descriptor, first tag wins
    seen: dict[str, tuple[str, KernelSpec]] = {}
    for tag, spec in out:
        seen.setdefault(spec.key(), (tag, spec))
    return list(seen.values())
