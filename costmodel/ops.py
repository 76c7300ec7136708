"""The torch calls behind every kernel family, shared by the suite and the layers.

The microbenchmark runners (``costmodel.runners``) and the real MoE and GNN modules
(``sim.moe_layer``, ``sim.gnn_layer``) both call these functions, so a kernel in a
layer's trace is timed by the suite through exactly the code the layer runs.

``kernel_scope`` labels each call for the torch profiler, which is how the simulator
times kernels inside a real forward pass and how the tests check that a layer's trace
and its execution agree.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn.functional as F
from torch._C._autograd import _profiler_enabled
from torch.profiler import record_function

from costmodel.device import torch_scatter_version
from costmodel.kernels import DTYPE_BYTES, SCATTER_BACKENDS

#: label prefix of the profiler ranges opened by kernel_scope
SCOPE_PREFIX = "kernel::"


_NO_SCOPE = contextlib.nullcontext()


def kernel_scope(family: str) -> contextlib.AbstractContextManager:
    """Profiler range around one kernel call; a no-op unless a profiler is recording
    (an idle ``record_function`` still costs ~9 us a call on CPU, a tax the layer's
    measured latency would pay and its kernels' microbenchmarks would not)."""
    return record_function(SCOPE_PREFIX + family) if _profiler_enabled() else _NO_SCOPE


# ----------------------------------------------------------------------------- dense


def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


def grouped_padded_bmm(x_padded: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[E, max_tokens, K] @ [E, K, N] -> [E, max_tokens, N]."""
    return torch.bmm(x_padded, w)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Ragged [sum n_e, K] @ [E, K, N] with int32 group end offsets."""
    return F.grouped_mm(x, w, offs=offsets)


def grouped_mm_unavailable_reason(k: int, n: int, dtype: str, device: torch.device) -> str | None:
    """Why ``grouped_mm`` cannot run this shape here, or None if it can."""
    if not hasattr(F, "grouped_mm"):
        return f"torch {torch.__version__} has no torch.nn.functional.grouped_mm (added in torch 2.8)"
    row_bytes = DTYPE_BYTES[dtype]
    if (k * row_bytes) % 16 or (n * row_bytes) % 16:
        return f"grouped_mm needs K and N rows in multiples of 16 bytes (K={k}, N={n}, {dtype})"
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        if major < 8 or dtype != "bfloat16":
            return "grouped_mm on CUDA needs bfloat16 on a device of compute capability >= 8.0"
    return None


# ----------------------------------------------------------------------------- sparse


def gather(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return src.index_select(0, index)


def gather_by_indexing(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``src[index]``: aten ``index``, another kernel than ``index_select`` on the CPU."""
    return src[index]


def gather_elements(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``torch.gather`` along dim 0."""
    return torch.gather(src, 0, index)


def scatter_backends_available() -> tuple[str, ...]:
    """Scatter backends usable in this process (torch-scatter only where installed)."""
    if torch_scatter_version() is None:
        return tuple(b for b in SCATTER_BACKENDS if b != "torch_scatter")
    return SCATTER_BACKENDS


def check_scatter_backend(backend: str) -> None:
    if backend not in SCATTER_BACKENDS:
        raise ValueError(f"scatter backend must be one of {list(SCATTER_BACKENDS)}, got {backend!r}")
    if backend not in scatter_backends_available():
        raise ValueError(
            "scatter backend 'torch_scatter' is not installed here: "
            "pip install --no-build-isolation torch-scatter (compiles against the installed torch); "
            f"available: {list(scatter_backends_available())}"
        )


def scatter(
    src: torch.Tensor, index: torch.Tensor, num_dst: int, *, reduce: str, backend: str
) -> torch.Tensor:
    """Reduce rows of ``src`` [E, F] into a fresh [num_dst, F] at ``index`` [E].

    Rows of the output that receive nothing are 0 for every backend and reduction.
    """
    width = src.shape[1]
    if backend == "index_add":
        return torch.zeros(num_dst, width, dtype=src.dtype, device=src.device).index_add_(0, index, src)
    if backend == "index_copy":
        return torch.zeros(num_dst, width, dtype=src.dtype, device=src.device).index_copy_(0, index, src)
    if backend == "index_put":
        return torch.zeros(num_dst, width, dtype=src.dtype, device=src.device).index_put_((index,), src, accumulate=True)
    if backend == "scatter_reduce":
        out = torch.zeros(num_dst, width, dtype=src.dtype, device=src.device)
        torch_reduce = {"sum": "sum", "mean": "mean", "max": "amax"}[reduce]
        return out.scatter_reduce_(0, index.view(-1, 1).expand_as(src), src, torch_reduce, include_self=False)
    if backend == "torch_scatter":
        import torch_scatter

        return torch_scatter.scatter(src, index, dim=0, dim_size=num_dst, reduce=reduce)
    raise ValueError(f"scatter backend must be one of {list(SCATTER_BACKENDS)}, got {backend!r}")


def spmm(adjacency_csr: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """CSR [N_dst, N_src] @ dense [N_src, F] (gather and sum fused)."""
    return torch.sparse.mm(adjacency_csr, x)


# ----------------------------------------------------------------------------- small ops

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "silu": F.silu,
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "sigmoid": torch.sigmoid,
    "copy": torch.clone,
}


def elementwise(op: str, *inputs: torch.Tensor) -> torch.Tensor:
    """One elementwise pass; ``scale`` multiplies by a broadcast (e.g. [rows, 1]) tensor."""
    if op in _ACTIVATIONS:
        return _ACTIVATIONS[op](inputs[0])
    if op == "add":
        return inputs[0] + inputs[1]
    if op in ("mul", "scale"):
        return inputs[0] * inputs[1]
    if op == "floordiv":
        return torch.div(inputs[0], inputs[1], rounding_mode="floor")
    if op == "fill":
        return torch.zeros_like(inputs[0])
    raise ValueError(f"unknown elementwise op {op!r}")


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = torch.topk(x, k, dim=-1)
    return values, indices


def sort(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = torch.sort(x, stable=True)
    return values, indices


def histogram(x: torch.Tensor, bins: int) -> torch.Tensor:
    return torch.bincount(x, minlength=bins)
