"""Worker functions for the launcher tests, in a module that imports nothing heavy: a
spawned rank imports the module of its ``fn`` by name, and a test module would pull in
pytest and the whole simulator (seconds per rank)."""

from __future__ import annotations

import time

import torch.distributed as dist


def fail_on_rank_1(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("rank 1 broke on purpose")
    dist.barrier()  # rank 0 waits for a peer that never comes
    return rank


def sleep(rank: int, world_size: int, seconds: float) -> None:
    time.sleep(seconds)
