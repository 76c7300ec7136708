"""A real MoE layer and its kernel trace, from one config.

Forward pass (inference, no grad), every kernel in a ``kernel_scope``:

1. router: ``gemm`` [T, D] x [D, E], ``softmax``, ``topk`` (k of E);
   a routing drawn by ``sim.workloads.routing`` may override the router's choice (the router's
   cost is still paid), which is how a sweep pins the routing concentration;
2. dispatch: stable ``sort`` of the A = kept assignments by expert, ``histogram``
   (bincount) of expert loads, ``gather`` of token ids and gates in sorted order,
   ``gather`` of the token rows [A, D];
3. experts, SwiGLU (HF Mixtral eager: down(silu(gate(x)) * up(x))) or a two-layer GELU
   MLP, run by the backend ``moe.backend`` names, a registered object in
   ``sim/workloads/backends/moe.py`` (``loop``: one ``gemm`` per projection per non-empty expert;
   ``padded``: a zero-padded ``torch.bmm``; ``grouped``: ``torch.nn.functional.grouped_mm``);
4. combine: ``elementwise`` scale by the gates, ``scatter`` (index_add, sum) into [T, D].

``moe_trace`` lists the same kernels with the same shapes without running anything; the
tests run the module under the profiler and check that both agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from costmodel.families.descriptor import KernelSpec
from costmodel.families.elementwise import ElementwiseSpec, elementwise
from costmodel.families.gather import GatherSpec, gather
from costmodel.families.gemm import GemmSpec, gemm
from costmodel.families.histogram import HistogramSpec, histogram
from costmodel.families.scatter import ScatterSpec, scatter
from costmodel.families.softmax import SoftmaxSpec, softmax
from costmodel.families.sort import SortSpec, sort
from costmodel.families.topk import TopkSpec, topk
from costmodel.measure.scope import kernel_scope
from sim.workloads.backends.moe import (  # noqa: F401 (MOE_BACKENDS and padded_slots re-exported)
    MOE_BACKENDS,
    expert_projections,
    moe_backend,
    padded_slots,
)
from sim.workloads.routing import Routing, check_routing_shape

EXPERT_KINDS = ("swiglu", "mlp")


@dataclass(frozen=True)
class MoEConfig:
    tokens: int = 1024  # T: tokens in the batch (batch x sequence)
    d_model: int = 512  # D: hidden size
    d_ff: int = 1024  # F: expert intermediate size
    num_experts: int = 16  # E
    top_k: int = 2  # experts per token
    expert: str = "swiglu"  # swiglu (3 GEMMs, Mixtral) | mlp (2 GEMMs + GELU)
    backend: str = "loop"  # a registered backend (sim/workloads/backends/moe.py): loop | padded | grouped
    dtype: str = "float32"

    def __post_init__(self) -> None:
        check_routing_shape(self.tokens, self.num_experts, self.top_k)
        for name in ("d_model", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"moe.{name} must be a positive integer (>= 1), got {value!r}")
        if self.expert not in EXPERT_KINDS:
            raise ValueError(f"moe.expert must be one of {list(EXPERT_KINDS)}, got {self.expert!r}")
        moe_backend(self.backend)  # a ValueError naming moe.backend and the registered backends

    def useful_flops(self, assignments: int) -> float:
        """Router plus expert FLOPs per forward (2MKN per GEMM), ``assignments`` kept rows."""
        projections = 3 if self.expert == "swiglu" else 2
        return 2.0 * self.tokens * self.d_model * self.num_experts + 2.0 * assignments * self.d_model * self.d_ff * projections


def backend_unavailable_reason(cfg: MoEConfig, device: torch.device) -> str | None:
    """Why ``cfg.backend`` cannot run here, or None."""
    return moe_backend(cfg.backend).unavailable_reason(cfg, device)


# ----------------------------------------------------------------------------- dispatch plan


@dataclass(frozen=True)
class DispatchPlan:
    """Host-side facts of one routing that both the module and the trace need."""

    counts: tuple[int, ...]  # kept tokens per expert
    assignments: int  # A = kept (token, expert) pairs
    token_hit_cv: float  # CV of how often each token row is gathered / combined into
    padded_rows: int  # E * max_n for the padded backend

    @classmethod
    def from_counts(cls, counts: Sequence[int], token_hits: np.ndarray) -> "DispatchPlan":
        counts = tuple(int(c) for c in counts)
        hits = token_hits.astype(np.float64)
        cv = float(hits.std() / hits.mean()) if hits.mean() > 0 else 0.0
        return cls(counts, sum(counts), round(cv, 3), len(counts) * max(counts))

    @classmethod
    def from_expert_counts(cls, counts: Sequence[int], cfg: "MoEConfig") -> "DispatchPlan":
        """The plan of user-given per-expert token counts (validated by ``check_expert_counts``);
        every token is assumed to be combined from the same number of experts (hit CV 0)."""
        checked = check_expert_counts(counts, tokens=cfg.tokens, top_k=cfg.top_k, num_experts=cfg.num_experts)
        return cls.from_counts(checked, np.full(cfg.tokens, sum(checked) / cfg.tokens))

    @classmethod
    def from_routing(cls, routing: Routing) -> "DispatchPlan":
        _, token, _ = routing.flat_assignments()
        return cls.from_counts(routing.expert_counts(), np.bincount(token, minlength=routing.tokens))


def check_expert_counts(counts: Sequence[int], *, tokens: int, top_k: int, num_experts: int) -> tuple[int, ...]:
    """Per-expert token counts as ints, or a ValueError naming the index, value and range.

    A top-k router sends each of ``tokens`` tokens to ``top_k`` distinct experts, so an
    expert receives at most ``tokens`` rows and all experts together at most
    ``tokens * top_k`` (exactly that without capacity drops, fewer with them); a layer with
    no routed row at all has nothing to compute. Counts must be whole numbers: 128.7 is
    refused, not truncated.
    """
    if hasattr(counts, "tolist"):  # numpy array or torch tensor
        counts = counts.tolist()
    if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence):
        raise ValueError(f"counts must be a sequence of moe.num_experts={num_experts} integers, "
                         f"got {type(counts).__name__}")
    if len(counts) != num_experts:
        raise ValueError(f"counts must hold moe.num_experts={num_experts} token counts (one per expert), "
                         f"got {len(counts)}")
    out = []
    for i, c in enumerate(counts):
        ok = isinstance(c, (int, float, np.integer, np.floating)) and not isinstance(c, (bool, np.bool_))
        if not ok or not (isinstance(c, (int, np.integer)) or (np.isfinite(c) and float(c).is_integer())) \
                or not 0 <= c <= tokens:
            raise ValueError(f"counts[{i}] must be an integer in [0, moe.tokens={tokens}], got {c!r}")
        out.append(int(c))
    total, most = sum(out), tokens * top_k
    if not 1 <= total <= most:
        raise ValueError(f"counts must sum to between 1 and moe.tokens x moe.top_k = {tokens} x {top_k} = {most} "
                         f"(each token is routed to top_k experts; fewer after capacity drops), got {total}")
    return tuple(out)


# ----------------------------------------------------------------------------- trace


def moe_trace(cfg: MoEConfig, plan: DispatchPlan) -> list[KernelSpec]:
    """The kernels ``MoELayer.forward`` runs for this config and routing, in order."""
    T, D, E, k, A, dt = cfg.tokens, cfg.d_model, cfg.num_experts, cfg.top_k, plan.assignments, cfg.dtype
    trace: list[KernelSpec] = [
        GemmSpec(T, D, E, dt),
        SoftmaxSpec(T, E, dt),
        TopkSpec(T, E, k, dt),
        SortSpec(A, "int64"),
        HistogramSpec(A, E),
        GatherSpec(A, 1, A, 0.0, False, "int64"),  # token id of each sorted assignment
        GatherSpec(A, 1, A, 0.0, False, dt),  # gate of each sorted assignment
        GatherSpec(A, D, T, plan.token_hit_cv, False, dt),  # token rows
    ]
    trace += moe_backend(cfg.backend).expert_trace(cfg, plan)
    trace += [
        ElementwiseSpec("scale", A * D, dt),
        ScatterSpec(A, D, T, "sum", "index_add", plan.token_hit_cv, False, dt),
    ]
    return trace


# ----------------------------------------------------------------------------- module


class MoELayer(nn.Module):
    """Router + experts with a selectable backend; weights seeded, inference only."""

    def __init__(self, cfg: MoEConfig, *, device: torch.device | str = "cpu", seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.backend = moe_backend(cfg.backend)  # runs the experts (sim/workloads/backends/moe.py)
        gen = torch.Generator().manual_seed(seed)
        dtype = getattr(torch, cfg.dtype)
        D, E = cfg.d_model, cfg.num_experts

        def init(*shape: int, fan_in: int) -> nn.Parameter:
            w = torch.randn(*shape, generator=gen) / fan_in**0.5
            return nn.Parameter(w.to(device=device, dtype=dtype), requires_grad=False)

        self.router = init(D, E, fan_in=D)
        # one [E, K, N] stack per projection: per-expert slices for the loop, whole for bmm/grouped_mm
        self.projections = nn.ParameterList([init(E, kk, nn_, fan_in=kk) for kk, nn_ in expert_projections(cfg)])

    def expert_activation(self, hidden: list[torch.Tensor]) -> torch.Tensor:
        """The activation between an expert's projections (what the backends call)."""
        if self.cfg.expert == "swiglu":
            with kernel_scope("elementwise"):
                a = elementwise("silu", hidden[0])
            with kernel_scope("elementwise"):
                return elementwise("mul", a, hidden[1])
        with kernel_scope("elementwise"):
            return elementwise("gelu", hidden[0])

    @torch.no_grad()
    def forward(self, x: torch.Tensor, routing: Routing | None = None) -> torch.Tensor:
        cfg = self.cfg
        T, k, E = cfg.tokens, cfg.top_k, cfg.num_experts
        if x.shape != (T, cfg.d_model):
            raise ValueError(f"MoELayer input must be [tokens={T}, d_model={cfg.d_model}], got {list(x.shape)}")
        with kernel_scope("gemm"):
            logits = gemm(x, self.router)
        with kernel_scope("softmax"):
            probs = softmax(logits)
        with kernel_scope("topk"):
            gate_vals, expert_ids = topk(probs, k)
        if routing is None:
            flat_expert = expert_ids.reshape(-1)
            flat_token = torch.arange(T, device=x.device).repeat_interleave(k)
            flat_gate = gate_vals.reshape(-1)
        else:
            flat_expert, flat_token, flat_gate = self._routing_tensors(routing, x.device)
        with kernel_scope("sort"):
            sorted_expert, order = sort(flat_expert)
        with kernel_scope("histogram"):
            counts = histogram(flat_expert, E)
        with kernel_scope("gather"):
            token_idx = gather(flat_token, order)
        with kernel_scope("gather"):
            gates_sorted = gather(flat_gate, order)
        with kernel_scope("gather"):
            x_sorted = gather(x, token_idx)
        counts_list = counts.tolist()  # host needs the group sizes (a device sync on GPUs)
        y_sorted = self.backend.run_experts(self, x_sorted, counts_list)
        with kernel_scope("elementwise"):
            weighted = elementwise("scale", y_sorted, gates_sorted.unsqueeze(1))
        with kernel_scope("scatter"):
            return scatter(weighted, token_idx, T, reduce="sum", backend="index_add")

    def _routing_tensors(self, routing: Routing, device: torch.device) -> tuple[torch.Tensor, ...]:
        cache = getattr(self, "_routing_cache", None)
        if cache is None or cache[0] is not routing:
            if routing.tokens != self.cfg.tokens or routing.top_k != self.cfg.top_k or routing.num_experts != self.cfg.num_experts:
                raise ValueError(
                    f"routing is for tokens={routing.tokens}, top_k={routing.top_k}, experts={routing.num_experts}; "
                    f"the layer has tokens={self.cfg.tokens}, top_k={self.cfg.top_k}, experts={self.cfg.num_experts}"
                )
            expert, token, gate = routing.flat_assignments()
            tensors = tuple(torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in (expert, token, gate))
            gate_t = tensors[2].to(getattr(torch, self.cfg.dtype))
            cache = (routing, (tensors[0], tensors[1], gate_t))
            self._routing_cache = cache
        return cache[1]
