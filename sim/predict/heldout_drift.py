"""Drift of a held-out prediction, read off kernels the experiment does not run.

A shared VM changes speed by phases of minutes (up to 2-3x here, and not by the same factor
for every family: memory-bound kernels slow down more than compute-bound ones when a
neighbour streams memory). A model fitted on yesterday's rows cannot know today's phase; the
experiment's own kernels would tell it, but a held-out score must not look at them.

So a held-out run also times *reference kernels*, up to ``REFERENCES_PER_FAMILY`` per family,
in the same rounds as its layers:
profiled kernels of the families that carry the layers' predicted time, chosen near the
family's heaviest kernel of the traces (in octaves of every size field, bytes moved and
FLOPs) but never within a factor ``MIN_DISTANCE_LOG2`` (octaves: sqrt(2)) of any kernel of
the traces in both bytes moved and FLOPs. Per family, the median of measured now / the
held-out regression's own prediction of that reference (``model_s``: the fitted surface, not
the reference's single profiled row) is the family's drift: how much slower or faster the
machine runs that family now than the models, fitted on many sittings, expect near the
layers' kernels; the held-out L3 of every trace kernel of that family is multiplied by it
(families without a reference get the median over all references). The experiment's own
kernels are never timed for this, looked up or fitted on.

The ratio against each reference's profiled row (``profiled_s``) is kept beside it
(``vs_profiled_row``) for comparison: it was the first rule, and it read the noise of the
phase each row was measured in as much as the machine's drift (``moe_skew``, EPYC VM: L3 median
10.9% scaled vs 11.0% unscaled, and 27.9% vs 8.3% in another run; once the experiment's own
kernels ran at 0.96x their profiled time while the references ran at 1.30-1.44x theirs).

This is a **side score** (``details.heldout_drift_scaled``), not the headline. Scored on the 29
committed runs with this rule and 3 references per family (``scripts/drift_rule_history.py``,
docs/method.md), it beat the uncorrected headline in 9: the large switches (0.82x), not the
typical run. Runs since time 16 (``REFERENCES_PER_FAMILY``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from costmodel.families.descriptor import KernelSpec
#: references per family. A reference's ratio to the fitted surface carries its own kernel's
#: residual (10-18% between sittings on these VMs) besides the phase, so a median of few reads
#: mostly that residual. Asked of the EPYC profiles' own sittings (``scripts/bench_sitting_holdout.py
#: PROFILE --last 6 --references 1,3,8,16``, 2026-12-07; references picked as here, nearest to a
#: drawn kernel outside its near twins, which are scored): on two threads 3 references took the
#: scored kernels' median APE from 10.4 to 12.2% and 16 from 11.1 to 11.5%; on one thread, where
#: the machine had drifted, 10.0 to 8.3% and 8.2%. Drawn at random instead, 16 cut the one-thread
#: bias from 8.2 to 2.6% where 3 left 5.1%. So 16, never worse than the first rule's 3
#: (docs/method.md, "How many references read a sitting's phase?").
REFERENCES_PER_FAMILY = 16
#: families carrying less than this share of the traces' predicted L3 time get no references
#: of their own (they take the median over every reference)
MIN_FAMILY_SHARE = 0.02
#: a reference differs from every kernel of the traces by at least this many octaves in bytes
#: moved or in FLOPs (0.5: a factor sqrt(2)), so no reference is a near-twin of a scored kernel
MIN_DISTANCE_LOG2 = 0.5
#: references are kernels whose profiled time lies here (seconds): long enough to time
#: cleanly in one call, short enough to add little to a round
REFERENCE_TIME_RANGE_S = (5e-5, 5e-2)


@dataclass(frozen=True)
class HeldOutReference:
    """A profiled kernel, not one of the experiment's, re-timed beside its layers."""

    key: str
    family: str
    spec: KernelSpec
    profiled_s: float  # the profile's time of it, as the held-out models were fitted on
    run: Callable[[], Any] | None = None
    model_s: float | None = None  # the held-out regression's L3 of it (no lookup); None: profiled_s


