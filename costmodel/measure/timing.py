"""Timing harness: a callable in, a ``Measurement`` out (never a bare float).

CPU: ``torch.utils.benchmark.Timer``'s block timer, as ``blocked_autorange`` loops over
it, with a cheaper block-size rule: one warm-up call, one timed call as the estimate, then
blocks of ``number`` calls (at least 1 ms each, so timer overhead stays below 0.1%)
repeated until a time budget *and* a minimum count of blocks are reached; thread count
taken from torch.

CUDA: the recipe of Triton's ``triton.testing.do_bench``: estimate from a few runs,
warm up, then time every repeat with its own pair of CUDA events, optionally zeroing a
buffer larger than L2 before each repeat (cold-cache timing), and synchronise once at
the end.

Noise: a measurement whose IQR/median exceeds ``max_rel_iqr`` is retried; if every
attempt is noisy the least noisy one is kept and flagged ``noisy=True`` in the data
(torch.utils.benchmark warns at IQR/median > 0.1, common.py; the default here is
stricter because the cost model's targets are a few percent). Median, IQR and mean are
``torch.utils.benchmark.Measurement``'s (linear-interpolated quantiles, as numpy's).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable

import numpy as np
import torch
import torch.utils.benchmark as benchmark


CPU_MIN_BLOCK_S = 1e-3  # shortest timed block on CPU


@dataclass(frozen=True)
class TimingConfig:
    """How hard to try for a clean number. Every default says what it is for."""

    min_run_time_s: float = 0.2  # CPU: budget per attempt of blocked_autorange
    min_runs: int = 7  # at least this many timed blocks, so median and IQR mean something
    max_rel_iqr: float = 0.05  # IQR/median above this counts as noisy and is retried
    retries: int = 2  # extra attempts for a noisy measurement
    rounds: int = 3  # separate passes over a suite or sweep; a kernel's value is the median of its rounds
    #: interleaved sweeps (``experiments.common.measure_interleaved``): up to this many more
    #: rounds for the layers whose round medians still differ by more than ``max_round_cv``
    #: (CV, ddof=1), each re-timed with the kernels its prediction sums. In busy spells of the
    #: development VM layers' round CV reached 14-24% (results/cpu_epyc/stale_s1: the two worst
    #: points, 24% off, had round CV 17% and 14%); the median of n rounds errs by about
    #: 1.25 CV / sqrt(n) (``costmodel.model.evaluation.measurement_sigma``), so 3 rounds at CV 15%
    #: leave ~11% of noise in the label and 7 rounds ~7%.
    extra_rounds: int = 0
    max_round_cv: float = 0.1

    cuda_warmup_ms: float = 25.0  # do_bench's default warm-up budget
    cuda_rep_ms: float = 100.0  # do_bench's default measuring budget
    cold_cache: bool = True  # CUDA: zero a buffer > L2 before each repeat; CPU: rotating operands (runners)
    cuda_flush_bytes: int = 256 * 1024 * 1024  # larger than any current L2 (H200: 60 MiB)
    #: CPU layers (``measure(..., evict_cpu_cache=True)``): bytes written before every timed
    #: call; twice the development VM's effective LLC (64 MiB already streams from DRAM, see
    #: ``costmodel.measure.runners.ARENA_BYTES``)
    cpu_evict_bytes: int = 128 * 1024 * 1024
    cpu_evict_max_calls: int = 40  # per-call timing with eviction: enough samples for a median
    #: CPU layers timed with eviction: at least this many calls over all rounds (split like
    #: ``min_runs``). The per-expert loop and grouped MoE layers on the EPYC VM vary 15-33%
    #: call to call (relative IQR, results/cpu_epyc/moe_paired3), where padded bmm varies
    #: 2-5%: three calls a round left their round medians 10-19% apart.
    layer_min_calls: int = 15

    def per_round(self) -> "TimingConfig":
        """The budget of one of ``rounds`` passes: the time and the blocks split between
        them (at least 3 blocks a round, so each round has a median and an IQR)."""
        return replace(self, min_run_time_s=self.min_run_time_s / self.rounds,
                       min_runs=max(3, -(-self.min_runs // self.rounds)),
                       layer_min_calls=max(1, -(-self.layer_min_calls // self.rounds)))

    def __post_init__(self) -> None:
        if self.min_run_time_s <= 0:
            raise ValueError(f"timing.min_run_time_s must be > 0, got {self.min_run_time_s}")
        if self.min_runs < 3:
            raise ValueError(f"timing.min_runs must be >= 3 (median/IQR need them), got {self.min_runs}")
        if not 0 < self.max_rel_iqr < 1:
            raise ValueError(f"timing.max_rel_iqr must be in (0, 1), got {self.max_rel_iqr}")
        if self.rounds < 1:
            raise ValueError(f"timing.rounds must be >= 1, got {self.rounds}")
        if self.extra_rounds < 0:
            raise ValueError(f"timing.extra_rounds must be >= 0, got {self.extra_rounds}")
        if not 0 < self.max_round_cv < 1:
            raise ValueError(f"timing.max_round_cv must be in (0, 1), got {self.max_round_cv}")
        if self.layer_min_calls < 1:
            raise ValueError(f"timing.layer_min_calls must be >= 1, got {self.layer_min_calls}")
        if self.retries < 0:
            raise ValueError(f"timing.retries must be >= 0, got {self.retries}")


@dataclass(frozen=True)
class Measurement:
    """Repeated timings of one callable and their robust statistics (seconds)."""

    times_s: tuple[float, ...]  # one entry per timed block: mean seconds per call
    number_per_run: int  # calls per timed block
    attempts: int  # 1 + retries used
    noisy: bool  # IQR/median stayed above the threshold in every attempt
    device: str
    threads: int
    spec: dict[str, Any] | None = field(default=None, compare=False)

    @cached_property
    def _stats(self) -> benchmark.Measurement:
        """torch.utils.benchmark's statistics of the per-call times (median, quartiles, mean)."""
        return benchmark.Measurement(number_per_run=1, raw_times=list(self.times_s),
                                     task_spec=benchmark.utils.common.TaskSpec("fn()", "", num_threads=self.threads))

    @property
    def median_s(self) -> float:
        return self._stats.median

    @property
    def iqr_s(self) -> float:
        return self._stats.iqr

    @property
    def mean_s(self) -> float:
        return self._stats.mean

    @property
    def std_s(self) -> float:
        return float(np.std(self.times_s, ddof=1)) if len(self.times_s) > 1 else 0.0

    @property
    def rel_iqr(self) -> float:
        return self.iqr_s / self.median_s

    @property
    def cv(self) -> float:
        """Coefficient of variation (std / mean) of the per-block times."""
        return self.std_s / self.mean_s

    def summary(self) -> dict[str, Any]:
        """Flat row for tidy tables."""
        return {
            "median_s": self.median_s,
            "iqr_s": self.iqr_s,
            "mean_s": self.mean_s,
            "cv": self.cv,
            "rel_iqr": self.rel_iqr,
            "runs": len(self.times_s),
            "number_per_run": self.number_per_run,
            "attempts": self.attempts,
            "noisy": self.noisy,
            "threads": self.threads,
        }

    def __str__(self) -> str:
        flag = " NOISY" if self.noisy else ""
        return (
            f"{self.median_s * 1e6:,.1f} us (IQR {self.iqr_s * 1e6:,.1f} us, "
            f"{len(self.times_s)} runs x {self.number_per_run}){flag}"
        )


