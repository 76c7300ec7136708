"""A real expert-parallel MoE layer: one rank's part, run on ``torch.distributed``.

Each rank holds the router (replicated) and the weights of its own expert slots, sliced
from the single-device ``sim.moe_layer.MoELayer`` built with the same config and seed,
so both layers compute the same function. Given its token shard and a precomputed routing
with its ``EPPlan`` (the same on every rank), ``EPMoELayer.forward``:

1. router: ``gemm``, ``softmax``, ``topk`` on the shard; paid, then overridden by the
   routing, exactly as ``MoELayer.forward`` does when given a routing;
2. dispatch: stable ``sort`` of the shard's dispatched assignments by (destination rank,
   local slot), ``histogram`` of rows per (rank, slot), ``gather`` of token ids, gates and
   rows; an ``all_to_all_single`` of the [W x L] counts (L = most slots on a rank), then one
   of the rows with uneven ``input_split_sizes`` / ``output_split_sizes`` (the counts
   exchange is how a receiver learns its split sizes, GShard / DeepSpeed-MoE style);
3. experts: the received rows regrouped by local slot (stable sort), then per non-empty
   slot the computation of ``MoELayer``'s ``loop`` backend with the same ``costmodel.ops``
   calls: SwiGLU down(silu(x W_gate) * (x W_up)) (Mixtral) or GELU MLP;
4. combine: the results put back in arrival order, an ``all_to_all_single`` with the
   splits reversed, a ``scale`` by the gates and an ``index_add`` into [T_r, D].

The received counts are checked against the plan (ranks given different plans fail loudly
instead of computing garbage). ``ep_forward_worker`` is the per-rank entry point for
``sim.distributed.launch.run_ep``; ``run_ep_forward`` runs it on W processes and
concatenates the shards.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from costmodel import ops
from sim.distributed.ep_plan import EPPlan
from sim.distributed.launch import run_ep
from sim.distributed.step_timing import time_step
from sim.moe_layer import MoEConfig, MoELayer
from sim.routing import Routing


class EPMoELayer(nn.Module):
    """Rank ``rank``'s part of an expert-parallel MoE layer; inference only."""

    def __init__(self, cfg: MoEConfig, plan: EPPlan, routing: Routing, *, rank: int, seed: int = 0) -> None:
        super().__init__()
        W = plan.world_size
        if not isinstance(rank, int) or not 0 <= rank < W:
            raise ValueError(f"rank must be an integer in [0, ep.world_size={W}), got {rank!r}")
        if plan.assignment_slot.shape != (cfg.tokens, cfg.top_k) or plan.placement.num_experts != cfg.num_experts:
            raise ValueError(f"plan is for {plan.assignment_slot.shape[0]} tokens, top_k={plan.assignment_slot.shape[1]}, "
                             f"{plan.placement.num_experts} experts; the layer has moe.tokens={cfg.tokens}, "
                             f"moe.top_k={cfg.top_k}, moe.num_experts={cfg.num_experts}")
        if routing.expert_ids.shape != plan.assignment_slot.shape:
            raise ValueError(f"routing has shape {list(routing.expert_ids.shape)}, the plan {list(plan.assignment_slot.shape)}")
        self.cfg, self.plan, self.rank = cfg, plan, rank
        place = plan.placement
        self.local_slots = place.slots_of_rank(rank)
        self.slots_per_rank = place.max_slots_per_rank()  # L: the counts exchange sends L per rank
        reference = MoELayer(cfg, seed=seed)  # the same draws as the single-device layer
        local_experts = torch.from_numpy(place.slot_expert[self.local_slots].copy())
        self.router = nn.Parameter(reference.router.detach().clone(), requires_grad=False)
        self.projections = nn.ParameterList(
            [nn.Parameter(w.detach().index_select(0, local_experts).clone(), requires_grad=False)
             for w in reference.projections])
        del reference

        lo, hi = (int(b) for b in plan.token_bounds[rank : rank + 2])
        self.shard_tokens = hi - lo
        slot = plan.assignment_slot[lo:hi].reshape(-1)
        sent = slot >= 0
        token = np.repeat(np.arange(hi - lo), cfg.top_k)[sent]
        key = place.slot_rank * self.slots_per_rank + place.local_index()  # [S] (rank, local slot) bucket
        dtype = getattr(torch, cfg.dtype)
        # like MoELayer's routing cache: host routing -> tensors once, not per step
        self._key = torch.from_numpy(key[slot[sent]])
        self._token = torch.from_numpy(token.astype(np.int64))
        self._gate = torch.from_numpy(routing.gates[lo:hi].reshape(-1)[sent].astype(np.float32)).to(dtype)
        self._expected_rows = [int(plan.slot_rows[s]) for s in self.local_slots]

    def _experts(self, x_grouped: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """``MoELayer``'s loop backend over this rank's slots."""
        y = torch.empty(x_grouped.shape[0], self.cfg.d_model, dtype=x_grouped.dtype)
        *first, last = self.projections
        start = 0
        for s, n in enumerate(counts):  # at most L slots
            if n == 0:
                continue
            rows = x_grouped[start : start + n]
            hidden = [ops.gemm(rows, w[s]) for w in first]
            if self.cfg.expert == "swiglu":
                act = ops.elementwise("mul", ops.elementwise("silu", hidden[0]), hidden[1])
            else:
                act = ops.elementwise("gelu", hidden[0])
            torch.matmul(act, last[s], out=y[start : start + n])
            start += n
        return y

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg, W, L = self.cfg, self.plan.world_size, self.slots_per_rank
        if x.shape != (self.shard_tokens, cfg.d_model):
            raise ValueError(f"rank {self.rank} input must be [shard tokens={self.shard_tokens}, "
                             f"d_model={cfg.d_model}], got {list(x.shape)}")
        ops.topk(ops.softmax(ops.gemm(x, self.router)), cfg.top_k)  # the router's cost, overridden
        _, order = ops.sort(self._key)
        send_counts = ops.histogram(self._key, W * L)
        token_idx = ops.gather(self._token, order)
        gates = ops.gather(self._gate, order)
        x_send = ops.gather(x, token_idx)

        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)  # L counts to and from every rank
        send_split = send_counts.view(W, L).sum(1).tolist()
        recv_split = recv_counts.view(W, L).sum(1).tolist()
        x_recv = x.new_empty(sum(recv_split), cfg.d_model)
        dist.all_to_all_single(x_recv, x_send, output_split_sizes=recv_split, input_split_sizes=send_split)

        slot_counts = recv_counts.view(W, L).sum(0).tolist()
        if slot_counts[: len(self._expected_rows)] != self._expected_rows or any(slot_counts[len(self._expected_rows):]):
            raise RuntimeError(f"rank {self.rank} received {slot_counts} rows per local slot, its plan says "
                               f"{self._expected_rows}: the ranks were given different plans")
        slot_of_row = torch.arange(L).repeat(W).repeat_interleave(recv_counts)  # arrivals: by source, then slot
        _, perm = ops.sort(slot_of_row)
        y_grouped = self._experts(ops.gather(x_recv, perm), slot_counts)
        y_recv = torch.empty_like(y_grouped).index_copy_(0, perm, y_grouped)

        y_back = x.new_empty(x_send.shape[0], cfg.d_model)
        dist.all_to_all_single(y_back, y_recv, output_split_sizes=send_split, input_split_sizes=recv_split)
        weighted = ops.elementwise("scale", y_back, gates.unsqueeze(1))
        return ops.scatter(weighted, token_idx, self.shard_tokens, reduce="sum", backend="index_add")


