"""Held-out scoring: predict an experiment's layers from models that never saw its kernels.

A simulator is worth what it predicts about work it has not run. Every measuring
experiment reports three errors (docs/method.md, "How a prediction is scored"):

- **held-out** (the headline, this module): L0-L3 refitted on the profile *without any
  row whose kernel key occurs in the experiment's traces*, so no kernel of the layers is
  looked up or interpolated through; the ceilings and the cold-call overhead as they stood
  before the run (the model as loaded, not the ones a paired run re-times); and no drift
  correction read off the experiment's own kernels (refresh records written by paired
  runs, whose ratios came from those kernels, are ignored here).
- **lookup** (``details.profile_lookup``): the profile as loaded, where a kernel the
  profile measured is predicted by its measurement (``CostModel.predict_table``).
- **replay** (``details.replay``): the layers' kernels timed in the same rounds as the
  layers (``calibration.paired``, ``sim.predict.paired``): the composition check.

The held-out fit is one fit per run (not per point), timed and reported
(``HeldOut.fit_s``). A family of the traces with fewer than ``MIN_HELDOUT_ROWS`` rows once
the experiment's kernels are left out cannot be predicted held out: ``HeldOutError``
names it and the rows it has, before anything is measured, and nothing falls back to the
lookup. ``neighbour_specs`` proposes kernels near a trace's (every size field scaled by 0.5
and 2, together and one at a time), which calibration measures for such families
(``sim.predict.calibration.calibrated_model(heldout=...)``).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from costmodel.families.descriptor import KernelSpec
from costmodel.model.models import make_levels
from costmodel.model.predictor import CostModel
from costmodel.store.profile import DeviceProfile

#: rows (distinct kernels) a family needs in the profile once the experiment's own kernels
#: are left out, for its held-out prediction to rest on more than one or two measurements
MIN_HELDOUT_ROWS = 3
#: the tags an experiment writes on its own layers' kernels in a profile (what the scripts that
#: leave an experiment suite out, ``scripts/heldout_by_suite.py`` and ``bench_where_to_measure.py``, hold out)
OWN_TAGS = ("calibration", "paired", "design")
#: refresh records ignored by the held-out fit: a paired run reads its drift off its own kernels
IGNORED_REFRESH_POLICIES = ("paired",)
#: size factors of ``neighbour_specs`` (a family with one size field, such as sort, gets the
#: wide set: two trace sizes an octave apart share their x0.5 / x2 neighbours)
NEIGHBOUR_FACTORS = (0.5, 2.0)
NEIGHBOUR_FACTORS_ONE_FIELD = (0.25, 0.5, 2.0, 4.0)
#: neighbours measured per family at most: half of them around the family's heaviest kernels
#: of the traces (``HEAVY_SHARE``), the rest spread over the family's bytes moved
NEIGHBOURS_PER_FAMILY = 24
#: share of ``NEIGHBOURS_PER_FAMILY`` given to the neighbours of the family's heaviest trace
#: kernels (by roofline seconds), the scaled-together ones first. Spread over bytes alone, a
#: family with many small kinds left its heaviest kernel without a neighbour: hf_moe's
#: 67M-element gradient add (19 ms, 15% of a training step) had none above it, and its
#: held-out prediction (11.8 ms, 68 GB/s on a 39 GB/s machine) followed the 16.7M add.
HEAVY_SHARE = 0.5


class HeldOutError(ValueError):
    """The profile cannot predict an experiment's kernels without having seen them."""


@dataclass
class HeldOut:
    """The held-out models of one run and what they were fitted on."""

    model: CostModel
    excluded_kernels: int  # distinct kernel keys of the traces
    excluded_rows: int  # profile rows (kernels) left out because the traces use them
    rows: int  # kernels the held-out models were fitted on
    fit_s: float  # wall time of the fit
    family_rows: dict[str, int] = field(default_factory=dict)  # per family of the traces: rows fitted on
    table: pd.DataFrame | None = None  # the kernel table fitted on (no kernel of the traces)
    references: list[Any] = field(default_factory=list)  # sim.predict.heldout_drift.HeldOutReference, timed with the layers
    drift: Any = None  # sim.predict.heldout_drift.FamilyDrift, once the references were timed

    def to_dict(self) -> dict[str, Any]:
        out = {"scored": True, "excluded_kernels": self.excluded_kernels, "excluded_profile_rows": self.excluded_rows,
               "fitted_rows": self.rows, "fit_s": round(self.fit_s, 2), "family_rows": dict(self.family_rows),
               "ceilings": "as loaded, before the run", "lookup": False,
               "ignored_refresh_policies": list(IGNORED_REFRESH_POLICIES)}
        if self.drift is not None:
            out["drift"] = self.drift.to_dict()
            out["drift"]["reference_kernels"] = [r.key for r in self.references]
        return out

    def describe(self) -> str:
        return (f"held-out models: refitted in {self.fit_s:.1f} s on {self.rows} profiled kernels, leaving out the "
                f"{self.excluded_rows} the experiment's {self.excluded_kernels} distinct kernels are (no lookup, "
                "ceilings as loaded)")


