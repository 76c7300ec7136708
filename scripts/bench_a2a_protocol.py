"""How long a gloo all-to-all takes depends on what the ranks did just before it.

The collective profile (``python -m costmodel bench suite=collectives``) times each call
warm and back to back: barrier, call. Inside an expert-parallel step the all-to-all follows
a cache eviction (the cold-cache protocol), the router's kernels and the dispatch's local
prep. This benchmark times the same uniform all-to-all on two pinned gloo ranks under
several protocols, so the gap between the profile and the layer can be read per cause:

- ``warm``: barrier, call (the collective profile's protocol);
- ``evict``: cache eviction (``costmodel.measure.timing.evict_caches``), barrier, call;
- ``evict_lead``: eviction, barrier, ``lead_ms`` of GEMMs (an EP step's router and dispatch
  prep before its first all-to-all), call;
- ``evict_lead_skew``: as ``evict_lead``, rank 1 doing ``skew_ms`` more GEMMs (the ranks
  arrive apart, as a layer's ranks do when their local work differs);
- ``compute``: barrier, ``compute_ms`` of GEMMs on every rank, call (no barrier between:
  the ranks arrive together as a balanced step's do);
- ``evict_compute``: eviction, barrier, the GEMMs, call (the EP step's order);
- ``counts_then_rows``: eviction, barrier, the GEMMs, a [W] int64 all-to-all, then the rows
  (the dispatch phase's two exchanges; the time is both).

Per protocol and size it prints the median, p75, p90, max and mean over the repeats of the slowest
rank's seconds in the call; ``--keep-awake true`` keeps the ranks' cores from idling while they
wait (``costmodel.collectives.awake``). Run alone (it measures):

    .venv/bin/python scripts/bench_a2a_protocol.py --repeats 41 [--keep-awake true]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

PROTOCOLS = ("warm", "evict", "evict_lead", "evict_lead_skew", "compute", "evict_compute", "counts_then_rows")


def _rank(rank: int, world_size: int, sizes: list[int], repeats: int, compute_ms: float,
          evict_bytes: int, lead_ms: float, skew_ms: float) -> dict[str, Any]:
    from costmodel.measure.allocator import configure_allocator
    from costmodel.measure.timing import TimingConfig, evict_caches

    configure_allocator("steady")
    cfg = TimingConfig(cpu_evict_bytes=evict_bytes)
    a = torch.randn(256, 256)
    t0 = time.perf_counter()
    for _ in range(10):
        torch.mm(a, a)
    per_gemm_s = (time.perf_counter() - t0) / 10
    gemms = max(1, int(compute_ms * 1e-3 / per_gemm_s))
    lead = max(1, int(lead_ms * 1e-3 / per_gemm_s))
    skewed = lead + (int(skew_ms * 1e-3 / per_gemm_s) if rank == 1 else 0)
    counts_in, counts_out = torch.ones(world_size, dtype=torch.int64), torch.empty(world_size, dtype=torch.int64)
    out: dict[str, Any] = {"gemms": gemms}
    for size in sizes:
        per_peer = size // 4 // world_size
        inp, res = torch.ones(per_peer * world_size), torch.empty(per_peer * world_size)

        def call() -> None:
            dist.all_to_all_single(res, inp)

        for proto in PROTOCOLS:
            times = []
            for i in range(repeats + 2):  # two untimed warm-ups
                if proto in ("evict", "evict_lead", "evict_lead_skew", "evict_compute", "counts_then_rows"):
                    evict_caches(torch.device("cpu"), cfg)
                dist.barrier()
                if proto == "warm" or proto == "evict":
                    start = time.perf_counter()
                    call()
                else:
                    n = {"evict_lead": lead, "evict_lead_skew": skewed}.get(proto, gemms)
                    for _ in range(n):
                        torch.mm(a, a)
                    start = time.perf_counter()
                    if proto == "counts_then_rows":
                        dist.all_to_all_single(counts_out, counts_in)
                    call()
                elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if i >= 2:
                    times.append(float(elapsed.item()))
            out[(proto, size)] = np.asarray(times)
    return out


def main() -> None:
    from costmodel.collectives.workers import run_workers

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[32768, 1048576], help="bytes per rank (all peers)")
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--compute-ms", type=float, default=2.0)
    ap.add_argument("--lead-ms", type=float, default=0.3, help="GEMM time before the call in evict_lead")
    ap.add_argument("--skew-ms", type=float, default=0.5, help="rank 1's extra GEMM time in evict_lead_skew")
    ap.add_argument("--evict-bytes", type=int, default=128 * 1024 * 1024)
    ap.add_argument("--keep-awake", choices=["true", "false"], default="false",
                    help="a SCHED_IDLE spinner per rank core (costmodel.collectives.awake), as the layers are measured")
    args = ap.parse_args()
    if not 3 <= args.repeats <= 1000:
        raise SystemExit(f"--repeats must be in [3, 1000], got {args.repeats}")
    run = run_workers(2, _rank, (args.sizes, args.repeats, args.compute_ms, args.evict_bytes, args.lead_ms, args.skew_ms), timeout_s=900,
                      placement="require", keep_awake=args.keep_awake == "true")
    res = run.results[0]
    print(f"2 gloo ranks, {run.note}; compute = {res['gemms']} GEMMs 256^3 (~{args.compute_ms} ms)")
    print(f"{'protocol':<18}{'bytes':>10}{'median us':>11}{'p75 us':>9}{'p90 us':>9}{'max us':>9}{'mean us':>9}")
    for size in args.sizes:
        for proto in PROTOCOLS:
            t = res[(proto, size)] * 1e6
            q = np.percentile(t, [50, 75, 90])
            print(f"{proto:<18}{size:>10}{q[0]:>11.0f}{q[1]:>9.0f}{q[2]:>9.0f}{t.max():>9.0f}{t.mean():>9.0f}")


if __name__ == "__main__":
    main()
