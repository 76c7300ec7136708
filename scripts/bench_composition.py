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
  chain overhead, measured now).

Usage: ``python scripts/bench_composition.py [--exponents 0,8] [--reps 3] [--d-model 1024 --d-ff 2048]
[--out DIR]``; at ``--d-model 8 --d-ff 16`` the kernels are negligible and the layer's cold
time is its host work and cold code, against which the model's chain share can be read;
writes ``composition.csv`` (every repetition) and ``composition.json`` (medians) to
``--out`` and prints the medians. Measure alone: it shares the cores with nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch
from rich.console import Console
from rich.table import Table

from costmodel.families.descriptor import KernelSpec
from costmodel.measure.allocator import configure_allocator
from costmodel.measure.ceilings import measure_cold_call_overhead
from costmodel.measure.runners import make_runner
from costmodel.measure.timing import TimingConfig, measure
from sim.api import load_cost_model
from sim.workloads.moe_layer import MoEConfig, MoELayer, DispatchPlan, moe_trace
from sim.workloads.routing import ZipfRouting, route
from sim.predict.error_parts import kernel_kind
from sim.predict.simulator import measure_callable, predict_trace

SMALL_BYTES = 1 << 20  # a kernel moving less than this is "small": its cold call is code, not data


def kind(spec: KernelSpec) -> str:
    """The code path a kernel runs: its family plus the field that picks the aten op
    (``sim.predict.error_parts.kernel_kind``), and its dtype."""
    return f"{kernel_kind(spec)}/{spec.dtype}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exponents", default="0,8", help="Zipf exponents (comma-separated)")
    ap.add_argument("--backends", default="loop,padded,grouped")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--d-model", type=int, default=1024, help="d_model (8 leaves the host work and cold code alone)")
    ap.add_argument("--d-ff", type=int, default=2048)
    ap.add_argument("--out", default="results/cpu_epyc/composition")
    args = ap.parse_args()
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
        for b in args.backends.split(","):
            cfg = MoEConfig(tokens=32, d_model=args.d_model, d_ff=args.d_ff, num_experts=16, top_k=2, backend=b)
            trace = moe_trace(cfg, DispatchPlan.from_routing(routing))
            layer = MoELayer(cfg, device=device, seed=0)
            cases.append((e, b, layer, routing, trace))
    rows = []
    for rep in range(args.reps):
        chain_s = measure_cold_call_overhead(device, "float32", TimingConfig(cold_cache=True))["cold_call_overhead_s"]
        for e, b, layer, routing, trace in cases:
            console.print(f"rep {rep + 1}/{args.reps}: exponent {e:g}, {b}", highlight=False)
            layer_s = measure_callable(lambda: layer(x, routing), device, timing).median_s
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
             "chain_ms": ("chain", ".2f"), "runners_over_layer": ("runners/layer", ".3f"),
             "l3_over_layer": ("L3/layer", ".3f")}
    for head, _ in shown.values():
        table.add_column(head, justify="right")
    for _, r in med.iterrows():
        table.add_row(*(format(r[c], f) for c, (_, f) in shown.items()))
    console.print(table)
    console.print(f"written: {out / 'composition.csv'}, {out / 'composition.json'}")


if __name__ == "__main__":
    main()
