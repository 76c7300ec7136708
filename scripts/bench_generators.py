"""Benchmark: seconds to generate one million edges per graph generator (median of 5 runs).

    python scripts/bench_generators.py [--edges 1000000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from sim.workloads.graphs import barabasi_albert, chung_lu, degree_stats, erdos_renyi, rmat, sbm

GENERATORS = {
    "rmat (Graph500)": lambda n, e, s: rmat(n, e, seed=s),
    "chung_lu (gamma 2.5)": lambda n, e, s: chung_lu(n, e, exponent=2.5, seed=s),
    "erdos_renyi": lambda n, e, s: erdos_renyi(n, e, seed=s),
    "barabasi_albert": lambda n, e, s: barabasi_albert(n, e, seed=s),
    "sbm (8 blocks)": lambda n, e, s: sbm(n, e, num_blocks=8, seed=s),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=int, default=1_000_000)
    parser.add_argument("--nodes", type=int, default=1 << 17)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = {}
    for name, make in GENERATORS.items():
        make(args.nodes, args.edges, 0)  # warm-up
        times = []
        for r in range(args.repeats):
            start = time.perf_counter()
            ei = make(args.nodes, args.edges, r)
            times.append(time.perf_counter() - start)
        stats = degree_stats(ei, args.nodes)
        results[name] = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
                         "edges": int(ei.shape[1]), "degree_cv": stats["degree_cv"]}
        print(f"{name:24s} {int(ei.shape[1]):>9,} edges  median {results[name]['median_s']:.3f} s "
              f"(min {min(times):.3f}, max {max(times):.3f})  in-degree CV {stats['degree_cv']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
