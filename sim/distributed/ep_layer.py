"""A real expert-parallel MoE layer: one rank's part, run on ``torch.distributed``.

Each rank holds the router (replicated) and the weights of its own expert slots, sliced
from the single-device ``sim.workloads.moe_layer.MoELayer`` built with the same config and seed,
so both layers compute the same function. Given its token shard and a precomputed routing
with its ``EPPlan`` (the same on every rank), ``EPMoELayer.forward``:

1. router: ``gemm``, ``softmax``, ``topk`` on the shard; paid, then overridden by the
   routing, exactly as ``MoELayer.forward`` does when given a routing;
2. dispatch: stable ``sort`` of the shard's dispatched assignments by (destination rank,
   local slot), ``histogram`` of rows per (rank, slot), ``gather`` of token ids, gates and
   rows; an ``all_to_all_single`` of the [W x L] counts (L = most slots on a rank), then one
   of the rows with uneven ``input_split_sizes`` / ``output_split_sizes`` (the counts
   exchange is how a receiver learns its split sizes, GShard / DeepSpeed-MoE style);
3. experts: the received rows regrouped by local slot (stable sort), then the config's
   registered backend (``sim.workloads.backends.moe``: loop, padded or grouped) runs them exactly as
   in ``MoELayer``, over ``LocalExperts``: this rank's slots seen as a layer of S_r experts
   (SwiGLU down(silu(x W_gate) * (x W_up)), Mixtral, or a GELU MLP);
4. combine: the results put back in arrival order, an ``all_to_all_single`` with the
   splits reversed, a ``scale`` by the gates and an ``index_add`` into [T_r, D].

Every compute op sits in the same ``kernel_scope`` as in ``MoELayer`` (the collectives are
not a kernel family yet). With ``time_phases=True`` each forward appends ``perf_counter``
marks at the phase boundaries of ``sim.distributed.ep_predict.PHASES`` (start, router end,
dispatch prep end, dispatch end, experts end, combine end, weighted-sum end) to
``phase_marks``; off by default, and then the forward does nothing extra. ``device`` (or
``.to(device)``) moves the weights and the routing tensors together: one GPU per process
under NCCL (``scripts/ep_torchrun.py --device cuda``). The received counts are checked against the plan (ranks given
different plans fail loudly instead of computing garbage). ``ep_forward_worker`` is the
per-rank entry point for ``sim.distributed.launch.run_ep``; ``run_ep_forward`` runs several
(config, plan, routing) cases in one launch and concatenates the shards; ``run_ep_phases``
times several cases in one launch: per case the slowest-rank step (``time_step``) and each
rank's per-repeat phase seconds.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from costmodel.families.elementwise import elementwise
from costmodel.families.gather import gather
from costmodel.families.gemm import gemm
from costmodel.families.histogram import histogram
from costmodel.families.scatter import scatter
from costmodel.families.softmax import softmax
from costmodel.families.sort import sort
from costmodel.families.topk import topk
from costmodel.measure.scope import kernel_scope
from sim.workloads.backends.moe import moe_backend
from sim.distributed.ep_plan import EPPlan
from sim.distributed.launch import run_ep
from sim.distributed.step_timing import time_step
from sim.workloads.moe_layer import MoEConfig, MoELayer
from sim.workloads.routing import Routing


class LocalExperts(nn.Module):
    """One rank's expert slots as the "layer" a ``sim.workloads.backends.moe`` backend runs: ``cfg``
    with ``num_experts`` = the rank's slots, ``projections`` [S_r, K, N] stacks sliced from
    the seeded ``MoELayer``, and ``MoELayer``'s own activation code."""

    expert_activation = MoELayer.expert_activation  # reads self.cfg.expert only

    def __init__(self, cfg: MoEConfig, reference: MoELayer, experts: np.ndarray) -> None:
        super().__init__()
        slots = int(experts.size)
        # top_k is not read by run_experts; capped so that a rank with fewer slots than top_k is a valid config
        self.cfg = replace(cfg, num_experts=max(slots, 1), top_k=min(cfg.top_k, max(slots, 1)))
        index = torch.from_numpy(experts.astype(np.int64))
        self.projections = nn.ParameterList(
            [nn.Parameter(w.detach().index_select(0, index).clone(), requires_grad=False)
             for w in reference.projections])


