"""Where to measure next: how much the L3 forms disagree about a kernel the profile lacks.

Query by committee (Seung, Opper and Sompolinsky, COLT 1992; for regression, Burbidge,
Rowland and King, IDEAL 2007): several models fitted to the same rows agree where the rows
pin the answer down and part where they do not, so their spread marks the kernels whose
measurement would teach the fit most. The committee here is the set of forms L3 already
chooses among (``costmodel.model.models.L3_CANDIDATES``: a GP, boosted and randomised trees,
a degree-2 ridge, and the trend-plus-trees forms), each fitted on one family's rows to the
same target as L3 (log10 of measured over roofline seconds) and clipped as L3 clips. The
spread of a kernel is the standard deviation of their predictions, in decades of efficiency.

``pick_by_spread`` turns spreads into a batch to measure: the kernel of largest spread
first, then every remaining candidate's spread is damped by its nearness to the pick
(``1 - exp(-d^2 / 2h^2)`` on standardised features, ``h = DIVERSITY_RADIUS``), so one
sparse region does not take the whole budget (the local penalisation of Gonzalez et al.,
AISTATS 2016, in its simplest form). ``scripts/bench_where_to_measure.py`` scores it
against random picks and the spread over bytes that ``sim.predict.heldout.neighbour_suite``
uses, on kernels the profile already measured (no timing).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from costmodel.families.descriptor import KernelSpec
from costmodel.model.features import family_features, kernel_table, log_efficiency
from costmodel.model.models import CLIP_MARGIN_DECADES, L3_CANDIDATES, NATIVE_THREADS, _check_table

#: forms on the committee: every L3 candidate (a committee of one form has no spread)
COMMITTEE_FORMS: tuple[str, ...] = tuple(L3_CANDIDATES)
#: a family with fewer training rows than this has no committee: its spread is ``np.inf``
#: (any of its kernels is worth measuring before a kernel of a fitted family)
MIN_COMMITTEE_ROWS = 6
#: ``calibration.neighbours``: how an experiment picks the half of each family's neighbours
#: that is not around its heaviest kernels (``sim.predict.calibration.neighbour_picker``)
NEIGHBOUR_PICKS = ("committee", "bytes")
#: nearness, in standard deviations of the family's features, within which a pick damps the
#: spread of the candidates around it (``pick_by_spread``)
DIVERSITY_RADIUS = 0.5


class Committee:
    """The L3 forms fitted per family on one kernel table; ``spread`` says where they part."""

    def __init__(self, ceilings: Mapping[str, Any], *, forms: Sequence[str] = COMMITTEE_FORMS) -> None:
        unknown = [f for f in forms if f not in L3_CANDIDATES]
        if unknown or len(forms) < 2:
            raise ValueError(f"forms: at least two of {list(L3_CANDIDATES)}, got {list(forms)}")
        self.ceilings = dict(ceilings)
        self.forms = tuple(forms)
        self.members_: dict[str, list[Any]] = {}
        self.clip_: dict[str, tuple[float, float]] = {}
        self.scale_: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def fit(self, table: pd.DataFrame) -> "Committee":
        """Fit every form on each family of ``table`` (a profile kernel table with ``median_s``)
        that has at least ``MIN_COMMITTEE_ROWS`` rows."""
        _check_table(table)
        target = log_efficiency(table, table["median_s"], self.ceilings)
        with threadpool_limits(limits=NATIVE_THREADS), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # GP optimiser chatter
            for family, idx in table.groupby("family").indices.items():
                F = family_features(table.iloc[idx], family, self.ceilings).to_numpy()
                mean, std = F.mean(axis=0), F.std(axis=0)
                self.scale_[family] = (mean, np.where(std > 0, std, 1.0))
                if len(idx) < MIN_COMMITTEE_ROWS:
                    continue
                t = target[idx]
                self.clip_[family] = (float(t.min()) - CLIP_MARGIN_DECADES, float(t.max()) + CLIP_MARGIN_DECADES)
                self.members_[family] = [L3_CANDIDATES[f]().fit(F, t) for f in self.forms]
        return self

    def predictions(self, queries: pd.DataFrame) -> np.ndarray:
        """(rows, forms) log efficiencies of ``queries``; NaN rows for a family with no committee."""
        _check_table(queries)
        out = np.full((len(queries), len(self.forms)), np.nan)
        with threadpool_limits(limits=NATIVE_THREADS):
            for family, idx in queries.groupby("family").indices.items():
                members = self.members_.get(family)
                if members is None:
                    continue
                F = family_features(queries.iloc[idx], family, self.ceilings).to_numpy()
                lo, hi = self.clip_[family]
                out[idx] = np.column_stack([np.clip(m.predict(F), lo, hi) for m in members])
        return out

    def spread(self, queries: pd.DataFrame) -> np.ndarray:
        """Per query, the committee's standard deviation in decades of efficiency (``np.inf``
        for a family the committee was not fitted on: it has too few rows to say anything)."""
        p = self.predictions(queries)
        out = np.full(len(queries), np.inf)
        known = ~np.isnan(p).any(axis=1)
        out[known] = p[known].std(axis=1)
        return out

    def standardised(self, queries: pd.DataFrame, family: str) -> np.ndarray:
        """``queries`` (all of ``family``) as features in the family's training standard units."""
        F = family_features(queries, family, self.ceilings).to_numpy()
        if family in self.scale_:
            mean, std = self.scale_[family]
        else:  # a family the committee never saw: the queries' own units
            mean, std = F.mean(axis=0), F.std(axis=0)
            std = np.where(std > 0, std, 1.0)
        return (F - mean) / std


