"""Time one step of a multi-rank layer as its slowest rank, inside a running process group.

Every rank calls ``time_step(step)`` together. Per repeat: a barrier (all ranks start
together), ``time.perf_counter`` around ``step()`` on each rank, then an ``all_reduce``
with MAX, so the step's time is the slowest rank's, as a synchronous step is (the
collectives inside the step already make the fast ranks wait; the MAX also counts the
waits at its end). The first ``warmup`` repeats are dropped; the rest are returned as the
project's ``costmodel.measure.timing.Measurement`` (median and IQR, one call per timed block),
the same on every rank. Under NCCL (one GPU per process) the clock stops after
``torch.cuda.synchronize``, as the step's kernels run asynchronously, and the MAX is reduced
on the process's GPU, where NCCL's tensors live. Meant for small steps and few repeats; it does
not retry.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from costmodel.measure.timing import Measurement, TimingConfig

MAX_WARMUP = 100
MAX_REPEATS = 1000
MIN_REPEATS = 3  # a median and an IQR need them (TimingConfig.min_runs)


def collective_device() -> torch.device:
    """Where this process's collectives take their tensors: its current GPU under NCCL, else
    the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def time_step(step: Callable[[], Any], *, warmup: int = 1, repeats: int = 5,
              max_rel_iqr: float = TimingConfig.max_rel_iqr, before: Callable[[], Any] | None = None) -> Measurement:
    """The slowest rank's time of ``step()``, ``repeats`` times after ``warmup`` untimed ones;
    ``before()`` (e.g. a cache eviction) runs untimed on every rank before each barrier."""
    if not isinstance(warmup, int) or isinstance(warmup, bool) or not 0 <= warmup <= MAX_WARMUP:
        raise ValueError(f"warmup must be an integer in [0, {MAX_WARMUP}], got {warmup!r}")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or not MIN_REPEATS <= repeats <= MAX_REPEATS:
        raise ValueError(f"repeats must be an integer in [{MIN_REPEATS}, {MAX_REPEATS}], got {repeats!r}")
    if not dist.is_initialized():
        raise RuntimeError("time_step runs inside a process group (sim.distributed.launch.run_ep)")
    device = collective_device()
    times_s = []
    for i in range(warmup + repeats):
        if before is not None:
            before()
        dist.barrier()
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if i >= warmup:
            times_s.append(float(elapsed.item()))
    q1, median, q3 = np.percentile(times_s, [25, 50, 75])
    world = dist.get_world_size()
    return Measurement(
        times_s=tuple(times_s), number_per_run=1, attempts=1,
        noisy=bool((q3 - q1) / median > max_rel_iqr) if median > 0 else False,
        device=f"{device.type} x{world} ({dist.get_backend()})", threads=torch.get_num_threads(),
        spec={"world_size": world, "backend": dist.get_backend(), "warmup": warmup, "repeats": repeats,
              "statistic": "max over ranks per repeat"},
    )
