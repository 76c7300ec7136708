"""Cost models L0-L3: kernel table -> predicted seconds, as scikit-learn estimators.

Each model takes a kernel table (``costmodel.model.features.kernel_table``; a profile's
measurements are one) as X and latency in seconds as y. Constructors only store their
keyword-only parameters, ``fit`` returns self, fitted attributes end in ``_``, so the
models compose with ``Pipeline``, ``cross_validate`` and grid search.

- L0 ``FlopsOverPeak``: FLOPs / measured peak FLOP/s: what people do today.
- L1 ``FamilyAchievedRate``: FLOPs / the family's median achieved FLOP/s in training
  (bytes / achieved bytes/s for kernels without FLOPs: gather, sort, histogram, copies).
- L2 ``Roofline``: max(FLOPs/peak, bytes/bandwidth) + per-call overhead, with measured
  ceilings (Williams, Waterman & Patterson, CACM 2009).
- L3 ``FittedCostModel``: per family, a regression of log10(measured / roofline) on the
  features of ``costmodel.model.features``. Learning the log residual over the roofline keeps
  extrapolation sane (far outside the data the prediction falls back to the roofline
  scaled by a bounded efficiency, never a runaway polynomial), and errors are relative,
  like the APE we report; the learned log-efficiency is also clipped to the range seen in
  training (plus ``CLIP_MARGIN_DECADES``), so no form can run away. The form is chosen
  per family by grouped cross-validation (folds never split one shape): see
  ``L3_CANDIDATES`` for the forms and why.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping, Sequence

import joblib
import numpy as np
from threadpoolctl import threadpool_limits
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.ensemble import ExtraTreesRegressor, HistGradientBoostingRegressor
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, RBF, WhiteKernel
from sklearn.linear_model import RidgeCV
from sklearn.model_selection import GroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import PolynomialFeatures, StandardScaler

from costmodel.families.descriptor import families
from costmodel.model.feature_ranges import outside_masks
from costmodel.model.features import family_features, log_efficiency, range_features, roofline_time_s

MIN_ROWS_FOR_CV = 12  # fewer rows than this: L3 uses the family's median efficiency
#: L3's log10 efficiency is clipped to the training range widened by this much (x1.26):
#: no model form may promise an efficiency far outside anything measured on the device
CLIP_MARGIN_DECADES = 0.1
#: batches at least this large predict a forest's trees on all cores (below it the thread
#: pool costs more than it saves)
PARALLEL_PREDICT_ROWS = 4096
#: native threads (OpenMP, BLAS) of a fit or a prediction. On the 2-core development VM with
#: other processes running, one cross-validation of HistGradientBoosting over 308 elementwise
#: kernels took 280 s with its default OpenMP pool (threads spinning for cores they did not
#: get) and 2.0 s with one thread; on a quiet machine both took 2 s. One thread keeps fitting
#: and prediction as fast on a busy machine as on a quiet one.
NATIVE_THREADS = 1


def _check_table(X: pd.DataFrame) -> None:
    if not isinstance(X, pd.DataFrame):
        raise TypeError(f"cost models take a kernel table (pandas DataFrame), got {type(X).__name__}")
    missing = {"family", "flops", "bytes_moved"} - set(X.columns)
    if missing:
        raise ValueError(f"kernel table is missing columns {sorted(missing)}")
    unknown = set(X["family"].unique()) - set(families())
    if unknown:
        raise ValueError(f"kernel table holds unknown families {sorted(unknown)}; known: {list(families())}")


def _ceilings(ceilings: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if ceilings is None:
        raise ValueError("this model needs the device's measured ceilings (ceilings=...)")
    return ceilings


def ape_pct(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Absolute percentage error |pred - meas| / meas * 100."""
    return 100.0 * np.abs(np.asarray(predicted) - np.asarray(measured)) / np.asarray(measured)


def counted_in_bytes(X: pd.DataFrame) -> np.ndarray:
    """Kernels that do no floating-point work (their descriptor's ``flops()`` is 0: gather,
    sort, histogram, copies, fills): their work is their ideal bytes."""
    return X["flops"].to_numpy() <= 0


