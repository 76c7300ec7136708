"""Measure a list of kernel descriptors into a device profile, with progress and resume.

``measure_specs`` is the one loop that turns descriptors into profile rows: it skips
what the profile already holds (resume, no duplicates), skips shapes too large for the
device with a note in ``skipped.csv`` (never a crash), flushes rows to disk atomically
every few seconds and on interruption (nothing measured is lost), and shows a progress
bar.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
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


@dataclass
class BenchResult:
    measured: int = 0
    already: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)
    noisy: int = 0
    wall_s: float = 0.0


def measurement_row(spec: KernelSpec, tag: str, summary: dict[str, Any], suite: str) -> dict[str, Any]:
    return {
        "key": spec.key(),
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


def measure_specs(
    tagged_specs: Sequence[tuple[str, KernelSpec]],
    profile: DeviceProfile,
    *,
    device: torch.device,
    timing: TimingConfig,
    limits: SizeLimits,
    suite: str,
    pool_bytes: int = 0,
    remeasure: bool = False,
    show_progress: bool = True,
) -> BenchResult:
    """Measure every descriptor not yet in ``profile`` and append the rows."""
    start = time.perf_counter()
    result = BenchResult()
    done = set() if remeasure else profile.measured_keys()
    todo = [(tag, s) for tag, s in tagged_specs if s.key() not in done]
    result.already = len(tagged_specs) - len(todo)
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

    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[current]}"),
        disable=not show_progress, transient=False,
    )
    try:
        with progress:
            task = progress.add_task(f"bench {suite}", total=len(todo), current="")
            for tag, spec in todo:
                progress.update(task, current=spec.label()[:60])
                reason = _too_large(spec, limits)
                if reason is None:
                    try:
                        runner = make_runner(spec, device, pool_bytes=pool_bytes)
                        m = measure(runner, device=device, config=timing)
                    except (torch.OutOfMemoryError, MemoryError) as err:
                        reason = f"out of memory: {str(err).splitlines()[0][:200]}"
                    finally:
                        runner = None  # free the inputs before the next shape
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                if reason is not None:
                    result.skipped.append({"key": spec.key(), "family": spec.family, "label": spec.label(), "reason": reason})
                else:
                    buffer.append(measurement_row(spec, tag, m.summary(), suite))
                    result.measured += 1
                    result.noisy += int(m.noisy)
                if time.perf_counter() - last_flush > FLUSH_EVERY_S:
                    flush()
                progress.advance(task)
    finally:
        flush()
        result.wall_s = time.perf_counter() - start
    return result
