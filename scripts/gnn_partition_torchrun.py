"""The partitioned GNN layer under an existing launcher: torchrun, Slurm (srun / the Hydra
submitit launcher) or any tool that sets torch.distributed's environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; LOCAL_RANK for the GPU).

    torchrun --nproc_per_node=2 scripts/gnn_partition_torchrun.py --partitioner metis --rmat-a 0.7
    torchrun --nproc_per_node=8 scripts/gnn_partition_torchrun.py --device cuda --nodes 1048576 --edges 16777216
    srun -N 2 --ntasks-per-node=1 torchrun --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d \\
        --rdzv_endpoint=$HEAD:29500 scripts/gnn_partition_torchrun.py --partitioner metis

Every rank draws the same seeded R-MAT graph (``sim.workloads.graphs.rmat``; ``--rmat-a`` is
the degree skew that ``experiment=gnn_degree`` sweeps), builds the same partition
(``sim.distributed.graph_partition``: random or METIS) and runs its part of
``PartitionedGNNLayer`` (send gather, halo ``all_to_all_single`` with uneven splits, the
project's single-device layer on its local graph); rank 0 prints the slowest rank's step
(median and IQR over repeats, ``sim.distributed.step_timing``) with the edge cut and, with
``--check``, that the gathered output equals the single-device ``GNNLayer``. gloo between CPU
processes (one thread each), NCCL between GPUs (one per process: ``sim.distributed.torchrun_env``).
The NCCL path is written, not yet run on a GPU here. ``experiment=gnn_partition`` runs the same
layer through the project's own two-process launcher and predicts it; this script is the way
onto many hosts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from sim.distributed.gnn_partition_layer import PartitionedGNNLayer  # noqa: E402
from sim.distributed.graph_partition import plan_graph_partition  # noqa: E402
from sim.distributed.step_timing import time_step  # noqa: E402
from sim.distributed.torchrun_env import LaunchError, add_launch_arguments, gathered_shards, join_group  # noqa: E402
from sim.workloads.gnn_layer import GNNConfig, GNNLayer  # noqa: E402
from sim.workloads.graphs import rmat  # noqa: E402

SCRIPT = "scripts/gnn_partition_torchrun.py"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4096)
    p.add_argument("--edges", type=int, default=32768)
    p.add_argument("--rmat-a", type=float, default=0.57, help="R-MAT's a, the degree skew (0.25 = uniform)")
    p.add_argument("--in-features", type=int, default=64)
    p.add_argument("--out-features", type=int, default=64)
    p.add_argument("--kind", default="gcn", help="gcn | sage")
    p.add_argument("--aggregation", default="sum", help="sum | mean | max")
    p.add_argument("--backend", default="index_add", help="aggregation backend (sim/workloads/backends/gnn.py)")
    p.add_argument("--partitioner", default="random", help="random | metis")
    add_launch_arguments(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # bad sizes, kinds and partitioners: a ValueError naming the field, before any process group
    cfg = GNNConfig(num_nodes=args.nodes, in_features=args.in_features, out_features=args.out_features,
                    kind=args.kind, aggregation=args.aggregation, backend=args.backend)
    graph = rmat(args.nodes, args.edges, a=args.rmat_a, b=None, c=None, d=None, seed=0)
    try:
        me = join_group(args.device, timeout_s=args.timeout_s, script=SCRIPT)
    except LaunchError as err:
        sys.exit(f"error: {err}")
    try:
        plan = plan_graph_partition(graph, cfg.num_nodes, world_size=me.world_size, partitioner=args.partitioner,
                                    feature_width=cfg.in_features, dtype=cfg.dtype, seed=0)
        layer = PartitionedGNNLayer(cfg, plan, graph, rank=me.rank, seed=0, device=me.device)
        x = torch.randn(cfg.num_nodes, cfg.in_features, generator=torch.Generator().manual_seed(0))
        own = torch.from_numpy(plan.own_nodes[me.rank])
        buf = layer.input_buffer(x[own])
        y_local = layer(buf)
        step = time_step(lambda: layer(buf), warmup=2, repeats=args.repeats)
        shards = gathered_shards(y_local, me) if args.check else None
        if shards is not None:  # rank 0
            single = GNNLayer(cfg, seed=0)
            single.set_graph(graph)
            with torch.no_grad():
                y_ref = single(x).numpy()
            y = np.zeros_like(y_ref)
            for r, shard in enumerate(shards):
                y[plan.own_nodes[r]] = shard
            err = float(np.abs(y - y_ref).max())
            print(f"output vs the single-device layer: max |diff| = {err:.2e}")
            if err > 1e-4 * max(1.0, float(np.abs(y_ref).max())):
                return 1
        if me.rank == 0:
            print(f"partitioned GNN step on {me.world_size} ranks ({dist.get_backend()}, {args.partitioner}, "
                  f"rmat a {args.rmat_a}): {step.median_s * 1e3:.3f} ms median over {args.repeats} repeats, "
                  f"IQR {step.iqr_s * 1e3:.3f} ms; edge cut {plan.edge_cut}, halo rows received per rank "
                  f"{plan.halo_send_rows.sum(axis=0).tolist()}")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
