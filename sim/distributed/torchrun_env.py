"""Join a process group started by an existing launcher (torchrun, ``srun`` + torchrun, the
Hydra submitit launcher calling either), on the CPU with gloo or one GPU per process with NCCL.

The launcher sets torch.distributed's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``; torchrun adds ``LOCAL_RANK``, the process's index on its host). A process on
a GPU takes the GPU of its local rank (``torch.cuda.set_device``) before the group starts, so
NCCL's collectives and the layer's tensors sit on one device per process, the layout
torchrun's documentation prescribes; a CPU process runs one thread, as the project's own
two-process launcher does (``costmodel.collectives.workers``). Every check runs before the
group is joined and names what to change: a missing variable, ``--device cuda`` on a host
without CUDA, more processes on a host than it has GPUs.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping

import numpy as np
import torch
import torch.distributed as dist

ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
DEVICES = ("auto", "cpu", "cuda")


class LaunchError(RuntimeError):
    """The process cannot join the group as asked; the message says what to change."""


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def backend(self) -> str:
        """torch.distributed's backend for this device: NCCL between GPUs, gloo between CPUs."""
        return process_group_backend(self.device)


def process_group_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _int_var(env: Mapping[str, str], name: str, default: str | None = None) -> int:
    raw = env.get(name, default)
    try:
        return int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise LaunchError(f"{name}={raw!r} is not an integer (set by the launcher)") from None


def rank_env(device: str, env: Mapping[str, str] | None = None, *, cuda_devices: int | None = None,
             script: str = "scripts/ep_torchrun.py") -> RankEnv:
    """This process's rank, world size, local rank and device, checked. ``device``: ``auto`` (a
    GPU where CUDA is available, else the CPU), ``cpu`` or ``cuda``; ``cuda_devices`` (the
    host's GPU count) defaults to ``torch.cuda.device_count()``; ``script`` is named in the
    message of a process started without a launcher."""
    env = os.environ if env is None else env
    if device not in DEVICES:
        raise LaunchError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    missing = [k for k in ENV if k not in env]
    if missing:
        raise LaunchError(f"{', '.join(missing)} not set: start this script with torchrun (or srun + torchrun), "
                          f"e.g. torchrun --nproc_per_node=2 {script}")
    rank, world, local = _int_var(env, "RANK"), _int_var(env, "WORLD_SIZE"), _int_var(env, "LOCAL_RANK", "0")
    if world < 1 or not 0 <= rank < world:
        raise LaunchError(f"RANK={rank} must lie in [0, WORLD_SIZE={world})")
    gpus = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    if device == "cuda" and gpus == 0:
        raise LaunchError(f"--device cuda: this host has no CUDA device (torch {torch.__version__}); "
                          "use --device cpu (gloo) or --device auto")
    on_gpu = device == "cuda" or (device == "auto" and gpus > 0)
    if not on_gpu:
        return RankEnv(rank, world, local, torch.device("cpu"))
    if not 0 <= local < gpus:
        raise LaunchError(f"LOCAL_RANK={local} but this host has {gpus} GPU(s): start at most {gpus} processes "
                          "per host (torchrun --nproc_per_node), one per GPU, or use --device cpu")
    return RankEnv(rank, world, local, torch.device("cuda", local))


def join_group(device: str, *, timeout_s: float, script: str = "scripts/ep_torchrun.py") -> RankEnv:
    """Check this process (``rank_env``), take its GPU or one CPU thread, and join the group."""
    if not timeout_s > 0:
        raise LaunchError(f"--timeout-s must be > 0, got {timeout_s!r}")
    me = rank_env(device, script=script)
    if me.device.type == "cuda":
        torch.cuda.set_device(me.device)
    else:
        torch.set_num_threads(1)
    dist.init_process_group(me.backend, timeout=timedelta(seconds=timeout_s))
    return me


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every torchrun script of the project shares: repeats, device, timeout, check."""
    parser.add_argument("--repeats", type=int, default=10, help="timed steps (after 2 untimed)")
    parser.add_argument("--device", default="auto", choices=DEVICES,
                        help="auto: a GPU per process (NCCL) where CUDA is there, else the CPU (gloo)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="collectives time out after this")
    parser.add_argument("--check", action="store_true", help="compare the gathered output with the single-device layer")


def gathered_shards(local: torch.Tensor, me: RankEnv) -> list[np.ndarray] | None:
    """Every rank's ``local`` output, as host arrays, on rank 0 (None on the others)."""
    shards: list[np.ndarray | None] = [None] * me.world_size
    dist.all_gather_object(shards, local.detach().cpu().numpy())
    return [s for s in shards if s is not None] if me.rank == 0 else None


__all__ = ["DEVICES", "ENV", "LaunchError", "RankEnv", "add_launch_arguments", "gathered_shards", "join_group",
           "process_group_backend", "rank_env"]
