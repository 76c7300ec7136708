"""Seeded inputs for the families' runners (``build``): random tensors, index tensors with a
given skew, a CSR adjacency. Made once per runner, outside the timed region."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from costmodel.families.indices import index_for_cv


def randn(shape: tuple[int, ...], dtype: str, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    """Standard normal values (random integers for an integer dtype), seeded by ``gen``."""
    if dtype.startswith("int"):
        return torch.randint(0, 1 << 20, shape, generator=gen).to(device=device, dtype=getattr(torch, dtype))
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=getattr(torch, dtype))


def randn_laid_out(shape: tuple[int, ...], transposed: bool, dtype: str, device: torch.device,
                   gen: torch.Generator) -> torch.Tensor:
    """``randn`` of logical ``shape``; with ``transposed`` its last two dims are stored
    swapped and the tensor is their transposed view (a ``W.t()`` operand), which the cold
    rotation of ``costmodel.measure.runners`` keeps in that layout."""
    if not transposed:
        return randn(shape, dtype, device, gen)
    return randn((*shape[:-2], shape[-1], shape[-2]), dtype, device, gen).transpose(-2, -1)


def skewed_index(num_rows: int, num_targets: int, cv: float, sorted_: bool, seed: int,
                 device: torch.device) -> torch.Tensor:
    """``num_rows`` ids in [0, num_targets) whose per-target counts have CV ``cv``
    (``costmodel.families.indices.index_for_cv``), ascending when ``sorted_``."""
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
