"""Turn a kernel descriptor into a zero-argument callable that runs it on a device.

Inputs are allocated once, seeded, outside the timed region.

Cold caches (``cold=True``, CPU): inside a layer a kernel finds its weights out of cache
(the layer streams far more data than the caches hold between two uses of one weight),
but a microbenchmark that repeats one call keeps its operands cache-resident and reads
fast. So every floating-point operand is rotated, call after call, through different
slices of one shared random arena larger than the last-level cache (``ARENA_BYTES``): each
call reads its operands from memory, as on a GPU after ``do_bench``'s L2 flush. Index
tensors are not rotated (their values matter); the arena is allocated once per process
and dtype, so rotation costs no per-kernel set-up.
"""

from __future__ import annotations

import itertools
import warnings
from functools import lru_cache
from typing import Any, Callable

import numpy as np
import torch

from costmodel import ops
from costmodel.indices import index_for_cv, index_for_share
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
        if spec.src_cv is None or spec.src_read_share is None:  # unset: uniform random columns
            src_ids = torch.randint(0, spec.num_src, (spec.nnz,), generator=gen)
        else:
            columns = index_for_share(spec.nnz, spec.num_src, spec.src_cv, spec.src_read_share, seed=seed + 1)[0]
            src_ids = torch.from_numpy(columns.copy())
        adjacency = csr_from_index(dst, src_ids, spec.num_dst, spec.num_src, None, getattr(torch, dt), device)
        return ops.spmm, (adjacency, _randn((spec.num_src, spec.width), dt, device, gen))
    if isinstance(spec, ElementwiseSpec):
        n_inputs = ELEMENTWISE_OPS[spec.op][0]
        if spec.dtype in ("int64", "int32"):
            x = torch.randint(0, 1 << 20, (spec.numel,), generator=gen).to(device=device, dtype=getattr(torch, dt))
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


ARENA_BYTES = 256 * 1024**2  # > the effective LLC of the development VM (64 MiB already reads from DRAM)
MAX_ROTATIONS = 64


@lru_cache(maxsize=8)
def _arena(dtype: torch.dtype, device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    numel = ARENA_BYTES // torch.empty(0, dtype=dtype).element_size()
    return torch.randn(numel, generator=gen).to(device=device, dtype=dtype)


def _rotations(inputs: Inputs, device: torch.device) -> list[Inputs]:
    """Input tuples whose dense floating-point tensors are views at rotating arena offsets."""
    dense = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.layout == torch.strided
             and t.is_floating_point() and t.is_contiguous() and t.numel() > 1]
    if not dense:
        return [inputs]
    copies = MAX_ROTATIONS
    for i in dense:
        arena = _arena(inputs[i].dtype, str(device))
        span = -(-inputs[i].numel() // 64) * 64  # cache-line aligned slots
        copies = min(copies, arena.numel() // span)
    if copies < 2:
        return [inputs]  # operands larger than half the arena are cold anyway
    out = []
    for c in range(copies):
        items = list(inputs)
        for i in dense:
            t = inputs[i]
            span = -(-t.numel() // 64) * 64
            items[i] = _arena(t.dtype, str(device))[c * span: c * span + t.numel()].view(t.shape)
        out.append(tuple(items))
    return out


def make_runner(spec: KernelSpec, device: torch.device | str = "cpu", *, seed: int = 0,
                cold: bool = False) -> Callable[[], Any]:
    """A callable running ``spec`` once per call, on inputs made outside the timed region;
    with ``cold`` (CPU) every call reads its operands from memory, not from cache."""
    device = torch.device(device)
    op, inputs = _build(spec, device, seed)
    pool = _rotations(inputs, device) if cold and device.type == "cpu" else [inputs]
    if len(pool) == 1:
        return lambda: op(*pool[0])
    cycle = itertools.cycle(pool)
    return lambda: op(*next(cycle))