def _time_cpu(fn: Callable[[], Any], cfg: TimingConfig) -> tuple[list[float], int]:
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    # Timer._timeit(number) is the raw block timer blocked_autorange itself loops over; the
    # public Timer.timeit adds a warm-up of its own before every block, tripling the cost
    # of slow kernels, so it is only the fallback.
    block = getattr(timer, "_timeit", None) or (lambda number: timer.timeit(number).raw_times[0])
    with benchmark.utils.common.set_torch_threads(torch.get_num_threads()):
        block(1)  # warm-up: first-call costs (allocation, lazy init) stay out of the data
        estimate = max(block(1), 1e-7)
        # blocks long enough that timer overhead (~1 us) is < 0.1%, short enough for many blocks
        block_s = max(CPU_MIN_BLOCK_S, cfg.min_run_time_s / (4 * cfg.min_runs))
        number = max(1, int(block_s / estimate))
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < cfg.min_runs or time.perf_counter() - start < cfg.min_run_time_s:
            times.append(block(number) / number)  # per-call mean of one block
    return times, number


_EVICT_BUFFERS: dict[tuple[str, int], torch.Tensor] = {}


def evict_caches(device: torch.device, cfg: TimingConfig) -> None:
    """Write a buffer larger than the device's last-level cache (CPU: ``cpu_evict_bytes``,
    CUDA: ``cuda_flush_bytes``), so that the next call finds its data in memory only."""
    nbytes = cfg.cuda_flush_bytes if device.type == "cuda" else cfg.cpu_evict_bytes
    key = (str(device), nbytes)
    if key not in _EVICT_BUFFERS:
        _EVICT_BUFFERS[key] = torch.empty(nbytes // 4, dtype=torch.int32, device=device)
    _EVICT_BUFFERS[key].zero_()


def _time_cpu_evicting(fn: Callable[[], Any], cfg: TimingConfig) -> tuple[list[float], int]:
    """One call per sample, each after writing ``cpu_evict_bytes`` (untimed), so every call
    starts with cold caches, as a layer inside a model whose weights are evicted between its
    calls does; the CPU counterpart of the L2 flush before every CUDA repeat."""
    fn()  # warm-up: first-call costs stay out of the data
    times: list[float] = []
    timed = 0.0
    need = max(cfg.min_runs, min(cfg.layer_min_calls, cfg.cpu_evict_max_calls))
    while len(times) < need or (timed < cfg.min_run_time_s and len(times) < cfg.cpu_evict_max_calls):
        evict_caches(torch.device("cpu"), cfg)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        timed += times[-1]
    return times, 1


def _time_cuda(fn: Callable[[], Any], cfg: TimingConfig, device: torch.device,
               sync_each: bool = False) -> tuple[list[float], int]:
    """CUDA-event timing in the manner of triton's ``do_bench``. ``sync_each`` (whole layers):
    wait for the device to drain before every timed call, so each call starts from an idle queue
    and its events hold all of its host dispatch. Without it a host-bound layer queues part of
    its launches while the L2 flush before it still runs, and how much of its dispatch the events
    miss varies with the flush (the first lease: 12 of 30 moe_skew points varied >10% between
    rounds). Kernels keep the back-to-back form: a sync before each would add launch latency to
    microsecond kernels."""
    fn()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        if cfg.cold_cache:
            evict_caches(device, cfg)
        fn()
    end.record()
    torch.cuda.synchronize(device)
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)
    n_warmup = max(1, int(cfg.cuda_warmup_ms / estimate_ms))
    n_repeat = max(cfg.min_runs * 3, int(cfg.cuda_rep_ms / estimate_ms))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    for _ in range(n_warmup):
        fn()
    for s, e in zip(starts, ends):
        if cfg.cold_cache:
            evict_caches(device, cfg)
        if sync_each:
            torch.cuda.synchronize(device)
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)], 1