def trace_keys(traces: Iterable[Iterable[KernelSpec]]) -> set[str]:
    """Every distinct kernel key of ``traces``."""
    return {s.key() for trace in traces for s in trace}


def trace_kernels(traces: Iterable[Iterable[KernelSpec]]) -> list[KernelSpec]:
    """Every kernel of ``traces``, each as often as the traces run it (what ``neighbour_suite``
    weighs: a GEMM an expert loop runs 488 times carries more of the layers' time than one it
    runs once at eight times the size)."""
    return [s for trace in traces for s in trace]


def trace_families(traces: Iterable[Iterable[KernelSpec]]) -> set[str]:
    return {s.family for trace in traces for s in trace}


def heldout_table(profile: DeviceProfile, exclude_keys: set[str]) -> tuple[pd.DataFrame, int]:
    """The profile's kernel table without the rows of ``exclude_keys`` (refresh records of
    paired runs ignored), and how many rows were left out."""
    table = profile.kernels(ignore_refresh_policies=IGNORED_REFRESH_POLICIES)
    if table.empty:
        return table, 0
    keep = ~table["key"].isin(exclude_keys)
    return table[keep].reset_index(drop=True), int((~keep).sum())


def family_shortfall(table: pd.DataFrame, families: Iterable[str]) -> dict[str, int]:
    """Families with fewer than ``MIN_HELDOUT_ROWS`` rows in ``table``: family -> rows it has."""
    counts = table["family"].value_counts().to_dict() if len(table) else {}
    return {f: int(counts.get(f, 0)) for f in sorted(set(families)) if counts.get(f, 0) < MIN_HELDOUT_ROWS}


def shortfall_message(profile: DeviceProfile, short: dict[str, int], total: dict[str, int], what: str) -> str:
    parts = ", ".join(f"{f}: {n} row{'s' if n != 1 else ''} left of {total.get(f, 0)}" for f, n in short.items())
    return (f"{what}: the profile {profile.path.name} is too small to predict these kernels held out: once the "
            f"experiment's own kernels are left out, it has fewer than {MIN_HELDOUT_ROWS} measured kernels of "
            f"{parts}. Measure kernels near them (run the experiment with measure=true, which calibrates "
            "neighbours of its kernels, or `python -m costmodel bench suite=quick`); a held-out score never falls "
            "back to looking the kernels up")


def fit_heldout(profile: DeviceProfile, as_loaded: CostModel, traces: Sequence[Sequence[KernelSpec]], *,
                cv_folds: int = 4, what: str = "held-out scoring") -> HeldOut:
    """L0-L3 fitted on ``profile`` without any kernel of ``traces``, with ``as_loaded``'s
    ceilings (the cold-call overhead included) and no lookup; ``HeldOutError`` where a family
    of the traces has fewer than ``MIN_HELDOUT_ROWS`` kernels left."""
    keys = trace_keys(traces)
    families = trace_families(traces)
    start = time.perf_counter()
    table, excluded = heldout_table(profile, keys)
    short = family_shortfall(table, families)
    if short:
        full = profile.kernels()
        total = full["family"].value_counts().to_dict() if len(full) else {}
        raise HeldOutError(shortfall_message(profile, short, total, what))
    ceilings = dict(as_loaded.ceilings)
    y = table["median_s"].to_numpy(dtype=np.float64)
    levels = {name: m.fit(table, y) for name, m in make_levels(ceilings, cv_folds=cv_folds).items()}
    fit_s = time.perf_counter() - start
    meta = {"heldout": True, "n_rows": int(len(table)), "l3_form": levels["L3"].chosen_}
    model = CostModel(fingerprint=as_loaded.fingerprint, ceilings=ceilings, levels=levels,
                      profile_hash=as_loaded.profile_hash, meta=meta, measured_s={})
    model.freshness = dict(getattr(as_loaded, "freshness", {}) or {})
    counts = table["family"].value_counts().to_dict()
    return HeldOut(model, excluded_kernels=len(keys), excluded_rows=excluded, rows=int(len(table)), fit_s=fit_s,
                   family_rows={f: int(counts.get(f, 0)) for f in sorted(families)}, table=table)


# ----------------------------------------------------------------------------- neighbours


def _scaled(value: Any, factor: float) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return max(1, int(round(value * factor)))
    if isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(int(round(v * factor)) for v in value)
    return value


