"""Is a kernel's slow-down beside its twin read better off its bytes or off its own traffic?

``costmodel.colocation`` scales a kernel predicted alone by a factor measured on a few kernels
per family beside a twin on the other core. This benchmark times GEMM loops that are not in
that measurement, alone and beside a twin (two gloo ranks pinned to two cores, the twin
running the same loop; alone and beside alternate over ``--rounds``), and compares the measured
ratio with the profile's factor read two ways: by the kernel's bytes (log2-interpolated), and
by its own pressure (bytes beyond the private cache per second alone, over the stream
neighbour's rate; ``factor_by_own_pressure``), the alone seconds being the ones
measured here, so only the co-location rule is tested. Run alone (it measures), ~1 minute:

    .venv/bin/python scripts/bench_colocation_pressure.py --profile profiles/<threads=1 profile> \\
        --out results/cpu_epyc/colocation_pressure
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

#: (label, m, k, n, distinct weights per pass): an EP rank's expert GEMMs (m = tokens per expert),
#: a decode-like GEMV, a wide skinny GEMM and a compute-bound square one
LOOPS = (("expert up/gate m=4", 4, 1024, 2048, 24), ("expert down m=4", 4, 2048, 1024, 24),
         ("GEMV m=1", 1, 8192, 512, 24), ("skinny m=16", 16, 8192, 2048, 4), ("square m=147", 147, 1024, 1024, 24),
         ("batch m=32", 32, 1024, 2048, 24))


def _rank(rank: int, world_size: int, loops: list, rounds: int, reps: int) -> list[dict[str, list[float]]]:
    import torch
    import torch.distributed as dist

    out = []
    for label, m, k, n, nw in loops:
        g = torch.Generator().manual_seed(rank)
        w, x = torch.randn(nw, k, n, generator=g), torch.randn(m, k, generator=g)

        def one_pass() -> None:
            for e in range(nw):
                torch.mm(x, w[e])

        one_pass()
        times: dict[str, list[float]] = {"alone": [], "beside": []}
        for r in range(rounds):
            for cond in (("alone", "beside") if r % 2 == 0 else ("beside", "alone")):
                dist.barrier()
                if cond == "alone" and rank != 0:
                    dist.barrier()  # the twin waits while rank 0 runs alone
                    continue
                for _ in range(reps):
                    t0 = time.perf_counter()
                    one_pass()
                    if rank == 0:
                        times[cond].append((time.perf_counter() - t0) / nw)
                if cond == "alone":
                    dist.barrier()
        out.append(times)
        del w
    return out


def factor_by_own_pressure(factors: Any, family: str, bytes_moved: float, alone_s: float) -> float:
    """The alternative reading tried here (``costmodel.colocation.store`` keeps bytes): the family's
    measured twin ratios interpolated linearly in each kernel's own pressure
    (``ColocationFactors.kernel_pressure``; those inside the private cache pooled at 0 by their
    median; held flat beyond the ends), read at this kernel's ``pressure_of([bytes_moved],
    alone_s)``. The bytes factor where the stream was not measured or fewer than two pressures were."""
    if not (isinstance(alone_s, (int, float)) and alone_s >= 0):
        raise ValueError(f"alone_s must be seconds >= 0, got {alone_s!r}")
    at: dict[float, list[float]] = {}
    for k in factors.kernels.get(family, []):
        p, r = factors.kernel_pressure(k), k.get("ratio")
        if p is not None and isinstance(r, (int, float)) and r > 0:
            at.setdefault(round(p, 6), []).append(float(r))
    if not factors.has_stream or len(at) < 2:
        return factors.factor(family, bytes_moved)
    xs = np.array(sorted(at))
    return float(np.interp(factors.pressure_of([float(bytes_moved)], float(alone_s)), xs,
                           [float(np.median(at[x])) for x in xs]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", type=Path, required=True, help="a threads=1 device profile folder with colocation.json")
    ap.add_argument("--rounds", type=int, default=4, help="alone/beside alternations per loop (default 4)")
    ap.add_argument("--reps", type=int, default=8, help="passes per condition and round (default 8)")
    ap.add_argument("--out", type=Path, default=None, help="folder for colocation_pressure.json")
    args = ap.parse_args()
    from costmodel.colocation.store import load_colocation
    from costmodel.collectives.workers import run_workers

    factors = load_colocation(args.profile)
    if factors is None or not factors.has_stream:
        raise SystemExit(f"{args.profile} has no colocation.json measured with the stream neighbour: run "
                         "python -m costmodel.colocation measure first")
    if not (2 <= args.rounds <= 20 and 3 <= args.reps <= 100):
        raise SystemExit("--rounds must be in [2, 20] and --reps in [3, 100]")
    run = run_workers(2, _rank, (list(LOOPS), args.rounds, args.reps), timeout_s=900, placement="require")
    rows = []
    for (label, m, k, n, _), times in zip(LOOPS, run.results[0]):
        alone, beside = float(np.median(times["alone"])), float(np.median(times["beside"]))
        b = 4.0 * (m * k + k * n + m * n)
        rows.append({"kernel": f"{label} (k={k}, n={n})", "bytes_moved": b, "alone_s": alone, "beside_s": beside,
                     "measured_ratio": beside / alone, "own_pressure": factors.pressure_of([b], alone),
                     "by_bytes": factors.factor("gemm", b),
                     "by_pressure": factor_by_own_pressure(factors, "gemm", b, alone)})
    print(f"\nGEMM beside its twin on {run.note}; factors from {factors.source} (measured {factors.measured_at})")
    print(f"{'kernel':36s} {'MB':>6s} {'GB/s':>6s} {'p own':>6s} {'measured':>9s} {'by bytes':>9s} {'by p':>7s}")
    for r in rows:
        print(f"{r['kernel']:36s} {r['bytes_moved'] / 1e6:6.2f} {r['bytes_moved'] / r['alone_s'] / 1e9:6.1f} "
              f"{r['own_pressure']:6.2f} {r['measured_ratio']:9.3f} {r['by_bytes']:9.3f} {r['by_pressure']:7.3f}")
    err = {rule: float(np.median([abs(r[rule] - r["measured_ratio"]) for r in rows])) for rule in ("by_bytes", "by_pressure")}
    print(f"median |factor - measured ratio|: by bytes {err['by_bytes']:.3f}, by own pressure {err['by_pressure']:.3f}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "colocation_pressure.json").write_text(json.dumps(
            {"profile": str(args.profile), "colocation_measured_at": factors.measured_at, "ranks": run.note,
             "rounds": args.rounds, "reps": args.reps, "rows": rows, "median_abs_error": err}, indent=2) + "\n")
        print(f"-> {args.out / 'colocation_pressure.json'}")


if __name__ == "__main__":
    main()
