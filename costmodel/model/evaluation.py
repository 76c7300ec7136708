"""Honest held-out evaluation of the cost-model levels.

- Held-out split: per family, a ``GroupShuffleSplit`` over shape groups
  (``models.shape_groups``): a test shape is never in training, not even under another
  backend.
- Extrapolation split: per family, the shapes whose work (FLOPs, or bytes for families
  without FLOPs) is above a quantile are the test set; training sees only smaller ones.
- Metrics: median and p90 absolute percentage error, share of shapes within +-10%
  (a fraction in [0, 1]), Spearman rank correlation, the test count, and the noise floor:
  the median APE a perfect model would score given how much each measured value itself
  varies between rounds (``noise_floor_median_ape_pct``).
- The same floor for the *maximum* APE over a set of points (``max_ape_within_prob``,
  ``noise_floor_max_ape_pct``): with independent normal errors of relative size
  sigma_i, P(max_i |e_i| <= x) = prod_i erf(x / (sigma_i sqrt 2)), the distribution of
  the largest of independent half-normal variables (the CDF of the maximum of independent
  variables is the product of their CDFs, e.g. David & Nagaraja, *Order Statistics*, 3rd
  ed., 2003; the half-normal CDF is erf(x / (sigma sqrt 2))).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Mapping

import numpy as np
import pandas as pd
from scipy.optimize import brentq
from scipy.special import erf
from scipy.stats import spearmanr
from sklearn.base import BaseEstimator, clone

from costmodel.model.models import ExtrapolationWarning, ape_pct, kernel_work, shape_groups

MIN_TEST_GROUPS = 4  # a family with fewer shape groups gets no held-out score


def measurement_sigma(round_cv: np.ndarray, rounds: np.ndarray) -> np.ndarray:
    """Relative standard error of a median of ``rounds`` round medians whose spread is
    ``round_cv``: sqrt(pi/2) * cv / sqrt(rounds) (the median's efficiency under normal noise)."""
    return np.sqrt(np.pi / 2) * np.asarray(round_cv, float) / np.sqrt(np.maximum(np.asarray(rounds, float), 1))


def point_sigma(df: pd.DataFrame, default_rounds: int) -> np.ndarray:
    """``measurement_sigma`` of every row of an experiment's results: its ``round_cv`` over
    its ``rounds_timed`` (``default_rounds`` for tables from before that column)."""
    rounds = df["rounds_timed"].to_numpy() if "rounds_timed" in df else np.full(len(df), default_rounds)
    return measurement_sigma(df["round_cv"].to_numpy(), rounds)


#: share of a perfect model's errors beyond two sigma: P(|N(0, 1)| > 2) = 1 - erf(2 / sqrt 2)
PERFECT_SHARE_BEYOND_2_SIGMA = round(float(1 - erf(2 / np.sqrt(2))), 4)


def beyond_noise(relative_error: np.ndarray, sigma: np.ndarray) -> dict[str, Any]:
    """How many points' errors exceed twice their measurement's own noise (points with a
    noise estimate only). A perfect model leaves 4.55% there; much more says the model (or
    its own measured inputs) adds error beyond what the measurements' spread explains."""
    relative_error, sigma = np.asarray(relative_error, float), np.asarray(sigma, float)
    known = np.isfinite(sigma) & (sigma > 0) & np.isfinite(relative_error)
    share = float(np.mean(np.abs(relative_error[known]) > 2 * sigma[known])) if known.any() else None
    return {"share_beyond_2_sigma": share, "points": int(known.sum()),
            "perfect_model_share": PERFECT_SHARE_BEYOND_2_SIGMA}


def noise_floor_median_ape_pct(sigma: np.ndarray) -> float:
    """Median APE a *perfect* model would score against labels this noisy: the median of
    |N(0, sigma_i)| is 0.6745 sigma_i. No model can be expected to beat it."""
    return float(100 * np.median(0.6745 * np.asarray(sigma, float))) if len(sigma) else float("nan")


def max_ape_within_prob(sigma: np.ndarray, limit_pct: float) -> float:
    """Probability that a *perfect* model's largest APE over points with relative noise
    ``sigma`` stays within ``limit_pct``: prod_i erf(limit / (sigma_i sqrt 2)) (the CDF of
    the largest of independent half-normal errors; module docstring). NaN sigmas are
    left out; a point with sigma 0 never exceeds any limit."""
    s = np.asarray(sigma, float)
    s = s[np.isfinite(s)]
    if limit_pct < 0:
        raise ValueError(f"limit_pct must be >= 0, got {limit_pct}")
    if not len(s):
        return float("nan")
    noisy = s[s > 0]
    return float(np.prod(erf(limit_pct / 100.0 / (noisy * np.sqrt(2)))))


def noise_floor_max_ape_pct(sigma: np.ndarray, quantile: float = 0.5) -> float:
    """The ``quantile`` of the largest APE a *perfect* model would score against labels
    this noisy (``max_ape_within_prob`` inverted): at 0.5, half of all runs of the same
    measurement would see a larger maximum from measurement noise alone."""
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    s = np.asarray(sigma, float)
    s = s[np.isfinite(s)]
    if not len(s):
        return float("nan")
    if not (s > 0).any():
        return 0.0
    hi = 100 * float(s.max()) * 10.0  # erf(10 / sqrt 2) ~ 1 - 1.5e-23: every factor is 1
    return float(brentq(lambda x: max_ape_within_prob(s, x) - quantile, 0.0, hi, xtol=1e-6))


def metrics(predicted: np.ndarray, measured: np.ndarray, sigma: np.ndarray | None = None) -> dict[str, Any]:
    """APE summary, the sign APE hides (predicted / measured: median, 10th and 90th percentile)
    and rank correlation; None where undefined (JSON has no NaN). With the measured values'
    relative noise ``sigma``, also the noise floor of the median APE."""
    predicted = np.asarray(predicted, dtype=np.float64)
    measured = np.asarray(measured, dtype=np.float64)
    floor = None if sigma is None or len(measured) == 0 else noise_floor_median_ape_pct(sigma)
    if len(measured) == 0:
        return {"median_ape_pct": None, "p90_ape_pct": None, "max_ape_pct": None, "within_10pct": None,
                "ratio_median": None, "ratio_p10": None, "ratio_p90": None,
                "spearman": None, "n_test": 0, "noise_floor_median_ape_pct": floor}
    ape = ape_pct(predicted, measured)
    defined = len(measured) > 2 and np.ptp(predicted) > 0 and np.ptp(measured) > 0
    rho = spearmanr(predicted, measured).statistic if defined else float("nan")
    return {
        "median_ape_pct": float(np.median(ape)),
        "p90_ape_pct": float(np.percentile(ape, 90)),
        "max_ape_pct": float(np.max(ape)),
        "within_10pct": float(np.mean(ape <= 10.0)),
        **dict(zip(("ratio_p10", "ratio_median", "ratio_p90"),
                   (float(q) for q in np.percentile(predicted / measured, [10, 50, 90])))),
        "spearman": None if math.isnan(rho) else float(rho),
        "n_test": int(len(measured)),
        "noise_floor_median_ape_pct": floor,
    }


def heldout_folds(X: pd.DataFrame, *, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Row positions (train, test) per fold: within each family the shape groups are dealt
    at random into ``folds`` folds, so every shape is held out exactly once (grouped K-fold).

    One 25% split scores a family of 28 shapes on 7 of them, and its median moves by several
    points with the seed; pooled over the folds every shape is scored by a model that never
    saw it. A family with fewer than ``MIN_TEST_GROUPS`` shapes stays in every training set
    and gets no held-out score."""
    if isinstance(folds, bool) or not isinstance(folds, (int, np.integer)) or folds < 2:
        raise ValueError(f"fit.heldout_folds must be an integer >= 2, got {folds!r}")
    groups = shape_groups(X)
    fold_of_row = np.full(len(X), -1)
    rng = np.random.default_rng(seed)
    for _, idx in X.groupby("family").indices.items():
        shapes = np.unique(groups[idx])
        if len(shapes) < max(MIN_TEST_GROUPS, folds):
            continue
        fold_of_shape = dict(zip(rng.permutation(shapes), np.arange(len(shapes)) % folds))
        fold_of_row[idx] = [fold_of_shape[g] for g in groups[idx]]
    return [(np.flatnonzero(fold_of_row != f), np.flatnonzero(fold_of_row == f)) for f in range(folds)]


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
    return evaluate_folds(levels, X, y, [(train, test)])


def evaluate_folds(
    levels: Mapping[str, BaseEstimator], X: pd.DataFrame, y: np.ndarray,
    splits: list[tuple[np.ndarray, np.ndarray]],
) -> dict[str, dict[str, dict[str, Any]]]:
    """{family: {level: metrics}} over the test rows of every split, each predicted by the
    levels fitted on that split's training rows (the test sets must not overlap)."""
    test = np.concatenate([te for _, te in splits]) if splits else np.array([], dtype=int)
    if len(np.unique(test)) != len(test):
        raise ValueError("the held-out folds overlap: a row is in the test set of two splits")
    predictions = {name: np.empty(len(test)) for name in levels}
    at = 0
    with warnings.catch_warnings():  # an extrapolation split extrapolates by design
        warnings.simplefilter("ignore", ExtrapolationWarning)
        for train, te in splits:
            if len(te) == 0:
                continue
            for name, model in levels.items():
                predictions[name][at:at + len(te)] = clone(model).fit(X.iloc[train], y[train]).predict(X.iloc[te])
            at += len(te)
    Xte, yte = X.iloc[test], y[test]
    report: dict[str, dict[str, dict[str, Any]]] = {}
    fam = Xte["family"].to_numpy()
    sigma = (measurement_sigma(Xte["round_cv"].to_numpy(), Xte["rounds"].to_numpy())
             if {"round_cv", "rounds"} <= set(Xte.columns) else None)
    for family in sorted(set(X["family"])):
        mask = fam == family
        s = None if sigma is None else sigma[mask]
        report[family] = {name: metrics(p[mask], yte[mask], s) for name, p in predictions.items()}
    report["all"] = {name: metrics(p, yte, sigma) for name, p in predictions.items()}
    return report
