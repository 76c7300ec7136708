"""The expert-parallel MoE layer under an existing launcher: torchrun, Slurm (srun / the Hydra
submitit launcher) or any tool that sets torch.distributed's environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; LOCAL_RANK for the GPU).

    torchrun --nproc_per_node=2 scripts/ep_torchrun.py --tokens 64 --experts 8 --zipf 1.5
    torchrun --nproc_per_node=8 scripts/ep_torchrun.py --device cuda --tokens 4096 --d-model 4096
    srun -N 2 --ntasks-per-node=1 torchrun --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d \\
        --rdzv_endpoint=$HEAD:29500 scripts/ep_torchrun.py --placement load_aware

Every rank draws the same seeded routing, builds the same plan (``sim.distributed.ep_plan``)
and runs its shard of ``EPMoELayer`` (uneven ``all_to_all_single``, the project's expert backend
per rank); rank 0 prints the slowest rank's step (median and IQR over repeats,
``sim.distributed.step_timing``) and, with ``--check``, that the gathered output equals the
single-device ``MoELayer``. gloo between CPU processes (one thread each), NCCL between GPUs
(one per process, its local rank's: ``sim.distributed.torchrun_env``); ``--device auto`` takes
the GPUs where CUDA is there. The NCCL path is written, not yet run on a GPU here.
The tests run the same layer through the project's own two-process launcher
(``tests/distributed/test_ep_layer.py``); this script is the way onto many hosts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from sim.distributed.ep_layer import EPMoELayer  # noqa: E402
from sim.distributed.ep_plan import plan_expert_parallel  # noqa: E402
from sim.distributed.step_timing import time_step  # noqa: E402
from sim.distributed.torchrun_env import LaunchError, add_launch_arguments, gathered_shards, join_group  # noqa: E402
from sim.workloads.moe_layer import MoEConfig, MoELayer  # noqa: E402
from sim.workloads.routing import ZipfRouting, route  # noqa: E402

def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--d-ff", type=int, default=512)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--backend", default="loop", help="expert backend per rank (sim/workloads/backends/moe.py)")
    p.add_argument("--zipf", type=float, default=1.0, help="routing concentration (Zipf exponent, 0 = uniform)")
    p.add_argument("--placement", default="contiguous", help="contiguous | round_robin | load_aware")
    add_launch_arguments(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    cfg = MoEConfig(tokens=args.tokens, d_model=args.d_model, d_ff=args.d_ff, num_experts=args.experts,
                    top_k=args.top_k, backend=args.backend)  # bad sizes: a ValueError naming the field
    try:
        me = join_group(args.device, timeout_s=args.timeout_s)
    except LaunchError as err:
        sys.exit(f"error: {err}")
    try:
        routing = route(ZipfRouting(args.zipf), tokens=cfg.tokens, num_experts=cfg.num_experts, top_k=cfg.top_k,
                        seed=0)
        plan = plan_expert_parallel(cfg, routing, world_size=me.world_size, placement=args.placement,
                                    expert_load=routing.expert_counts())
        layer = EPMoELayer(cfg, plan, routing, rank=me.rank, seed=0, device=me.device)
        x = torch.randn(cfg.tokens, cfg.d_model, generator=torch.Generator().manual_seed(0))
        lo, hi = (int(b) for b in plan.token_bounds[me.rank: me.rank + 2])
        x_local = x[lo:hi].contiguous().to(me.device)
        with torch.no_grad():
            y_local = layer(x_local)
            step = time_step(lambda: layer(x_local), warmup=2, repeats=args.repeats)
        shards = gathered_shards(y_local, me) if args.check else None
        if shards is not None:  # rank 0
            with torch.no_grad():
                y_ref = MoELayer(cfg, seed=0)(x, routing).numpy()
            err = float(np.abs(np.concatenate(shards) - y_ref).max())
            print(f"output vs the single-device layer: max |diff| = {err:.2e}")
            if err > 1e-4:
                return 1
        if me.rank == 0:
            print(f"EP step on {me.world_size} ranks ({dist.get_backend()}, {args.placement}, zipf {args.zipf}): "
                  f"{step.median_s * 1e3:.3f} ms median over {args.repeats} repeats, IQR {step.iqr_s * 1e3:.3f} ms; "
                  f"rows per rank {plan.rank_rows.tolist()}")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
