"""How much one placement workload slows down beside another, each on its own core.

    python scripts/bench_workload_pairs.py                         # the default victims and neighbours
    python scripts/bench_workload_pairs.py --victims moe_decode_uniform --neighbours stream mlp_skinny_b1

Each victim (a workload of the default placement mix, ``conf/placement_mix/default.yaml``)
is built in this process, pinned to core 0 with one thread and the steady allocator (as the
experiments run), and timed (``--calls`` calls
after two warm-ups, the median) alone, then beside each neighbour, then alone again (the
two alone medians give the drift of the run). A neighbour runs in a spawned process pinned
to core 1 with one thread, back to back until the victim's timing ends (or ``--deadline-s``
passes: a bounded loop), pinned the same way; ``stream`` is the co-location measurement's memory-streaming
neighbour (``costmodel.colocation.rank.StreamNeighbour``). Every neighbour process is ended
before the next starts, and on any error.

It answers what ``experiment=placement``'s co-location model predicts from kernels: a
workload's sensitivity to a streaming neighbour, and whether a real neighbour presses as
hard as its bytes say (docs/expert_parallel.md, "Beside different work"). Nothing is written;
one line per victim: alone ms, the alone drift, and the ratio beside each neighbour.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MIX = Path(__file__).resolve().parents[1] / "conf" / "placement_mix" / "default.yaml"
DEFAULT_VICTIMS = ("moe_decode_uniform", "mlp_balanced_a", "gnn_skewed")
DEFAULT_NEIGHBOURS = ("stream", "gnn_skewed", "moe_decode_uniform", "mlp_balanced_a", "mlp_skinny_b1")


def build(name: str) -> Callable[[], Any]:
    """The callable of workload ``name`` of the default mix, built as ``experiment=placement``
    builds it (``experiments.placement.build_workloads``: the same checks and per-workload
    seeds), or the stream neighbour."""
    import torch
    from omegaconf import OmegaConf

    if name == "stream":
        from costmodel.colocation.rank import StreamNeighbour

        return StreamNeighbour()
    mix = OmegaConf.to_container(OmegaConf.load(MIX))
    if name not in mix:
        raise SystemExit(f"bench_workload_pairs.py: error: workload {name!r} is not in {MIX.name} "
                         f"(it has {sorted(mix)} and 'stream')")
    from experiments.placement import build_workloads

    workloads = {w.name: w for w in build_workloads({"placement_mix": mix, "dtype": "float32", "seed": 0})}
    return workloads[name].factory.build(torch.device("cpu"))


def pin(core: int) -> None:
    """One thread on ``core``, the steady allocator (as the experiments run: no page faults of
    freshly mapped buffers in the timings)."""
    import torch

    from costmodel.measure.allocator import configure_allocator

    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    configure_allocator("steady")


def _neighbour(name: str, core: int, ready: Any, stop: Any, deadline_s: float) -> None:
    pin(core)
    run = build(name)
    run()
    ready.set()
    end = time.monotonic() + deadline_s
    while not stop.is_set() and time.monotonic() < end:  # bounded by the deadline
        run()


def median_call_s(run: Callable[[], Any], calls: int) -> float:
    run()
    run()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def beside(run: Callable[[], Any], neighbour: str, calls: int, deadline_s: float) -> float:
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_neighbour, args=(neighbour, 1, ready, stop, deadline_s), daemon=True)
    proc.start()
    try:
        if not ready.wait(timeout=120):
            raise RuntimeError(f"neighbour {neighbour!r} did not start within 120 s")
        return median_call_s(run, calls)
    finally:
        stop.set()
        proc.join(timeout=deadline_s + 10)
        if proc.is_alive():
            proc.kill()
            proc.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--victims", nargs="+", default=list(DEFAULT_VICTIMS))
    parser.add_argument("--neighbours", nargs="+", default=list(DEFAULT_NEIGHBOURS))
    parser.add_argument("--calls", type=int, default=15, help="timed calls per condition (>= 3)")
    parser.add_argument("--deadline-s", type=float, default=60.0, help="longest a neighbour runs (> 0)")
    args = parser.parse_args(argv)
    if args.calls < 3:
        parser.error(f"--calls must be an integer >= 3, got {args.calls}")
    if not args.deadline_s > 0:
        parser.error(f"--deadline-s must be > 0 seconds, got {args.deadline_s}")
    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        parser.error("needs cores 0 and 1 (the victim on core 0, the neighbour on core 1)")
    pin(0)
    for victim in args.victims:
        run = build(victim)
        alone = median_call_s(run, args.calls)
        ratios = {nb: beside(run, nb, args.calls, args.deadline_s) for nb in args.neighbours}
        again = median_call_s(run, args.calls)
        base = (alone + again) / 2
        print(f"{victim:24s} alone {base * 1e3:8.2f} ms (drift {again / alone:.2f}) "
              + " ".join(f"{nb} {t / base:.2f}x" for nb, t in ratios.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
