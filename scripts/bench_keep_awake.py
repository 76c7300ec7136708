"""What a parked core costs an expert-parallel step: the same EP MoE layer timed with the
ranks' cores left to idle and kept awake (``costmodel.collectives.awake``), in alternating
launches so a slow spell of the machine falls on both.

A rank that waits in a gloo all-to-all blocks; on a VM its idle vCPU is halted, and waking it
goes through the hypervisor. Per condition it prints, over every repeat of every launch, the
median / p90 of each measured segment (``sim.distributed.ep_layer.MEASURED_SEGMENTS``) on each
rank, the share of steps whose dispatch all-to-alls took over 2 ms, and the slowest-rank step's
median and IQR. Run alone (it measures); about a minute:

    .venv/bin/python scripts/bench_keep_awake.py --rounds 2 --repeats 25 --out results/cpu_epyc/keep_awake
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from sim.distributed.ep_layer import MEASURED_SEGMENTS, run_ep_phases
from sim.distributed.ep_plan import plan_expert_parallel
from sim.workloads.moe_layer import MoEConfig
from sim.workloads.routing import ZipfRouting, route

TAIL_MS = 2.0  # a dispatch above this paid a wake-up (the awake dispatch's p90 is well under 1 ms on the VMs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="launches per condition, alternating (default 2)")
    ap.add_argument("--repeats", type=int, default=25, help="timed steps per launch (default 25)")
    ap.add_argument("--exponent", type=float, default=0.0, help="Zipf routing exponent (0: uniform)")
    ap.add_argument("--evict-mib", type=int, default=64, help="cache eviction before each step, MiB (0: none)")
    ap.add_argument("--out", type=Path, default=None, help="folder for keep_awake.json")
    args = ap.parse_args()
    if not (1 <= args.rounds <= 20 and 5 <= args.repeats <= 500):
        raise SystemExit("--rounds must be in [1, 20] and --repeats in [5, 500]")
    # moe_ep's default layer (conf/experiment/moe_ep.yaml), loop backend, contiguous placement
    cfg = MoEConfig(tokens=32, d_model=1024, d_ff=2048, num_experts=16, top_k=2, expert="swiglu", backend="loop")
    routing = route(ZipfRouting(args.exponent), tokens=32, num_experts=16, top_k=2, seed=1)
    plan = plan_expert_parallel(cfg, routing, world_size=2, placement="contiguous")
    x = np.random.default_rng(0).standard_normal((cfg.tokens, cfg.d_model)).astype(np.float32)
    seg = {name: i for i, name in enumerate(MEASURED_SEGMENTS)}
    phases = {False: [], True: []}
    steps = {False: [], True: []}
    notes = {}
    start = time.monotonic()
    for r in range(args.rounds):
        for awake in (False, True):
            run = run_ep_phases([(cfg, plan, routing)], x, world_size=2, warmup=2, repeats=args.repeats,
                                evict_bytes=args.evict_mib * 2**20, timeout_s=600, keep_awake=awake)
            case = run["cases"][0]
            phases[awake].append(np.stack(case["phase_s"]))  # [ranks, repeats, segments]
            steps[awake].append(np.asarray(case["step"].times_s))
            notes[awake] = run["note"]
            print(f"round {r + 1}/{args.rounds}, cores {'kept awake' if awake else 'left to idle'}: done "
                  f"({time.monotonic() - start:.0f} s)", flush=True)
    report = {"layer": cfg.__dict__, "routing_exponent": args.exponent, "rounds": args.rounds, "repeats": args.repeats,
              "evict_mib": args.evict_mib, "tail_ms": TAIL_MS, "conditions": {}}
    print(f"\nEP MoE step (T={cfg.tokens}, D={cfg.d_model}, F={cfg.d_ff}, E={cfg.num_experts}, top-{cfg.top_k}, "
          f"loop), 2 gloo ranks; ms, median / p90 over {args.rounds} x {args.repeats} steps")
    print(f"{'cores':12s} {'rank':>4s} " + " ".join(f"{s:>17s}" for s in MEASURED_SEGMENTS)
          + f" {'dispatch>2ms':>12s} {'step med (IQR)':>16s}")
    for awake in (False, True):
        ph = np.concatenate(phases[awake], axis=1) * 1e3
        st = np.concatenate(steps[awake]) * 1e3
        q1, med, q3 = np.percentile(st, [25, 50, 75])
        name = "kept awake" if awake else "left to idle"
        cond = {"note": notes[awake], "step_median_ms": float(med), "step_iqr_ms": float(q3 - q1), "ranks": []}
        for rank in range(ph.shape[0]):
            a = ph[rank]
            tail = float(np.mean(a[:, seg["dispatch_a2a"]] > TAIL_MS))
            cond["ranks"].append({"median_ms": dict(zip(MEASURED_SEGMENTS, np.median(a, 0).tolist())),
                                  "p90_ms": dict(zip(MEASURED_SEGMENTS, np.percentile(a, 90, 0).tolist())),
                                  "dispatch_tail_share": tail})
            print(f"{name if rank == 0 else '':12s} {rank:4d} "
                  + " ".join(f"{m:7.2f} / {p:7.2f}" for m, p in zip(np.median(a, 0), np.percentile(a, 90, 0)))
                  + f" {tail:12.2f}" + (f" {med:7.2f} ({q3 - q1:5.2f})" if rank == 0 else ""))
        report["conditions"][name] = cond
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "keep_awake.json").write_text(json.dumps(report, indent=2) + "\n")
        print(f"-> {args.out / 'keep_awake.json'}")


if __name__ == "__main__":
    main()
