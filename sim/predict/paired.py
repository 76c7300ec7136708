"""Kernels timed beside the layers they compose: a check of the simulator that the machine's
drift cannot spoil (``calibration.paired``, on by default in measuring experiments).

A shared machine changes speed over minutes. On the development VM (2 vCPUs) the same
kernels ran 0.75x-1.14x their profiled time from one run to the next, per family, and
within one run the layers' round-to-round CV reached 15-25% in busy spells
(results/cpu_epyc/moe1..3, gnn1..3). A layer timed now and checked against kernels
profiled an hour ago mixes the cost model's error with that drift, and no tolerance of a
freshness check can separate them: drift below the tolerance still moves the headline.

So every distinct kernel of an experiment's traces is timed in the *same* interleaved
rounds as its layers (``experiments.common.measure_interleaved``), exactly as the profile
times kernels (``costmodel.measure.runners.make_runner``, the suite's cold-operand rotation, the
per-round budget). The rows replace the profile's rows of those kernels, as a refresh does
(recorded in provenance with the ratio now/before per family and latency regime, so older
rows of those families in those regimes are scaled in later fits,
``costmodel.measure.freshness.refresh_scale``); the models are
refitted, and the layers are predicted from them. The ceilings' cold-call chain
(``costmodel.measure.ceilings``: what each kind of kernel of a layer timed from evicted caches
pays once beyond its profiled time, ``costmodel.model.cold_start``) is timed in the same rounds,
cold and warm, and stored the same way (``record_cold_chain``): on the development VM it
measured 14 us per op when the profile was made and 9-34 us since.

What this gives is **replay**, not a prediction: the refitted model predicts every kernel
it now holds by that kernel's measurement (``CostModel.predict_table``, the lookup), so the
layers are scored on the sum of their own kernels timed minutes earlier plus the cold-call
chain timed beside them. That is the composition check: how much a layer costs beyond the
kernels it is made of (host dispatch, cold starts, Python between ops). It is reported as
``details.replay``; the headline of every measuring experiment is the held-out score
(``sim.predict.heldout``: models fitted without any of these kernels, ceilings as before the run),
and the profile as loaded is ``details.profile_lookup``. The method is the A/B interleaving
of benchmarking practice (e.g. Georges et al., "Statistically rigorous Java performance
evaluation", OOPSLA 2007: measure alternatives in the same run, randomised over time).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from costmodel.families.descriptor import KernelSpec
from costmodel.measure.bench import measurement_row
from costmodel.measure.freshness import REFRESH_COMMAND, TIME_FORMAT, regime_of, regime_scales
from costmodel.measure.runners import make_runner
from costmodel.measure.timing import Measurement
from costmodel.model.predictor import CostModel
from costmodel.store.profile import DeviceProfile

TAG = "paired"


@dataclass(frozen=True)
class KernelJob:
    """A kernel to time beside the layers: its runner is built just before each round's
    timing and dropped after it (``measure_interleaved`` calls ``build``), so the inputs of
    hundreds of kernels are never alive at once."""

    spec: KernelSpec
    device: torch.device
    cold: bool

    def build(self) -> Callable[[], Any]:
        return make_runner(self.spec, self.device, cold=self.cold)


def distinct_kernels(traces: Iterable[Sequence[KernelSpec]]) -> list[KernelSpec]:
    """Every distinct descriptor of ``traces``, in first-seen order."""
    return list(dict.fromkeys(s for trace in traces for s in trace))


def kernel_jobs(traces: Iterable[Sequence[KernelSpec]], device: torch.device, *, cold: bool) -> list[KernelJob]:
    return [KernelJob(s, device, cold) for s in distinct_kernels(traces)]


def _kernel_job_numbers(traces: Sequence[Sequence[KernelSpec]], first_kernel_job: int) -> dict[KernelSpec, int]:
    """Job index of every distinct kernel of ``traces``, as ``kernel_jobs`` lays them out."""
    return {s: first_kernel_job + j for j, s in enumerate(distinct_kernels(traces))}


def paired_order(traces: Sequence[Sequence[KernelSpec]], first_kernel_job: int) -> list[int]:
    """A timing order that puts each layer next to its own kernels.

    Jobs are the layers (0..n-1), then anything else, then the distinct kernels of
    ``traces`` from index ``first_kernel_job`` in first-seen order (``kernel_jobs``). Each
    layer is followed by the kernels it is the first to use, so a layer and the kernels
    its prediction sums are timed within seconds of each other: the VM's speed phases
    (minutes long, up to 2x here) then move both together instead of biasing their ratio.
    Jobs between the layers and the kernels keep their place at the end."""
    job_of = _kernel_job_numbers(traces, first_kernel_job)
    order: list[int] = []
    for i, trace in enumerate(traces):
        order.append(i)
        order += [job_of.pop(s) for s in trace if s in job_of]  # popped: each kernel once, where first used
    return order + list(range(len(traces), first_kernel_job))


def layer_kernel_jobs(traces: Sequence[Sequence[KernelSpec]], first_kernel_job: int) -> dict[int, list[int]]:
    """Per layer (0..n-1), the job indices of every distinct kernel of its trace, numbered
    as ``paired_order`` numbers them: what a layer is re-timed with in an extra round."""
    job_of = _kernel_job_numbers(traces, first_kernel_job)
    return {i: sorted({job_of[s] for s in trace}) for i, trace in enumerate(traces)}


@dataclass
class PairedResult:
    """What ``record_paired`` wrote and how far the machine was from the profile."""

    kernels: int
    rows: int
    family_ratio: dict[str, float]
    family_kernels: dict[str, int]
    ratio_median: float | None
    ratio_iqr: float | None
    at: str
    wall_s: float = 0.0  # seconds spent inside the kernels' timed calls
    #: labels of kernels whose rounds disagreed beyond ``UNSTABLE_ROUND_SPREAD``: not recorded,
    #: the profile keeps its older rows of them
    unstable: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kernels": self.kernels, "rows": self.rows, "at": self.at,
                "now_over_profile_median": self.ratio_median, "now_over_profile_iqr": self.ratio_iqr,
                "family_ratio": self.family_ratio, "family_kernels": self.family_kernels,
                "kernel_timed_s": self.wall_s, "unstable_kept_profiled": list(self.unstable)}

    def describe(self, suite: str) -> str:
        fams = ", ".join(f"{f} {r:.2f}x" for f, r in sorted(self.family_ratio.items()))
        drift = ("" if self.ratio_median is None else
                 f"; they took {self.ratio_median:.2f}x their profiled time (median, IQR {self.ratio_iqr:.2f}; {fams})")
        unstable = (f"; {len(self.unstable)} whose rounds disagreed more than {UNSTABLE_ROUND_SPREAD:g}x kept their "
                    f"profiled rows ({', '.join(self.unstable[:3])}{', ...' if len(self.unstable) > 3 else ''})"
                    if self.unstable else "")
        return (f"paired calibration: {self.kernels} kernels of {suite} timed in the same rounds as the layers "
                f"({self.wall_s:.0f} s timed){drift}; their rows replace the profile's and the models are "
                f"refitted{unstable}")


#: A kernel whose slowest round took more than this many times its fastest was in two
#: states, not drifting: the VM's speed phases moved kernels by up to 2x between rounds
#: here, while the GB-sized weight gathers of transformers' batched_mm experts took 0.06 s in
#: one round and 1.4 s in the next two (results/cpu_epyc/hf_moe_s1; the layers around them
#: stayed at 0.34 s). Its rows are not recorded; the profile keeps the ones it had.
UNSTABLE_ROUND_SPREAD = 3.0


def record_paired(profile: DeviceProfile, jobs: Sequence[KernelJob], rounds: Sequence[Sequence[Measurement]], *,
                  suite: str, lock_note: Any = None) -> PairedResult:
    """Write every kernel's per-round measurement into ``profile`` (replacing all its older
    rows: a kernel given extra rounds in a noisy spell has more rounds than the next run's),
    with a provenance record of the refresh: per family, the median of now/before over the
    kernels the profile already had (1.0 for a family it had none of)."""
    if len(jobs) != len(rounds):
        raise ValueError(f"{len(jobs)} kernels but {len(rounds)} measurement lists")
    before = profile.kernels()
    profiled = dict(zip(before["key"], before["median_s"])) if len(before) else {}
    # the refresh's time stamps the new rows too: a row is scaled by a refresh only when it
    # was measured before it (``refresh_scale``), and these are the refresh
    at = time.strftime(TIME_FORMAT)
    rows, ratios, unstable = [], [], []
    for job, ms in zip(jobs, rounds):
        old = profiled.get(job.spec.key())
        medians = [m.median_s for m in ms]
        if old and old > 0 and max(medians) > UNSTABLE_ROUND_SPREAD * min(medians):
            unstable.append(job.spec.label())  # two states, not a drift: keep what the profile has
            continue
        rows += [{**measurement_row(job.spec, TAG, m.summary(), suite, r), "measured_at": at} for r, m in enumerate(ms)]
        if old and old > 0:
            ratios.append((job.spec.family, int(regime_of(old)), float(np.median(medians)) / float(old)))
    table = pd.DataFrame(ratios, columns=["family", "regime", "ratio"])
    family_ratio, regime_ratio = regime_scales(table)
    family_kernels = {f: int(n) for f, n in table.groupby("family").size().items()} if len(table) else {}
    families = sorted({j.spec.family for j in jobs})
    # recorded before the rows, as a freshness refresh is: rows of these families measured
    # before ``at`` are scaled by the family's ratio in later fits; the new rows are not
    profile.add_provenance({
        "command": REFRESH_COMMAND, "host": socket.gethostname(),
        "reason": f"paired calibration: {suite}'s kernels timed in the same rounds as its layers",
        "refresh": {"at": at, "policy": "paired", "tolerance": None,
                    "family_scale": {f: family_ratio.get(f, 1.0) for f in families},
                    "regime_scale": {f: regime_ratio.get(f, {}) for f in families},
                    "family_kernels": {f: family_kernels.get(f, 0) for f in families}},
        "measure_lock": lock_note,
    })
    written = profile.append_measurements(rows, replace="key")
    q1, med, q3 = np.percentile(table["ratio"], [25, 50, 75]) if len(table) else (None, None, None)
    return PairedResult(kernels=len(jobs), rows=written, family_ratio=family_ratio, family_kernels=family_kernels,
                        ratio_median=None if med is None else float(med),
                        ratio_iqr=None if med is None else float(q3 - q1), at=at,
                        wall_s=float(sum(sum(m.times_s) * m.number_per_run for ms in rounds for m in ms)),
                        unstable=tuple(unstable))


def record_cold_chain(profile: DeviceProfile, cold: Sequence[Measurement], warm: Sequence[Measurement], *,
                      at: str | None = None) -> dict[str, Any]:
    """Add the cold-call overhead measured from the chain's rounds (``cold``: each call after
    an eviction, ``warm``: back to back) to the profile's ceilings (``with_cold_call_overhead``:
    the stored value becomes the median of the recent measurements), keeping the previous
    value in the evidence; returns ``{"profiled", "now", "stored", "cold_s", "warm_s"}`` (seconds)."""
    from costmodel.measure.ceilings import COLD_CHAIN_OPS, cold_call_overhead_from, with_cold_call_overhead  # noqa: PLC0415

    cold_s, warm_s = [m.median_s for m in cold], [m.median_s for m in warm]
    now = cold_call_overhead_from(cold_s, warm_s)
    stamp = at or time.strftime(TIME_FORMAT)
    before, after = profile.update_ceilings(lambda ceilings: with_cold_call_overhead(ceilings, now, {
        "chain_ops": COLD_CHAIN_OPS, "cold_s": cold_s, "warm_s": warm_s, "paired_at": stamp,
        "before_s": ceilings.get("cold_call_overhead_s")}), "recording the cold-call chain")
    return {"profiled": before.get("cold_call_overhead_s"), "now": now, "stored": after["cold_call_overhead_s"],
            "cold_s": cold_s, "warm_s": warm_s}


def refit(profile: DeviceProfile, *, cv_folds: int = 4, freshness: dict[str, Any] | None = None) -> CostModel:
    """The cost models fitted again on the profile with the paired rows, saved beside it."""
    model = CostModel.fit_profile(profile, cv_folds=cv_folds)
    model.save(profile)
    model.freshness = dict(freshness or {})
    return model