class EPMoELayer(nn.Module):
    """Rank ``rank``'s part of an expert-parallel MoE layer; inference only."""

    def __init__(self, cfg: MoEConfig, plan: EPPlan, routing: Routing, *, rank: int, seed: int = 0,
                 reference: MoELayer | None = None, time_phases: bool = False,
                 device: torch.device | str = "cpu") -> None:
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
        self.backend = moe_backend(cfg.backend)
        if reference is None:
            reference = MoELayer(cfg, seed=seed)  # the same draws as the single-device layer
        elif reference.cfg != cfg:
            raise ValueError(f"reference layer has config {reference.cfg}, the EP layer {cfg}")
        #: perf_counter marks of every forward's phase boundaries (time_phases=True), else None
        self.phase_marks: list[list[float]] | None = [] if time_phases else None
        self.router = nn.Parameter(reference.router.detach().clone(), requires_grad=False)
        self.experts = LocalExperts(cfg, reference, place.slot_expert[self.local_slots])
        del reference

        lo, hi = (int(b) for b in plan.token_bounds[rank : rank + 2])
        self.shard_tokens = hi - lo
        slot = plan.assignment_slot[lo:hi].reshape(-1)
        sent = slot >= 0
        token = np.repeat(np.arange(hi - lo), cfg.top_k)[sent]
        key = place.slot_rank * self.slots_per_rank + place.local_index()  # [S] (rank, local slot) bucket
        dtype = getattr(torch, cfg.dtype)
        # like MoELayer's routing cache: host routing -> tensors once, not per step; buffers, so
        # that .to(device) moves them with the weights (NCCL collectives take device tensors)
        self.register_buffer("_key", torch.from_numpy(key[slot[sent]]), persistent=False)
        self.register_buffer("_token", torch.from_numpy(token.astype(np.int64)), persistent=False)
        self.register_buffer("_gate", torch.from_numpy(routing.gates[lo:hi].reshape(-1)[sent].astype(np.float32))
                             .to(dtype), persistent=False)
        self._expected_rows = [int(plan.slot_rows[s]) for s in self.local_slots]
        self.to(device)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg, W, L = self.cfg, self.plan.world_size, self.slots_per_rank
        if x.shape != (self.shard_tokens, cfg.d_model):
            raise ValueError(f"rank {self.rank} input must be [shard tokens={self.shard_tokens}, "
                             f"d_model={cfg.d_model}], got {list(x.shape)}")
        if x.device != self.router.device:
            raise ValueError(f"rank {self.rank} input is on {x.device}, the layer on {self.router.device}")
        marks = None
        if self.phase_marks is not None:
            marks = [time.perf_counter()]
            self.phase_marks.append(marks)
        # the router's kernels, paid and then overridden by the routing (as MoELayer with a routing)
        with kernel_scope("gemm"):
            logits = gemm(x, self.router)
        with kernel_scope("softmax"):
            probs = softmax(logits)
        with kernel_scope("topk"):
            topk(probs, cfg.top_k)
        if marks is not None:
            marks.append(time.perf_counter())
        with kernel_scope("sort"):
            _, order = sort(self._key)
        with kernel_scope("histogram"):
            send_counts = histogram(self._key, W * L)
        with kernel_scope("gather"):
            token_idx = gather(self._token, order)
        with kernel_scope("gather"):
            gates = gather(self._gate, order)
        with kernel_scope("gather"):
            x_send = gather(x, token_idx)

        if marks is not None:
            marks.append(time.perf_counter())
        # dispatch: counts first (L per rank pair), then the rows with uneven splits
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        send_split = send_counts.view(W, L).sum(1).tolist()
        recv_split = recv_counts.view(W, L).sum(1).tolist()
        x_recv = x.new_empty(sum(recv_split), cfg.d_model)
        dist.all_to_all_single(x_recv, x_send, output_split_sizes=recv_split, input_split_sizes=send_split)
        if marks is not None:
            marks.append(time.perf_counter())

        n_local = len(self._expected_rows)
        slot_counts = recv_counts.view(W, L).sum(0).tolist()
        if slot_counts[:n_local] != self._expected_rows or any(slot_counts[n_local:]):
            raise RuntimeError(f"rank {self.rank} received {slot_counts} rows per local slot, its plan says "
                               f"{self._expected_rows}: the ranks were given different plans")
        slot_of_row = torch.arange(L, device=x.device).repeat(W).repeat_interleave(recv_counts)  # arrivals: by source, then slot
        with kernel_scope("sort"):
            _, perm = sort(slot_of_row)
        with kernel_scope("gather"):
            x_grouped = gather(x_recv, perm)
        if x_grouped.shape[0]:
            y_grouped = self.backend.run_experts(self.experts, x_grouped, slot_counts[:n_local])
        else:  # no rows arrived (a rank may even hold no slot): nothing to run
            y_grouped = x_grouped
        with kernel_scope("scatter"):
            y_recv = scatter(y_grouped, perm, y_grouped.shape[0], reduce="copy", backend="index_copy")
        if marks is not None:
            marks.append(time.perf_counter())

        # combine: the same splits reversed, then gates and the sum over each token's experts
        y_back = x.new_empty(x_send.shape[0], cfg.d_model)
        dist.all_to_all_single(y_back, y_recv, output_split_sizes=send_split, input_split_sizes=recv_split)
        if marks is not None:
            marks.append(time.perf_counter())
        with kernel_scope("elementwise"):
            weighted = elementwise("scale", y_back, gates.unsqueeze(1))
        with kernel_scope("scatter"):
            out = scatter(weighted, token_idx, self.shard_tokens, reduce="sum", backend="index_add")
        if marks is not None:
            marks.append(time.perf_counter())
        return out


