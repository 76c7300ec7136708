"""Is this profile still true of this machine? Time a few of its kernels now, per family.

A measured cost model is only as good as the freshness of its measurements: the development
VM runs the same kernels 0.6-1.4x their profiled time from one hour to the next, and
memory-bound and compute-bound families drift by different factors (one day: GNN
aggregation 0.61x, GEMMs far less). So the check is per kernel family:

1. ``pick_references``: up to ``per_family`` profiled kernels of every family in scope,
   spread over the family's latency range (quantiles of the profiled median), between
   ``min_s`` (5 us) and ``max_s`` (50 ms), where timing is cheap and clean;
2. ``check_freshness``: time them now, in ``rounds`` interleaved passes, exactly as the
   profile timed them (same runner, same cold-cache mode, the per-round budget), and take
   per family the median of now / profiled;
3. a family whose ratio is outside [1 / (1 + tolerance), 1 + tolerance] is *stale*.

What a caller does with stale families (``sim.predict.calibration.calibrated_model``): re-measure
the kernels it needs of those families, and record a *refresh* in the profile's provenance
(``refresh_entry``): when, why, and per family and latency regime (the decade of a
kernel's time, ``regime_of``) the ratio new / profiled over the kernels it re-measured
(``remeasured_ratios``; the check's own four-kernel ratio only decides whether to
refresh). Rows of a refreshed family measured before the refresh, and not re-measured,
enter later fits scaled by the ratio of their own measuring session (*epoch*, below), else
of their own regime (``refresh_scale``; a regime the refresh re-measured nothing in is
left as it was), so the profile's coverage of shapes is kept while its level follows the
machine; the stored measurements themselves are never rewritten.

Epochs. A profile is written over many sittings (the full suite one day, a calibration the
next, paired rounds of each run), and a shared VM runs each sitting at its own speed: on
the EPYC VM one refresh found the `gnn` calibration rows of one night 2.7x (scatter) to
4.5x (spmm) slower than the machine, while the full-suite rows of the day before were
0.76x (gather) of it; one ratio per family, read off the night's rows, then scaled the
day's gather rows by 0.28x, and those references read 2.72x their scaled time afterwards.
So rows measured with gaps under ``EPOCH_GAP_S`` form one epoch (``measurement_epochs``,
named by the interval of its rows' times); a refresh re-measures, besides the suite's kernels, up to
``ANCHORS_PER_EPOCH`` kernels of every older epoch of a stale family (``epoch_anchors``),
and records per family and epoch the median ratio over at least ``MIN_EPOCH_KERNELS`` of
them (``epoch_scales``): each epoch's rows follow their own drift. That ratio is taken against
the rows *as measured* (``sitting_scale`` in the record) and replaces whatever earlier
refreshes scaled those rows by: chained ratios, each read off other kernels, compounded into
a random walk (one sitting's GEMM rows stood at 3.6x their measured times after a day of
refreshes, beside neighbours measured that hour at 1x). Records of the first form
(``epoch_scale``, a ratio against the rows as scaled so far) still multiply.

The default tolerance (``DEFAULT_TOLERANCE``) is chosen from the measured run-to-run noise
of these per-family ratios on the development VM: see docs/method.md.

A busy machine is not a changed device. While another process used the CPUs, the check read
softmax at 1284x, scatter at 765x and gather at 480x their profiled time, and the refresh
that followed wrote rows 2,203x the old values into the profile; in this session's test run
the check read gemm at 2201x beside histogram at 0.48x. So before any refresh,
``busy_reason`` looks at what else ran during the check (``other_cpu_cores``: CPU time of
other processes, from /proc/stat less this process's own, per second of wall time) and at
the ratios themselves (any family beyond ``BUSY_RATIO`` either way): either one means the
machine is busy, the report says so, naming what it saw, and nothing is refreshed
(``stale_families`` is emptied): rows measured under that load are never recorded.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from costmodel.families.descriptor import from_record
from costmodel.measure.runners import make_runner
from costmodel.measure.timing import TimingConfig, measure

#: policies for ``calibration.refresh``
POLICIES = ("never", "auto", "always")
#: every refresh policy a record may carry: ``profile.kernels(ignore_refresh_policies=...)``
#: with these gives the rows as measured
ALL_REFRESH_POLICIES = POLICIES + ("paired",)
#: a family is stale when now/profiled leaves [1/(1+t), 1+t]; see the module docstring
DEFAULT_TOLERANCE = 0.10
REFRESH_COMMAND = "freshness refresh"
#: a family ratio beyond this either way is a busy machine, not drift: the development VM's
#: own drift stayed within 0.6-1.4x over days and reached 2.4-3.9x on another day's host of
#: the same fingerprint (results/cpu_epyc/moe_v18), while busy spells read 480-2201x
BUSY_RATIO = 10.0
#: other processes using more than this many cores on average during the check: busy
BUSY_OTHER_CORES = 0.5
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
#: rows measured less than this apart (seconds) belong to one measuring session, an epoch
#: (the full suite took 1.6 h of rows seconds apart; separate sittings were hours apart)
EPOCH_GAP_S = 1800
#: kernels of every older epoch of a stale family that a refresh re-measures besides the suite's
ANCHORS_PER_EPOCH = 3
#: re-measured kernels an epoch needs for a ratio of its own (fewer: the regime's ratio applies)
MIN_EPOCH_KERNELS = 2
#: kernels of every sitting of a family that the freshness check times besides the suite's
CHECK_PER_EPOCH = 2


def check_policy(value: Any) -> str:
    """``calibration.refresh`` as one of POLICIES (true/false accepted as always/never)."""
    if value is True:
        return "always"
    if value is False or value is None:
        return "never"
    if isinstance(value, str) and value.lower() in POLICIES:
        return value.lower()
    raise ValueError(f"calibration.refresh must be one of {list(POLICIES)} (or true/false), got {value!r}")


def check_tolerance(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 10:
        raise ValueError(f"calibration.tolerance must be a number in (0, 10) (0.1 = 10% either way), got {value!r}")
    return float(value)


@dataclass
class FreshnessReport:
    """What the check saw and did; ``to_dict`` goes into summary.json ``details.freshness``."""

    policy: str
    tolerance: float
    checked_kernels: int = 0
    family_ratio: dict[str, float] = field(default_factory=dict)  # median now / profiled
    family_iqr: dict[str, float] = field(default_factory=dict)
    family_kernels: dict[str, int] = field(default_factory=dict)
    stale_families: list[str] = field(default_factory=list)
    #: per family and sitting (``measurement_epochs``), the median now / profiled of its references
    sitting_ratio: dict[str, dict[str, float]] = field(default_factory=dict)
    #: per refreshed family, the scale recorded for its older rows: the median of new / profiled
    #: over the kernels the refresh re-measured (not the quick check's ratio)
    refresh_scale: dict[str, float] = field(default_factory=dict)
    refreshed_kernels: int = 0
    refreshed_at: str | None = None
    check_wall_s: float = 0.0
    refresh_wall_s: float = 0.0
    written_on_other_host: bool = False
    note: str = ""
    #: why the check found the machine busy (no refresh was recorded); "" when it was not
    busy: str = ""
    other_cpu_cores: float | None = None  # other processes' CPU use during the check, in cores

    @property
    def refreshed(self) -> bool:
        return self.refreshed_at is not None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "refreshed": self.refreshed}

    def describe(self) -> str:
        if not self.family_ratio:
            return f"profile freshness ({self.policy}): {self.note or 'nothing to check'}"
        ratios = ", ".join(f"{f} {r:.2f}x" for f, r in sorted(self.family_ratio.items()))
        head = (f"profile freshness ({self.policy}, tolerance ±{100 * self.tolerance:.0f}%): {self.checked_kernels} "
                f"reference kernels timed now vs profiled, per family: {ratios}")
        if self.busy:
            head += (f"; [yellow]machine busy ({self.busy}): nothing refreshed, no row recorded under that load; "
                     "rerun on a quiet machine[/]")
        elif self.stale_families:
            head += f"; stale: {', '.join(self.stale_families)}"
        off = [f"{f} {span.partition('/')[0]} {r:.2f}x" for f, by in sorted(self.sitting_ratio.items())
               for span, r in sorted(by.items()) if is_stale(r, self.tolerance)]
        if off:
            head += f"; sittings beyond tolerance: {', '.join(off)}"
        else:
            head += "; every family within tolerance"
        if self.written_on_other_host:
            head += " (profile written on another host of the same fingerprint)"
        return head


def pick_references(kernels: pd.DataFrame, *, keys: Iterable[str] | None = None, per_family: int = 4,
                    min_s: float = 5e-6, max_s: float = 5e-2) -> pd.DataFrame:
    """Up to ``per_family`` rows of ``kernels`` per family (restricted to ``keys`` when
    given), spread over the family's latency range; deterministic."""
    if kernels.empty:
        return kernels
    rows = kernels if keys is None else kernels[kernels["key"].isin(set(keys))]
    rows = rows[rows["median_s"].between(min_s, max_s)]
    picked = []
    for _, g in rows.groupby("family", sort=True):
        g = g.sort_values(["median_s", "key"])
        idx = np.unique(np.linspace(0, len(g) - 1, min(per_family, len(g))).round().astype(int))
        picked.append(g.iloc[idx])
    return pd.concat(picked, ignore_index=True) if picked else rows.iloc[:0]


