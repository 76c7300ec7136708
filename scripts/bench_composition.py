"""What a cold MoE layer costs beyond its kernels, and where it goes (CPU).

For the ``moe_skew`` default layer (T=32, D=1024, F=2048, E=16, top-2, SwiGLU) at a few
Zipf exponents and every backend, in interleaved repetitions (so the machine's speed
phases move every column together):

- ``layer_ms``: the real layer, one call at a time after evicting the caches, as the
  experiments time it (``sim.predict.simulator.measure_callable``, median of >= 15 calls);
- ``runners_ms``: the sum of its kernels, each timed alone by the profile's own runner
  (cold operands rotated through the arena, ``costmodel.measure.runners``);
- ``l3_ms``: what the cost model predicts (the profile's rows for measured kernels, plus
  ``ceilings.cold_call_overhead_s`` per kernel: the 10-op chain of ``costmodel.measure.ceilings``);
- ``kind_cold_ms``: for every distinct kind of *small* kernel in the layer (family and
  op/impl/backend, each read from its descriptor; < 1 MiB moved, so data is negligible),
  one call after an eviction minus its runner's median: what the kind's code and
  metadata cost when they start out of cache, summed over the kinds;
- ``chain_ms``: the current model's share of the same thing (kernels x the per-op
  chain overhead, measured now);
- ``recold_ms``: a hypothesis, not a model: every *later* call of a small kind charged its
  kind's cold cost again when more than ``RECOLD_BYTES`` moved through the cache since the
  kind last ran (an expert's weights streamed between two of its small ops); compare
  ``gap`` against ``kind_cold + recold``.

``--hf mixtral/eager,qwen2_moe/grouped_mm`` adds transformers' sparse MoE blocks (``experiments.hf_moe``'s
configs: d_model and d_ff as given, 16 experts, top-2, routing pinned to the same draws), their
kernels read off a capture (``sim.capture``); ``--backends ''`` leaves the project's layer out.

Usage: ``python scripts/bench_composition.py [--exponents 0,8] [--reps 3] [--d-model 1024 --d-ff 2048]
[--hf MODEL/IMPL,...] [--out DIR]``; at ``--d-model 8 --d-ff 16`` the kernels are negligible and the layer's cold
time is its host work and cold code, against which the model's chain share can be read;
writes ``composition.csv`` (every repetition) and ``composition.json`` (medians) to
``--out`` and prints the medians. Measure alone: it shares the cores with nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch
from rich.console import Console
from rich.table import Table

from costmodel.families.descriptor import KernelSpec
from costmodel.measure.allocator import configure_allocator
from costmodel.measure.ceilings import measure_cold_call_overhead
from costmodel.measure.runners import make_runner
from costmodel.measure.timing import TimingConfig, measure
from costmodel.model.cold_start import cold_start_kind as kind, mib_since_kind  # kind: family, op and dtype
from sim.api import load_cost_model
from sim.workloads.moe_layer import MoEConfig, MoELayer, DispatchPlan, moe_trace
from sim.capture.dispatch import capture_trace
from sim.workloads.routing import Routing, ZipfRouting, route
from sim.predict.simulator import measure_callable, predict_trace

SMALL_BYTES = 1 << 20  # a kernel moving less than this is "small": its cold call is code, not data
RECOLD_BYTES = 1 << 20  # bytes streamed since a small kind last ran that would flush a core's L2 (512 KiB-1 MiB)


def recold_calls(trace: list[KernelSpec]) -> dict[str, int]:
    """Per small kind: its later calls with over ``RECOLD_BYTES`` moved since the kind's previous call
    (``costmodel.model.cold_start.mib_since_kind``, the distance the cost model charges re-cooling by)."""
    count: dict[str, int] = {}
    for s, since in zip(trace, mib_since_kind(trace)):
        if s.bytes_moved() < SMALL_BYTES and since * 2**20 > RECOLD_BYTES:  # NaN (a first call) compares False
            count[kind(s)] = count.get(kind(s), 0) + 1
    return count


def check_hf_case(case: str) -> None:
    """``case`` is model/impl with a model and an implementation ``hf_block_call`` builds, else SystemExit."""
    name, _, impl = case.partition("/")
    if name not in ("mixtral", "qwen2_moe") or impl not in ("eager", "grouped_mm", "batched_mm"):
        raise SystemExit(f"--hf takes model/impl with model mixtral or qwen2_moe and impl eager, grouped_mm or "
                         f"batched_mm, got {case!r}")


def hf_block_call(case: str, routing: Routing, d_model: int, d_ff: int) -> Callable[[], Any]:
    """One forward of transformers' sparse MoE block ``model/impl`` (``experiments.hf_moe``'s
    config and seeded weights) on 32 tokens, its router pinned to ``routing``."""
    from experiments.hf_moe import PinnedGate, hf_config, init_weights, moe_block  # noqa: PLC0415 (transformers is optional)

    name, _, impl = case.partition("/")
    h = {"tokens": 32, "hidden_size": d_model, "intermediate_size": d_ff, "shared_expert_intermediate_size": d_ff,
         "num_experts": 16, "top_k": 2, "whole_model": {"vocab_size": 4096, "heads": 8, "kv_heads": 2}}
    cpu = torch.device("cpu")
    block = init_weights(moe_block(name, hf_config(name, h, impl)), 0, cpu, torch.float32)
    block.gate = PinnedGate(block.gate)
    block.gate.indices, block.gate.weights = block.gate.pin(routing, cpu, torch.float32)
    x = torch.randn(1, 32, d_model, generator=torch.Generator().manual_seed(1))

    def call() -> Any:
        with torch.no_grad():
            return block(x)

    call()  # first-call set-up stays out of the capture and the timing
    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exponents", default="0,8", help="Zipf exponents (comma-separated)")
    ap.add_argument("--backends", default="loop,padded,grouped")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--d-model", type=int, default=1024, help="d_model (8 leaves the host work and cold code alone)")
    ap.add_argument("--d-ff", type=int, default=2048)
    ap.add_argument("--hf", default="", help="transformers blocks as model/impl, comma-separated "
                    "(mixtral or qwen2_moe; eager, grouped_mm or batched_mm)")
    ap.add_argument("--out", default="results/cpu_epyc/composition")
    args = ap.parse_args()
    hf_cases = [c for c in args.hf.split(",") if c]
    for case in hf_cases:
        check_hf_case(case)
    configure_allocator("steady")
    device = torch.device("cpu")
    timing = TimingConfig(cold_cache=True, rounds=1, min_run_time_s=0.2 / 3)
    model = load_cost_model("cpu")
    console = Console(width=150)
    if args.d_model < 1 or args.d_ff < 1 or args.reps < 1:
        raise SystemExit(f"--d-model, --d-ff and --reps must be >= 1, got {args.d_model}, {args.d_ff}, {args.reps}")
    x = torch.randn(32, args.d_model, generator=torch.Generator().manual_seed(0))
    cases = []
    for e in (float(v) for v in args.exponents.split(",")):
        routing = route(ZipfRouting(exponent=e), tokens=32, num_experts=16, top_k=2, seed=0)
        for b in (b for b in args.backends.split(",") if b):
            cfg = MoEConfig(tokens=32, d_model=args.d_model, d_ff=args.d_ff, num_experts=16, top_k=2, backend=b)
            trace = moe_trace(cfg, DispatchPlan.from_routing(routing))
            layer = MoELayer(cfg, device=device, seed=0)
            cases.append((e, b, lambda layer=layer, routing=routing: layer(x, routing), trace))
        for case in hf_cases:
            call = hf_block_call(case, routing, args.d_model, args.d_ff)
            cases.append((e, case, call, capture_trace(call).kernels()))
    rows = []
    for rep in range(args.reps):
        chain_s = measure_cold_call_overhead(device, "float32", TimingConfig(cold_cache=True))["cold_call_overhead_s"]
        for e, b, call, trace in cases:
            console.print(f"rep {rep + 1}/{args.reps}: exponent {e:g}, {b}", highlight=False)
            layer_s = measure_callable(call, device, timing).median_s
            runner = {s: measure(make_runner(s, device, cold=True), device=device, config=timing).median_s
                      for s in dict.fromkeys(trace)}
            small = {}
            for s in trace:
                if s.bytes_moved() < SMALL_BYTES:
                    small.setdefault(kind(s), s)
            # single calls right after an eviction, as the layer's are timed (``measure_callable``)
            kind_cold = {k: measure(make_runner(s, device, cold=True), device=device, config=timing,
                                    evict_cpu_cache=True).median_s - runner[s] for k, s in small.items()}
            rows.append({
                "rep": rep, "exponent": e, "backend": b, "kernels": len(trace), "small_kinds": len(small),
                "layer_ms": 1e3 * layer_s, "runners_ms": 1e3 * sum(runner[s] for s in trace),
                "l3_ms": 1e3 * float(predict_trace(model, trace, ["L3"], quiet=True)["L3"].sum()),
                "kind_cold_ms": 1e3 * sum(kind_cold.values()), "chain_ms": 1e3 * chain_s * len(trace),
                "recold_ms": 1e3 * sum(n * kind_cold[k] for k, n in recold_calls(list(trace)).items()),
                "chain_us_per_op": 1e6 * chain_s,
                **{f"cold_us[{k}]": 1e6 * v for k, v in kind_cold.items()},
            })
    df = pd.DataFrame(rows)
    df["gap_ms"] = df["layer_ms"] - df["runners_ms"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "composition.csv", index=False)
    med = df.groupby(["exponent", "backend"], sort=False).median(numeric_only=True).reset_index()
    med["runners_over_layer"] = med["runners_ms"] / med["layer_ms"]
    med["l3_over_layer"] = med["l3_ms"] / med["layer_ms"]
    (out / "composition.json").write_text(json.dumps({
        "what": __doc__.split("\n")[0], "reps": args.reps, "d_model": args.d_model, "d_ff": args.d_ff, "device": model.fingerprint.describe(),
        "medians": med.drop(columns=["rep"]).to_dict("records")}, indent=2) + "\n")
    table = Table(title=f"cold MoE layer vs its kernels (medians of {args.reps} interleaved repetitions; ms)")
    shown = {"exponent": ("exponent", "g"), "backend": ("backend", ""), "kernels": ("kernels", ".0f"),
             "small_kinds": ("small kinds", ".0f"), "layer_ms": ("layer", ".2f"), "runners_ms": ("Σ runners", ".2f"),
             "gap_ms": ("gap", ".2f"), "l3_ms": ("L3", ".2f"), "kind_cold_ms": ("kinds cold", ".2f"),
             "chain_ms": ("chain", ".2f"), "recold_ms": ("recold", ".2f"), "runners_over_layer": ("runners/layer", ".3f"),
             "l3_over_layer": ("L3/layer", ".3f")}
    for head, _ in shown.values():
        table.add_column(head, justify="right")
    for _, r in med.iterrows():
        table.add_row(*(format(r[c], f) for c, (_, f) in shown.items()))
    console.print(table)
    console.print(f"written: {out / 'composition.csv'}, {out / 'composition.json'}")


if __name__ == "__main__":
    main()
