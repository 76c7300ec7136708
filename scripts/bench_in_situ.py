"""Where a cold layer's time goes, op by op: every aten op timed inside the layer, beside its runner.

A layer costs more than its kernels timed alone (``scripts/bench_composition.py``: the gap).
This script finds where. It runs each case as the experiments time it (one call after
evicting the caches, ``timing.cold_cache``) under a dispatch mode that captures every aten
op (``sim.capture.dispatch.CaptureMode``, so each timed op carries its kernel descriptor) and
times the op's own call with ``perf_counter``. Over ``--reps`` cold calls each op keeps its
median. Every kernel is also timed alone by the profile's runner (cold operands,
``costmodel.measure.runners``). Per case it reports:

- ``wall_ms``: the layer alone, as the experiments measure it (``measure_callable``);
- ``kernels_in_situ_ms`` against ``runners_ms``: the same kernels inside the layer and alone;
- ``host_ops_ms``: the ops that launch no kernel (views, ``.item()`` reads), in situ;
- ``first_calls_extra_ms`` and ``later_calls_extra_ms``: in situ minus runner, summed over each
  kind's first call and over its later calls, beside what the cost model charges for them
  (``model_first_ms``, ``model_recold_ms``: ``costmodel.model.cold_start`` on the profile as loaded);
- per kernel kind (family and op, dtype): calls, in situ against runner, and the extra per
  call split into the kind's *first* call in the layer and its *later* calls, with the bytes
  the layer streamed since the kind last ran (what could have pushed its code and
  metadata out of cache again).

The mode adds its own Python around every op (the timed call excludes it), so the wall
under the timer is longer than ``wall_ms``; compare the in-situ sums with the runners, not
with that wall. The mode's Python also cools each op's code a little: where the in-situ times
of all ops sum to more than ``wall_ms``, ``timer_excess_us_per_op`` (that excess per op) is a
lower bound of what the timer adds to each op.

Cases: ``--backends loop,grouped`` (the ``moe_skew`` default layer, T=32, D=1024, F=2048,
E=16, top-2), ``--hf mixtral/eager,qwen2_moe/grouped_mm`` (transformers' blocks as
``bench_composition.py --hf``), ``--modules olmoe,gat`` (``bench_unseen_modules.py``'s
blocks and convolutions at their sizes). Writes ``ops.csv`` (one row per op per case),
``kinds.csv``, ``recold.csv`` (small kernels' later calls binned by MiB since, measured extra
against the model's re-cooling charge) and ``summary.json`` to ``--out`` and prints the tables. Measure alone.

    python scripts/bench_in_situ.py --hf mixtral/eager,mixtral/grouped_mm --backends loop --modules gat
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
from rich.console import Console
from rich.table import Table

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS.parent))
sys.path.insert(0, str(SCRIPTS))

from costmodel.measure.allocator import configure_allocator  # noqa: E402
from costmodel.measure.runners import make_runner  # noqa: E402
from costmodel.measure.timing import TimingConfig, evict_caches, measure  # noqa: E402
from costmodel.model.cold_start import (  # noqa: E402
    charges_at, cold_start_charges_s, cold_start_kind, cold_start_per_kind_s, mib_since_kind, recold_curve,
)
from sim.api import load_cost_model  # noqa: E402
from sim.capture.dispatch import CaptureMode, CapturedOp  # noqa: E402
from sim.predict.simulator import measure_callable  # noqa: E402
from bench_composition import SMALL_BYTES  # noqa: E402 (a kernel moving less is small: its extra is code, not data)

HOST_KINDS = ("view",)  # ops that launch no kernel: their in-situ time is host work


class TimedCaptureMode(CaptureMode):
    """``CaptureMode`` that also times each op's own call (its recording stays outside the timing)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        start = time.perf_counter()
        out = func(*args, **kwargs)
        self.seconds.append(time.perf_counter() - start)
        self._record(func, args, kwargs, out)
        return out