def kernel_work(X: pd.DataFrame) -> np.ndarray:
    """FLOPs, or ideal bytes for kernels that do no floating-point work
    (``counted_in_bytes``): the quantity L1 divides by a family's achieved rate."""
    return np.where(counted_in_bytes(X), X["bytes_moved"], X["flops"]).astype(np.float64)


class FlopsOverPeak(RegressorMixin, BaseEstimator):
    """L0: latency = FLOPs / peak FLOP/s (zero for kernels that do no arithmetic)."""

    def __init__(self, *, ceilings: Mapping[str, Any] | None = None) -> None:
        self.ceilings = ceilings

    def fit(self, X: pd.DataFrame, y: Any = None) -> "FlopsOverPeak":
        _check_table(X)
        self.peak_flops_per_s_ = float(_ceilings(self.ceilings)["peak_flops_per_s"])
        return self

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        _check_table(X)
        return X["flops"].to_numpy(dtype=np.float64) / self.peak_flops_per_s_


class FamilyAchievedRate(RegressorMixin, BaseEstimator):
    """L1: latency = work / the family's median achieved rate in the training data."""

    def fit(self, X: pd.DataFrame, y: Any) -> "FamilyAchievedRate":
        _check_table(X)
        work = self._work(X)
        rate = pd.Series(work / np.asarray(y, dtype=np.float64), index=X.index)
        self.rate_ = rate.groupby(X["family"]).median().to_dict()
        return self

    @staticmethod
    def _work(X: pd.DataFrame) -> np.ndarray:
        return kernel_work(X)

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        _check_table(X)
        missing = set(X["family"].unique()) - set(self.rate_)
        if missing:
            raise ValueError(f"L1 was fitted without families {sorted(missing)}; refit on a profile that has them")
        return self._work(X) / X["family"].map(self.rate_).to_numpy(dtype=np.float64)


class Roofline(RegressorMixin, BaseEstimator):
    """L2: latency = max(FLOPs/peak, bytes/bandwidth) + per-call overhead."""

    def __init__(self, *, ceilings: Mapping[str, Any] | None = None) -> None:
        self.ceilings = ceilings

    def fit(self, X: pd.DataFrame, y: Any = None) -> "Roofline":
        _check_table(X)
        self.ceilings_ = dict(_ceilings(self.ceilings))
        return self

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        _check_table(X)
        return roofline_time_s(
            X["flops"].to_numpy(dtype=np.float64), X["bytes_moved"].to_numpy(dtype=np.float64), self.ceilings_
        )


# ----------------------------------------------------------------------------- L3


class TrendPlusResidual(RegressorMixin, BaseEstimator):
    """A linear trend in the (log) features, then trees fitted to what the trend leaves.

    Trees alone predict a constant beyond their data (the edge leaf), so a kernel twice as
    large as any measured gets the efficiency of the largest measured one; a linear trend
    in log features extrapolates the measured log-log slope (a power law) instead, and the
    trees on its residual keep the steps inside the range (blocking, cache-size and
    backend switches). The same idea as model trees with linear models in the leaves
    (Quinlan's M5, 1992; LightGBM's ``linear_tree``), in its simplest form."""

    def __init__(self, *, residual: str = "gbm") -> None:
        self.residual = residual

    def fit(self, X: np.ndarray, y: np.ndarray) -> "TrendPlusResidual":
        if self.residual not in RESIDUAL_TREES:
            raise ValueError(f"residual must be one of {sorted(RESIDUAL_TREES)}, got {self.residual!r}")
        self.trend_ = _ridge1().fit(X, y)
        self.residual_ = RESIDUAL_TREES[self.residual]().fit(X, y - self.trend_.predict(X))
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.trend_.predict(X) + self.residual_.predict(X)


def _ridge1() -> Any:
    return make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-3, 3, 13)))


def _gbm() -> Any:
    return HistGradientBoostingRegressor(
        max_iter=150, learning_rate=0.1, min_samples_leaf=4, l2_regularization=1e-3, random_state=0
    )


def _extra_trees() -> Any:
    return ExtraTreesRegressor(n_estimators=100, min_samples_leaf=2, random_state=0)