def time_references(references: pd.DataFrame, *, device: torch.device, timing: TimingConfig,
                    rounds: int = 2) -> np.ndarray:
    """Seconds now per reference row: median over ``rounds`` interleaved passes, each with
    the per-round budget the profile was measured with."""
    runners = [make_runner(from_record(rec), device, cold=timing.cold_cache) for rec in references.to_dict("records")]
    per_round = replace(timing.per_round(), retries=0)
    times = np.empty((rounds, len(runners)))
    for r in range(rounds):
        for i, run in enumerate(runners):
            times[r, i] = measure(run, device=device, config=per_round).median_s
    return np.median(times, axis=0)


def family_ratios(references: pd.DataFrame, now_s: Sequence[float]) -> pd.DataFrame:
    """Per family: median and IQR of now / profiled, and how many kernels."""
    frame = pd.DataFrame({"family": references["family"].to_numpy(),
                          "ratio": np.asarray(now_s) / references["median_s"].to_numpy()})
    g = frame.groupby("family")["ratio"]
    return pd.DataFrame({"ratio": g.median(), "iqr": g.quantile(0.75) - g.quantile(0.25), "kernels": g.size()})


def sitting_ratios(references: pd.DataFrame, now_s: Sequence[float], epochs: pd.Series) -> dict[str, dict[str, float]]:
    """Per family and sitting (``key_epochs``), the median now / profiled over its references,
    for sittings with at least ``MIN_EPOCH_KERNELS`` of them."""
    frame = pd.DataFrame({"family": references["family"].to_numpy(),
                          "epoch": references["key"].map(epochs).fillna("").to_numpy(dtype=object),
                          "ratio": np.asarray(now_s) / references["median_s"].to_numpy()})
    return epoch_scales(frame)


