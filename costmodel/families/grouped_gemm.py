"""Grouped expert GEMM: one GEMM per expert in a single call (padded ``bmm`` or ragged
``grouped_mm``, and ``grouped_mm``'s weight-gradient form; aten ``bmm``/``baddbmm``/
``_grouped_mm``), in any operand layout."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from costmodel.families.aten_map import OpCall, Unmappable, aten, matmul_dtype, matrix_layout, register
from costmodel.families.columns import column, layout_features, log10, onehot
from costmodel.families.descriptor import (
    DTYPE_BYTES,
    KernelSpec,
    check_choice,
    check_layout,
    check_positive,
    layout_flags,
)
from costmodel.families.inputs import randn_laid_out
from costmodel.families.registry import SuiteContext, grid, register_family


# ----------------------------------------------------------------------------- descriptor


GROUPED_IMPLS = ("padded_bmm", "grouped_mm", "grouped_mm_ragged_k")


@dataclass(frozen=True)
class GroupedGemmSpec(KernelSpec):
    """One GEMM per expert, Y_e[n_e, N] = X_e[n_e, K] @ W_e[K, N], in a single call.

    ``impl`` says how the call is made: ``padded_bmm`` pads every expert to the busiest
    expert's token count and runs ``torch.bmm`` (it pays for max(n_e) * E rows);
    ``grouped_mm`` runs ``torch.nn.functional.grouped_mm`` over the ragged groups;
    ``grouped_mm_ragged_k`` is its weight-gradient form, dW_e[K, N] = X_e^T[K, n_e] @
    G_e[n_e, N], the groups ragged along the reduction dim and every expert's [K, N] written.

    ``layout`` (``descriptor.LAYOUTS``) says which operand is a transposed view, as for
    ``GemmSpec``: "nt" is a weight stored [E, N, K] (transformers' Mixtral experts), "tn"
    the weight gradient's X^T.
    """

    family: ClassVar[str] = "grouped_gemm"
    tokens_per_expert: tuple[int, ...]
    k: int
    n: int
    impl: str = "grouped_mm"
    dtype: str = "float32"
    layout: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "k", "n")
        check_choice(self, "impl", GROUPED_IMPLS)
        check_layout(self)
        counts = self.tokens_per_expert
        if not isinstance(counts, tuple) or len(counts) == 0:
            raise ValueError("GroupedGemmSpec.tokens_per_expert must be a non-empty tuple of token counts")
        if any((not isinstance(c, int)) or c < 0 for c in counts):
            raise ValueError(f"GroupedGemmSpec.tokens_per_expert must hold integers >= 0, got {counts!r}")
        if sum(counts) == 0:
            raise ValueError("GroupedGemmSpec.tokens_per_expert must route at least one token (sum >= 1)")

    @property
    def num_experts(self) -> int:
        return len(self.tokens_per_expert)

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens_per_expert)

    @property
    def max_tokens(self) -> int:
        return max(self.tokens_per_expert)

    def executed_rows(self) -> int:
        """Rows the kernel actually multiplies: padded to the busiest expert for bmm."""
        if self.impl == "padded_bmm":
            return self.num_experts * self.max_tokens
        return self.total_tokens

    def flops(self) -> float:
        # Useful work: 2 * K * N * sum_e n_e (the MoE FLOPs people count). Padding is waste,
        # exposed by executed_flops() and by the padding-waste feature.
        return 2.0 * self.k * self.n * self.total_tokens

    def executed_flops(self) -> float:
        return 2.0 * self.k * self.n * self.executed_rows()

    def weight_experts(self) -> int:
        """Experts whose [K, N] matrix the call reads or writes: all E for a padded bmm (it
        multiplies every expert's slice, empty or not) and for the weight gradient (every
        expert's gradient is written, zero for an empty group); only experts with tokens for
        grouped_mm, which skips empty groups (measured on CPU: 3 non-empty of 16 experts read
        3.1 ms, all 16 10.4 ms, K=1024, N=2048; CUTLASS grouped GEMMs schedule tiles of
        non-empty groups only)."""
        if self.impl in ("padded_bmm", "grouped_mm_ragged_k"):
            return self.num_experts
        return sum(1 for c in self.tokens_per_expert if c > 0)

    def read_prefix_numel(self) -> tuple[int | None, ...] | None:
        """The forward ``grouped_mm`` reads only its non-empty experts' weights: its runner
        puts them first (``build``), so a call reads the weight's leading E_read * K * N."""
        if self.impl != "grouped_mm" or self.weight_experts() == self.num_experts:
            return None
        return (None, self.weight_experts() * self.k * self.n, None)

    def bytes_moved(self) -> float:
        # Inputs read once, outputs written once, each read expert's weight once:
        # s * (rows*K + E_read*K*N + rows*N), rows = executed rows (padding included); the
        # weight gradient reads X (rows*K) and G (rows*N) and writes E*K*N: the same sum.
        rows = self.executed_rows()
        return float(self.elem_bytes * (rows * self.k + self.weight_experts() * self.k * self.n + rows * self.n))


# ----------------------------------------------------------------------------- suite


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


def suite(cfg: Mapping[str, Any], ctx: SuiteContext) -> list[tuple[str, KernelSpec]]:
    """Experts x total tokens x (K, N) x power-law skew exponent x implementation; then, when
    the section has ``model_shapes``, the expert shapes of public MoE configs (each
    ``[name, experts, k, n]``, both projections listed) x its ``total_tokens`` x its
    ``skew_exponent`` x ``impl``, tagged ``model:<name>``. The grid's largest expert is
    1024 x 256; users' experts are 4-15x larger and out of cache on a CPU, so without these a
    fitted model extrapolates on every real MoE layer."""
    out: list[tuple[str, KernelSpec]] = [
        ("grid", GroupedGemmSpec(power_law_counts(int(total), int(experts), exponent), int(k), int(n), impl, ctx.dtype))
        for experts, total, (k, n), exponent, impl in grid(cfg, "experts", "total_tokens", "kn", "skew_exponent", "impl")]
    shapes = cfg.get("model_shapes")
    if shapes:
        for (name, experts, k, n), total, exponent, impl in itertools.product(
                shapes["shapes"], shapes["total_tokens"], shapes["skew_exponent"], cfg["impl"]):
            out.append((f"model:{name}", GroupedGemmSpec(power_law_counts(int(total), int(experts), exponent),
                                                         int(k), int(n), impl, ctx.dtype)))
    return out


# ----------------------------------------------------------------------------- torch call


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


# ----------------------------------------------------------------------------- runner


def build(spec: GroupedGemmSpec, device: torch.device, gen: torch.Generator,
          seed: int) -> tuple[Callable[..., Any], tuple]:
    dt = spec.dtype
    trans_a, trans_b = layout_flags(spec.layout)
    if spec.impl == "padded_bmm":
        return grouped_padded_bmm, (randn_laid_out((spec.num_experts, spec.max_tokens, spec.k), trans_a, dt, device, gen),
                                        randn_laid_out((spec.num_experts, spec.k, spec.n), trans_b, dt, device, gen))
    counts = spec.tokens_per_expert
    if spec.impl == "grouped_mm":
        # Non-empty groups first (stable): the same work (one GEMM per non-empty group, empty
        # ones skipped wherever they sit), with every weight the call reads in one leading
        # block (``GroupedGemmSpec.read_prefix_numel``), which the cold rotation keeps cold.
        counts = tuple(sorted(counts, key=lambda c: c == 0))
    offsets = torch.tensor(np.cumsum(counts), dtype=torch.int32, device=device)
    if spec.impl == "grouped_mm_ragged_k":
        return grouped_mm, (randn_laid_out((spec.k, spec.total_tokens), trans_a, dt, device, gen),
                                randn_laid_out((spec.total_tokens, spec.n), trans_b, dt, device, gen), offsets)
    return grouped_mm, (randn_laid_out((spec.total_tokens, spec.k), trans_a, dt, device, gen),
                            randn_laid_out((spec.num_experts, spec.k, spec.n), trans_b, dt, device, gen), offsets)


# ----------------------------------------------------------------------------- features


def _counts_matrix(column: pd.Series) -> np.ndarray:
    """Comma-separated per-expert counts -> [rows, max experts] floats, NaN-padded."""
    rows = [str(s).split(",") for s in column]
    widths = {len(r) for r in rows}
    if len(widths) == 1:
        return np.array(rows, dtype=np.float64)
    out = np.full((len(rows), max(widths)), np.nan)
    for i, r in enumerate(rows):
        out[i, : len(r)] = np.array(r, dtype=np.float64)
    return out


def features(t: pd.DataFrame, ceilings: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Experts, non-empty experts, total/max/mean tokens, imbalance (max/mean, CV) of the
    rows executed (a padded bmm executes max_n rows per expert), padding waste 1 - sum/(E*max),
    implementation, transposed operands."""
    counts = _counts_matrix(t["tokens_per_expert"])  # NaN past each row's expert count
    valid = ~np.isnan(counts)
    padded = t["impl"].astype(str).to_numpy() == "padded_bmm"
    experts = valid.sum(axis=1)
    mx = np.nanmax(counts, axis=1)
    useful = np.nansum(counts, axis=1)
    # ragged statistics of the rows the kernel *executes*: a padded bmm runs max_n rows
    # for every expert, so its groups are uniform whatever the routing was
    executed = np.where(padded[:, None] & valid, mx[:, None], counts)
    total = np.nansum(executed, axis=1)
    nonempty = (executed > 0).sum(axis=1)  # NaN > 0 is False
    cv = np.nanstd(executed, axis=1) / np.nanmean(executed, axis=1)
    k, n = column(t, "k"), column(t, "n")
    return {
        "log_experts": log10(experts), "log_nonempty": log10(nonempty), "log_total_tokens": log10(total),
        "log_max_tokens": log10(mx), "max_over_mean": mx / (total / experts), "tokens_cv": cv,
        "padding_waste": 1.0 - useful / (experts * mx), "log_mean_nonempty": log10(total / nonempty),
        "log_k": log10(k), "log_n": log10(n), **onehot(t["impl"], GROUPED_IMPLS, "impl"), **layout_features(t),
    }


# ----------------------------------------------------------------------------- aten ops


def _nonzero_rows(x: torch.Tensor) -> tuple[int, ...]:
    """Rows per batch that hold any non-zero: the real tokens of a zero-padded expert batch."""
    return tuple(int(c) for c in (x.detach() != 0).any(dim=-1).sum(dim=-1).tolist())


@register([aten.bmm, aten.baddbmm], family="grouped_gemm",
          note="impl=padded_bmm; tokens per batch are the rows holding any non-zero value (read from the "
               "input: zero-padding rows of a padded MoE batch are not useful work); a dense bmm "
               "(attention) has every row non-zero and counts all of them")
def _bmm(call: OpCall) -> KernelSpec:
    x, w = (call.args[1], call.args[2]) if call.func.overloadpacket is aten.baddbmm else (call.args[0], call.args[1])
    counts = _nonzero_rows(x)
    if sum(counts) == 0:
        counts = (int(x.shape[1]),) * int(x.shape[0])
    return GroupedGemmSpec(counts, int(x.shape[2]), int(w.shape[2]), "padded_bmm",
                           matmul_dtype(x, GroupedGemmSpec.allowed_dtypes), matrix_layout(x, w))


@register([aten._grouped_mm], family="grouped_gemm",
          note="impl=grouped_mm; tokens per expert from the offsets tensor; the weight-gradient form "
               "(2-D x 2-D, ragged reduction dim) is impl=grouped_mm_ragged_k; layout from the strides")
def _grouped(call: OpCall) -> KernelSpec:
    x, w, offs = call.args[0], call.args[1], call.arg(2, "offs")
    if offs is None or x.dim() != 2 or w.dim() not in (2, 3):
        raise Unmappable("only the ragged forms with offsets ([sum n, K] x [E, K, N], [K, sum n] x [sum n, N]) are described")
    ends = offs.detach().to("cpu", torch.int64).numpy()
    counts = tuple(int(c) for c in np.diff(ends, prepend=0))
    # 2-D x 2-D is the weight gradient: X^T [K, sum n] @ G [sum n, N] -> [E, K, N]
    ragged_k = w.dim() == 2
    k = int(x.shape[0]) if ragged_k else int(x.shape[1])
    return GroupedGemmSpec(counts, k, int(w.shape[-1]), "grouped_mm_ragged_k" if ragged_k else "grouped_mm",
                           matmul_dtype(x, GroupedGemmSpec.allowed_dtypes), matrix_layout(x, w))


register_family(GroupedGemmSpec, suite=suite, build=build, features=features,
                range_features=("log_experts", "log_total_tokens", "log_k", "log_n"))