RESIDUAL_TREES = {"gbm": _gbm, "extra_trees": _extra_trees}


def _gp() -> Any:
    kernel = ConstantKernel(1.0, (1e-3, 1e2)) * RBF(length_scale=1.0, length_scale_bounds=(1e-2, 1e3)) + WhiteKernel(
        1e-3, (1e-6, 1e0)
    )
    return make_pipeline(StandardScaler(), GaussianProcessRegressor(kernel=kernel, normalize_y=True, random_state=0))


#: L3 model forms tried per family (all on log10(measured / roofline)):
#: - "gp": Gaussian process with an RBF kernel plus white noise on standardised features:
#:   smooth interpolation between measured shapes (GEMM efficiency changes smoothly with
#:   M, K, N between the blocking steps), noise estimated rather than memorised, and a
#:   prior mean far from data, i.e. sane extrapolation;
#: - "gbm": histogram gradient boosting: captures sharp steps (thread partitioning,
#:   cache-size cliffs, backend switches) that a smooth model blurs;
#: - "extra_trees": randomised trees averaged: steps like gbm, less variance on small
#:   families (it won gather and elementwise on the development CPU);
#: - "ridge2": ridge on degree-2 polynomial features: the simple baseline;
#: - "trend_gbm" / "trend_extra_trees": a linear trend in the log features plus trees on its
#:   residual (``TrendPlusResidual``): the trees' steps inside the range, a power law beyond.
#: The winner per family is the lowest median APE under grouped K-fold CV (``averaged_top``
#: adds averages of the best forms, off by default: ``AVERAGED_TOP``); the choice and
#: every candidate's CV error are stored in ``chosen_`` and ``cv_median_ape_pct_``.
#: Ensemble sizes are set by prediction cost at equal error: on the development CPU's
#: profile (2,051 kernels), 150 boosting rounds at rate 0.1 and 100 randomised trees had
#: the CV error of 400 rounds at 0.05 and 300 trees within 0.3 points in every family with
#: over 80 rows, at a third of the prediction time (about 4 instead of 12 us per kernel).
L3_CANDIDATES: dict[str, Any] = {
    "gp": _gp,
    "gbm": _gbm,
    "extra_trees": _extra_trees,
    "ridge2": lambda: make_pipeline(
        StandardScaler(), PolynomialFeatures(2), RidgeCV(alphas=np.logspace(-4, 3, 15))
    ),
    "trend_gbm": lambda: TrendPlusResidual(residual="gbm"),
    "trend_extra_trees": lambda: TrendPlusResidual(residual="extra_trees"),
}

#: averages L3 may try beside the single forms (``FittedCostModel(averaged_top=...)``): the
#: mean log efficiency of the best k forms by grouped CV, for each k given (``AveragedForms``;
#: named ``avg:<form>+<form>...`` in ``chosen_``), chosen only where its own grouped-CV error
#: (the same folds' predictions, averaged) is the lowest. Forms that err differently on shapes
#: they have not seen may cancel part of each other's error (model averaging: Breiman 1996,
#: "Stacked regressions"; Hastie, Tibshirani and Friedman, *The Elements of Statistical
#: Learning*, 2nd ed., section 8.8). Off by default: scored on the suites the experiments leave
#: out (``scripts/bench_l3_averaging.py``, EPYC profiles, 2026-12-07) with (2, 3) it moved the
#: pooled held-out median APE from 9.8 to 10.0% (two threads) and 13.1 to 13.7% (one thread), by
#: suite from -3.9 to +1.2 points. 21 of the 27 averages CV chose were within 5% of the best
#: single form's CV error, near ties; keeping only the other 6 gave 9.7% and 13.1%.
AVERAGED_TOP: tuple[int, ...] = ()
AVERAGE_PREFIX = "avg:"


