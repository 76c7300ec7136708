"""Measure a list of kernel descriptors into a device profile, with progress and resume.

``measure_specs`` is the one loop that turns descriptors into profile rows: it makes
``timing.rounds`` separate passes over the list (so minute-scale drift of a shared
machine is averaged, not baked into some kernels), skips (kernel, round) pairs the profile
already holds (resume, no duplicates), skips shapes too large for the device with a note
in ``skipped.csv`` (never a crash), flushes rows to disk atomically every few seconds
and on interruption (nothing measured is lost; ``MeasureInterrupted`` then says what was
kept and how to resume), and shows progress. Callers hold the machine's measuring lock
(``costmodel.store.locks.measuring``) around it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from costmodel.families.descriptor import KernelSpec
from costmodel.measure.runners import make_runner
from costmodel.measure.timing import TimingConfig, measure
from costmodel.store.profile import DeviceProfile

FLUSH_EVERY_S = 2.0
#: seed of the first round's kernel order (``round_order``); round r uses this + r
ROUND_ORDER_SEED = 0


@dataclass(frozen=True)
class SizeLimits:
    """Largest kernel the suite will attempt on this device (bigger ones are skipped)."""

    max_flops: float  # one call above this takes too long to repeat
    max_bytes: float  # ideal traffic above this risks running out of memory
    max_call_s: float = float("inf")  # a first call slower than this is skipped (too slow to repeat)


@dataclass
class BenchResult:
    measured: int = 0  # kernels that got at least one new round in this run
    rows: int = 0  # (kernel, round) rows this run added to the profile
    already: int = 0  # kernels whose every round was in the profile before this run
    partial: int = 0  # kernels with some but not all rounds in the profile before this run
    skipped: list[dict[str, Any]] = field(default_factory=list)
    noisy: int = 0
    wall_s: float = 0.0


class MeasureInterrupted(KeyboardInterrupt):
    """Ctrl-C during a bench: what was kept and how to resume (the message), rows already flushed."""


def round_coverage(keys: Sequence[str], done: set[tuple[str, int]], rounds: int) -> tuple[int, int]:
    """(kernels with every round in ``done``, kernels with some but not all)."""
    complete = partial = 0
    for key in dict.fromkeys(keys):
        have = sum((key, r) in done for r in range(rounds))
        complete += have == rounds
        partial += 0 < have < rounds
    return complete, partial


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


def round_order(n: int, round_: int) -> list[int]:
    """The order round ``round_`` times ``n`` kernels in: a permutation seeded by the round
    (the same on every run, a different one each round).

    In a fixed order an experiment's kernels were timed first in every round and their
    held-out neighbours after them, and a machine whose speed changes within seconds
    measured the two groups apart: in two moe_ep calibrations on the Intel VM (2026-12-06)
    the neighbours of its expert GEMMs came out at 105 us per weight MB and the GEMMs
    themselves at 138, so the held-out models put the GEMMs at 0.78-0.88x their measured
    time; the same nine GEMMs timed in shuffled rounds right after cost 121-136 us per MB
    alike."""
    return [int(i) for i in np.random.default_rng(ROUND_ORDER_SEED + round_).permutation(n)]


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
    time budget. Each round visits the kernels in its own shuffled order (``round_order``),
    so no group of them (an experiment's own kernels, their neighbours, one family) is
    always timed in the same stretch of a round.
    """
    start = time.perf_counter()
    result = BenchResult()
    per_round = timing.per_round()
    done = set() if remeasure else profile.measured_rounds()
    skipped_keys: set[str] = set()
    noisy_keys: set[str] = set()
    new_keys: set[str] = set()
    keys = [s.key() for _, s in tagged_specs]
    todo = [(r, *tagged_specs[i]) for r in range(timing.rounds) for i in round_order(len(tagged_specs), r)
            if (tagged_specs[i][1].key(), r) not in done]
    result.already, result.partial = round_coverage(keys, done, timing.rounds)
    buffer: list[dict[str, Any]] = []
    last_flush = time.perf_counter()
    flush_cost_s = 0.0
    skipped_saved = 0

    def flush() -> None:
        nonlocal last_flush, flush_cost_s, skipped_saved
        t0 = time.perf_counter()
        if buffer:
            result.rows += profile.append_measurements(buffer, replace=remeasure)
            buffer.clear()
        if len(result.skipped) > skipped_saved:
            profile.record_skipped(result.skipped[skipped_saved:])
            skipped_saved = len(result.skipped)
        last_flush = time.perf_counter()
        flush_cost_s = last_flush - t0

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
                    new_keys.add(key)
                    result.measured = len(new_keys)
                    if m.noisy and key not in noisy_keys:
                        noisy_keys.add(key)
                        result.noisy += 1
                # flush every few seconds, but never spend more than ~5% of the time re-reading
                # and rewriting a large profile
                if time.perf_counter() - last_flush > max(FLUSH_EVERY_S, 20 * flush_cost_s):
                    flush()
                progress.advance(task)
    except KeyboardInterrupt:
        flush()
        result.wall_s = time.perf_counter() - start
        complete, partial = round_coverage(keys, profile.measured_rounds(), timing.rounds)
        raise MeasureInterrupted(
            f"interrupted: this run's {result.rows} measured rows ({result.measured} kernels) are saved in "
            f"{profile.path}; of the {len(set(keys))} kernels asked for, {complete} are complete and {partial} "
            f"partially measured. Rerun the same command to resume: measured rounds are not repeated."
        ) from None
    finally:
        flush()
        result.wall_s = time.perf_counter() - start
    return result
