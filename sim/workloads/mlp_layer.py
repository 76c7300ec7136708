"""A dense two-layer MLP, [B, D] -> [B, H] -> [B, D], and its kernel trace.

    h = x W1          gemm [B, D] x [D, H]
    h = gelu(h)       elementwise (tanh form)
    y = h W2          gemm [B, H] x [H, D]

FLOPs grow linearly with the batch B; latency does not, because small B gives skinny
GEMMs that read the whole weight matrices for little work (the seed article's
"MLP / Batch Size" section).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from costmodel.families.descriptor import KernelSpec
from costmodel.families.elementwise import ElementwiseSpec, elementwise
from costmodel.families.gemm import GemmSpec, gemm
from costmodel.measure.scope import kernel_scope


@dataclass(frozen=True)
class MLPConfig:
    batch: int = 1  # B: rows (tokens) per call
    d_model: int = 1024  # D
    d_hidden: int = 4096  # H
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("batch", "d_model", "d_hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"mlp.{name} must be a positive integer (>= 1), got {value!r}")

    def flops(self) -> float:
        return 2.0 * 2 * self.batch * self.d_model * self.d_hidden


def mlp_trace(cfg: MLPConfig) -> list[KernelSpec]:
    return [
        GemmSpec(cfg.batch, cfg.d_model, cfg.d_hidden, cfg.dtype),
        ElementwiseSpec("gelu", cfg.batch * cfg.d_hidden, cfg.dtype),
        GemmSpec(cfg.batch, cfg.d_hidden, cfg.d_model, cfg.dtype),
    ]


class MLP(nn.Module):
    def __init__(self, cfg: MLPConfig, *, device: torch.device | str = "cpu", seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        gen = torch.Generator().manual_seed(seed)
        dtype = getattr(torch, cfg.dtype)
        self.w1 = nn.Parameter((torch.randn(cfg.d_model, cfg.d_hidden, generator=gen) / cfg.d_model**0.5).to(
            device, dtype), requires_grad=False)
        self.w2 = nn.Parameter((torch.randn(cfg.d_hidden, cfg.d_model, generator=gen) / cfg.d_hidden**0.5).to(
            device, dtype), requires_grad=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with kernel_scope("gemm"):
            h = gemm(x, self.w1)
        with kernel_scope("elementwise"):
            h = elementwise("gelu", h)
        with kernel_scope("gemm"):
            return gemm(h, self.w2)
