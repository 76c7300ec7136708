"""Shape grids per kernel family: a suite config (conf/suite/*.yaml) -> descriptors.

A suite names, per family, lists of values whose cartesian product is measured, plus
optional log-uniform random shapes (seeded) so that held-out evaluation meets shapes that
are not on any grid line. Index skews are asked for as a CV; the descriptor records the
CV the generated index really has (``realised_cv``), so the model learns from the truth. ``equal_flops_trio`` builds the article's balanced /
medium-skinny / tall-skinny GEMMs of equal 2MKN, sized to the device's memory.

Everything is expanded and validated before anything is measured, so a bad size or name
fails at once with the field named.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Mapping

import numpy as np

from costmodel.indices import column_pattern, index_for_share, realised_cv
from costmodel.kernels import (
    DTYPE_BYTES,
    ElementwiseSpec,
    GatherSpec,
    GemmSpec,
    GroupedGemmSpec,
    HistogramSpec,
    KernelSpec,
    ScatterSpec,
    SCATTER_BACKEND_REDUCES,
    SoftmaxSpec,
    SortSpec,
    SpmmSpec,
    TopkSpec,
    families,
)


def _grid(cfg: Mapping[str, Any], *names: str) -> Iterable[tuple[Any, ...]]:
    for name in names:
        if name not in cfg:
            raise ValueError(f"suite grid is missing the list {name!r}; it has {sorted(cfg)}")
    return itertools.product(*(list(cfg[n]) for n in names))


def power_law_counts(total: int, experts: int, exponent: float) -> tuple[int, ...]:
    """Split ``total`` tokens over experts with shares ~ (i+1)^-exponent (largest remainder).

    exponent 0 is perfectly balanced; large exponents put nearly everything on expert 0.
    """
    weights = np.arange(1, experts + 1, dtype=np.float64) ** (-float(exponent))
    raw = total * weights / weights.sum()
    counts = np.floor(raw).astype(np.int64)
    remainder = total - int(counts.sum())
    counts[np.argsort(-(raw - counts), kind="stable")[:remainder]] += 1
    return tuple(int(c) for c in counts)


def capped_power_law_counts(total: int, experts: int, exponent: float, cap: int) -> tuple[int, ...]:
    """``power_law_counts`` with no expert above ``cap`` (water-filling the excess onto the
    next experts): top-k routing without replacement never gives an expert more than the
    number of tokens."""
    if cap * experts < total:
        raise ValueError(f"cannot place {total} tokens on {experts} experts of capacity {cap}")
    weights = np.arange(1, experts + 1, dtype=np.float64) ** (-float(exponent))
    share = np.zeros(experts)
    free = np.ones(experts, dtype=bool)
    remaining = float(total)
    while remaining > 1e-9 and free.any():
        alloc = remaining * weights * free / (weights * free).sum()
        over = free & (share + alloc >= cap)
        if not over.any():
            share += alloc
            break
        remaining -= (cap - share[over]).sum()
        share[over] = cap
        free &= ~over
    counts = np.floor(share).astype(np.int64)
    rest = total - int(counts.sum())
    order = np.argsort(-(share - counts), kind="stable")
    counts[order[:rest]] += 1
    return tuple(int(c) for c in counts)


def equal_flops_trio(total_flops: float, dtype: str) -> list[tuple[str, GemmSpec]]:
    """Balanced, medium-skinny (M=32) and tall-skinny (M=1) GEMMs with equal 2MKN."""
    k = 4096
    side = int(round((total_flops / 2.0) ** (1 / 3) / 64.0)) * 64
    side = max(side, 64)
    balanced = GemmSpec(side, side, max(64, int(round(total_flops / (2.0 * side * side)))), dtype)
    medium = GemmSpec(32, k, max(1, int(round(total_flops / (2.0 * 32 * k)))), dtype)
    tall = GemmSpec(1, k, max(1, int(round(total_flops / (2.0 * k)))), dtype)
    return [("balanced", balanced), ("medium-skinny", medium), ("tall-skinny", tall)]


def trio_flops(memory_bytes: int, dtype: str, max_operand_bytes: int) -> float:
    """FLOPs of the trio so the tall-skinny weight (K*N elements) fits the memory budget."""
    budget = min(memory_bytes // 8, max_operand_bytes)
    return 2.0 * budget / DTYPE_BYTES[dtype]  # tall-skinny: 2*1*K*N = 2 * (K*N)


def _log_uniform(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(round(float(np.exp(rng.uniform(np.log(lo), np.log(hi))))))


def gemm_specs(cfg: Mapping[str, Any], dtype: str) -> list[KernelSpec]:
    specs: list[KernelSpec] = [GemmSpec(m, k, n, dtype) for m, k, n in _grid(cfg, "m", "k", "n")]
    rnd = cfg.get("random")
    if rnd:
        rng = np.random.default_rng(int(rnd["seed"]))
        for _ in range(int(rnd["count"])):
            specs.append(
                GemmSpec(
                    _log_uniform(rng, *rnd["m"]), _log_uniform(rng, *rnd["k"]), _log_uniform(rng, *rnd["n"]), dtype
                )
            )
    return specs


def grouped_gemm_specs(cfg: Mapping[str, Any], dtype: str) -> list[KernelSpec]:
    specs: list[KernelSpec] = []
    for experts, total, (k, n), exponent, impl in _grid(cfg, "experts", "total_tokens", "kn", "skew_exponent", "impl"):
        specs.append(GroupedGemmSpec(power_law_counts(int(total), int(experts), exponent), int(k), int(n), impl, dtype))
    return specs


def gather_specs(cfg: Mapping[str, Any], dtype: str) -> list[KernelSpec]:
    return [
        GatherSpec(rows, width, src, realised_cv(rows, src, cv, sorted=bool(srt)), bool(srt), dtype)
        for rows, width, src, cv, srt in _grid(cfg, "num_rows", "width", "num_src", "index_cv", "sorted")
    ]


def scatter_specs(cfg: Mapping[str, Any], dtype: str, backends: Iterable[str]) -> list[KernelSpec]:
    specs: list[KernelSpec] = []
    allowed = set(backends)
    for rows, width, dst, cv, srt, backend in _grid(cfg, "num_rows", "width", "num_dst", "index_cv", "sorted", "backend"):
        if backend not in SCATTER_BACKEND_REDUCES:
            raise ValueError(f"suite scatter.backend must be among {sorted(SCATTER_BACKEND_REDUCES)}, got {backend!r}")
        if backend not in allowed:
            continue  # e.g. torch_scatter not installed: measured where it is
        for reduce in SCATTER_BACKEND_REDUCES[backend]:
            if reduce not in cfg.get("reduce", ["sum", "mean", "max", "copy"]):
                continue
            if backend == "index_copy" and (rows > dst or cv != cfg["index_cv"][0]):
                continue  # a copy needs distinct destinations: one index pattern only
            cv_real = 0.0 if backend == "index_copy" else realised_cv(rows, dst, cv, sorted=bool(srt))
            specs.append(ScatterSpec(rows, width, dst, reduce, backend, cv_real, bool(srt), dtype))
    return specs


def spmm_specs(cfg: Mapping[str, Any], dtype: str) -> list[KernelSpec]:
    """The spmm grid. ``columns`` (optional) lists the column-index patterns: null for
    uniform random columns, or [src_cv, src_read_share] as wished; each descriptor carries
    the pattern its index realises (the runner draws it with seed 1, as here)."""
    specs: list[KernelSpec] = []
    for nnz, width, nodes, cv in _grid(cfg, "nnz", "width", "nodes", "index_cv"):
        rows_cv = realised_cv(nnz, nodes, cv, sorted=True)
        for pattern in cfg.get("columns") or [None]:
            if pattern is None:
                specs.append(SpmmSpec(nnz, width, nodes, nodes, rows_cv, dtype))
                continue
            if len(pattern) != 2:
                raise ValueError(f"suite spmm.columns entries are null or [src_cv, src_read_share], got {pattern!r}")
            _, src_cv, share = index_for_share(nnz, nodes, float(pattern[0]), float(pattern[1]), seed=1)
            specs.append(SpmmSpec(nnz, width, nodes, nodes, rows_cv, dtype, *column_pattern(src_cv, share)))
    return specs


def small_op_specs(family: str, cfg: Mapping[str, Any], dtype: str) -> list[KernelSpec]:
    if family == "elementwise":
        out: list[KernelSpec] = []
        for op, numel in _grid(cfg, "op", "numel"):
            out.append(ElementwiseSpec(op, numel, "int64" if op == "floordiv" else dtype))
        return out
    if family == "softmax":
        return [SoftmaxSpec(r, c, dtype) for r, c in _grid(cfg, "rows", "cols")]
    if family == "topk":
        return [TopkSpec(r, c, k, dtype) for r, c, k in _grid(cfg, "rows", "cols", "k") if k <= c]
    if family == "sort":
        return [SortSpec(n, "int64") for (n,) in _grid(cfg, "n")]
    if family == "histogram":
        return [HistogramSpec(n, b) for n, b in _grid(cfg, "n", "bins")]
    raise ValueError(f"unknown small-op family {family!r}")


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

    out: list[tuple[str, KernelSpec]] = []
    for family in chosen:
        cfg = suite[family]
        if family == "gemm":
            trio = cfg.get("equal_flops_trio")
            if trio:  # first, so a trio shape that is also on the grid keeps its trio tag
                flops = trio_flops(memory_bytes, dtype, int(trio["max_operand_bytes"]))
                out += [(f"trio:{name}", s) for name, s in equal_flops_trio(flops, dtype)]
            out += [("grid", s) for s in gemm_specs(cfg, dtype)]
        elif family == "grouped_gemm":
            out += [("grid", s) for s in grouped_gemm_specs(cfg, dtype)]
        elif family == "gather":
            out += [("grid", s) for s in gather_specs(cfg, dtype)]
        elif family == "scatter":
            out += [("grid", s) for s in scatter_specs(cfg, dtype, scatter_backends)]
        elif family == "spmm":
            out += [("grid", s) for s in spmm_specs(cfg, dtype)]
        else:
            out += [("grid", s) for s in small_op_specs(family, cfg, dtype)]
    # one row per descriptor, first tag wins
    seen: dict[str, tuple[str, KernelSpec]] = {}
    for tag, spec in out:
        seen.setdefault(spec.key(), (tag, spec))
    return list(seen.values())
