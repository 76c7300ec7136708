"""Turn a kernel descriptor into a zero-argument callable that runs it on a device.

Inputs are allocated once, seeded, outside the timed region, by the family's ``build``
(``costmodel.families``).

Cold caches (``cold=True``, CPU): inside a layer a kernel finds its weights out of cache
(the layer streams far more data than the caches hold between two uses of one weight),
but a microbenchmark that repeats one call keeps its operands cache-resident and reads
fast. So every floating-point operand is rotated, call after call, through different
slices of one shared random arena larger than the last-level cache (``ARENA_BYTES``), in
their layout (a transposed view stays one): each call reads its operands from memory, as
on a GPU after ``do_bench``'s L2 flush. A call's operands lie side by side, never on the
same bytes: until 2026-12-07 every operand of a copy started at the same offset, so
``a + b`` read one buffer twice, and binary elementwise kernels of 1-8 MiB timed 0.55-0.8x
their time on distinct operands (AMD EPYC VM; ``scripts/bench_runner_layout.py``). Index tensors are not rotated (their values
matter); the arena is allocated once per process and dtype, so rotation costs no
per-kernel set-up.

A call that reads only a leading part of an operand (``KernelSpec.read_prefix_numel``:
``grouped_mm`` skips its empty experts' weights) gets copies spaced by what it reads, not
by the operand's size. Spaced by size, a 33.5 MB [64, 256, 512] expert weight fits 8 copies
in the arena; a call reading 4 of its experts (2 MB) then cycled through 16 MB, inside the
development VM's 32 MiB L3, and timed 0.79 ms where the same call after a full cache
eviction took 1.10 ms. Such copies overlap in what no call reads.
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import Any, Callable

import torch

from costmodel.families import family_of
from costmodel.families.aten_map import is_transposed_view
from costmodel.families.inputs import csr_from_index  # noqa: F401 (re-exported: sim.workloads.gnn_layer builds its CSR with it)
from costmodel.families.descriptor import KernelSpec

Inputs = tuple[Any, ...]


def _build(spec: KernelSpec, device: torch.device, seed: int) -> tuple[Callable[..., Any], Inputs]:
    """The family's runner (``costmodel.families.<family>.build``) on seeded inputs."""
    return family_of(spec.family).build(spec, device, torch.Generator().manual_seed(seed), seed)


ARENA_BYTES = 256 * 1024**2  # > the effective LLC of the development VM (64 MiB already reads from DRAM)
MAX_ROTATIONS = 64
MAX_PREFIX_ROTATIONS = 1024  # a call reading 256 KB of a larger operand still cycles through 256 MB


@lru_cache(maxsize=8)
def _arena(dtype: torch.dtype, device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    numel = ARENA_BYTES // torch.empty(0, dtype=dtype).element_size()
    return torch.randn(numel, generator=gen).to(device=device, dtype=dtype)


def _arena_view(t: torch.Tensor, arena: torch.Tensor, offset: int) -> torch.Tensor:
    """``t``'s shape at ``offset`` of the arena, in its layout (a transposed view, an ``nt``
    GEMM's weight, rotates as a transposed view)."""
    slot = arena[offset: offset + t.numel()]
    return slot.view(t.shape) if t.is_contiguous() else slot.view(t.mT.shape).mT


def _aligned(numel: int) -> int:
    return -(-numel // 64) * 64  # cache-line aligned slots


def _prefix_rotations(inputs: Inputs, device: torch.device, dense: list[int],
                      read: dict[int, int]) -> list[Inputs]:
    """Copies of each dense operand ``i`` spaced by the ``read[i]`` elements a call reads of
    it (by its size where absent), each operand in its own part of the arena, as many copies
    as fit (at most ``MAX_PREFIX_ROTATIONS``): the calls cycle through about the arena."""
    sizes = {i: _aligned(inputs[i].numel()) for i in dense}
    steps = {i: _aligned(read.get(i, inputs[i].numel())) for i in dense}
    arena = {i: _arena(inputs[i].dtype, str(device)) for i in dense}
    free = min(a.numel() for a in arena.values()) - sum(sizes.values())
    copies = min(MAX_PREFIX_ROTATIONS, free // sum(steps.values()) + 1) if free >= 0 else 0
    if copies < 2:
        return [inputs]
    base, start = {}, 0
    for i in dense:
        base[i] = start
        start += (copies - 1) * steps[i] + sizes[i]
    out = []
    for c in range(copies):
        items = list(inputs)
        for i in dense:
            items[i] = _arena_view(inputs[i], arena[i], base[i] + c * steps[i])
        out.append(tuple(items))
    return out


def dense_operands(inputs: Inputs) -> list[int]:
    """Positions of the operands a cold runner rotates: dense floating-point tensors of more
    than one element, contiguous or a transposed view (index tensors keep their values)."""
    return [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.layout == torch.strided
            and t.is_floating_point() and t.numel() > 1 and (t.is_contiguous() or is_transposed_view(t))]


def _rotations(inputs: Inputs, device: torch.device,
               read_prefix: tuple[int | None, ...] | None = None) -> list[Inputs]:
    """Input tuples whose dense floating-point tensors are views at rotating arena offsets."""
    dense = dense_operands(inputs)
    if not dense:
        return [inputs]
    read = {i: n for i, n in enumerate(read_prefix or ()) if n is not None and i in dense and n < inputs[i].numel()}
    if read:
        return _prefix_rotations(inputs, device, dense, read)
    arena = {i: _arena(inputs[i].dtype, str(device)) for i in dense}
    # operands of one dtype share an arena: each copy lays them side by side, so no operand
    # is read through another's bytes (at one offset, add(a, b) read a single buffer twice)
    base, stride = {}, {}
    for i in dense:
        base[i] = stride.get(inputs[i].dtype, 0)
        stride[inputs[i].dtype] = base[i] + _aligned(inputs[i].numel())
    copies = min([MAX_ROTATIONS] + [arena[i].numel() // stride[inputs[i].dtype] for i in dense])
    if copies < 2:
        return [inputs]  # operands larger than half the arena are cold anyway
    out = []
    for c in range(copies):
        items = list(inputs)
        for i in dense:
            items[i] = _arena_view(inputs[i], arena[i], c * stride[inputs[i].dtype] + base[i])
        out.append(tuple(items))
    return out


def make_runner(spec: KernelSpec, device: torch.device | str = "cpu", *, seed: int = 0,
                cold: bool = False) -> Callable[[], Any]:
    """A callable running ``spec`` once per call, on inputs made outside the timed region;
    with ``cold`` (CPU) every call reads its operands from memory, not from cache."""
    device = torch.device(device)
    op, inputs = _build(spec, device, seed)
    pool = _rotations(inputs, device, spec.read_prefix_numel()) if cold and device.type == "cpu" else [inputs]
    if len(pool) == 1:
        return lambda: op(*pool[0])
    cycle = itertools.cycle(pool)
    return lambda: op(*next(cycle))