def is_stale(ratio: float, tolerance: float) -> bool:
    return not (1 / (1 + tolerance) <= ratio <= 1 + tolerance)


def check_freshness(kernels: pd.DataFrame, *, device: torch.device, timing: TimingConfig, policy: str = "auto",
                    tolerance: float = DEFAULT_TOLERANCE, keys: Iterable[str] | None = None, per_family: int = 4,
                    rounds: int = 2, last_host: str | None = None, measurements: pd.DataFrame | None = None,
                    exclude: Iterable[str] = ()) -> FreshnessReport:
    """Time up to ``per_family`` profiled kernels per family (of ``keys`` when given) now and
    compare with the profile; ``stale_families`` lists those beyond ``tolerance``.

    With ``measurements`` (the raw rows, for their times), every older sitting of a family in
    scope is checked too: up to ``CHECK_PER_EPOCH`` of its kernels (never one of ``exclude``)
    join the references, and a family is also stale when one sitting's median ratio (over at
    least ``MIN_EPOCH_KERNELS``) is beyond the tolerance (``sitting_ratio``): kernels
    calibrated a minute ago say nothing of rows measured on another day."""
    report = FreshnessReport(policy=check_policy(policy), tolerance=check_tolerance(tolerance))
    report.written_on_other_host = last_host is not None and last_host != socket.gethostname()
    if report.policy == "never":
        report.note = "not checked (calibration.refresh=never)"
        return report
    refs = pick_references(kernels, keys=keys, per_family=per_family)
    if refs.empty:
        report.note = "no profiled kernel of this suite to compare with yet"
        return report
    epochs = key_epochs(measurements) if measurements is not None else pd.Series(dtype=object)
    if not epochs.empty:
        more = epoch_anchors(epochs, kernels, sorted(set(refs["family"])), covered=(), per_epoch=CHECK_PER_EPOCH,
                             exclude=set(exclude) | set(refs["key"]))
        refs = pd.concat([refs, kernels[kernels["key"].isin(set(more))]], ignore_index=True)
    start, cpu_before = time.perf_counter(), cpu_seconds()
    now_s = time_references(refs, device=device, timing=timing, rounds=rounds)
    ratios = family_ratios(refs, now_s)
    if not epochs.empty:
        report.sitting_ratio = sitting_ratios(refs, now_s, epochs)
    report.check_wall_s = time.perf_counter() - start
    report.other_cpu_cores = other_cpu_cores(cpu_before, cpu_seconds(), report.check_wall_s)
    report.checked_kernels = int(len(refs))
    report.family_ratio = {f: float(r) for f, r in ratios["ratio"].items()}
    report.family_iqr = {f: float(r) for f, r in ratios["iqr"].items()}
    report.family_kernels = {f: int(n) for f, n in ratios["kernels"].items()}
    report.stale_families = sorted(f for f, r in report.family_ratio.items()
                                   if report.policy == "always" or is_stale(r, report.tolerance)
                                   or any(is_stale(x, report.tolerance) for x in report.sitting_ratio.get(f, {}).values()))
    report.busy = busy_reason(report.family_ratio, report.other_cpu_cores)
    if report.busy:
        report.stale_families = []  # a busy machine is not a changed device: record nothing
    return report