@dataclass
class FamilyDrift:
    """Per family, measured now / profiled over its references; ``overall`` for the rest."""

    by_family: dict[str, float] = field(default_factory=dict)
    overall: float = 1.0
    references: int = 0
    #: the same medians against each reference's profiled row (the first rule), for comparison
    vs_profiled_row: dict[str, float] = field(default_factory=dict)
    #: per reference: key, family, seconds measured now, the held-out model's and the profiled row's
    #: (what a better drift rule, e.g. one that weighs the references' spread, can be scored on later)
    per_reference: list[dict[str, Any]] = field(default_factory=list)

    def factor(self, family: str) -> float:
        return self.by_family.get(family, self.overall)

    def to_dict(self) -> dict[str, Any]:
        return {"by_family": {f: round(r, 4) for f, r in sorted(self.by_family.items())},
                "overall": round(self.overall, 4), "references": self.references,
                "vs_profiled_row": {f: round(r, 4) for f, r in sorted(self.vs_profiled_row.items())},
                "per_reference": self.per_reference,
                "rule": (f"per family, median of measured now / the held-out regression's L3 of the reference over "
                         f"up to {REFERENCES_PER_FAMILY} reference kernels timed in the same rounds, none within "
                         f"{2 ** MIN_DISTANCE_LOG2:.2f}x of a scored kernel in both bytes and FLOPs; other families "
                         "take the overall median (vs_profiled_row: the same against each reference's profiled row)")}

    def describe(self) -> str:
        if not self.references:
            return "held-out drift: no reference kernels, predictions not corrected"
        parts = ", ".join(f"{f} {r:.2f}x" for f, r in sorted(self.by_family.items()))
        rows = ", ".join(f"{f} {r:.2f}x" for f, r in sorted(self.vs_profiled_row.items()))
        return (f"held-out drift from {self.references} reference kernels (none of this run's), measured now / "
                f"held-out model: {parts}; other families {self.overall:.2f}x (against their profiled rows: {rows})")


def _log2(values: Any) -> np.ndarray:
    return np.log2(np.maximum(np.asarray(values, dtype=np.float64), 1.0))


def _size_fields(spec: KernelSpec) -> list[str]:
    """The integer size fields of a descriptor (m, k, n; rows, cols; num_rows, width ...)."""
    return [f.name for f in dataclasses.fields(spec)
            if isinstance(getattr(spec, f.name), int) and not isinstance(getattr(spec, f.name), bool)]


def family_shares(traces: Sequence[Sequence[KernelSpec]], predicted_s: Mapping[str, float]) -> dict[str, float]:
    """Share of the traces' summed predicted time per family (``predicted_s`` by kernel key)."""
    total: dict[str, float] = {}
    for trace in traces:
        for s in trace:
            total[s.family] = total.get(s.family, 0.0) + float(predicted_s[s.key()])
    whole = sum(total.values()) or 1.0
    return {f: t / whole for f, t in total.items()}


def choose_references(table: pd.DataFrame, traces: Sequence[Sequence[KernelSpec]],
                      predicted_s: Mapping[str, float], *, per_family: int = REFERENCES_PER_FAMILY,
                      min_share: float = MIN_FAMILY_SHARE) -> pd.DataFrame:
    """Rows of ``table`` (a held-out kernel table: no kernel of the traces) to time as drift
    references: for each family with at least ``min_share`` of the traces' predicted time,
    the ``per_family`` rows nearest (in log bytes and log FLOPs) to the family's heaviest
    trace kernel, among rows whose profiled time is in ``REFERENCE_TIME_RANGE_S`` and which
    differ from every trace kernel by ``MIN_DISTANCE_LOG2`` octaves in bytes or FLOPs."""
    specs = {s.key(): s for trace in traces for s in trace}
    keys = set(specs)
    if len(table) and table["key"].isin(keys).any():
        raise ValueError("drift references must come from a held-out table: it holds kernels of the traces")
    heaviest: dict[str, tuple[float, KernelSpec]] = {}
    for trace in traces:
        for s in trace:
            t = float(predicted_s[s.key()])
            if s.family not in heaviest or t > heaviest[s.family][0]:
                heaviest[s.family] = (t, s)
    shares = family_shares(traces, predicted_s)
    lo, hi = REFERENCE_TIME_RANGE_S
    picked = []
    for family in sorted(f for f, share in shares.items() if share >= min_share):
        rows = table[(table["family"] == family) & table["median_s"].between(lo, hi)]
        if rows.empty:
            continue
        rb, rf = _log2(rows["bytes_moved"]), _log2(rows["flops"])
        fam = [s for s in specs.values() if s.family == family]
        tb, tf = _log2([s.bytes_moved() for s in fam]), _log2([s.flops() for s in fam])
        # distance to the nearest scored kernel, in octaves, by the larger of the two axes
        gap = np.maximum(np.abs(rb[:, None] - tb[None, :]), np.abs(rf[:, None] - tf[None, :])).min(axis=1)
        target = heaviest[family][1]
        # nearness to the heaviest kernel: octaves of bytes, FLOPs and every integer size field
        # (a GEMM of the same k and n with another m before one of another aspect)
        sq = (rb - _log2(target.bytes_moved())) ** 2 + (rf - _log2(target.flops())) ** 2
        for name in _size_fields(target):
            if name in rows:
                values = pd.to_numeric(rows[name], errors="coerce").to_numpy(dtype=np.float64)
                sq = sq + np.where(np.isfinite(values), (_log2(np.nan_to_num(values, nan=1.0))
                                                         - _log2(getattr(target, name))) ** 2, 0.0)
        near = np.sqrt(sq)
        ok = gap >= MIN_DISTANCE_LOG2
        if not ok.any():
            continue
        order = np.argsort(np.where(ok, near, np.inf), kind="stable")[: min(per_family, int(ok.sum()))]
        picked.append(rows.iloc[order])
    return pd.concat(picked, ignore_index=True) if picked else table.iloc[0:0]