def pick_by_spread(committee: Committee, candidates: pd.DataFrame, budget_per_family: int, *,
                   radius: float = DIVERSITY_RADIUS) -> list[int]:
    """Positions (into ``candidates``) of at most ``budget_per_family`` kernels per family to
    measure next: greedily the largest committee spread, each pick damping the spread of the
    candidates near it (module docstring). Ties (a family without committee: all ``inf``)
    fall to the candidates farthest from those already picked, then to table order."""
    if budget_per_family < 1:
        raise ValueError(f"budget_per_family must be >= 1, got {budget_per_family}")
    if radius <= 0:
        raise ValueError(f"radius must be > 0 (standard deviations of the features), got {radius}")
    spread = committee.spread(candidates)
    chosen: list[int] = []
    for family, idx in candidates.groupby("family").indices.items():
        X = committee.standardised(candidates.iloc[idx], family)
        score = np.where(np.isinf(spread[idx]), 1e6, spread[idx]).astype(float)
        far = np.full(len(idx), np.inf)  # distance to the nearest pick so far
        taken = np.zeros(len(idx), dtype=bool)
        for _ in range(min(budget_per_family, len(idx))):
            near = np.minimum(far, 1e6)
            damp = np.where(np.isinf(far), 1.0, 1.0 - np.exp(-near**2 / (2 * radius**2)))
            key = np.where(taken, -np.inf, score * damp)
            # the largest damped spread; among equals the farthest from the picks, then the first
            best = int(np.lexsort((-np.arange(len(idx)), near, key))[-1])
            taken[best] = True
            chosen.append(int(idx[best]))
            far = np.minimum(far, np.linalg.norm(X - X[best], axis=1))
    return sorted(chosen)


def committee_picker(train: pd.DataFrame, ceilings: Mapping[str, Any], families: Iterable[str]
                     ) -> Callable[[list[KernelSpec], int], list[KernelSpec]]:
    """``pick(candidates, n)``: the ``n`` candidates (descriptors of one family) a committee
    fitted on ``train``'s rows of ``families`` would measure first (``pick_by_spread``):
    ``sim.predict.heldout.neighbour_suite``'s ``pick_rest`` in a calibration."""
    wanted = set(families)
    committee = Committee(ceilings).fit(train[train["family"].isin(wanted)].reset_index(drop=True))

    def pick(candidates: list[KernelSpec], n: int) -> list[KernelSpec]:
        if not candidates:
            return []
        return [candidates[i] for i in pick_by_spread(committee, kernel_table(candidates), n)]
    return pick