class AveragedForms(RegressorMixin, BaseEstimator):
    """The mean of several L3 forms' predictions of log efficiency (a geometric mean of their
    predicted times), each fitted on the same rows."""

    def __init__(self, forms: tuple[str, ...] = ("gp", "extra_trees")) -> None:
        self.forms = forms

    def fit(self, X: np.ndarray, y: np.ndarray) -> "AveragedForms":
        unknown = [f for f in self.forms if f not in L3_CANDIDATES]
        if len(self.forms) < 2 or unknown:
            raise ValueError(f"forms: at least two of {list(L3_CANDIDATES)}, got {list(self.forms)}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.models_ = [L3_CANDIDATES[f]().fit(X, y) for f in self.forms]
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return np.mean([m.predict(X) for m in self.models_], axis=0)


def averaged_name(forms: Sequence[str]) -> str:
    return AVERAGE_PREFIX + "+".join(forms)


def make_form(name: str) -> Any:
    """An unfitted L3 form by the name ``chosen_`` stores: one of ``L3_CANDIDATES`` or an average."""
    if name.startswith(AVERAGE_PREFIX):
        return AveragedForms(tuple(name[len(AVERAGE_PREFIX):].split("+")))
    return L3_CANDIDATES[name]()


class EdgeEfficiency(RegressorMixin, BaseEstimator):
    """A constant log efficiency: the median over the largest ``top_share`` of the training
    kernels by roofline time (the family's edge). Beyond the range a kernel is assumed to run
    as efficiently as the largest ones measured: what a performance engineer does by hand."""

    def __init__(self, *, top_share: float = 0.1) -> None:
        self.top_share = top_share

    def fit(self, X: np.ndarray, y: np.ndarray) -> "EdgeEfficiency":
        size = np.asarray(X)[:, ROOFLINE_FEATURE]
        top = size >= np.quantile(size, 1.0 - self.top_share)
        self.value_ = float(np.median(np.asarray(y)[top]))
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return np.full(len(X), self.value_)


class RooflineEfficiency(RegressorMixin, BaseEstimator):
    """Log efficiency 0: the roofline itself (L2), within the clip to the family's measured
    efficiencies that every L3 prediction gets (``CLIP_MARGIN_DECADES``)."""

    def fit(self, X: np.ndarray, y: np.ndarray) -> "RooflineEfficiency":
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return np.zeros(len(X))


#: column of ``family_features``' matrix holding log roofline time (the kernel's size on the
#: device's roofline; the common features come first, in this order)
ROOFLINE_FEATURE = 3

#: forms tried for queries *outside* the fitted range (``FittedCostModel`` docstring): the
#: in-range winner itself ("same"), a linear trend alone, the trend-plus-trees forms, the
#: efficiency of the largest measured kernels ("edge") and the roofline ("roofline"). On the
#: fit report's extrapolation split the roofline L2 beat every fitted form for gemm (37% vs
#: 56%) and gather (43% vs 112%) on the EPYC profile: the constants keep that option open.
EXTRAPOLATOR_CANDIDATES: dict[str, Any] = {
    "ridge1": _ridge1,
    "trend_gbm": L3_CANDIDATES["trend_gbm"],
    "trend_extra_trees": L3_CANDIDATES["trend_extra_trees"],
    "edge": EdgeEfficiency,
    "roofline": RooflineEfficiency,
}
#: an extrapolator replaces the in-range winner only where its nested-split error is at most
#: this share of the winner's: a near tie is noise of a 20% split (on hf_moe's kernels,
#: elementwise's ridge1, chosen on a near tie, raised the kernel median from 36.5% to 40.4%)
EXTRAPOLATOR_MARGIN = 0.9
#: the nested extrapolation split that chooses the extrapolator: training rows whose work
#: (FLOPs, or bytes for kernels without FLOPs) lies above this quantile are its test set
EXTRAPOLATION_SPLIT_QUANTILE = 0.8


def shape_groups(X: pd.DataFrame) -> np.ndarray:
    """Group id per row: the shape without implementation choices (backend, impl, reduce).

    Held-out splits and CV folds keep all rows of one shape together, so a test shape is
    never seen in training under another backend or as a repeated row.
    """
    ignore = {"key", "backend", "impl", "reduce", "tag", "suite", "measured_at"}
    shape_cols = [c for c in X.columns if c not in ignore and c in _DESCRIPTOR_COLUMNS]
    return pd.util.hash_pandas_object(X[shape_cols].astype(str), index=False).to_numpy()


_DESCRIPTOR_COLUMNS = {
    "family", "m", "k", "n", "dtype", "tokens_per_expert", "num_rows", "width", "num_src", "num_dst",
    "index_cv", "sorted", "nnz", "op", "numel", "rows", "cols", "bins", "reduced",
}


class FittedCostModel(RegressorMixin, BaseEstimator):
    """L3: per-family regression of log10(latency / roofline) on shape features.

    Two models per family. Inside the fitted range (every range feature within what was
    measured) the form chosen by grouped CV (``chosen_``) predicts. Outside it, a form chosen
    by how well it extrapolates (``extrapolator_``): fitted on the family's smaller kernels
    (work up to the ``EXTRAPOLATION_SPLIT_QUANTILE``) and scored on its larger ones, among
    the in-range winner ("same") and ``EXTRAPOLATOR_CANDIDATES``. Interpolation and
    extrapolation reward different forms: trees win inside the range and predict a flat
    efficiency beyond it, where a trend in log features carries the measured slope on (on
    the EPYC profile's fit report, gemm's extrapolation error was 86% with the CV winner
    alone, against 37% for the roofline).
    """

    def __init__(
        self,
        *,
        ceilings: Mapping[str, Any] | None = None,
        candidates: tuple[str, ...] = ("gp", "gbm", "extra_trees", "ridge2", "trend_gbm", "trend_extra_trees"),
        cv_folds: int = 4,
        averaged_top: tuple[int, ...] = AVERAGED_TOP,
    ) -> None:
        self.ceilings = ceilings
        self.candidates = candidates
        self.cv_folds = cv_folds
        self.averaged_top = averaged_top

    def _target(self, X: pd.DataFrame, y: Any) -> np.ndarray:
        return log_efficiency(X, y, self.ceilings_)

    def fit(self, X: pd.DataFrame, y: Any) -> "FittedCostModel":
        with threadpool_limits(limits=NATIVE_THREADS):
            return self._fit(X, y)

    def _fit(self, X: pd.DataFrame, y: Any) -> "FittedCostModel":
        _check_table(X)
        for c in self.candidates:
            if c not in L3_CANDIDATES:
                raise ValueError(f"L3 candidates must be among {list(L3_CANDIDATES)}, got {c!r}")
        if self.cv_folds < 2:
            raise ValueError(f"cv_folds must be >= 2, got {self.cv_folds}")
        if any(not isinstance(k, (int, np.integer)) or k < 2 for k in self.averaged_top):
            raise ValueError(f"averaged_top: forms per average, each an integer >= 2, got {list(self.averaged_top)}")
        self.ceilings_ = dict(_ceilings(self.ceilings))
        y = np.asarray(y, dtype=np.float64)
        target = self._target(X, y)
        groups = shape_groups(X)
        self.models_: dict[str, Any] = {}
        self.chosen_: dict[str, str] = {}
        self.cv_median_ape_pct_: dict[str, dict[str, float]] = {}
        self.feature_ranges_: dict[str, dict[str, tuple[float, float]]] = {}
        self.feature_names_: dict[str, list[str]] = {}
        self.target_range_: dict[str, tuple[float, float]] = {}
        self.extrapolators_: dict[str, Any] = {}
        self.extrapolator_: dict[str, str] = {}
        self.extrapolation_cv_median_ape_pct_: dict[str, dict[str, float]] = {}
        work = kernel_work(X)
        for family, idx in X.groupby("family").indices.items():
            rows = X.iloc[idx]
            feats = family_features(rows, family, self.ceilings_)
            self.feature_names_[family] = list(feats.columns)
            checked = range_features(family)
            self.feature_ranges_[family] = {
                c: (float(feats[c].min()), float(feats[c].max())) for c in feats.columns if c in checked
            }
            t = target[idx]
            self.target_range_[family] = (float(t.min()) - CLIP_MARGIN_DECADES, float(t.max()) + CLIP_MARGIN_DECADES)
            n_groups = len(np.unique(groups[idx]))
            if len(idx) < MIN_ROWS_FOR_CV or n_groups < self.cv_folds:
                self.models_[family] = float(np.median(t))
                self.chosen_[family] = "median_efficiency"
                continue
            scores = self._cv_scores(feats.to_numpy(), t, y[idx], groups[idx])
            best = min(scores, key=scores.get)
            self.cv_median_ape_pct_[family] = scores
            self.chosen_[family] = best
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # GP optimiser convergence chatter
                self.models_[family] = make_form(best).fit(feats.to_numpy(), t)
            self._fit_extrapolator(family, best, feats.to_numpy(), t, y[idx], work[idx])
        return self

    def _fit_extrapolator(self, family: str, best: str, F: np.ndarray, t: np.ndarray, y: np.ndarray,
                          work: np.ndarray) -> None:
        """Choose and fit the family's form for queries outside the fitted range: each
        candidate is fitted on the rows up to the work quantile and scored (median APE) on
        the rows above it; "same" keeps the in-range winner."""
        larger = work > np.quantile(work, EXTRAPOLATION_SPLIT_QUANTILE)
        if larger.sum() < 2 or (~larger).sum() < MIN_ROWS_FOR_CV:
            self.extrapolator_[family] = "same"
            return
        forms = {"same": lambda: make_form(best), **EXTRAPOLATOR_CANDIDATES}
        lo, hi = t[~larger].min() - CLIP_MARGIN_DECADES, t[~larger].max() + CLIP_MARGIN_DECADES
        scores = {}
        for name, make in forms.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = make().fit(F[~larger], t[~larger])
            predicted = y[larger] / 10 ** t[larger] * 10 ** np.clip(model.predict(F[larger]), lo, hi)
            scores[name] = float(np.median(ape_pct(predicted, y[larger])))
        choice = min(scores, key=scores.get)
        if scores[choice] > EXTRAPOLATOR_MARGIN * scores["same"]:
            choice = "same"
        self.extrapolation_cv_median_ape_pct_[family] = scores
        self.extrapolator_[family] = choice
        if choice != "same" and choice != best:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.extrapolators_[family] = forms[choice]().fit(F, t)

    def _cv_scores(self, F: np.ndarray, t: np.ndarray, y: np.ndarray, groups: np.ndarray) -> dict[str, float]:
        """Median APE under grouped K-fold CV of every candidate form, then of the average of the
        best k of them for each k of ``averaged_top`` (the same folds' predictions, averaged in
        log efficiency: no extra fit)."""
        folds = list(GroupKFold(n_splits=self.cv_folds).split(F, t, groups))
        log_eff = {name: self._cv_log_efficiency(name, F, t, folds) for name in self.candidates}
        roofline = y / 10 ** t

        def score(predicted_log_eff: np.ndarray) -> float:
            return float(np.median(ape_pct(roofline * 10 ** predicted_log_eff, y)))

        scores = {name: score(e) for name, e in log_eff.items()}
        ranked = sorted(scores, key=scores.get)
        for k in sorted(set(self.averaged_top)):
            if k > len(ranked):  # more forms than there are candidates: nothing to average
                continue
            top = ranked[:k]
            scores[averaged_name(top)] = score(np.mean([log_eff[name] for name in top], axis=0))
        return scores

    @staticmethod
    def _cv_log_efficiency(name: str, F: np.ndarray, t: np.ndarray, folds: Sequence[tuple[np.ndarray, np.ndarray]]
                           ) -> np.ndarray:
        """Each row's log efficiency predicted by ``name`` fitted on the folds without it (clipped
        to the training rows' range, as ``predict`` clips)."""
        out = np.empty(len(t))
        for train, test in folds:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = L3_CANDIDATES[name]().fit(F[train], t[train])
            lo, hi = t[train].min() - CLIP_MARGIN_DECADES, t[train].max() + CLIP_MARGIN_DECADES
            out[test] = np.clip(model.predict(F[test]), lo, hi)
        return out

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        with threadpool_limits(limits=NATIVE_THREADS):
            return self._predict(X)

    def _predict(self, X: pd.DataFrame) -> np.ndarray:
        _check_table(X)
        missing = set(X["family"].unique()) - set(self.models_)
        if missing:
            raise ValueError(
                f"L3 was fitted without families {sorted(missing)}; measure them "
                f"(python -m costmodel bench bench.families=[{','.join(sorted(missing))}]) and refit"
            )
        roof = roofline_time_s(X["flops"].to_numpy(float), X["bytes_moved"].to_numpy(float), self.ceilings_)
        log_eff = np.empty(len(X))
        for family, idx in X.groupby("family").indices.items():
            model = self.models_[family]
            if isinstance(model, float):
                log_eff[idx] = model
                continue
            feats = family_features(X.iloc[idx], family, self.ceilings_)
            self._warn_out_of_range(family, feats)
            lo, hi = self.target_range_[family]
            # forests spread their trees over all cores on large batches only (read by joblib,
            # so the fitted estimator itself is left as it was fitted)
            F = feats.to_numpy()
            with joblib.parallel_config(n_jobs=-1 if len(idx) >= PARALLEL_PREDICT_ROWS else 1):
                log_eff[idx] = np.clip(model.predict(F), lo, hi)
                extrapolator = getattr(self, "extrapolators_", {}).get(family)
                if extrapolator is not None:
                    outside = np.zeros(len(idx), dtype=bool)
                    for mask in self._outside(family, feats).values():
                        outside |= mask
                    if outside.any():
                        log_eff[idx[outside]] = np.clip(extrapolator.predict(F[outside]), lo, hi)
        return roof * 10**log_eff

    def _outside(self, family: str, feats: pd.DataFrame) -> dict[str, np.ndarray]:
        """Per range feature, which rows lie outside the fitted range (2% of it as tolerance)."""
        return outside_masks(feats, self.feature_ranges_.get(family, {}), rel_tol=0.02, abs_tol=1e-9)

    def _warn_out_of_range(self, family: str, feats: pd.DataFrame) -> None:
        for name, outside in self._outside(family, feats).items():
            if outside.any():
                lo, hi = self.feature_ranges_[family][name]
                bad = feats[name].to_numpy()[outside]
                warnings.warn(
                    f"{family}: {int(outside.sum())} queries have {name} in [{bad.min():.3g}, {bad.max():.3g}], "
                    f"outside the fitted range [{lo:.3g}, {hi:.3g}]: extrapolating",
                    ExtrapolationWarning,
                    stacklevel=3,
                )

    def coverage(self, X: pd.DataFrame) -> dict[str, dict[str, Any]]:
        """How much of a kernel table lies inside what the model was fitted on, per family:
        ``rows``, ``in_range_pct`` (rows whose every range feature is inside the fitted range,
        the test behind ``ExtrapolationWarning``) and, per feature with rows outside,
        ``{"fitted": [lo, hi], "queried": [lo, hi], "outside_pct"}`` (log10 sizes)."""
        _check_table(X)
        report: dict[str, dict[str, Any]] = {}
        for family, idx in X.groupby("family").indices.items():
            feats = family_features(X.iloc[idx], family, self.ceilings_)
            outside = self._outside(family, feats)
            any_out = np.zeros(len(idx), dtype=bool)
            features = {}
            for name, mask in outside.items():
                any_out |= mask
                if mask.any():
                    values = feats[name].to_numpy()
                    features[name] = {"fitted": [round(v, 3) for v in self.feature_ranges_[family][name]],
                                      "queried": [round(float(values.min()), 3), round(float(values.max()), 3)],
                                      "outside_pct": round(100 * float(mask.mean()), 2)}
            report[family] = {"rows": int(len(idx)), "in_range_pct": round(100 * float(1 - any_out.mean()), 2),
                              "fitted": family in self.models_, "features_outside": features}
        return report


class ExtrapolationWarning(UserWarning):
    """A prediction was asked for outside the range the model was fitted on."""


def make_levels(ceilings: Mapping[str, Any], *, cv_folds: int = 4) -> dict[str, BaseEstimator]:
    """Unfitted L0-L3 for a device's ceilings."""
    return {
        "L0": FlopsOverPeak(ceilings=ceilings),
        "L1": FamilyAchievedRate(),
        "L2": Roofline(ceilings=ceilings),
        "L3": FittedCostModel(ceilings=ceilings, cv_folds=cv_folds),
    }


def clone_level(model: BaseEstimator) -> BaseEstimator:
    return clone(model)