def cpu_seconds() -> tuple[float, float] | None:
    """(CPU seconds every process used, CPU seconds this process used) so far; None where
    /proc/stat cannot be read (not Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal: busy = all but idle and iowait (proc(5))
    values = [int(v) for v in fields[:8]]
    busy = sum(values) - values[3] - values[4]
    own = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), own.user + own.system


def other_cpu_cores(before: tuple[float, float] | None, after: tuple[float, float] | None,
                    wall_s: float) -> float | None:
    """Cores other processes kept busy on average between two ``cpu_seconds`` readings."""
    if before is None or after is None or wall_s <= 0:
        return None
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, others / wall_s)


def busy_reason(family_ratio: Mapping[str, float], other_cores: float | None) -> str:
    """Why the machine looks busy rather than drifted ("" when it does not): other processes
    above ``BUSY_OTHER_CORES``, or a family ratio beyond ``BUSY_RATIO`` either way."""
    reasons = []
    if other_cores is not None and other_cores > BUSY_OTHER_CORES:
        reasons.append(f"other processes used {other_cores:.2f} cores during the check")
    wild = {f: r for f, r in family_ratio.items() if not 1 / BUSY_RATIO <= r <= BUSY_RATIO}
    if wild:
        reasons.append("ratios beyond " + f"{BUSY_RATIO:g}x: " + ", ".join(f"{f} {r:.3g}x" for f, r in sorted(wild.items())))
    return "; ".join(reasons)


def refresh_entry(report: FreshnessReport, families: Sequence[str], *, reason: str, at: str | None = None,
                  family_scale: Mapping[str, float] | None = None,
                  regime_scale: Mapping[str, Mapping[str, float]] | None = None,
                  epoch_scale: Mapping[str, Mapping[str, float]] | None = None,
                  sitting_scale: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, Any]:
    """The provenance entry of a refresh: rows of ``families`` measured before ``at`` are
    scaled by ``family_scale`` in later fits (default: the check's ratio; 1.0 where no
    reference was timed). ``sim.predict.calibration`` passes the ratio the refresh itself measured
    (``remeasured_ratios``) per family and per latency regime, and the time it started, so
    the rows it wrote are never scaled; with ``regime_scale`` only older rows in a regime
    the refresh re-measured are scaled (``refresh_scale``); with ``sitting_scale`` (ratios
    against the rows as measured), older rows of a sitting the refresh re-measured take their
    sitting's ratio instead, in place of every earlier scale."""
    at = at or time.strftime(TIME_FORMAT)
    report.refreshed_at = at
    scale = dict(family_scale) if family_scale is not None else {f: report.family_ratio.get(f, 1.0) for f in families}
    report.refresh_scale = {f: float(scale.get(f, 1.0)) for f in families}
    refresh = {"at": at, "tolerance": report.tolerance, "policy": report.policy, "family_scale": report.refresh_scale,
               "family_kernels": {f: report.family_kernels.get(f, 0) for f in families}}
    if regime_scale is not None:
        refresh["regime_scale"] = {f: dict(regime_scale.get(f, {})) for f in families}
    if epoch_scale:
        refresh["epoch_scale"] = {f: dict(epoch_scale[f]) for f in families if epoch_scale.get(f)}
    if sitting_scale:
        refresh["sitting_scale"] = {f: dict(sitting_scale[f]) for f in families if sitting_scale.get(f)}
    return {"command": REFRESH_COMMAND, "host": socket.gethostname(), "reason": reason, "refresh": refresh}


