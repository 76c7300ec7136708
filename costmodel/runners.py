"""Turn a kernel descriptor into a zero-argument callable that runs it on a device.

Inputs are allocated once, seeded, outside the timed region. With ``pool_bytes`` > 0 the
callable cycles through enough independent copies of its inputs that their total exceeds
``pool_bytes``: each call then finds its operands out of the near caches, as a kernel
inside a real layer does (the CPU analogue of flushing L2 between repeats on a GPU).
"""

from __future__ import annotations

import itertools
import math
import warnings
from typing import Any, Callable

import numpy as np
import torch

from costmodel import ops
from costmodel.indices import index_for_cv
from costmodel.kernels import (
    ElementwiseSpec,
    GatherSpec,
    GemmSpec,
    GroupedGemmSpec,
    HistogramSpec,
    KernelSpec,
    ScatterSpec,
    SoftmaxSpec,
    SortSpec,
    SpmmSpec,
    TopkSpec,
    ELEMENTWISE_OPS,
)

MAX_POOL_COPIES = 32

Inputs = tuple[Any, ...]


def _randn(shape: tuple[int, ...], dtype: str, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    if dtype.startswith("int"):
        return torch.randint(0, 1 << 20, shape, generator=gen).to(device=device, dtype=getattr(torch, dtype))
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=getattr(torch, dtype))


def _index(num_rows: int, num_targets: int, cv: float, sorted_: bool, seed: int, device: torch.device) -> torch.Tensor:
    index, _ = index_for_cv(num_rows, num_targets, cv, sorted=sorted_, seed=seed)
    return torch.from_numpy(index.copy()).to(device)  # the cached array is read-only


def csr_from_index(dst: np.ndarray | torch.Tensor, src: np.ndarray | torch.Tensor, num_dst: int, num_src: int,
                   values: torch.Tensor | None, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Sparse CSR adjacency [num_dst, num_src] with one entry per (dst, src) edge."""
    dst_t = torch.as_tensor(dst, dtype=torch.int64)
    src_t = torch.as_tensor(src, dtype=torch.int64)
    vals = torch.ones(dst_t.numel(), dtype=dtype) if values is None else values.to("cpu", dtype)
    with warnings.catch_warnings():  # torch flags sparse CSR as beta on every construction
        warnings.simplefilter("ignore", UserWarning)
        coo = torch.sparse_coo_tensor(
            torch.stack([dst_t, src_t]), vals, (num_dst, num_src), check_invariants=False
        ).coalesce()
        return coo.to_sparse_csr().to(device)


def _build(spec: KernelSpec, device: torch.device, seed: int) -> tuple[Callable[..., Any], Inputs]:
    gen = torch.Generator().manual_seed(seed)
    dt = spec.dtype  # type: ignore[attr-defined]
    if isinstance(spec, GemmSpec):
        return ops.gemm, (_randn((spec.m, spec.k), dt, device, gen), _randn((spec.k, spec.n), dt, device, gen))
    if isinstance(spec, GroupedGemmSpec):
        w = _randn((spec.num_experts, spec.k, spec.n), dt, device, gen)
        if spec.impl == "padded_bmm":
            return ops.grouped_padded_bmm, (_randn((spec.num_experts, spec.max_tokens, spec.k), dt, device, gen), w)
        offsets = torch.tensor(np.cumsum(spec.tokens_per_expert), dtype=torch.int32, device=device)
        return ops.grouped_mm, (_randn((spec.total_tokens, spec.k), dt, device, gen), w, offsets)
    if isinstance(spec, GatherSpec):
        src = _randn((spec.num_src, spec.width) if spec.width > 1 else (spec.num_src,), dt, device, gen)
        return ops.gather, (src, _index(spec.num_rows, spec.num_src, spec.index_cv, spec.sorted, seed, device))
    if isinstance(spec, ScatterSpec):
        src = _randn((spec.num_rows, spec.width), dt, device, gen)
        if spec.backend == "index_copy":  # a copy needs distinct destinations
            perm = np.random.default_rng(seed).permutation(spec.num_dst)[: spec.num_rows]
            index = torch.from_numpy(np.sort(perm) if spec.sorted else perm).to(device)
        else:
            index = _index(spec.num_rows, spec.num_dst, spec.index_cv, spec.sorted, seed, device)

        def run_scatter(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
            return ops.scatter(src, index, spec.num_dst, reduce=spec.reduce, backend=spec.backend)

        return run_scatter, (src, index)
    if isinstance(spec, SpmmSpec):
        dst = _index(spec.nnz, spec.num_dst, spec.index_cv, True, seed, device).cpu()
        src_ids = torch.randint(0, spec.num_src, (spec.nnz,), generator=gen)
        adjacency = csr_from_index(dst, src_ids, spec.num_dst, spec.num_src, None, getattr(torch, dt), device)
        return ops.spmm, (adjacency, _randn((spec.num_src, spec.width), dt, device, gen))
    if isinstance(spec, ElementwiseSpec):
        n_inputs = ELEMENTWISE_OPS[spec.op][0]
        if spec.dtype == "int64":
            x = torch.randint(0, 1 << 20, (spec.numel,), generator=gen).to(device)
            second: Any = 7
        else:
            x = _randn((spec.numel,), dt, device, gen)
            second = _randn((spec.numel,), dt, device, gen) if n_inputs == 2 else _randn((1,), dt, device, gen)
        op = spec.op

        def run_elementwise(a: Any, b: Any) -> torch.Tensor:
            return ops.elementwise(op, a, b)

        return run_elementwise, (x, second)
    if isinstance(spec, SoftmaxSpec):
        return ops.softmax, (_randn((spec.rows, spec.cols), dt, device, gen),)
    if isinstance(spec, TopkSpec):
        k = spec.k
        return (lambda x: ops.topk(x, k)), (_randn((spec.rows, spec.cols), dt, device, gen),)
    if isinstance(spec, SortSpec):
        if spec.dtype.startswith("int"):
            keys = torch.randint(0, max(spec.n, 2), (spec.n,), generator=gen).to(device=device, dtype=getattr(torch, dt))
        else:
            keys = _randn((spec.n,), dt, device, gen)
        return ops.sort, (keys,)
    if isinstance(spec, HistogramSpec):
        bins = spec.bins
        return (lambda x: ops.histogram(x, bins)), (torch.randint(0, bins, (spec.n,), generator=gen).to(device),)
    raise ValueError(f"no runner for kernel family {spec.family!r}")


def _input_bytes(inputs: Inputs) -> int:
    total = 0
    for t in inputs:
        if isinstance(t, torch.Tensor):
            if t.layout == torch.sparse_csr:
                total += sum(x.numel() * x.element_size() for x in (t.values(), t.col_indices(), t.crow_indices()))
            else:
                total += t.numel() * t.element_size()
    return total


def make_runner(spec: KernelSpec, device: torch.device | str = "cpu", *, seed: int = 0,
                pool_bytes: int = 0) -> Callable[[], Any]:
    """A callable running ``spec`` once per call, on inputs made outside the timed region."""
    device = torch.device(device)
    op, inputs = _build(spec, device, seed)
    copies = 1
    if pool_bytes > 0:
        copies = min(MAX_POOL_COPIES, max(1, math.ceil(pool_bytes / max(_input_bytes(inputs), 1))))
    if copies == 1:
        return lambda: op(*inputs)
    pool = [inputs] + [_build(spec, device, seed + i)[1] for i in range(1, copies)]
    cycle = itertools.cycle(pool)
    return lambda: op(*next(cycle))
