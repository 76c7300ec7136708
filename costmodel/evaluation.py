"""Honest held-out evaluation of the cost-model levels.

- Held-out split: per family, a ``GroupShuffleSplit`` over shape groups
  (``models.shape_groups``): a test shape is never in training, not even under another
  backend.
- Extrapolation split: per family, the shapes whose work (FLOPs, or bytes for families
  without FLOPs) is above a quantile are the test set; training sees only smaller ones.
- Metrics: median and p90 absolute percentage error, share of shapes within +-10%
  (a fraction in [0, 1]), Spearman rank correlation, and the test count.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Mapping

import numpy as np
import pandas as pd
from scipy.stats import spearmanr
from sklearn.base import BaseEstimator, clone
from sklearn.model_selection import GroupShuffleSplit

from costmodel.models import ExtrapolationWarning, ape_pct, kernel_work, shape_groups

MIN_TEST_GROUPS = 4  # a family with fewer shape groups gets no held-out score


def metrics(predicted: np.ndarray, measured: np.ndarray) -> dict[str, Any]:
    """APE summary and rank correlation; None where undefined (JSON has no NaN)."""
    predicted = np.asarray(predicted, dtype=np.float64)
    measured = np.asarray(measured, dtype=np.float64)
    if len(measured) == 0:
        return {"median_ape_pct": None, "p90_ape_pct": None, "max_ape_pct": None, "within_10pct": None,
                "spearman": None, "n_test": 0}
    ape = ape_pct(predicted, measured)
    defined = len(measured) > 2 and np.ptp(predicted) > 0 and np.ptp(measured) > 0
    rho = spearmanr(predicted, measured).statistic if defined else float("nan")
    return {
        "median_ape_pct": float(np.median(ape)),
        "p90_ape_pct": float(np.percentile(ape, 90)),
        "max_ape_pct": float(np.max(ape)),
        "within_10pct": float(np.mean(ape <= 10.0)),
        "spearman": None if math.isnan(rho) else float(rho),
        "n_test": int(len(measured)),
    }


def heldout_split(X: pd.DataFrame, *, test_size: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row positions (train, test), split per family by shape group."""
    if not 0 < test_size < 1:
        raise ValueError(f"fit.test_size must be in (0, 1), got {test_size}")
    groups = shape_groups(X)
    train, test = [], []
    for _, idx in X.groupby("family").indices.items():
        if len(np.unique(groups[idx])) < MIN_TEST_GROUPS:
            train.extend(idx)
            continue
        splitter = GroupShuffleSplit(n_splits=1, test_size=test_size, random_state=seed)
        tr, te = next(splitter.split(idx, groups=groups[idx]))
        train.extend(idx[tr])
        test.extend(idx[te])
    return np.sort(np.array(train, dtype=int)), np.sort(np.array(test, dtype=int))


def extrapolation_split(X: pd.DataFrame, *, quantile: float) -> tuple[np.ndarray, np.ndarray]:
    """Row positions (train, test): test = shapes larger than the family's work quantile."""
    if not 0 < quantile < 1:
        raise ValueError(f"fit.extrapolation_quantile must be in (0, 1), got {quantile}")
    w = kernel_work(X)
    train, test = [], []
    for _, idx in X.groupby("family").indices.items():
        if len(idx) < 2 * MIN_TEST_GROUPS:
            train.extend(idx)
            continue
        cut = np.quantile(w[idx], quantile)
        train.extend(idx[w[idx] <= cut])
        test.extend(idx[w[idx] > cut])
    return np.sort(np.array(train, dtype=int)), np.sort(np.array(test, dtype=int))


def evaluate_split(
    levels: Mapping[str, BaseEstimator], X: pd.DataFrame, y: np.ndarray, train: np.ndarray, test: np.ndarray
) -> dict[str, dict[str, dict[str, Any]]]:
    """{family: {level: metrics}} for every level fitted on train and scored on test."""
    report: dict[str, dict[str, dict[str, Any]]] = {}
    Xtr, ytr, Xte, yte = X.iloc[train], y[train], X.iloc[test], y[test]
    with warnings.catch_warnings():  # an extrapolation split extrapolates by design
        warnings.simplefilter("ignore", ExtrapolationWarning)
        predictions = {name: clone(model).fit(Xtr, ytr).predict(Xte) for name, model in levels.items()}
    fam = Xte["family"].to_numpy()
    for family in sorted(set(X["family"])):
        mask = fam == family
        report[family] = {name: metrics(p[mask], yte[mask]) for name, p in predictions.items()}
    report["all"] = {name: metrics(p, yte) for name, p in predictions.items()}
    return report