def regime_of(seconds: Any) -> np.ndarray:
    """A kernel's latency regime: the decade of its time (floor(log10 s): -5 is 10-100 us).

    Drift is shared within a regime, not within a family: the same `scatter` family held
    64-row MoE combines (tens of us, overhead-bound) and 500k-edge GNN aggregations
    (milliseconds, bandwidth-bound), and one family factor from either run, applied to all
    older scatter rows, rescaled the other's: three `gnn_degree` runs left the profile's MoE
    scatters at 1/6.9 of what `hf_moe` then measured (results/cpu_epyc/hf_moe_x1)."""
    return np.floor(np.log10(np.maximum(np.asarray(seconds, dtype=np.float64), 1e-12))).astype(int)


def measurement_epochs(measured_at: Any) -> np.ndarray:
    """Per row, its epoch: the run of rows measured less than ``EPOCH_GAP_S`` apart that it
    belongs to, as the ISO 8601 interval "first/last" of their times (a range, so a refresh's
    ratio keeps applying to the rows it names after some of them were re-measured and
    replaced); "" for rows without a time."""
    stamps = pd.to_datetime(pd.Series(measured_at, dtype="object").astype("string"), errors="coerce",
                            format=TIME_FORMAT)
    labels = np.full(len(stamps), "", dtype=object)
    known = stamps.notna().to_numpy()
    if not known.any():
        return labels
    order = np.argsort(stamps[known].to_numpy(), kind="stable")
    times = stamps[known].to_numpy()[order]
    starts = np.concatenate([[True], np.diff(times).astype("timedelta64[s]").astype(np.int64) >= EPOCH_GAP_S])
    run = np.cumsum(starts) - 1
    text = pd.DatetimeIndex(times).strftime(TIME_FORMAT).to_numpy(dtype=object)
    first, last = text[starts], text[np.concatenate([starts[1:], [True]])]
    sorted_labels = np.array([f"{a}/{b}" for a, b in zip(first, last)], dtype=object)[run]
    inner = np.empty(len(times), dtype=object)
    inner[order] = sorted_labels
    labels[known] = inner
    return labels