Case = tuple[MoEConfig, EPPlan, Routing]


def ep_forward_worker(rank: int, world_size: int, cases: Sequence[Case], x: np.ndarray, seed: int = 0,
                      time_repeats: int = 0, time_warmup: int = 1) -> dict[str, Any]:
    """One rank: the EP layer's output shard for each (config, plan, routing) case, and with
    ``time_repeats`` > 0 the step time of the first case (``step_timing.time_step``)."""
    outputs, step = [], None
    for i, (cfg, plan, routing) in enumerate(cases):
        if plan.world_size != world_size:
            raise ValueError(f"case {i}: plan is for ep.world_size={plan.world_size}, the run has {world_size}")
        layer = EPMoELayer(cfg, plan, routing, rank=rank, seed=seed)
        lo, hi = (int(b) for b in plan.token_bounds[rank : rank + 2])
        x_local = torch.from_numpy(np.ascontiguousarray(x[lo:hi])).to(getattr(torch, cfg.dtype))
        outputs.append(layer(x_local).numpy())
        if i == 0 and time_repeats:
            step = time_step(lambda: layer(x_local), warmup=time_warmup, repeats=time_repeats)
    return {"outputs": outputs, "step": step}


def run_ep_forward(cases: Sequence[Case], x: np.ndarray, *, world_size: int, seed: int = 0,
                   time_repeats: int = 0, timeout_s: float = 60.0) -> dict[str, Any]:
    """The EP layer on ``world_size`` gloo processes for each (config, plan, routing) case,
    all in one launch: full [T, D] outputs per case (shards concatenated in rank order),
    each rank's step measurement of the first case (or None), and the pinning note."""
    for i, (cfg, _, _) in enumerate(cases):
        if x.shape != (cfg.tokens, cfg.d_model):
            raise ValueError(f"case {i}: x must be [moe.tokens={cfg.tokens}, moe.d_model={cfg.d_model}], "
                             f"got {list(x.shape)}")
    run = run_ep(world_size, ep_forward_worker, (list(cases), x, seed, time_repeats), timeout_s=timeout_s)
    outputs = [np.concatenate([r["outputs"][i] for r in run.results]) for i in range(len(cases))]
    return {"outputs": outputs, "steps": [r["step"] for r in run.results], "note": run.note}


MAX_ROUNDS = 20  # passes over the cases in one launch (ep.rounds)
#: measured segments of one forward (``phase_marks`` differences): the dispatch phase is
#: its local prep plus the two all-to-alls (waits included), as ``ep_predict`` predicts it
MEASURED_SEGMENTS = ("router", "dispatch_prep", "dispatch_a2a", "experts", "combine", "weighted_sum")


