"""experiment=hf_moe: transformers' own sparse MoE blocks, captured, predicted and measured.

Mixtral's and Qwen2-MoE's sparse MoE blocks are built from their config classes with
random weights (nothing downloaded), for each expert implementation transformers offers
here (``eager`` loop, ``grouped_mm``, ``batched_mm``). The router still runs (its kernels
are paid) but the experts it returns are replaced by a routing drawn by ``sim.workloads.routing``
(the ``pinned`` gate), so the concentration sweep is the one of ``moe_skew``. Every call is
captured once (``sim.capture.dispatch``), its kernels calibrated on first use (the suite is the
captured kernels), predicted with L0-L3 and timed. At one point each block also runs a
training step (forward + loss + backward), and a whole tiny Mixtral causal LM (a few
decoder layers) runs a forward and a training step.

Outputs: results.csv, summary.json (``details.coverage_pct``: median share of the measured
time on modelled ops), latency_vs_concentration.png, predicted_vs_measured.png.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import torch  # noqa: E402

from costmodel.families.grouped_gemm import grouped_mm_unavailable_reason  # noqa: E402
from costmodel.measure.runtime import Runtime  # noqa: E402
from sim.predict.heldout import trace_kernels  # noqa: E402
from experiments.captured import (  # noqa: E402
    CapturedWorkload, coverage_details, measure_captured, missing_extra_error, training_details,
)
from costmodel.cli.config_schema import Interval, ListOf, Options, Rule, at_most  # noqa: E402
from experiments.common import (  # noqa: E402
    calibration_options, check_common, config_dict, console, instantiate_sweep, output_dir, plot_latency_by_backend, plot_predicted_vs_measured, print_summary,
    print_table, summary, write_outputs,
)
from sim.api import capture_module  # noqa: E402
from sim.predict.calibration import calibrated_model, captured_suite  # noqa: E402
from sim.capture.dispatch import capture_trace  # noqa: E402
from sim.workloads.routing import Routing, route  # noqa: E402

MODELS = ("mixtral", "qwen2_moe")
IMPLEMENTATIONS = ("eager", "grouped_mm", "batched_mm")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise missing_extra_error("transformers", "hf", "hf_moe") from None
    return transformers


class PinnedGate(torch.nn.Module):
    """Runs the block's own router (its kernels are paid) and returns the pinned experts and
    gates of a ``sim.workloads.routing`` draw instead of the router's choice."""

    def __init__(self, gate: torch.nn.Module) -> None:
        super().__init__()
        self.gate = gate
        self.indices: torch.Tensor | None = None
        self.weights: torch.Tensor | None = None

    def pin(self, routing: Routing, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.from_numpy(np.ascontiguousarray(routing.expert_ids)).to(device),
                torch.from_numpy(np.ascontiguousarray(routing.gates, dtype=np.float32)).to(device, dtype))

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits, _, _ = self.gate(hidden)
        return logits, self.weights, self.indices  # type: ignore[return-value]


#: hf_moe's fields (beside the shared ones, ``experiments.common.COMMON_CONSTRAINTS``)
CONSTRAINTS: dict[str, Any] = {
    **{f"hf_moe.{key}": Interval(int, 1, None) for key in ("tokens", "hidden_size", "intermediate_size", "num_experts")},
    "hf_moe.top_k": at_most("hf_moe.num_experts"),
    "hf_moe.models": ListOf(Options(MODELS), words=f"a non-empty list of some of {list(MODELS)}"),
    "hf_moe.implementations": ListOf(Options(IMPLEMENTATIONS),
                                     words=f"a non-empty list of some of {list(IMPLEMENTATIONS)}"),
    "hf_moe.whole_model.layers": Interval(int, 0, 4, words="an integer in [0, 4] (0 = skip)"),
    "routing.capacity_factor": Rule(lambda v, cfg: v is None,
                                    "null (transformers' MoE blocks drop no tokens: hf_moe has no capacity limit)"),
}


def hf_config(name: str, h: Mapping[str, Any], impl: str, *, layers: int = 1) -> Any:
    tf = _transformers()
    common = dict(hidden_size=h["hidden_size"], num_experts_per_tok=h["top_k"], num_hidden_layers=layers,
                  vocab_size=h["whole_model"]["vocab_size"], num_attention_heads=h["whole_model"]["heads"],
                  num_key_value_heads=h["whole_model"]["kv_heads"], max_position_embeddings=4 * h["tokens"])
    if name == "mixtral":
        cfg = tf.MixtralConfig(intermediate_size=h["intermediate_size"], num_local_experts=h["num_experts"], **common)
    else:
        cfg = tf.Qwen2MoeConfig(moe_intermediate_size=h["intermediate_size"], num_experts=h["num_experts"],
                                intermediate_size=h["shared_expert_intermediate_size"],
                                shared_expert_intermediate_size=h["shared_expert_intermediate_size"], **common)
    cfg._experts_implementation = impl
    cfg._attn_implementation = "eager"  # attention as matmul + softmax kernels (sdpa is one fused op)
    return cfg