def key_epochs(measurements: pd.DataFrame, *, before: str | None = None) -> pd.Series:
    """Per kernel key, the epoch most of its rows (measured before ``before``) belong to."""
    if measurements.empty or "measured_at" not in measurements:
        return pd.Series(dtype=object)
    frame = measurements.assign(epoch=measurement_epochs(measurements["measured_at"]))
    if before is not None:
        frame = frame[frame["measured_at"].astype(str) < before]
    frame = frame[frame["epoch"] != ""]
    if frame.empty:
        return pd.Series(dtype=object)
    return frame.groupby("key")["epoch"].agg(lambda e: e.value_counts().index[0])


def epoch_anchors(epochs: pd.Series, kernels: pd.DataFrame, families: Iterable[str], *,
                  covered: Iterable[str], exclude: Iterable[str] = (), per_epoch: int = ANCHORS_PER_EPOCH,
                  min_s: float = 5e-6, max_s: float = 5e-2) -> list[str]:
    """Keys to re-measure so that every epoch (``epochs``: key -> epoch, ``key_epochs``) of
    ``families`` has a ratio of its own: per family and epoch with fewer than
    ``MIN_EPOCH_KERNELS`` of ``covered`` (the keys being re-measured anyway), up to
    ``per_epoch`` of its kernels spread over their latency (``pick_references``' rule), never
    one of ``exclude`` (an experiment's own kernels)."""
    wanted, covered, exclude = set(families), set(covered), set(exclude)
    if epochs.empty or kernels.empty:
        return []
    table = kernels[kernels["family"].isin(wanted) & ~kernels["key"].isin(exclude)]
    table = table.assign(epoch=table["key"].map(epochs)).dropna(subset=["epoch"])
    out: list[str] = []
    for (_, _), g in table.groupby(["family", "epoch"], sort=True):
        if g["key"].isin(covered).sum() >= MIN_EPOCH_KERNELS:
            continue
        out += pick_references(g.drop(columns=["epoch"]), per_family=per_epoch, min_s=min_s, max_s=max_s)["key"].tolist()
    return out