def ep_forward_worker(rank: int, world_size: int, cfg: MoEConfig, cases: Sequence[tuple[EPPlan, Routing]],
                      x: np.ndarray, seed: int = 0, time_repeats: int = 0, time_warmup: int = 1) -> dict[str, Any]:
    """One rank: the EP layer's output shard for each (plan, routing) case, and with
    ``time_repeats`` > 0 the step time of the first case (``step_timing.time_step``)."""
    outputs, step = [], None
    for i, (plan, routing) in enumerate(cases):
        if plan.world_size != world_size:
            raise ValueError(f"case {i}: plan is for ep.world_size={plan.world_size}, the run has {world_size}")
        layer = EPMoELayer(cfg, plan, routing, rank=rank, seed=seed)
        lo, hi = (int(b) for b in plan.token_bounds[rank : rank + 2])
        x_local = torch.from_numpy(np.ascontiguousarray(x[lo:hi])).to(getattr(torch, cfg.dtype))
        outputs.append(layer(x_local).numpy())
        if i == 0 and time_repeats:
            step = time_step(lambda: layer(x_local), warmup=time_warmup, repeats=time_repeats)
    return {"outputs": outputs, "step": step}


def run_ep_forward(cfg: MoEConfig, cases: Sequence[tuple[EPPlan, Routing]], x: np.ndarray, *, world_size: int,
                   seed: int = 0, time_repeats: int = 0, timeout_s: float = 60.0) -> dict[str, Any]:
    """The EP layer on ``world_size`` gloo processes: full [T, D] outputs per case (shards
    concatenated in rank order), each rank's step measurement (or None), the pinning note."""
    if x.shape != (cfg.tokens, cfg.d_model):
        raise ValueError(f"x must be [moe.tokens={cfg.tokens}, moe.d_model={cfg.d_model}], got {list(x.shape)}")
    run = run_ep(world_size, ep_forward_worker, (cfg, list(cases), x, seed, time_repeats), timeout_s=timeout_s)
    outputs = [np.concatenate([r["outputs"][i] for r in run.results]) for i in range(len(cases))]
    return {"outputs": outputs, "steps": [r["step"] for r in run.results], "note": run.note}
