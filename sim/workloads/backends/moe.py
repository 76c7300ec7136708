"""The MoE layer's expert backends: how the experts run over the expert-sorted rows.

``MoELayer`` (``sim/workloads/moe_layer.py``) routes, sorts and gathers the token rows, then hands
them to its backend, and combines what comes back; ``moe_trace`` does the same with kernel
descriptors. Each backend is one class that declares, side by side:

- ``run_experts``: its part of the forward pass, every kernel in a ``kernel_scope``;
- ``expert_trace``: the kernels that part runs, with the same shapes, without running anything;
- ``unavailable_reason``: why it cannot run on a device (None when it can);
- ``hidden_rows`` / ``buffer_elements``: its activations, for ``sim.workloads.memory.moe_need``;
- ``calibration_kernels``: the kernels a profile needs to predict it over every routing
  (``sim.predict.calibration.moe_suite``), from seeded recipes, never from an evaluated routing.

Registered backends (``MOE_BACKENDS``, looked up by ``moe.backend``):

- ``loop``: one ``gemm`` per projection per non-empty expert, as HF eager loops;
- ``padded``: ``scatter`` (index_copy) of the rows into a zeroed [E, max_n, D] buffer,
  ``grouped_gemm`` impl=padded_bmm (``torch.bmm``), ``gather`` back out; it pays for the
  busiest expert on every expert;
- ``grouped``: ``grouped_gemm`` impl=grouped_mm (``torch.nn.functional.grouped_mm``) over
  the ragged groups.

A new backend is a subclass of ``MoEBackend`` here and one ``MOE_BACKENDS.register`` call;
the layer, its trace, the memory check and calibration find it by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from costmodel.families.descriptor import KernelSpec
from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gather import GatherSpec, gather
from costmodel.families.gemm import GemmSpec, gemm
from costmodel.families.grouped_gemm import (
    GroupedGemmSpec,
    grouped_mm,
    grouped_mm_unavailable_reason,
    grouped_padded_bmm,
)
from costmodel.families.scatter import ScatterSpec, scatter
from costmodel.measure.scope import kernel_scope
from costmodel.measure.suite import capped_power_law_counts, power_law_counts
from sim.workloads.backends.registry import BackendRegistry

if TYPE_CHECKING:  # annotations only: sim.workloads.moe_layer imports this module
    from sim.workloads.moe_layer import DispatchPlan, MoEConfig, MoELayer


# ----------------------------------------------------------------------------- expert shapes


def expert_projections(cfg: MoEConfig) -> list[tuple[int, int]]:
    """(K, N) of each expert GEMM in execution order."""
    if cfg.expert == "swiglu":
        return [(cfg.d_model, cfg.d_ff), (cfg.d_model, cfg.d_ff), (cfg.d_ff, cfg.d_model)]
    return [(cfg.d_model, cfg.d_ff), (cfg.d_ff, cfg.d_model)]


def activation_specs(cfg: MoEConfig, rows: int) -> list[KernelSpec]:
    """The elementwise kernels between the projections, over ``rows`` hidden rows."""
    numel = rows * cfg.d_ff
    if cfg.expert == "swiglu":
        return [ElementwiseSpec("silu", numel, cfg.dtype), ElementwiseSpec("mul", numel, cfg.dtype)]
    return [ElementwiseSpec("gelu", numel, cfg.dtype)]


def hidden_maps(cfg: MoEConfig) -> int:
    """[rows, d_ff] maps alive at once: gate, up, silu(gate), product | first GEMM, gelu."""
    return 4 if cfg.expert == "swiglu" else 2


def padded_slots(counts: Sequence[int]) -> np.ndarray:
    """Row of each expert-sorted assignment in the [E * max_n] padded buffer."""
    counts_a = np.asarray(counts, dtype=np.int64)
    max_n = int(counts_a.max())
    starts = np.cumsum(counts_a) - counts_a
    return np.repeat(np.arange(counts_a.size, dtype=np.int64) * max_n - starts, counts_a) + np.arange(
        int(counts_a.sum()), dtype=np.int64
    )


def log_grid(lo: int, hi: int, points: int) -> list[int]:
    """Up to ``points`` distinct integers from ``lo`` to ``hi``, evenly spaced in log."""
    return sorted({int(round(v)) for v in np.geomspace(max(lo, 1), max(hi, 1), points)})


def counts_with_max(total: int, experts: int, max_n: int) -> tuple[int, ...]:
    """A count vector summing to ``total`` whose busiest expert has ``max_n`` (padded bmm
    cost depends only on E * max_n)."""
    rest = total - max_n
    others = power_law_counts(rest, experts - 1, 0.0) if experts > 1 else ()
    return (max_n, *others)


def padded_gather_cv(assignments: int, rows: int) -> float:
    """Hit-count CV of reading ``assignments`` of ``rows`` padded slots once each and the
    rest never: sqrt((1 - f) / f) for the filled share f."""
    filled = assignments / rows
    return round(((1 - filled) / filled) ** 0.5, 3)


# ----------------------------------------------------------------------------- backends


class MoEBackend(ABC):
    """How the experts run; see the module docstring for what each method declares."""

    name: str

    def unavailable_reason(self, cfg: MoEConfig, device: torch.device) -> str | None:
        """Why this backend cannot run ``cfg`` on ``device``, or None."""
        return None

    @abstractmethod
    def run_experts(self, layer: MoELayer, x_sorted: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """[A, D] expert outputs of the [A, D] expert-sorted rows; ``counts`` rows per expert."""

    @abstractmethod
    def expert_trace(self, cfg: MoEConfig, plan: DispatchPlan) -> list[KernelSpec]:
        """The kernels ``run_experts`` runs for this plan, in order."""

    @abstractmethod
    def hidden_rows(self, cfg: MoEConfig, busiest_rows: int) -> int:
        """Rows of each [rows, d_ff] hidden map when the busiest expert gets ``busiest_rows``."""

    def buffer_elements(self, cfg: MoEConfig, busiest_rows: int) -> int:
        """Elements of the staging buffers it allocates beyond the hidden maps (none by default)."""
        return 0

    @abstractmethod
    def calibration_kernels(self, cfg: MoEConfig, rng: np.random.Generator) -> list[KernelSpec]:
        """Its kernels over the sizes routing can produce (balanced to all rows on one expert)."""


class LoopExperts(MoEBackend):
    """One GEMM per projection per non-empty expert (HF eager)."""

    name = "loop"

    def run_experts(self, layer: MoELayer, x_sorted: torch.Tensor, counts: list[int]) -> torch.Tensor:
        y = torch.empty(x_sorted.shape[0], layer.cfg.d_model, dtype=x_sorted.dtype, device=x_sorted.device)
        start = 0
        *first, last = layer.projections
        for e, n_e in enumerate(counts):
            if n_e == 0:
                continue
            rows = x_sorted[start : start + n_e]
            hidden = []
            for w in first:
                with kernel_scope("gemm"):
                    hidden.append(gemm(rows, w[e]))
            act = layer.expert_activation(hidden)
            with kernel_scope("gemm"):
                torch.matmul(act, last[e], out=y[start : start + n_e])
            start += n_e
        return y

    def expert_trace(self, cfg: MoEConfig, plan: DispatchPlan) -> list[KernelSpec]:
        proj, dt = expert_projections(cfg), cfg.dtype
        trace: list[KernelSpec] = []
        for n_e in plan.counts:
            if n_e == 0:
                continue
            trace += [GemmSpec(n_e, kk, nn_, dt) for kk, nn_ in proj[:-1]]
            trace += activation_specs(cfg, n_e)
            trace.append(GemmSpec(n_e, *proj[-1], dt))
        return trace

    def hidden_rows(self, cfg: MoEConfig, busiest_rows: int) -> int:
        return busiest_rows  # one expert's rows at a time

    def calibration_kernels(self, cfg: MoEConfig, rng: np.random.Generator) -> list[KernelSpec]:
        out: list[KernelSpec] = []
        for m in log_grid(1, cfg.tokens, 24):
            out += [GemmSpec(m, kk, nn_, cfg.dtype) for kk, nn_ in expert_projections(cfg)]
            out += activation_specs(cfg, m)
        return out


class PaddedExperts(MoEBackend):
    """Rows copied into a zeroed [E, max_n, D] buffer, one ``torch.bmm`` per projection."""

    name = "padded"

    def run_experts(self, layer: MoELayer, x_sorted: torch.Tensor, counts: list[int]) -> torch.Tensor:
        E, D = layer.cfg.num_experts, layer.cfg.d_model
        max_n = max(counts)
        slots = torch.from_numpy(padded_slots(counts)).to(x_sorted.device)
        with kernel_scope("scatter"):
            x_pad = scatter(x_sorted, slots, E * max_n, reduce="copy", backend="index_copy").view(E, max_n, D)
        *first, last = layer.projections
        hidden = []
        for w in first:
            with kernel_scope("grouped_gemm"):
                hidden.append(grouped_padded_bmm(x_pad, w))
        act = layer.expert_activation(hidden)
        with kernel_scope("grouped_gemm"):
            y_pad = grouped_padded_bmm(act, last)
        with kernel_scope("gather"):
            return gather(y_pad.view(E * max_n, D), slots)

    def expert_trace(self, cfg: MoEConfig, plan: DispatchPlan) -> list[KernelSpec]:
        A, D, rows, dt = plan.assignments, cfg.d_model, plan.padded_rows, cfg.dtype
        proj = expert_projections(cfg)
        return [
            ScatterSpec(A, D, rows, "copy", "index_copy", 0.0, True, dt),
            *(GroupedGemmSpec(plan.counts, kk, nn_, "padded_bmm", dt) for kk, nn_ in proj[:-1]),
            *activation_specs(cfg, rows),
            GroupedGemmSpec(plan.counts, *proj[-1], "padded_bmm", dt),
            GatherSpec(A, D, rows, padded_gather_cv(A, rows), True, dt),
        ]

    def hidden_rows(self, cfg: MoEConfig, busiest_rows: int) -> int:
        return cfg.num_experts * busiest_rows  # every expert padded to the busiest

    def buffer_elements(self, cfg: MoEConfig, busiest_rows: int) -> int:
        return 2 * self.hidden_rows(cfg, busiest_rows) * cfg.d_model  # the padded input and output

    def calibration_kernels(self, cfg: MoEConfig, rng: np.random.Generator) -> list[KernelSpec]:
        T, D, E, dt = cfg.tokens, cfg.d_model, cfg.num_experts, cfg.dtype
        A = T * cfg.top_k
        out: list[KernelSpec] = []
        for max_n in log_grid(-(-A // E), T, 10):  # the cost depends only on E * max_n
            rows = E * max_n
            counts = counts_with_max(A, E, max_n)
            out.append(ScatterSpec(A, D, rows, "copy", "index_copy", 0.0, True, dt))
            out += [GroupedGemmSpec(counts, kk, nn_, "padded_bmm", dt) for kk, nn_ in expert_projections(cfg)]
            out += activation_specs(cfg, rows)
            out.append(GatherSpec(A, D, rows, padded_gather_cv(A, rows), True, dt))
        return out


class GroupedExperts(MoEBackend):
    """One ``torch.nn.functional.grouped_mm`` per projection over the ragged groups."""

    name = "grouped"

    def unavailable_reason(self, cfg: MoEConfig, device: torch.device) -> str | None:
        for k, n in ((cfg.d_model, cfg.d_ff), (cfg.d_ff, cfg.d_model)):
            reason = grouped_mm_unavailable_reason(k, n, cfg.dtype, device)
            if reason:
                return reason
        return None

    def run_experts(self, layer: MoELayer, x_sorted: torch.Tensor, counts: list[int]) -> torch.Tensor:
        # int32 on the host, then moved: no int64 -> int32 conversion kernel in the forward pass
        offsets = torch.from_numpy(np.cumsum(counts, dtype=np.int32)).to(x_sorted.device)
        *first, last = layer.projections
        hidden = []
        for w in first:
            with kernel_scope("grouped_gemm"):
                hidden.append(grouped_mm(x_sorted, w, offsets))
        act = layer.expert_activation(hidden)
        with kernel_scope("grouped_gemm"):
            return grouped_mm(act, last, offsets)

    def expert_trace(self, cfg: MoEConfig, plan: DispatchPlan) -> list[KernelSpec]:
        proj, dt = expert_projections(cfg), cfg.dtype
        return [
            *(GroupedGemmSpec(plan.counts, kk, nn_, "grouped_mm", dt) for kk, nn_ in proj[:-1]),
            *activation_specs(cfg, plan.assignments),
            GroupedGemmSpec(plan.counts, *proj[-1], "grouped_mm", dt),
        ]

    def hidden_rows(self, cfg: MoEConfig, busiest_rows: int) -> int:
        return cfg.tokens * cfg.top_k  # every kept assignment at once

    def calibration_kernels(self, cfg: MoEConfig, rng: np.random.Generator) -> list[KernelSpec]:
        T, E = cfg.tokens, cfg.num_experts
        A = T * cfg.top_k
        exponents = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0)  # balanced .. all on a few experts
        vectors = [capped_power_law_counts(A, E, s, T) for s in exponents]
        vectors += [tuple(int(c) for c in rng.multinomial(A, rng.dirichlet(np.full(E, a)))) for a in (0.1, 0.3, 1.0, 3.0)]
        out: list[KernelSpec] = []
        for counts in vectors:
            out += [GroupedGemmSpec(counts, kk, nn_, "grouped_mm", cfg.dtype) for kk, nn_ in expert_projections(cfg)]
        return out + activation_specs(cfg, A)


MOE_BACKENDS: BackendRegistry[MoEBackend] = BackendRegistry(field="moe.backend", where="sim/workloads/backends/moe.py")
for _backend in (LoopExperts(), PaddedExperts(), GroupedExperts()):
    MOE_BACKENDS.register(_backend)


def moe_backend(name: str) -> MoEBackend:
    """The registered MoE backend ``name`` (a ValueError naming ``moe.backend`` and the choices)."""
    return MOE_BACKENDS.lookup(name)