def timed_ops(call: Callable[[], Any], reps: int, timing: TimingConfig) -> tuple[list[CapturedOp], np.ndarray]:
    """The ops of ``call`` and each op's median in-situ seconds over ``reps`` cold calls.

    Raises ValueError when two calls dispatch different op sequences (the medians would mix ops)."""
    ops, times = None, []
    for rep in range(reps):
        evict_caches(torch.device("cpu"), timing)
        mode = TimedCaptureMode()
        with mode:
            call()
        names = [op.aten_op for op in mode.ops]
        if ops is None:
            ops = mode.ops
        elif names != [op.aten_op for op in ops]:
            raise ValueError(f"call {rep + 1} dispatched {len(names)} ops where call 1 dispatched {len(ops)} "
                             "(or other ones): the case is not deterministic, in-situ times cannot be matched op by op")
        times.append(mode.seconds)
    return ops, np.median(np.asarray(times), axis=0)


def op_table(ops: list[CapturedOp], in_situ_s: np.ndarray, runner_s: dict[Any, float]) -> pd.DataFrame:
    """One row per op: its kind, kernel kind, in-situ and runner seconds and, for a kernel, whether it
    is its kind's first in the layer and the MiB the layer's kernels moved since the kind last ran
    (``costmodel.model.cold_start.mib_since_kind``, what the cost model charges re-cooling by)."""
    kernels = [op for op in ops if op.kind == "kernel" and op.spec is not None]
    since = dict(zip((op.index for op in kernels), mib_since_kind([op.spec for op in kernels])))
    return pd.DataFrame([{
        "index": op.index, "aten_op": op.aten_op, "op_kind": op.kind,
        "kind": cold_start_kind(op.spec) if op.index in since else op.aten_op, "in_situ_s": float(t),
        "runner_s": runner_s.get(op.spec) if op.index in since else None,
        "first_of_kind": bool(np.isnan(since[op.index])) if op.index in since else None,
        "bytes_since_kind_mib": since.get(op.index), "bytes_moved": op.bytes_moved,
    } for op, t in zip(ops, in_situ_s)])


def kind_table(ops: pd.DataFrame) -> pd.DataFrame:
    """Per kernel kind: calls, in situ, runner, and the extra per call at the first call and at later ones."""
    k = ops[ops.op_kind == "kernel"].assign(extra_s=lambda d: d.in_situ_s - d.runner_s,
                                            first_of_kind=lambda d: d.first_of_kind.astype(bool))
    first, later = k[k.first_of_kind], k[~k.first_of_kind]
    out = k.groupby("kind").agg(calls=("in_situ_s", "size"), in_situ_ms=("in_situ_s", "sum"), runner_ms=("runner_s", "sum"))
    out[["in_situ_ms", "runner_ms"]] *= 1e3
    out["first_extra_us"] = first.groupby("kind").extra_s.median() * 1e6
    out["later_extra_us"] = later.groupby("kind").extra_s.median() * 1e6
    out["later_mib_since"] = later.groupby("kind").bytes_since_kind_mib.median()
    out["ratio"] = out.in_situ_ms / out.runner_ms
    return out.reset_index().sort_values("in_situ_ms", ascending=False)


def check_cases(args: argparse.Namespace) -> None:
    """Every named case exists (SystemExit naming the option and the choices), before any timing."""
    import bench_composition as composition  # noqa: PLC0415 (scripts are files, imported by path)
    import bench_unseen_modules as unseen  # noqa: PLC0415

    from sim.workloads.backends import MOE_BACKENDS  # noqa: PLC0415

    choices = {"--backends": sorted(MOE_BACKENDS), "--modules": sorted(unseen.MOE_CASES) + sorted(unseen.GNN_CASES)}
    for option, value in (("--backends", args.backends), ("--modules", args.modules)):
        for name in filter(None, value.split(",")):
            if name not in choices[option]:
                raise SystemExit(f"{option} takes names from {choices[option]}, got {name!r}")
    for case in filter(None, args.hf.split(",")):
        composition.check_hf_case(case)


#: MiB-since bins of the re-cooling table (small kernels' later calls)
MIB_BINS = (0.0, 0.5, 2.0, 6.0, 12.0, 20.0, 40.0, float("inf"))