def ep_phase_worker(rank: int, world_size: int, cases: Sequence[Case], x: np.ndarray, seed: int = 0,
                    warmup: int = 2, repeats: int = 10, evict_bytes: int = 0,
                    a2a_sizes: Sequence[int] = (), allocator: str = "steady",
                    replay: Mapping[str, Any] | None = None, rounds: int = 1,
                    references: Sequence[Any] = ()) -> dict[str, Any]:
    """One rank: ``rounds`` passes over the cases (alternating order, as the partitioned GNN
    layer is timed), each timing ``warmup`` + ``repeats`` steps of every case with the
    phase-timed layer (``time_step``), so a slow spell of a shared machine spreads over the
    cases instead of landing on one; per case the step ``Measurement`` of all its rounds'
    repeats, the median of each round, and the rank's [rounds x repeats, len(MEASURED_SEGMENTS)]
    segment seconds. A case's layer is rebuilt each round from the one seeded reference (its
    slots' weights sliced again: one case's weights in memory at a time). With ``evict_bytes``
    > 0 a buffer that large is written before every repeat (untimed), so each step starts from
    cold caches. ``a2a_sizes``: first time uniform all-to-alls of these bytes per peer
    (``ep_collectives.time_all_to_all_grid``, for a collective model fitted in the same launch).
    ``allocator``: the profile's host allocator mode (``costmodel.measure.allocator``, part of its
    fingerprint), applied first: a spawned rank starts with glibc's default, whose fresh pages
    per large tensor made partitioned GNN layers 2.3x slower than under ``steady``.
    ``replay`` (a ``TimingConfig``'s fields, or None): after a case's last round, the rank also
    times each distinct kernel of its own phases (``ep_predict.ep_rank_kernels``) with the
    profile's runners, cold operands and timing, all ranks at once as in the step; returned
    per case as ``kernel_s`` {kernel key: median seconds} (rank replay: how fast the rank's
    kernels run inside the ranks, against the profile's). ``references`` (``KernelSpec``s: the
    held-out drift references of ``sim.predict.heldout_drift``, never a kernel of the cases) are
    timed the same way at the end of every round, all ranks at once; returned as
    ``reference_s``, per reference its median over the rounds (needs ``replay``'s timing)."""
    from sim.distributed.ep_collectives import time_all_to_all_grid  # noqa: PLC0415

    from costmodel.measure.allocator import configure_allocator  # noqa: PLC0415
    from costmodel.measure.timing import TimingConfig, evict_caches  # noqa: PLC0415

    if references and replay is None:
        raise ValueError("references are timed with the replay's timing: pass replay too")
    configure_allocator(allocator)
    if not isinstance(rounds, int) or isinstance(rounds, bool) or not 1 <= rounds <= MAX_ROUNDS:
        raise ValueError(f"rounds must be an integer in [1, {MAX_ROUNDS}], got {rounds!r}")
    for i, (_, plan, _) in enumerate(cases):
        if plan.world_size != world_size:
            raise ValueError(f"case {i}: plan is for ep.world_size={plan.world_size}, the run has {world_size}")
    evict_cfg = TimingConfig(cpu_evict_bytes=int(evict_bytes)) if evict_bytes else None
    before = (lambda: evict_caches(torch.device("cpu"), evict_cfg)) if evict_cfg is not None else None
    a2a = time_all_to_all_grid(rank, world_size, a2a_sizes) if a2a_sizes else []
    seeded: dict[MoEConfig, MoELayer] = {}
    steps: list[list[Any]] = [[] for _ in cases]
    phases: list[list[np.ndarray]] = [[] for _ in cases]
    kernel_s: list[dict[str, float] | None] = [None for _ in cases]
    reference_rounds: list[list[float]] = []
    for r in range(rounds):
        order = range(len(cases)) if r % 2 == 0 else range(len(cases) - 1, -1, -1)
        for i in order:
            cfg, plan, routing = cases[i]
            if cfg not in seeded:
                seeded.clear()  # one reference layer's weights at a time
                seeded[cfg] = MoELayer(cfg, seed=seed)
            layer = EPMoELayer(cfg, plan, routing, rank=rank, seed=seed, reference=seeded[cfg], time_phases=True)
            lo, hi = (int(b) for b in plan.token_bounds[rank : rank + 2])
            x_local = torch.from_numpy(np.ascontiguousarray(x[lo:hi])).to(getattr(torch, cfg.dtype))
            steps[i].append(time_step(lambda: layer(x_local), warmup=warmup, repeats=repeats, before=before))
            phases[i].append(np.diff(np.asarray(layer.phase_marks[warmup:], dtype=np.float64), axis=1))
            del layer
            if replay is not None and r == rounds - 1:
                kernel_s[i] = time_rank_kernels(cfg, plan, rank, replay)
        if references:
            reference_rounds.append(time_specs(references, replay))  # type: ignore[arg-type]
    out = []
    for i in range(len(cases)):
        case = {"step": merge_rounds(steps[i]), "round_medians_s": [float(m.median_s) for m in steps[i]],
                "phase_s": np.concatenate(phases[i])}
        if replay is not None:
            case["kernel_s"] = kernel_s[i]
        out.append(case)
    reference_s = np.median(np.asarray(reference_rounds), axis=0).tolist() if reference_rounds else []
    return {"cases": out, "a2a": a2a, "reference_s": reference_s}