def family_drift(references: Sequence[HeldOutReference], measured_now_s: Sequence[float]) -> FamilyDrift:
    """Per family, the median of measured now / the held-out model's L3 over its references
    (``model_s``; a reference without one is read against its profiled row), and the same
    against the profiled rows in ``vs_profiled_row``."""
    if len(references) != len(measured_now_s):
        raise ValueError(f"{len(references)} references but {len(measured_now_s)} timings")
    if not references:
        return FamilyDrift()
    now = np.asarray(measured_now_s, dtype=np.float64)
    per_reference = [{"key": r.key, "family": r.family, "measured_now_s": float(t),
                      "model_s": None if r.model_s is None else float(r.model_s), "profiled_s": float(r.profiled_s)}
                     for r, t in zip(references, now)]
    ratios = pd.DataFrame({"family": [r.family for r in references],
                           "ratio": now / [r.profiled_s if r.model_s is None else r.model_s for r in references],
                           "row_ratio": now / [r.profiled_s for r in references]})
    ratios = ratios[np.isfinite(ratios["ratio"]) & (ratios["ratio"] > 0)]
    if ratios.empty:
        return FamilyDrift(per_reference=per_reference)
    by_family = ratios.groupby("family")["ratio"].median().to_dict()
    by_row = ratios.groupby("family")["row_ratio"].median().to_dict()
    return FamilyDrift(by_family={f: float(r) for f, r in by_family.items()},
                       overall=float(ratios["ratio"].median()), references=int(len(ratios)),
                       vs_profiled_row={f: float(r) for f, r in by_row.items()}, per_reference=per_reference)


def drift_scaled_l3(model: Any, trace: Sequence[KernelSpec], pred: pd.DataFrame,
                    l3_factor: Callable[[str], float]) -> np.ndarray:
    """Per kernel of ``trace``, its L3 (``pred``: ``sim.predict.simulator.predict_trace``'s table of
    it) multiplied by ``l3_factor(family)`` (``FamilyDrift.factor``), the cold start of its kind
    (``costmodel.model.cold_start``) left as it was: the drift is the kernels' speed, not the
    host's first call."""
    from costmodel.model.cold_start import cold_start_charges_s  # noqa: PLC0415

    if not len(pred):
        return np.zeros(0)
    cold = cold_start_charges_s(model, "L3", trace)
    factor = pred["family"].map(l3_factor).to_numpy(dtype=np.float64)
    return (pred["L3"].to_numpy(dtype=np.float64) - cold) * factor + cold


def build_references(heldout: Any, traces: Sequence[Sequence[KernelSpec]], device: Any, *, cold: bool,
                     make_run: Callable[[KernelSpec], Callable[[], Any]] | None = None) -> list[HeldOutReference]:
    """The drift references of a held-out run (``sim.predict.heldout.HeldOut``), each with a runner
    timed as the profile timed it (``costmodel.measure.runners.make_runner``)."""
    from costmodel.families.descriptor import from_record  # noqa: PLC0415
    from costmodel.measure.runners import make_runner  # noqa: PLC0415
    from costmodel.model.features import kernel_table  # noqa: PLC0415

    if heldout.table is None or heldout.table.empty:
        return []
    distinct = list({s.key(): s for trace in traces for s in trace}.values())
    predicted = heldout.model.predict(distinct, ["L3"])["L3"].to_numpy()
    by_key = {s.key(): float(p) for s, p in zip(distinct, predicted)}
    rows = choose_references(heldout.table, traces, by_key)
    if rows.empty:
        return []
    records = rows.to_dict("records")
    specs = [from_record(rec) for rec in records]
    # the regression's surface at each reference, never its lookup (``predict_table`` without keys)
    model_s = heldout.model.predict_table(kernel_table(specs), ["L3"])["L3"].to_numpy()
    run_of = make_run or (lambda s: make_runner(s, device, cold=cold))
    return [HeldOutReference(s.key(), s.family, s, float(rec["median_s"]), run_of(s), float(m))
            for s, rec, m in zip(specs, records, model_s)]