def recold_table(ops: pd.DataFrame, model: Any) -> pd.DataFrame:
    """Later calls of small kernels (< 1 MiB moved) over every case, binned by the MiB streamed since
    their kind last ran: calls, the measured extra per call (in situ - runner, median) and the cost
    model's re-cooling charge per call (median)."""
    small = ops[(ops.op_kind == "kernel") & ~ops.first_of_kind.astype(bool) & (ops.bytes_moved < SMALL_BYTES)].copy()
    curve = recold_curve(model, "L3")
    per_kind = cold_start_per_kind_s(model, "L3")
    small["model_us"] = 1e6 * charges_at(per_kind, curve, small.bytes_since_kind_mib.to_numpy(dtype=float))
    small["extra_us"] = 1e6 * (small.in_situ_s - small.runner_s)
    small["mib_since"] = pd.cut(small.bytes_since_kind_mib, MIB_BINS, include_lowest=True)
    return (small.groupby("mib_since", observed=True)
            .agg(calls=("extra_us", "size"), measured_extra_us=("extra_us", "median"), model_recold_us=("model_us", "median"))
            .reset_index().assign(mib_since=lambda d: d.mib_since.astype(str)))


def cases_from(args: argparse.Namespace, device: torch.device) -> list[tuple[str, Callable[[], Any]]]:
    """(name, callable) per requested case; builders from bench_composition.py and bench_unseen_modules.py."""
    import bench_composition as composition  # noqa: PLC0415 (scripts are files, imported by path)
    from sim.workloads.moe_layer import MoEConfig, MoELayer  # noqa: PLC0415
    from sim.workloads.routing import ZipfRouting, route  # noqa: PLC0415

    routing = route(ZipfRouting(exponent=args.exponent), tokens=32, num_experts=16, top_k=2, seed=0)
    x = torch.randn(32, 1024, generator=torch.Generator().manual_seed(0))
    cases = []
    for b in filter(None, args.backends.split(",")):
        layer = MoELayer(MoEConfig(tokens=32, d_model=1024, d_ff=2048, num_experts=16, top_k=2, backend=b), device=device, seed=0)
        cases.append((b, lambda layer=layer: layer(x, routing)))
    for case in filter(None, args.hf.split(",")):
        cases.append((case, composition.hf_block_call(case, routing, 1024, 2048)))
    if args.modules:
        import bench_unseen_modules as unseen  # noqa: PLC0415

        for name in args.modules.split(","):
            if name in unseen.MOE_CASES:
                module, inputs = unseen.build_moe(unseen.MOE_CASES[name], unseen.MOE_CASES[name].size, seed=0)
            else:
                edges = unseen.build_graph("rmat", unseen.GRAPH, seed=0)
                module, inputs = unseen.build_conv(name, unseen.GRAPH, edges, seed=0)

            def call(module: torch.nn.Module = module, inputs: tuple = inputs) -> Any:
                with torch.no_grad():
                    return module(*inputs)
            call()
            cases.append((name, call))
    return cases


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="", help="the project's MoE layer backends (loop, padded, grouped)")
    ap.add_argument("--hf", default="", help="transformers blocks as model/impl (bench_composition.py --hf)")
    ap.add_argument("--modules", default="", help="bench_unseen_modules.py modules (olmoe, gat, ...)")
    ap.add_argument("--exponent", type=float, default=0.0, help="Zipf exponent of the MoE routing")
    ap.add_argument("--reps", type=int, default=15, help="cold calls timed op by op (>= 3)")
    ap.add_argument("--out", default="results/cpu_epyc/in_situ")
    args = ap.parse_args(argv)
    if args.reps < 3:
        raise SystemExit(f"--reps must be >= 3 (a median of in-situ times), got {args.reps}")
    if not (args.backends or args.hf or args.modules):
        raise SystemExit("name at least one case: --backends, --hf or --modules")
    check_cases(args)
    configure_allocator("steady")
    device = torch.device("cpu")
    timing = TimingConfig(cold_cache=True, rounds=1, min_run_time_s=0.2 / 3)
    console = Console(width=160)
    model = load_cost_model("cpu")  # the profile as loaded: its cold start and re-cooling curve
    cases = cases_from(args, device)
    frames, summary = [], []
    for i, (name, call) in enumerate(cases, 1):
        console.print(f"[{i}/{len(cases)}] {name}: wall, {args.reps} cold calls op by op, runners", highlight=False)
        wall_s = measure_callable(call, device, timing).median_s
        ops, in_situ = timed_ops(call, args.reps, timing)
        runner = {op.spec: measure(make_runner(op.spec, device, cold=True), device=device, config=timing).median_s
                  for op in ops if op.kind == "kernel" and op.spec is not None}
        table = op_table(ops, in_situ, runner).assign(case=name)
        frames.append(table)
        kernels = table[table.op_kind == "kernel"].astype({"first_of_kind": bool})
        extra = kernels.in_situ_s - kernels.runner_s
        charges = cold_start_charges_s(model, "L3", [op.spec for op in ops if op.kind == "kernel" and op.spec is not None])
        summary.append({"case": name, "ops": len(table), "kernels": len(kernels), "wall_ms": 1e3 * wall_s,
                        "kernels_in_situ_ms": 1e3 * kernels.in_situ_s.sum(), "runners_ms": 1e3 * kernels.runner_s.sum(),
                        "first_calls_extra_ms": 1e3 * extra[kernels.first_of_kind].sum(),
                        "later_calls_extra_ms": 1e3 * extra[~kernels.first_of_kind].sum(),
                        "model_first_ms": 1e3 * charges[kernels.first_of_kind.to_numpy()].sum(),
                        "model_recold_ms": 1e3 * charges[~kernels.first_of_kind.to_numpy()].sum(),
                        "host_ops_ms": 1e3 * table[table.op_kind.isin(HOST_KINDS)].in_situ_s.sum(),
                        "host_ops": int(table.op_kind.isin(HOST_KINDS).sum()),
                        "other_ops_ms": 1e3 * table[~table.op_kind.isin(("kernel", *HOST_KINDS))].in_situ_s.sum(),
                        "timer_excess_us_per_op": 1e6 * max(0.0, table.in_situ_s.sum() - wall_s) / len(table)})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ops_df = pd.concat(frames, ignore_index=True)
    ops_df.to_csv(out / "ops.csv", index=False)
    kinds = pd.concat([kind_table(f).assign(case=f.case.iloc[0]) for f in frames], ignore_index=True)
    kinds.to_csv(out / "kinds.csv", index=False)
    (out / "summary.json").write_text(json.dumps({"what": __doc__.split("\n")[0], "reps": args.reps,
                                                  "exponent": args.exponent, "cases": summary}, indent=2) + "\n")
    t = Table(title=f"cold layers op by op (ms; in-situ medians of {args.reps} cold calls)")
    for head in ("case", "ops", "kernels", "wall", "kernels in situ", "Σ runners", "first calls +", "model first",
                 "later calls +", "model recold", "host ops", "host-op calls", "timer excess us/op"):
        t.add_column(head, justify="right")
    for s in summary:
        t.add_row(s["case"], str(s["ops"]), str(s["kernels"]), *(f"{s[c]:.2f}" for c in (
            "wall_ms", "kernels_in_situ_ms", "runners_ms", "first_calls_extra_ms", "model_first_ms", "later_calls_extra_ms",
            "model_recold_ms", "host_ops_ms")), str(s["host_ops"]), f"{s['timer_excess_us_per_op']:.1f}")
    console.print(t)
    for name, f in kinds.groupby("case", sort=False):
        console.print(f"\n{name}: per kernel kind (extra = in situ - runner, per call)", highlight=False)
        console.print(f.drop(columns="case").round(3).to_string(index=False), highlight=False)
    recold = recold_table(ops_df, model)
    recold.to_csv(out / "recold.csv", index=False)
    console.print("\nlater calls of small kernels (< 1 MiB) by MiB streamed since their kind last ran: measured extra "
                  "(in situ - runner) against the model's re-cooling charge, per call (medians)", highlight=False)
    console.print(recold.round(1).to_string(index=False), highlight=False)
    console.print(f"written: {out / 'ops.csv'}, {out / 'kinds.csv'}, {out / 'recold.csv'}, {out / 'summary.json'}")


if __name__ == "__main__":
    main()