def measure(
    fn: Callable[[], Any],
    *,
    device: torch.device | str = "cpu",
    config: TimingConfig | None = None,
    spec: dict[str, Any] | None = None,
    evict_cpu_cache: bool = False,
) -> Measurement:
    """Time ``fn`` on ``device``; retry while noisy; return the least noisy attempt.

    ``evict_cpu_cache`` (for whole layers): on the CPU, evict the caches before every timed call
    instead of timing blocks of back-to-back calls; on CUDA, drain the queue before every timed
    call (``_time_cuda(sync_each=True)``). Kernel runners stay on blocks: they get
    cold operands by rotation, which keeps microsecond kernels cheap to time."""
    cfg = config or TimingConfig()
    device = torch.device(device)
    best: Measurement | None = None
    attempts = 0
    for attempts in range(1, cfg.retries + 2):
        if device.type == "cuda":
            times, number = _time_cuda(fn, cfg, device, sync_each=evict_cpu_cache)
        elif evict_cpu_cache:
            times, number = _time_cpu_evicting(fn, cfg)
        else:
            times, number = _time_cpu(fn, cfg)
        m = Measurement(times_s=tuple(float(t) for t in times), number_per_run=number, attempts=attempts,
                        noisy=False, device=str(device), threads=torch.get_num_threads(), spec=spec)
        if best is None or m.rel_iqr < best.rel_iqr:
            best = m
        if m.rel_iqr <= cfg.max_rel_iqr:
            break
    assert best is not None
    return replace(best, attempts=attempts, noisy=bool(best.rel_iqr > cfg.max_rel_iqr))