def moe_block(name: str, cfg: Any) -> torch.nn.Module:
    if name == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as Block
    else:
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock as Block
    return Block(cfg)


def init_weights(module: torch.nn.Module, seed: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Every parameter drawn N(0, 0.02) from ``seed`` (the same weights for every implementation), then moved."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return module.to(device=device, dtype=dtype)


def impl_unavailable_reason(impl: str, h: Mapping[str, Any], dtype: str, device: torch.device) -> str | None:
    if impl == "grouped_mm":
        for k, n in ((h["hidden_size"], 2 * h["intermediate_size"]), (h["intermediate_size"], h["hidden_size"])):
            reason = grouped_mm_unavailable_reason(k, n, dtype, device)
            if reason:
                return reason
    return None


def validate(cfg: Any) -> list[tuple[Any, Any]]:
    """Every key checked and transformers importable, nothing built or measured; returns the
    routing generators of the sweep."""
    cfg = config_dict(cfg)
    check_common(cfg, CONSTRAINTS)
    _transformers()
    return instantiate_sweep(cfg["routing"], "routing")


def run(cfg: Any, out_dir: str | Path | None = None, *, plan: Any = None) -> dict[str, Any]:
    """``plan``: what ``validate(cfg)`` returned (the entry point's one check), else validated here."""
    cfg = config_dict(cfg)
    h = cfg["hf_moe"]
    generators = validate(cfg) if plan is None else plan
    rt = Runtime.from_cfg(cfg, checked=True)
    dtype = getattr(torch, rt.dtype)
    impls = [i for i in h["implementations"] if not impl_unavailable_reason(i, h, rt.dtype, rt.device)]
    unavailable = {i: impl_unavailable_reason(i, h, rt.dtype, rt.device) for i in h["implementations"] if i not in impls}
    for impl, reason in unavailable.items():
        console.print(f"[yellow]expert implementation {impl!r} is unavailable here and is skipped:[/] {reason}")
    if not impls:
        raise ValueError(f"no requested expert implementation can run here: {unavailable}")
    out = output_dir(cfg, out_dir)
    T, H = h["tokens"], h["hidden_size"]
    x = torch.randn(1, T, H, generator=torch.Generator().manual_seed(rt.seed)).to(rt.device, dtype)
    train_point = int(h["train_point"]) % len(generators)
    routings = [route(gen, tokens=T, num_experts=h["num_experts"], top_k=h["top_k"], seed=rt.seed + i)
                for i, (_, gen) in enumerate(generators)]

    workloads: list[CapturedWorkload] = []
    console.print("capturing the blocks' kernel traces")
    for name in h["models"]:
        # one block per model, its weights shared by every implementation (transformers reads
        # config._experts_implementation at each call): one copy of the experts in memory
        block_cfg = hf_config(name, h, impls[0])
        block = init_weights(moe_block(name, block_cfg), rt.seed, rt.device, dtype)
        block.gate = PinnedGate(block.gate)
        for impl in impls:
            for i, ((value, gen), routing) in enumerate(zip(generators, routings)):
                pinned = block.gate.pin(routing, rt.device, dtype)

                def forward(block=block, pinned=pinned, impl=impl, block_cfg=block_cfg) -> Any:
                    block_cfg._experts_implementation = impl
                    block.gate.indices, block.gate.weights = pinned
                    with torch.no_grad():
                        return block(x)

                columns = {"module": f"{name}/{impl}", "model": name, "impl": impl, "backend": f"{name}/{impl}",
                           "kind": "block", "point": i, "generator": type(gen).__name__,
                           "param": cfg["routing"]["sweep"]["param"], "value": value, **routing.metrics()}
                forward()  # warm-up: first-call set-up stays out of the capture
                workloads.append(CapturedWorkload(f"{name}/{impl}", forward, capture_trace(forward), columns))
                if i == train_point and h["train_step"]:
                    xg = x.detach().clone().requires_grad_(False)

                    def step(block=block, pinned=pinned, xg=xg, impl=impl, block_cfg=block_cfg) -> None:
                        block_cfg._experts_implementation = impl
                        block.gate.indices, block.gate.weights = pinned
                        block.zero_grad(set_to_none=True)
                        block(xg).float().sum().backward()

                    block_cfg._experts_implementation = impl
                    block.gate.indices, block.gate.weights = pinned
                    trace = capture_module(block, (xg,), backward=True)
                    workloads.append(CapturedWorkload(f"{name}/{impl} train", step, trace,
                                                      {**columns, "kind": "train_step", "backend": f"{name}/{impl} train"}))
    workloads += whole_model_workloads(h, impls, rt, dtype)

    model = calibrated_model(rt, captured_suite([w.captured for w in workloads]), suite_name="hf_moe",
                             progress=bool(cfg.get("progress", True)),
                             heldout=trace_kernels(w.captured.kernels() for w in workloads), **calibration_options(cfg))
    df = measure_captured(cfg, rt, model, workloads, what="hf_moe", description="measure hf moe")
    blocks = df[df["kind"] == "block"]
    summ = summary("hf_moe", rt.fingerprint.describe(), df, details={
        **coverage_details(df),
        "blocks": {k: h[k] for k in ("tokens", "hidden_size", "intermediate_size", "num_experts", "top_k")},
        "models": list(h["models"]), "implementations": impls, "unavailable_implementations": unavailable,
        "routing": cfg["routing"]["generator"].get("_target_"), "sweep_param": cfg["routing"]["sweep"]["param"],
        "block_median_ape_pct": {lv: float(blocks[f"ape_{lv}_pct"].median()) for lv in ("L0", "L1", "L2", "L3")},
        "per_module_median_ape_L3_pct": blocks.groupby("module")["ape_L3_pct"].median().to_dict(),
        "latency_ratio_max_over_min_per_module": blocks.groupby("module")["measured_s"].agg(lambda s: s.max() / s.min()).to_dict(),
        "training": training_details(df), "model_profile": str(model.fingerprint.id),
    })
    write_outputs(out, df, summ)
    # the swept knob on x, as moe_skew: max/mean load saturates at E/top_k and stacks the
    # most concentrated points on one vertical line
    param = cfg["routing"]["sweep"]["param"]
    plot_latency_by_backend(blocks, "value", out / "latency_vs_concentration.png",
                            xlabel=f"routing {param} (the swept concentration knob)", l0_label="L0 = FLOPs / peak",
                            title="transformers MoE blocks: latency vs routing concentration")
    plot_predicted_vs_measured(df, out / "predicted_vs_measured.png", title="hf_moe: predicted vs measured", hue="kind")
    print_table(df, {"module": "", "kind": "", "value": "", "max_over_mean": ".2f", "measured_s": "ms", "pred_L0_s": "ms",
                     "pred_L2_s": "ms", "pred_L3_s": "ms", "ape_L3_pct": ".1f", "coverage_measured_pct": ".1f",
                     "capture_over_call": ".2f"}, title="transformers MoE: predicted vs measured (ms; APE %)")
    print_summary(summ)
    console.print(f"outputs in {out}")
    return summ


def whole_model_workloads(h: Mapping[str, Any], impls: list[str], rt: Runtime, dtype: torch.dtype) -> list[CapturedWorkload]:
    """A tiny Mixtral causal LM (``whole_model.layers`` decoder layers, its own router):
    forward and a training step (next-token loss)."""
    w = h["whole_model"]
    if not w["layers"]:
        return []
    tf = _transformers()
    impl = "grouped_mm" if "grouped_mm" in impls else impls[0]
    lm = init_weights(tf.MixtralForCausalLM(hf_config("mixtral", h, impl, layers=int(w["layers"]))), rt.seed, rt.device, dtype)
    ids = torch.randint(0, w["vocab_size"], (1, h["tokens"]), generator=torch.Generator().manual_seed(rt.seed)).to(rt.device)
    module = f"mixtral_lm{w['layers']}/{impl}"
    columns = {"module": module, "model": "mixtral_lm", "impl": impl, "backend": module, "point": -1,
               "value": float("nan"), "max_over_mean": float("nan")}

    def forward() -> Any:
        with torch.no_grad():
            return lm(ids)

    def step() -> None:
        lm.zero_grad(set_to_none=True)
        lm(ids, labels=ids).loss.backward()

    forward()
    step()
    return [
        CapturedWorkload(module, forward, capture_trace(forward), {**columns, "kind": "forward"}),
        CapturedWorkload(f"{module} train", step, capture_module(lm, (ids,), {"labels": ids}, backward=True,
                                                                 loss_fn=lambda o: o.loss),
                         {**columns, "kind": "train_step"}),
    ]