def epoch_scales(ratios: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per family and epoch, the median ratio of a ``remeasured_ratios`` table, for epochs
    with at least ``MIN_EPOCH_KERNELS`` re-measured kernels."""
    if ratios.empty or "epoch" not in ratios:
        return {}
    out: dict[str, dict[str, float]] = {}
    for (f, e), g in ratios[ratios["epoch"].astype(str) != ""].groupby(["family", "epoch"])["ratio"]:
        if len(g) >= MIN_EPOCH_KERNELS:
            out.setdefault(str(f), {})[str(e)] = float(g.median())
    return out


def regime_scales(ratios: pd.DataFrame) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(per family, per family and regime) median ratio of a table with ``family``,
    ``regime`` and ``ratio`` columns (regimes as text keys, for JSON)."""
    if ratios.empty:
        return {}, {}
    family = {f: float(g.median()) for f, g in ratios.groupby("family")["ratio"]}
    regime: dict[str, dict[str, float]] = {}
    for (f, r), g in ratios.groupby(["family", "regime"])["ratio"]:
        regime.setdefault(str(f), {})[str(int(r))] = float(g.median())
    return family, regime


def remeasured_ratios(before: pd.DataFrame, measurements: pd.DataFrame, keys: Iterable[str], *,
                      since: str, epochs: pd.Series | None = None) -> pd.DataFrame:
    """Per re-measured kernel of ``keys``: family, regime (of its time in ``before``) and the
    ratio (median of its rows measured at or after ``since``) / (its median in ``before``,
    the kernel table as it was fitted), and its epoch before the refresh (``epochs``, from
    ``key_epochs`` of the measurements before it: a re-measurement replaces the old rows).

    These, not the quick check's ratio, are what a refresh records for older rows: they rest
    on every re-measured kernel and all its rounds. The check times four kernels per family
    for seconds; on the development VM one of its gather ratios read 201x in a transient
    (results/cpu_epyc/moe_x1) and, recorded as the scale, multiplied every older gather row
    by 201 in later fits (the next `gnn_degree` run's profile as loaded: L3 3593% median)."""
    keys = set(keys)
    empty = pd.DataFrame(columns=["family", "regime", "ratio"])
    stamped = measurements["measured_at"].notna() if "measured_at" in measurements else False
    fresh = measurements[stamped & measurements["key"].isin(keys) & (measurements["measured_at"].astype(str) >= since)]
    if fresh.empty or before.empty:
        return empty
    now = fresh.groupby("key")["median_s"].median()
    old = before.set_index("key")["median_s"]
    family = before.set_index("key")["family"]
    common = now.index.intersection(old.index)
    epochs = (key_epochs(measurements, before=since) if epochs is None else epochs).reindex(common).fillna("")
    ratios = pd.DataFrame({"family": family[common], "regime": regime_of(old[common]), "ratio": now[common] / old[common],
                           "epoch": epochs.to_numpy(dtype=object)})
    return ratios[np.isfinite(ratios["ratio"]) & (ratios["ratio"] > 0)]


def refreshes(provenance: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The refresh records of a profile's provenance, oldest first."""
    return [dict(e["refresh"]) for e in provenance if e.get("command") == REFRESH_COMMAND and "refresh" in e]


def refresh_scale(measurements: pd.DataFrame, provenance: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Per measured row: the product of the scales of every refresh of its family recorded
    after the row was measured (1.0 for rows measured since, or never refreshed).

    A refresh with a ``regime_scale`` (every refresh since regimes were introduced) scales an
    older row only by the ratio of its own latency regime (``regime_of`` its time as scaled
    so far) and leaves rows of regimes it re-measured nothing in unscaled; older records
    scale every older row of the family by ``family_scale``. A refresh with an
    ``sitting_scale`` sets the scale of the older rows of each sitting it holds a ratio for
    to that ratio (taken against the rows as measured, so it replaces earlier scales); one
    with an ``epoch_scale`` multiplies them by it; the regime rule applies to the rest."""
    scale = np.ones(len(measurements))
    if not len(measurements):
        return scale
    when = measurements["measured_at"].astype(str).to_numpy() if "measured_at" in measurements else None
    family = measurements["family"].astype(str).to_numpy()
    seconds = measurements["median_s"].to_numpy(dtype=np.float64) if "median_s" in measurements else None
    for rec in refreshes(provenance):
        by_regime = rec.get("regime_scale")
        by_epoch = rec.get("epoch_scale") or {}
        by_sitting = rec.get("sitting_scale") or {}
        for fam, factor in rec.get("family_scale", {}).items():
            hit = family == fam
            if when is not None:
                hit &= when < str(rec["at"])
            for span, ratio in (by_sitting.get(fam) or {}).items() if when is not None else ():
                lo, _, hi = str(span).partition("/")  # against the rows as measured: replaces earlier scales
                mine = hit & (when >= lo) & (when <= (hi or lo))
                scale[mine] = float(ratio)
                hit &= ~mine
            for span, ratio in (by_epoch.get(fam) or {}).items():  # an epoch the refresh re-measured: its own ratio
                lo, _, hi = str(span).partition("/")
                mine = hit & (when >= lo) & (when <= (hi or lo))
                scale[mine] *= float(ratio)
                hit &= ~mine
            if by_regime is not None and seconds is not None:
                regimes = regime_of(seconds[hit] * scale[hit])
                table = by_regime.get(fam, {})
                scale[hit] *= np.array([float(table.get(str(int(r)), 1.0)) for r in regimes])
            else:
                scale[hit] *= float(factor)
    return scale


def last_writer_host(provenance: Sequence[Mapping[str, Any]]) -> str | None:
    """Host of the latest provenance entry that names one (None for older profiles)."""
    for entry in reversed(provenance):
        if entry.get("host"):
            return str(entry["host"])
    return None
