"""Measure a collectives suite on W gloo processes of this host and append it to the profile.

``bench_collectives(world_size, suite_path, profile_root)`` checks everything it can before
a process starts (world size against the cores this process may use, the port, the suite),
launches the ranks with ``costmodel.collectives.workers.run_workers`` (one thread each,
pinned one core per rank), lets each rank time every collective of the suite
(``costmodel.collectives.rank``), combines the ranks' times and appends one row per
(collective, rank) to the collective profile (``costmodel.collectives.store``).

Statistics per collective and timing protocol (``warm``, and ``step`` where the suite has a
step section: ``costmodel.collectives.rank``): per rank, the median, mean and IQR of its
per-repeat seconds; across ranks, the max over ranks of each repeat (the step-relevant time:
a synchronous step waits for its slowest rank), its median, mean and IQR. A rank whose IQR/median exceeds ``MAX_REL_IQR``
(0.1, torch.utils.benchmark's warning threshold) has its row marked ``noisy``; nothing is
retried, the flag says so instead of hiding it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from costmodel.collectives import rank as rank_module
from costmodel.collectives.spec import CollectiveSpec, CollectiveSpecError, check_world_size
from costmodel.collectives.store import CollectiveProfile, placement_name
from costmodel.collectives.suite import CollectiveSuite, load_suite, to_item
from costmodel.collectives.workers import place_ranks, run_workers
from costmodel.measure.device import fingerprint

log = logging.getLogger(__name__)

DEFAULT_SUITE = Path(__file__).resolve().parents[2] / "conf" / "suite" / "collectives.yaml"
MAX_REL_IQR = 0.1  # torch.utils.benchmark's warning threshold (common.py)


@dataclass(frozen=True)
class BenchResult:
    path: Path  # the collective profile folder
    rows_added: int
    rows_total: int
    wall_s: float
    placement: str
    note: str  # how the ranks were placed
    run_id: str


def combine(spec: CollectiveSpec, times_by_rank: list[np.ndarray], *, run_id: str, suite: str, warmup: int,
            measured_at: str, protocol: str = "warm") -> list[dict[str, Any]]:
    """One row per rank: the rank's statistics and the max-over-ranks statistics."""
    repeats = min(len(t) for t in times_by_rank)
    stacked = np.stack([t[:repeats] for t in times_by_rank])  # [W, repeats]
    worst = stacked.max(axis=0)
    wq1, wmed, wq3 = np.percentile(worst, [25, 50, 75])
    b = spec.per_rank_bytes()
    send_matrix = json.dumps([[int(x) for x in row] for row in spec.send_bytes]) if spec.send_bytes else ""
    rows = []
    for r in range(spec.world_size):
        q1, med, q3 = np.percentile(stacked[r], [25, 50, 75])
        rows.append({
            "run_id": run_id, "measured_at": measured_at, "suite": suite, "key": spec.key(), "op": spec.op,
            "pattern": spec.pattern, "protocol": protocol, "world_size": spec.world_size, "backend": spec.backend,
            "dtype": spec.dtype,
            "rank": r, "nominal_bytes": spec.nominal_bytes, "message_bytes": spec.message_bytes,
            "send_matrix": send_matrix, "bytes_sent": float(b["sent"][r]), "bytes_recv": float(b["recv"][r]),
            "bytes_moved": float(b["moved"][r]), "bytes_home": float(b["home"][r]),
            "max_rank_bytes_moved": float(b["moved"].max()), "warmup": warmup, "repeats": repeats,
            "median_s": float(med), "mean_s": float(stacked[r].mean()), "iqr_s": float(q3 - q1),
            "min_s": float(stacked[r].min()),
            "rel_iqr": float((q3 - q1) / med) if med > 0 else 0.0, "noisy": bool((q3 - q1) / med > MAX_REL_IQR),
            "max_over_ranks_median_s": float(wmed), "max_over_ranks_mean_s": float(worst.mean()),
            "max_over_ranks_iqr_s": float(wq3 - wq1),
        })
    return rows


def bench_collectives(world_size: int, suite_path: str | Path | dict = DEFAULT_SUITE,
                      profile_root: str | Path = "profiles", *, backend: str = "gloo",
                      allow_oversubscribe: bool = False, port: int | None = None, timeout_s: float | None = None,
                      progress: bool = True, measure_lock: bool = True,
                      rank_fn: Callable[..., Any] | None = None, keep_awake: bool = True) -> BenchResult:
    """Measure every collective of the suite on ``world_size`` ranks; append to the profile.

    ``keep_awake`` (default): the ranks' cores kept from idling while they wait in a collective
    (``costmodel.collectives.awake``), as the expert-parallel and partitioned layers are measured;
    the profile's placement says so (``cores0-1-awake``).

    Errors before any process starts: ``world_size`` beyond the cores this process may use
    (unless ``allow_oversubscribe``: then unpinned), a ``port`` in use, a bad suite. A rank
    that dies or hangs stops every rank (``EPWorkerError``/``EPTimeoutError`` with the reason).
    """
    w = check_world_size(world_size)
    if w < 2:
        raise CollectiveSpecError(f"world_size must be >= 2 for a collective benchmark, got {world_size!r}")
    if backend != "gloo":
        raise CollectiveSpecError(f"backend must be 'gloo' for the host benchmark (one process per core), "
                                  f"got {backend!r}")
    placement_policy = "auto" if allow_oversubscribe else "require"
    cores, note = place_ranks(w, placement_policy)
    suite: CollectiveSuite = load_suite(suite_path, w, backend=backend)
    device = fingerprint(torch.device("cpu"), suite.specs[0].dtype)
    profile = CollectiveProfile.open(profile_root, device, backend=backend, world_size=w,
                                     placement=placement_name(cores, keep_awake))
    items = [to_item(s) for s in suite.specs]
    run_id = uuid.uuid4().hex[:12]
    measured_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    fn = rank_fn or rank_module.measure_items
    log.info("bench_collectives: %d collectives on world_size=%d (%s) into %s", len(items), w, note, profile.path)
    if progress:
        print(f"collectives: {len(items)} calls, world_size={w}, {note}, into {profile.path}", flush=True)
    start = time.monotonic()
    if measure_lock:
        from costmodel.store.locks import measuring
        ctx = measuring(f"collectives bench world_size={w}")
    else:
        from contextlib import nullcontext
        ctx = nullcontext()
    with ctx:
        run = run_workers(w, fn, (items, suite.timing, progress, suite.step), timeout_s=timeout_s or suite.timeout_s,
                          backend=backend, port=port, placement=placement_policy, keep_awake=keep_awake)
    wall = time.monotonic() - start
    rows: list[dict[str, Any]] = []
    for i, spec in enumerate(suite.specs):
        per_rank = [run.results[r][i] for r in range(w)]
        protocols = {"warm": per_rank} if suite.step is None else {"warm": [p[0] for p in per_rank],
                                                                  "step": [p[1] for p in per_rank]}
        for protocol, times in protocols.items():
            rows += combine(spec, times, run_id=run_id, suite=suite.name, warmup=int(suite.timing["warmup"]),
                            measured_at=measured_at, protocol=protocol)
    total = profile.append(rows)
    if progress:
        print(f"collectives: {len(rows)} rows added ({total} in all) in {wall:.1f} s -> "
              f"{profile.path / 'measurements.csv'}", flush=True)
    return BenchResult(path=profile.path, rows_added=len(rows), rows_total=total, wall_s=wall,
                       placement=placement_name(cores, keep_awake), note=run.note, run_id=run_id)
