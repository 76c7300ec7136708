"""Measure a list of kernel descriptors into a device profile, with progress and resume.

``measure_specs`` is the one loop that turns descriptors into profile rows: it makes
``timing.rounds`` separate passes over the list (so minute-scale drift of a shared
machine is averaged, not baked into some kernels), skips (kernel, round) pairs the profile
already holds (resume, no duplicates), skips shapes too large for the device with a note
in ``skipped.csv`` (never a crash), flushes rows to disk atomically every few seconds
and on interruption (nothing measured is lost), and shows progress.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from costmodel.kernels import KernelSpec
from costmodel.profile import DeviceProfile
from costmodel.runners import make_runner
from costmodel.timing import TimingConfig, measure

FLUSH_EVERY_S = 2.0


@dataclass(frozen=True)
class SizeLimits:
    """Largest kernel the suite will attempt on this device (bigger ones are skipped)."""

    max_flops: float  # one call above this takes too long to repeat
    max_bytes: float  # ideal traffic above this risks running out of memory
    max_call_s: float = float("inf")  # a first call slower than this is skipped (too slow to repeat)


@dataclass
class BenchResult:
    measured: int = 0
    already: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)
    noisy: int = 0
    wall_s: float = 0.0


def measurement_row(spec: KernelSpec, tag: str, summary: dict[str, Any], suite: str, round_: int) -> dict[str, Any]:
    return {
        "key": spec.key(),
        "round": round_,
        **spec.to_record(),
        "tag": tag,
        "flops": spec.flops(),
        "bytes_moved": spec.bytes_moved(),
        **summary,
        "suite": suite,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _too_large(spec: KernelSpec, limits: SizeLimits) -> str | None:
    flops_attr = getattr(spec, "executed_flops", spec.flops)
    if flops_attr() > limits.max_flops:
        return f"{flops_attr():.3g} FLOPs exceeds bench.limits.max_flops={limits.max_flops:.3g}"
    if spec.bytes_moved() > limits.max_bytes:
        return f"{spec.bytes_moved():.3g} bytes exceeds bench.limits.max_bytes={limits.max_bytes:.3g}"
    return None


class _LogProgress(Progress):
    """Progress for logs and CI (no terminal): one plain line every LOG_EVERY_S seconds."""

    LOG_EVERY_S = 10.0

    def __init__(self) -> None:
        super().__init__(disable=True)
        self._last = 0.0

    def advance(self, task_id: Any, advance: float = 1) -> None:
        super().advance(task_id, advance)
        task = self._tasks[task_id]
        now = time.perf_counter()
        if now - self._last >= self.LOG_EVERY_S or task.completed == task.total:
            self._last = now
            eta = task.time_remaining
            print(
                f"{task.description}: {task.completed:.0f}/{task.total:.0f} "
                f"elapsed {task.elapsed or 0:.0f}s eta {eta or 0:.0f}s {task.fields.get('current', '')}",
                flush=True,
            )


def make_progress(show: bool) -> Progress:
    """A live bar on a terminal, periodic plain lines otherwise, nothing if not ``show``."""
    if show and not Console().is_terminal:
        return _LogProgress()
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[current]}"),
        disable=not show, transient=False,
    )


def _too_slow(runner: Any, device: torch.device, limits: SizeLimits) -> str | None:
    """Time one call (also a warm-up); a kernel slower than the limit is not repeated."""
    start = time.perf_counter()
    runner()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    if elapsed > limits.max_call_s:
        return f"one call took {elapsed:.2f} s > bench.limits.max_call_s={limits.max_call_s:g}"
    return None


def measure_specs(
    tagged_specs: Sequence[tuple[str, KernelSpec]],
    profile: DeviceProfile,
    *,
    device: torch.device,
    timing: TimingConfig,
    limits: SizeLimits,
    suite: str,
    remeasure: bool = False,
    show_progress: bool = True,
) -> BenchResult:
    """Measure every (descriptor, round) not yet in ``profile`` and append the rows.

    Rounds are separate passes over the whole list, so each kernel is sampled at
    ``timing.rounds`` moments spread over the run; each round gets 1/rounds of the
    time budget.
    """
    start = time.perf_counter()
    result = BenchResult()
    per_round = timing.per_round()
    done = set() if remeasure else profile.measured_rounds()
    skipped_keys: set[str] = set()
    noisy_keys: set[str] = set()
    todo = [(r, tag, s) for r in range(timing.rounds) for tag, s in tagged_specs if (s.key(), r) not in done]
    result.already = len(tagged_specs) - len({s.key() for _, _, s in todo})
    buffer: list[dict[str, Any]] = []
    last_flush = time.perf_counter()

    def flush() -> None:
        nonlocal last_flush
        if buffer:
            profile.append_measurements(buffer, replace=remeasure)
            buffer.clear()
        if result.skipped:
            profile.record_skipped(result.skipped)
        last_flush = time.perf_counter()

    progress = make_progress(show_progress)
    try:
        with progress:
            task = progress.add_task(f"bench {suite}", total=len(todo), current="")
            for round_, tag, spec in todo:
                key = spec.key()
                progress.update(task, current=f"round {round_ + 1}/{timing.rounds} {spec.label()[:60]}")
                if key in skipped_keys:
                    progress.advance(task)
                    continue
                reason = _too_large(spec, limits)
                if reason is None:
                    try:
                        runner = make_runner(spec, device, cold=timing.cold_cache)
                        reason = _too_slow(runner, device, limits)
                        if reason is None:
                            m = measure(runner, device=device, config=per_round)
                    except (torch.OutOfMemoryError, MemoryError) as err:
                        reason = f"out of memory: {str(err).splitlines()[0][:200]}"
                    finally:
                        runner = None  # free the inputs before the next shape
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                if reason is not None:
                    skipped_keys.add(key)
                    result.skipped.append({"key": key, "family": spec.family, "label": spec.label(), "reason": reason})
                else:
                    buffer.append(measurement_row(spec, tag, m.summary(), suite, round_))
                    result.measured += round_ == 0
                    if m.noisy and key not in noisy_keys:
                        noisy_keys.add(key)
                        result.noisy += 1
                if time.perf_counter() - last_flush > FLUSH_EVERY_S:
                    flush()
                progress.advance(task)
    finally:
        flush()
        result.wall_s = time.perf_counter() - start
    return result