def neighbour_specs(spec: KernelSpec) -> list[KernelSpec]:
    """Kernels near ``spec``: every integer size field (and per-expert count vector) scaled by
    each of ``NEIGHBOUR_FACTORS``, all together and one field at a time, in that order (the
    nearest first); combinations the family's own validation rejects (a top-k larger than its
    row, say) are left out."""
    sizes = [f.name for f in dataclasses.fields(spec)
             if _scaled(getattr(spec, f.name), 2.0) != getattr(spec, f.name)]
    groups = [sizes] + ([[n] for n in sizes] if len(sizes) > 1 else [])
    factors = sorted(NEIGHBOUR_FACTORS if len(sizes) > 1 else NEIGHBOUR_FACTORS_ONE_FIELD, key=lambda f: abs(np.log(f)))
    out: dict[str, KernelSpec] = {}
    for names in groups:  # nearest first: all sizes together, then one field at a time; x0.5 and x2 before x0.25 and x4
        for factor in factors:
            try:
                near = dataclasses.replace(spec, **{n: _scaled(getattr(spec, n), factor) for n in names})
            except (ValueError, TypeError):
                continue
            if near != spec:
                out.setdefault(near.key(), near)
    return list(out.values())


def evenly_spaced_ranks(n_items: int, k: int) -> np.ndarray:
    """Up to ``k`` distinct positions evenly spaced over ``n_items`` sorted items, both ends
    included: the bytes rule of ``neighbour_suite`` (and of ``scripts/bench_where_to_measure.py``)."""
    return np.unique(np.round(np.linspace(0, n_items - 1, min(k, n_items))).astype(int))


def neighbour_suite(specs: Iterable[KernelSpec], families: Iterable[str], exclude_keys: set[str], *,
                    weight: Callable[[KernelSpec], float] | None = None,
                    pick_rest: Callable[[list[KernelSpec], int], list[KernelSpec]] | None = None
                    ) -> list[tuple[str, KernelSpec]]:
    """Neighbours of the ``specs`` of ``families`` (never a kernel of ``exclude_keys``), at most
    ``NEIGHBOURS_PER_FAMILY`` per family, tagged for calibration: first the neighbours of the
    family's heaviest specs, up to ``HEAVY_SHARE`` of the budget, the sizes scaled together
    before one field at a time; then the rest: ``pick_rest(candidates, n)`` where given (the
    calibration's: where the L3 forms disagree most, ``costmodel.model.committee``), else at
    evenly spaced ranks of bytes moved. What a profile measures around an experiment's kernels.

    ``specs`` lists a kernel as often as the traces run it (``trace_kernels``) and a kernel's
    heaviness is its ``weight`` (seconds; default bytes moved) times that count: the time it
    carries in the traces. Weighed per call, moe_ep's heavy neighbours all went to the 32-64-row
    expert GEMMs its balanced counterparts run once, none to the 1-8-row ones its expert loops
    run hundreds of times (85% of its GEMM time), and the held-out models predicted those from
    rows of other sittings (results/cpu/moe_ep, 2026-12-06: 0.86x measured)."""
    weigh = weight if weight is not None else (lambda s: float(s.bytes_moved()))
    wanted = set(families)
    #: per family, key -> (priority: minus its heaviest parent's weight, its rank among that
    #: parent's neighbours; the descriptor)
    by_family: dict[str, dict[str, tuple[tuple[float, int], KernelSpec]]] = {}
    for s, uses in Counter(specs).items():
        if s.family not in wanted:
            continue
        w = uses * float(weigh(s))
        for rank, near in enumerate(neighbour_specs(s)):
            key = near.key()
            if key in exclude_keys:
                continue
            known = by_family.setdefault(s.family, {})
            if key not in known or (-w, rank) < known[key][0]:
                known[key] = ((-w, rank), near)
    out: list[tuple[str, KernelSpec]] = []
    heavy_n = int(round(HEAVY_SHARE * NEIGHBOURS_PER_FAMILY))
    by_bytes = lambda s: (s.bytes_moved(), s.key())  # noqa: E731
    for family in sorted(by_family):
        ranked = [near for _, near in sorted(by_family[family].values(), key=lambda e: (e[0], e[1].key()))]
        if len(ranked) <= NEIGHBOURS_PER_FAMILY:
            chosen = sorted(ranked, key=by_bytes)
        elif pick_rest is not None:
            chosen = ranked[:heavy_n] + sorted(pick_rest(ranked[heavy_n:], NEIGHBOURS_PER_FAMILY - heavy_n), key=by_bytes)
        else:
            rest = sorted(ranked[heavy_n:], key=by_bytes)
            chosen = ranked[:heavy_n] + [rest[i] for i in evenly_spaced_ranks(len(rest), NEIGHBOURS_PER_FAMILY - heavy_n)]
        out += [("heldout_neighbour", s) for s in chosen]
    return out