def merge_rounds(rounds: Sequence[Any]) -> Any:
    """One ``Measurement`` of every repeat of every round (``time_step``'s), noisy if any round was."""
    from costmodel.measure.timing import Measurement  # noqa: PLC0415

    first = rounds[0]
    return Measurement(times_s=tuple(t for m in rounds for t in m.times_s), number_per_run=first.number_per_run,
                       attempts=len(rounds), noisy=any(m.noisy for m in rounds), device=first.device,
                       threads=first.threads, spec={**dict(first.spec), "rounds": len(rounds),
                                                    "repeats": sum(len(m.times_s) for m in rounds)})


def time_rank_kernels(cfg: MoEConfig, plan: EPPlan, rank: int, timing: Mapping[str, Any]) -> dict[str, float]:
    """Median seconds of each distinct kernel of ``rank``'s phases, timed in this process
    with the profile's runners (cold operands) and ``timing`` (``TimingConfig`` fields); the
    ranks meet at a barrier first, so they time side by side as they run the step."""
    from sim.distributed.ep_predict import PHASES, ep_rank_kernels  # noqa: PLC0415

    kernels = ep_rank_kernels(cfg, plan)[rank]
    distinct = {s.key(): s for p in PHASES for s in kernels[p]}
    return dict(zip(distinct, time_specs(list(distinct.values()), timing)))


def time_specs(specs: Sequence[Any], timing: Mapping[str, Any]) -> list[float]:
    """Median seconds of each ``KernelSpec`` in ``specs``, timed in this process with the profile's
    runners (cold operands) and ``timing`` (``TimingConfig`` fields); the ranks meet at a barrier
    first, so they time side by side as they run the step."""
    from costmodel.measure.runners import make_runner  # noqa: PLC0415
    from costmodel.measure.timing import TimingConfig, measure  # noqa: PLC0415

    config = TimingConfig(**dict(timing))
    dist.barrier()
    return [float(measure(make_runner(spec, "cpu", cold=config.cold_cache), config=config).median_s) for spec in specs]


def run_ep_phases(cases: Sequence[Case], x: np.ndarray, *, world_size: int, seed: int = 0, warmup: int = 2,
                  repeats: int = 10, evict_bytes: int = 0, a2a_sizes: Sequence[int] = (),
                  timeout_s: float = 600.0, allocator: str = "steady",
                  replay: Mapping[str, Any] | None = None, keep_awake: bool = False,
                  rounds: int = 1, references: Sequence[Any] = ()) -> dict[str, Any]:
    """Every case timed on ``world_size`` gloo processes in one launch, ``rounds`` passes over the
    cases (``keep_awake``: the ranks' cores kept from idling in a collective,
    ``costmodel.collectives.awake``): per case the slowest-rank step ``Measurement`` of all
    rounds, each round's median, and each rank's [rounds x repeats, segments] phase seconds
    (and, with ``replay``, each rank's ``kernel_s``: ``ep_phase_worker``);
    ``a2a``: the all-to-all grid's (bytes per peer, seconds), timed first; ``reference_s``: per
    rank, each of ``references``' median seconds over the rounds (``ep_phase_worker``)."""
    for i, (cfg, _, _) in enumerate(cases):
        if x.shape != (cfg.tokens, cfg.d_model):
            raise ValueError(f"case {i}: x must be [moe.tokens={cfg.tokens}, moe.d_model={cfg.d_model}], "
                             f"got {list(x.shape)}")
    run = run_ep(world_size, ep_phase_worker,
                 (list(cases), x, seed, warmup, repeats, evict_bytes, list(a2a_sizes), allocator,
                  None if replay is None else dict(replay), rounds, list(references)),
                 timeout_s=timeout_s, keep_awake=keep_awake)
    per_case = [{"step": run.results[0]["cases"][i]["step"],
                 "round_medians_s": run.results[0]["cases"][i]["round_medians_s"],
                 "phase_s": [r["cases"][i]["phase_s"] for r in run.results],
                 **({"kernel_s": [r["cases"][i]["kernel_s"] for r in run.results]} if replay is not None else {})}
                for i in range(len(cases))]
    return {"cases": per_case, "a2a": run.results[0]["a2a"], "note": run.note, "cores": run.cores,
            "reference_s": [r["reference_s"] for r in run.results]}
