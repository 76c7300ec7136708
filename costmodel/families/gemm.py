"""GEMM: C[M, N] = A[M, K] @ B[K, N] (``torch.matmul``; ``mm``/``addmm``/``mv``/``dot``
and ``linear`` land here), in any operand layout (``layout``: which operands are
transposed views, as ``nn.Linear``'s weight always is)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import pandas as pd
import torch

from costmodel.families.aten_map import OpCall, Unmappable, aten, matmul_dtype, matrix_layout, register
from costmodel.families.columns import column, elem_bytes, layout_features, log10, page_strided_rows
from costmodel.families.descriptor import DTYPE_BYTES, KernelSpec, check_layout, check_positive, layout_flags
from costmodel.families.inputs import randn_laid_out
from costmodel.families.registry import SuiteContext, grid, register_family
from costmodel.families.spmm import spmm_spec


# ----------------------------------------------------------------------------- descriptor


@dataclass(frozen=True)
class GemmSpec(KernelSpec):
    """C[M, N] = A[M, K] @ B[K, N] (``torch.matmul``).

    ``layout`` (``descriptor.LAYOUTS``): "nt" when B is stored [N, K] and passed transposed
    (``x @ W.t()``, what ``nn.Linear`` runs), "tn"/"tt" for a transposed A (weight
    gradients); None is "nn", both stored as their logical shapes."""

    family: ClassVar[str] = "gemm"
    m: int
    k: int
    n: int
    dtype: str = "float32"
    layout: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "m", "k", "n")
        check_layout(self)

    def flops(self) -> float:
        # 2MKN: each of the MN outputs takes K multiplies and K adds (CS336; seed article).
        return 2.0 * self.m * self.k * self.n

    def bytes_moved(self) -> float:
        # s(MK + KN + MN): A and B read once, C written once (seed article 19.2.5).
        return float(self.elem_bytes * (self.m * self.k + self.k * self.n + self.m * self.n))


# ----------------------------------------------------------------------------- suite


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


def suite(cfg: Mapping[str, Any], ctx: SuiteContext) -> list[tuple[str, KernelSpec]]:
    """The trio (first, so a trio shape also on the grid keeps its trio tag), the M x K x N
    grid in each of ``layouts`` (default ["nn"]; "nt" is every ``nn.Linear``), and
    ``random.count`` log-uniform shapes (seeded, row-major)."""
    out: list[tuple[str, KernelSpec]] = []
    trio = cfg.get("equal_flops_trio")
    if trio:
        flops = trio_flops(ctx.memory_bytes, ctx.dtype, int(trio["max_operand_bytes"]))
        out += [(f"trio:{name}", s) for name, s in equal_flops_trio(flops, ctx.dtype)]
    layouts = list(cfg.get("layouts", ["nn"]))
    out += [("grid", GemmSpec(m, k, n, ctx.dtype, layout)) for layout in layouts for m, k, n in grid(cfg, "m", "k", "n")]
    rnd = cfg.get("random")
    if rnd:
        rng = np.random.default_rng(int(rnd["seed"]))
        for _ in range(int(rnd["count"])):
            shape = (_log_uniform(rng, *rnd["m"]), _log_uniform(rng, *rnd["k"]), _log_uniform(rng, *rnd["n"]))
            out.append(("grid", GemmSpec(*shape, ctx.dtype)))
    return out


# ----------------------------------------------------------------------------- torch call


def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


# ----------------------------------------------------------------------------- runner


def build(spec: GemmSpec, device: torch.device, gen: torch.Generator, seed: int) -> tuple[Callable[..., Any], tuple]:
    trans_a, trans_b = layout_flags(spec.layout)
    return gemm, (randn_laid_out((spec.m, spec.k), trans_a, spec.dtype, device, gen),
                      randn_laid_out((spec.k, spec.n), trans_b, spec.dtype, device, gen))


# ----------------------------------------------------------------------------- features


TILE = {"cpu": 64, "cuda": 128}  # output tile edge used for the tile/wave features


def features(t: pd.DataFrame, ceilings: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """log M, K, N, aspect log(M/N), output tiles and wave efficiency (tiles over
    ceil(tiles/units)*units: how well the tiles fill the parallel units, "wave quantization",
    NVIDIA's Matrix Multiplication Background guide), and whether it is a matrix-vector
    product (M or N = 1: BLAS switches to a GEMV kernel), which operands are transposed
    (BLAS runs another kernel per transa/transb), and whether B is stored [K, N] with rows a
    multiple of 4 KiB apart (``columns.page_strided_rows``). On the EPYC VM such a B cost M = 4-16
    GEMMs 1.15-1.26x their neighbours' time per weight element, M = 64 1.07-1.09x, while B stored
    [N, K] (``nn.Linear``'s "nt") showed no such step (0.99-1.05x at the median;
    ``scripts/bench_gemm_stride.py``, results/cpu_epyc/gemm_stride). Flagging only the stored
    [K, N] case held out better on both EPYC profiles (4-fold by shape, two seeds: 4.4 / 4.2 ->
    4.1 / 4.1% one thread, 6.8 / 6.4 -> 6.5 / 6.2% two) than flagging every layout's stride."""
    units = float(ceilings.get("parallel_units", 1))
    tile = TILE.get(str(ceilings.get("device_kind", "cpu")), 64)
    m, k, n = column(t, "m"), column(t, "k"), column(t, "n")
    tiles = np.ceil(m / tile) * np.ceil(n / tile)
    layout = layout_features(t)
    return {
        "log_m": log10(m), "log_k": log10(k), "log_n": log10(n), "log_m_over_n": log10(m / n),
        "log_tiles": log10(tiles), "wave_eff": tiles / (np.ceil(tiles / units) * units),
        "gemv": ((m == 1) | (n == 1)).astype(np.float64), **layout,
        "b_rows_page_strided": page_strided_rows(n, elem_bytes(t)) * (1.0 - layout["trans_b"]),
    }


# ----------------------------------------------------------------------------- aten ops


@register([aten.mm, aten.addmm], family="gemm", sparse=True,
          note="linear/matmul land here (bias fused by addmm's beta*C); layout from the operands' strides "
               "(linear's weight is a transposed view: nt); a sparse CSR or COO first operand maps to spmm")
def _mm(call: OpCall) -> KernelSpec:
    is_add = call.func.overloadpacket is aten.addmm
    a, b = (call.args[1], call.args[2]) if is_add else (call.args[0], call.args[1])
    if a.layout in (torch.sparse_csr, torch.sparse_coo) and b.layout == torch.strided:
        return spmm_spec(a, b, call, call.args[0] if is_add else None)
    if a.layout != torch.strided or b.layout != torch.strided:
        raise Unmappable(f"operand layouts {a.layout}, {b.layout} are not dense, or sparse (CSR, COO) x dense")
    return GemmSpec(int(a.shape[0]), int(a.shape[1]), int(b.shape[1]), matmul_dtype(a, GemmSpec.allowed_dtypes),
                    matrix_layout(a, b))


@register([aten.mv, aten.addmv], family="gemm", note="matrix-vector product as a GEMM with N = 1")
def _mv(call: OpCall) -> KernelSpec:
    a = call.args[1] if call.func.overloadpacket is aten.addmv else call.args[0]
    return GemmSpec(int(a.shape[0]), int(a.shape[1]), 1, matmul_dtype(a, GemmSpec.allowed_dtypes))


@register([aten.dot], family="gemm", note="dot product as a GEMM with M = N = 1")
def _dot(call: OpCall) -> KernelSpec:
    a = call.args[0]
    return GemmSpec(1, int(a.numel()), 1, matmul_dtype(a, GemmSpec.allowed_dtypes))


register_family(GemmSpec, suite=suite, build=build, features=features,
                range_features=("log_m", "log_k", "log_n"))
