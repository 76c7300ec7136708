"""Collective cost models: L2 latency-bandwidth (Hockney) and L3 fitted regression, per op.

L2 (Hockney, "The communication challenge for MPP: Intel Paragon and Meiko CS-2", Parallel
Computing 20(3), 1994; the alpha-beta model of Thakur, Rabenseifner & Gropp, "Optimization of
collective communication operations in MPICH", IJHPCA 19(1), 2005):

    t_rank = alpha_op + bytes_moved_rank / beta_op

with ``bytes_moved_rank`` from ``costmodel.collectives.spec`` (NCCL-tests' bus-bandwidth
factors; all_to_all: the rank's off-diagonal send + receive bytes). alpha >= 0 and beta > 0
are fitted per op by non-negative least squares on *relative* residuals ((pred - t) / t),
so 256 B calls weigh as much as 16 MiB ones (plain least squares would let the largest
sizes set alpha).

L3: a scikit-learn regressor per op on log seconds, features per rank (``rank_features``):
log2 bytes sent and received, the share kept home (``home_share``), log2 bytes moved, the
max over ranks of bytes moved, the imbalance max/mean of bytes moved, and the world size.
Candidate classes (``CANDIDATES``), chosen per op by grouped cross-validation with groups =
the suite's message size (a size is never both trained and scored; score: mean
|log(pred / measured)|): ridge on the residual over L2 in log space at two strengths
(extrapolates like L2), quadratic ridge, shallow gradient boosting, and the L2 line itself
(so a profile whose extra features only carry noise gets L2 back rather than a worse fit).

L3 never extrapolates on its own: a call whose features lie outside the box the op was
measured over (``ranges[op]["features"]``: each feature's min and max) is predicted at the
nearest point of the box (each feature clipped into its measured range) and carried to the
call along the L2 line, ``L3(x) = L3(clip(x)) * L2(x) / L2(clip(x))``. Without it a quadratic
fitted over calls that all keep some bytes home answered a pure exchange (nothing home, the
halo pattern of a partitioned GNN layer) 17x too fast. ``extrapolating`` names every feature
outside the box.

One model per timing protocol (``costmodel.collectives.suite``): ``warm`` fits each row's
median over calls made back to back; ``step`` fits the mean of calls made as a layer's step
makes them (after an eviction, a barrier and local work), the statistic that adds up when a
step holds several calls with a heavy tail. A step of a multi-rank layer asks for ``step``.

``CollectiveModel`` answers per-rank seconds for a send matrix or an (op, bytes) pair;
``load_collective_model`` fits one from this host's collective profile;
``make_latency_bandwidth_model`` builds an L2-only model from given alpha and beta (tests,
predict-only what-ifs at a larger W).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import nnls
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.linear_model import Ridge
from sklearn.model_selection import GroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import PolynomialFeatures, StandardScaler
from sklearn.utils.validation import check_is_fitted

from costmodel.collectives.spec import (OPS, CollectiveSpecError, all_to_all_bytes, bus_factor, check_bytes,
                                        check_send_matrix, check_world_size, uniform_send_matrix)
from costmodel.collectives.store import CollectiveProfile, CollectiveProfileError, folder_for
from costmodel.model.feature_ranges import clip_to_ranges, outside_masks

LEVELS = ("L2", "L3")
#: the statistic each timing protocol's rows are fitted on
TARGETS = {"warm": "median_s", "step": "mean_s"}
FEATURES = ("log_sent", "log_recv", "home_share", "log_moved", "log_max_moved", "imbalance", "world_size")
_MIN_ROWS = 3  # an op with fewer rows has no fit


# ----------------------------------------------------------------------------- features


def home_share(home, sent) -> np.ndarray:
    """The share of a rank's all-to-all bytes that stay home, home / (home + sent) (0 when it
    has none): a bounded feature, so a call's mix of home and peer bytes is compared with the
    measured mixes at any size (log2 bytes kept home put a pure exchange of 8 MB next to
    256 B calls)."""
    home, sent = np.asarray(home, dtype=float), np.asarray(sent, dtype=float)
    total = home + sent
    return np.divide(home, total, out=np.zeros_like(total), where=total > 0)


def rank_features(sent, recv, home, world_size) -> pd.DataFrame:
    """Per-rank model columns from per-rank byte vectors (one call = one group of W rows)."""
    sent, recv, home = (np.asarray(x, dtype=float) for x in (sent, recv, home))
    moved = sent + recv
    mean = moved.mean()
    return pd.DataFrame({
        "log_sent": np.log2(1 + sent), "log_recv": np.log2(1 + recv), "home_share": home_share(home, sent),
        "log_moved": np.log2(1 + moved), "log_max_moved": np.full(len(moved), np.log2(1 + moved.max())),
        "imbalance": np.full(len(moved), (moved.max() + 1) / (mean + 1)),
        "world_size": np.full(len(moved), float(world_size)),
    })


#: features ``extrapolating`` reports through its own checks (world size, bytes moved, imbalance)
ALREADY_CHECKED = ("log_moved", "log_max_moved", "imbalance", "world_size")
#: how ``extrapolating`` names a feature (log2(1 + bytes) features are reported in bytes)
FEATURE_WORDS = {"log_sent": "bytes sent per rank", "log_recv": "bytes received per rank",
                 "home_share": "share of a rank's bytes kept home", "log_moved": "bytes moved per rank",
                 "log_max_moved": "max bytes moved per rank", "imbalance": "imbalance", "world_size": "world size"}


def _feature_value(column: str, value: float) -> float:
    """A feature's value in the unit ``FEATURE_WORDS`` names (bytes for the log2 columns)."""
    return float(np.exp2(value) - 1) if column.startswith("log_") else float(value)


def _outside(feats: pd.DataFrame, box: dict[str, tuple[float, float]]) -> list[tuple[str, tuple[float, float], float]]:
    """(column, measured range, the farthest value outside it) for each column of ``feats`` beyond ``box``."""
    out = []
    for c, mask in outside_masks(feats, box, rel_tol=1e-6, abs_tol=1e-15).items():
        if mask.any():
            lo, hi = box[c]
            v = feats[c].to_numpy(float)
            out.append((c, (lo, hi), float(v.min() if v.min() < lo else v.max())))
    return out


def frame_features(rows: pd.DataFrame) -> pd.DataFrame:
    """The same columns for profile rows (each row already carries its call's max)."""
    moved = rows["bytes_moved"].to_numpy(float)
    mean = rows.groupby(["run_id", "key"])["bytes_moved"].transform("mean").to_numpy(float)
    return pd.DataFrame({
        "log_sent": np.log2(1 + rows["bytes_sent"].to_numpy(float)),
        "log_recv": np.log2(1 + rows["bytes_recv"].to_numpy(float)),
        "home_share": home_share(rows["bytes_home"].to_numpy(float), rows["bytes_sent"].to_numpy(float)),
        "log_moved": np.log2(1 + moved),
        "log_max_moved": np.log2(1 + rows["max_rank_bytes_moved"].to_numpy(float)),
        "imbalance": (rows["max_rank_bytes_moved"].to_numpy(float) + 1) / (mean + 1),
        "world_size": rows["world_size"].to_numpy(float),
    }, index=rows.index)


def _moved_from_features(X: pd.DataFrame) -> np.ndarray:
    return np.exp2(np.asarray(X["log_moved"], dtype=float)) - 1


# ----------------------------------------------------------------------------- estimators


class LatencyBandwidth(RegressorMixin, BaseEstimator):
    """t = alpha + bytes / beta (Hockney), fitted on relative residuals with alpha, 1/beta >= 0.

    ``fit(X, y)``: X a column of bytes moved (or a frame with ``log_moved``), y seconds.
    """

    def __init__(self, *, min_alpha_s: float = 0.0):
        self.min_alpha_s = min_alpha_s

    @staticmethod
    def _bytes(X) -> np.ndarray:
        if isinstance(X, pd.DataFrame) and "log_moved" in X:
            return _moved_from_features(X)
        return np.asarray(X, dtype=float).reshape(-1)

    def fit(self, X, y):
        b, t = self._bytes(X), np.asarray(y, dtype=float).reshape(-1)
        if len(b) != len(t) or len(t) < 2 or np.any(t <= 0):
            raise ValueError(f"LatencyBandwidth.fit needs >= 2 rows of positive seconds, got {len(t)}")
        A = np.column_stack([np.ones_like(b), b]) / t[:, None]
        coef, _ = nnls(A, np.ones_like(t))
        self.alpha_s_ = max(float(coef[0]), self.min_alpha_s)
        self.inv_beta_s_per_byte_ = float(coef[1])
        self.beta_bytes_per_s_ = float("inf") if coef[1] == 0 else 1.0 / float(coef[1])
        return self

    def predict(self, X) -> np.ndarray:
        check_is_fitted(self, "alpha_s_")
        return self.alpha_s_ + self._bytes(X) * self.inv_beta_s_per_byte_


class LogResidualOverL2(RegressorMixin, BaseEstimator):
    """log t = log L2(t) + ridge(features): learns what the alpha-beta line misses, so far
    from the data it falls back towards L2 instead of towards a constant."""

    def __init__(self, *, alpha: float = 1.0):
        self.alpha = alpha

    def fit(self, X, y):
        y = np.asarray(y, dtype=float)
        self.l2_ = LatencyBandwidth().fit(X, y)
        self.ridge_ = make_pipeline(StandardScaler(), Ridge(alpha=self.alpha)).fit(
            X, np.log(y) - np.log(self.l2_.predict(X)))
        return self

    def predict(self, X) -> np.ndarray:
        check_is_fitted(self, "ridge_")
        return self.l2_.predict(X) * np.exp(self.ridge_.predict(X))


class LogTarget(RegressorMixin, BaseEstimator):
    """Fit ``regressor`` on log seconds, predict seconds."""

    def __init__(self, *, regressor=None):
        self.regressor = regressor

    def fit(self, X, y):
        self.regressor_ = clone(self.regressor).fit(X, np.log(np.asarray(y, dtype=float)))
        return self

    def predict(self, X) -> np.ndarray:
        check_is_fitted(self, "regressor_")
        return np.exp(self.regressor_.predict(X))


def candidates() -> dict[str, BaseEstimator]:
    """L3 model classes tried per op (selected by grouped held-out error)."""
    return {
        "alpha_beta": LatencyBandwidth(),  # L2 itself: chosen when the features only fit noise
        "residual_ridge": LogResidualOverL2(alpha=1.0),
        "residual_ridge_strong": LogResidualOverL2(alpha=30.0),  # close to L2: for noisy profiles
        "poly2_ridge": LogTarget(regressor=make_pipeline(StandardScaler(), PolynomialFeatures(2), Ridge(alpha=1.0))),
        "gbr": LogTarget(regressor=GradientBoostingRegressor(n_estimators=150, max_depth=2, learning_rate=0.1,
                                                             min_samples_leaf=2, random_state=0)),
    }


def ape(pred, meas) -> np.ndarray:
    pred, meas = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    return np.abs(pred - meas) / meas


def select_l3(X: pd.DataFrame, y: np.ndarray, groups: np.ndarray, *, n_splits: int = 3) -> tuple[str, dict]:
    """The candidate with the lowest mean held-out |log(pred / measured)| over
    GroupKFold(groups) (a log error: a 5x miss costs what it is, where a median APE would hide
    the tail); its scores."""
    k = min(n_splits, len(np.unique(groups)))
    scores: dict[str, float] = {}
    for name, est in candidates().items():
        if k < 2:
            scores[name] = float("nan")
            continue
        errs = []
        for tr, te in GroupKFold(n_splits=k).split(X, y, groups):
            pred = clone(est).fit(X.iloc[tr], y[tr]).predict(X.iloc[te])
            errs.append(np.abs(np.log(np.maximum(pred, 1e-12) / y[te])))
        scores[name] = float(np.mean(np.concatenate(errs)))
    finite = {n: s for n, s in scores.items() if np.isfinite(s)}
    best = min(finite, key=finite.get) if finite else "residual_ridge"
    return best, scores


# ----------------------------------------------------------------------------- the model


@dataclass
class CollectiveModel:
    """Per-rank seconds of collectives on ``world_size`` ranks of ``backend``."""

    world_size: int
    backend: str
    fingerprint: dict[str, Any]
    l2: dict[str, LatencyBandwidth]  # per op
    l3: dict[str, BaseEstimator] = field(default_factory=dict)  # per op
    l3_class: dict[str, str] = field(default_factory=dict)  # per op: the chosen candidate's name
    ranges: dict[str, dict[str, float]] = field(default_factory=dict)  # per op: measured min/max
    measured_world_sizes: tuple[int, ...] = ()
    protocol: str = "warm"  # the timing protocol of the rows it was fitted on (TARGETS)

    @property
    def levels(self) -> tuple[str, ...]:
        return LEVELS if self.l3 else ("L2",)

    def _check(self, op: str, level: str) -> None:
        if level not in self.levels:
            raise ValueError(f"level must be one of {list(self.levels)} for this model, got {level!r}")
        table = self.l2 if level == "L2" else self.l3
        if op not in table:
            raise ValueError(f"op must be one of {sorted(table)} (measured for {level}), got {op!r}")

    def _predict(self, op: str, feats: pd.DataFrame, level: str) -> np.ndarray:
        self._check(op, level)
        if level == "L2":
            return np.asarray(self.l2[op].predict(feats), dtype=float)
        box = self.ranges.get(op, {}).get("features")
        if not box:
            return np.asarray(self.l3[op].predict(feats), dtype=float)
        inside = clip_to_ranges(feats, box)
        scale = np.asarray(self.l2[op].predict(feats), dtype=float) / np.maximum(
            np.asarray(self.l2[op].predict(inside), dtype=float), 1e-12)
        return np.asarray(self.l3[op].predict(inside), dtype=float) * scale

    def predict_all_to_all_s(self, send_bytes: np.ndarray, level: str = "L3") -> np.ndarray:
        """Seconds each rank spends in ``all_to_all_single`` for a [W, W] send matrix (bytes)."""
        m = check_send_matrix(send_bytes)
        b = all_to_all_bytes(m)
        return self._predict("all_to_all", rank_features(b["sent"], b["recv"], b["home"], m.shape[0]), level)

    def predict_s(self, op: str, bytes_per_rank: float, level: str = "L3") -> float:
        """Seconds of one call with n = ``bytes_per_rank`` (NCCL-tests' size; for all_to_all: each
        rank sends n split evenly over all ranks); the slowest rank's, for a symmetric call."""
        if op not in OPS:
            raise CollectiveSpecError(f"op must be one of {list(OPS)}, got {op!r}")
        n = check_bytes(bytes_per_rank, field_name="bytes_per_rank")
        if op == "all_to_all":
            return float(self.predict_all_to_all_s(uniform_send_matrix(n, self.world_size), level).max())
        moved = bus_factor(op, self.world_size) * n
        w = self.world_size
        feats = rank_features([moved / 2] * w, [moved / 2] * w, [0.0] * w, w)
        return float(self._predict(op, feats, level).max())

    def extrapolating(self, send_bytes, op: str = "all_to_all") -> str | None:
        """A sentence when the call lies outside what was measured (world size, bytes moved per
        rank, imbalance, and for a send matrix the share kept home), else None. ``send_bytes``:
        a [W, W] matrix, or n for ``op``."""
        matrix_bytes = None
        if op == "all_to_all" and np.ndim(send_bytes) == 2:
            m = check_send_matrix(send_bytes)
            w = m.shape[0]
            matrix_bytes = all_to_all_bytes(m)
            moved = matrix_bytes["moved"]
        else:
            n = check_bytes(send_bytes, field_name="send_bytes")
            w = self.world_size
            moved = (all_to_all_bytes(uniform_send_matrix(n, w))["moved"] if op == "all_to_all"
                     else np.full(w, bus_factor(op, w) * n))
        why = []
        if self.measured_world_sizes and w not in self.measured_world_sizes:
            why.append(f"world size {w} was not measured (measured: {list(self.measured_world_sizes)})")
        r = self.ranges.get(op)
        if r is None:
            why.append(f"{op} was not measured (this model is {self.describe_source()})")
        else:
            lo, hi = float(moved.min()), float(moved.max())
            if lo < r["min_bytes_moved"] or hi > r["max_bytes_moved"]:
                why.append(f"bytes moved per rank {lo:.0f}..{hi:.0f} lie outside the measured "
                           f"{r['min_bytes_moved']:.0f}..{r['max_bytes_moved']:.0f}")
            imb = (moved.max() + 1) / (moved.mean() + 1)
            if imb > r.get("max_imbalance", np.inf) * 1.001:
                why.append(f"imbalance (max/mean bytes moved) {imb:.2f} exceeds the measured {r['max_imbalance']:.2f}")
            if matrix_bytes is not None and r.get("features"):
                b = matrix_bytes
                feats = rank_features(b["sent"], b["recv"], b["home"], w)
                why += [f"{FEATURE_WORDS.get(c, c)} {_feature_value(c, v):.3g} lies outside the measured "
                        f"{_feature_value(c, lo):.3g}..{_feature_value(c, hi):.3g} (L3 follows L2 from the nearest "
                        "measured call)" for c, (lo, hi), v in _outside(feats, r["features"])
                        if c not in ALREADY_CHECKED]
        return ("extrapolating " + op + ": " + "; ".join(why)) if why else None

    def describe_source(self) -> str:
        return str(self.fingerprint.get("source", self.fingerprint.get("id", "a collective profile")))


def make_latency_bandwidth_model(alpha_s: float, beta_bytes_per_s: float, world_size: int, *,
                                 backend: str = "gloo") -> CollectiveModel:
    """An L2-only ``CollectiveModel`` with the same alpha and beta for every op (levels ("L2",);
    asking it for L3 is a ValueError naming its levels). No measured range: ``extrapolating``
    always says so."""
    w = check_world_size(world_size)
    ok_a = isinstance(alpha_s, (int, float)) and np.isfinite(alpha_s) and alpha_s >= 0
    if not ok_a:
        raise CollectiveSpecError(f"alpha_s must be a finite number of seconds >= 0, got {alpha_s!r}")
    ok_b = isinstance(beta_bytes_per_s, (int, float)) and np.isfinite(beta_bytes_per_s) and beta_bytes_per_s > 0
    if not ok_b:
        raise CollectiveSpecError(f"beta_bytes_per_s must be a finite number of bytes/s > 0, got {beta_bytes_per_s!r}")
    l2 = {}
    for op in OPS:
        est = LatencyBandwidth()
        est.alpha_s_, est.inv_beta_s_per_byte_, est.beta_bytes_per_s_ = float(alpha_s), 1.0 / beta_bytes_per_s, \
            float(beta_bytes_per_s)
        l2[op] = est
    fp = {"source": f"latency-bandwidth what-if (alpha={alpha_s:g} s, beta={beta_bytes_per_s:g} B/s)",
          "backend": backend, "world_size": w}
    return CollectiveModel(world_size=w, backend=backend, fingerprint=fp, l2=l2)


# ----------------------------------------------------------------------------- fitting


def check_protocol(protocol: object) -> str:
    if protocol not in TARGETS:
        raise CollectiveSpecError(f"protocol must be one of {list(TARGETS)}, got {protocol!r}")
    return str(protocol)


def training_rows(frame: pd.DataFrame, protocol: str = "warm") -> pd.DataFrame:
    """Profile rows of ``protocol`` usable for fitting (a positive statistic), with ``target_s``
    (the protocol's statistic, ``TARGETS``) and ``group`` (message size) columns."""
    target = TARGETS[check_protocol(protocol)]
    kind = frame["protocol"] if "protocol" in frame else pd.Series("warm", index=frame.index)
    stat = pd.to_numeric(frame[target], errors="coerce") if target in frame else pd.Series(np.nan, index=frame.index)
    rows = frame[(kind == protocol) & (stat > 0)].copy()
    rows["target_s"] = stat[rows.index].astype(float)
    rows["group"] = rows["nominal_bytes"].astype(float)
    return rows.reset_index(drop=True)


def fit_collective_model(frame: pd.DataFrame, fingerprint: dict[str, Any], *, world_size: int,
                         backend: str = "gloo", protocol: str = "warm") -> CollectiveModel:
    """L2 and L3 per op from profile rows (``CollectiveProfile.measurements()``) of ``protocol``."""
    rows = training_rows(frame, protocol)
    l2, l3, l3_class, ranges = {}, {}, {}, {}
    for op, part in rows.groupby("op"):
        if len(part) < _MIN_ROWS:
            continue
        X, y = frame_features(part), part["target_s"].to_numpy(float)
        l2[op] = LatencyBandwidth().fit(X, y)
        name, _ = select_l3(X, y, part["group"].to_numpy())
        l3[op] = clone(candidates()[name]).fit(X, y)
        l3_class[op] = name
        ranges[op] = {"min_bytes_moved": float(part["bytes_moved"].min()),
                      "max_bytes_moved": float(part["bytes_moved"].max()),
                      "max_imbalance": float(X["imbalance"].max()),
                      "features": {c: (float(X[c].min()), float(X[c].max())) for c in X.columns}}
    if not l2:
        raise CollectiveProfileError(f"no op has {_MIN_ROWS} measured rows of the {protocol!r} protocol to fit in "
                                     f"{fingerprint.get('source')}" + (" (a profile measured before the step protocol: "
                                     "measure it again with python -m costmodel.collectives bench)"
                                     if protocol != "warm" else ""))
    sizes = tuple(sorted({int(x) for x in rows["world_size"]}))
    return CollectiveModel(world_size=world_size, backend=backend, fingerprint=fingerprint, l2=l2, l3=l3,
                           l3_class=l3_class, ranges=ranges, measured_world_sizes=sizes, protocol=protocol)


def has_protocol(path: str | Path, protocol: str) -> bool:
    """Whether the collective profile at ``path`` holds rows of ``protocol``."""
    return bool((CollectiveProfile.load(path).measurements()["protocol"] == check_protocol(protocol)).any())


def find_profile(world_size: int, backend: str, profile_root: str | Path, dtype: str = "float32",
                 keep_awake: bool = True) -> Path:
    """This host's collective profile folder for (backend, W): the pinned placement this host
    gives W ranks (cores kept awake or not, ``keep_awake``) if measured, else the only other
    placement measured in the same state; else the error."""
    import torch

    from costmodel.collectives.store import placement_name
    from costmodel.collectives.workers import pick_cores
    from costmodel.measure.device import fingerprint

    device = fingerprint(torch.device("cpu"), dtype)
    cores, _ = pick_cores(world_size)
    want = folder_for(profile_root, device, backend=backend, world_size=world_size,
                      placement=placement_name(cores, keep_awake))
    if (want / "measurements.csv").is_file():
        return want
    others = sorted(p.parent for p in want.parent.glob(f"{backend}-w{world_size}-*/measurements.csv")
                    if p.parent.name.endswith("-awake") == (keep_awake and cores is not None))
    if len(others) == 1:
        return others[0]
    where = f" (other placements measured: {[p.name for p in others]})" if others else ""
    raise CollectiveProfileError(
        f"no collective profile for world_size={world_size}, backend={backend!r} on this host: {want} is missing"
        f"{where}; measure it with: python -m costmodel.collectives bench world_size={world_size} "
        f"profile_root={profile_root}" + ("" if keep_awake else " keep_awake=false"))


def load_collective_model(world_size: int = 2, backend: str = "gloo", profile_root: str | Path = "profiles",
                          measure_if_missing: bool = False, *, dtype: str = "float32",
                          protocol: str = "warm", keep_awake: bool = True) -> CollectiveModel:
    """Fit L2 and L3 from this host's collective profile for (``world_size``, ``backend``),
    on its rows of ``protocol`` (``warm``: calls back to back; ``step``: calls inside a step).

    Missing profile, or one without rows of ``protocol``: ``CollectiveProfileError`` naming the
    folder and the bench command, or, with ``measure_if_missing``, the default suite is
    measured first (about 30 s at W=2 on the 2-core VMs; rows are added, none replaced). The fit
    (seconds) is kept in memory until the profile's file changes.
    """
    w = check_world_size(world_size)
    check_protocol(protocol)
    try:
        path = find_profile(w, backend, profile_root, dtype, keep_awake)
        if not has_protocol(path, protocol):
            raise CollectiveProfileError(
                f"the collective profile {path} holds no rows of the {protocol!r} timing protocol (measured before "
                f"it existed); measure it again with: python -m costmodel.collectives bench world_size={w} "
                f"profile_root={profile_root}")
    except CollectiveProfileError:
        if not measure_if_missing:
            raise
        from costmodel.collectives.bench import bench_collectives
        path = bench_collectives(w, profile_root=profile_root, backend=backend, keep_awake=keep_awake).path
    stat = (Path(path) / "measurements.csv").stat()
    key = (str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size, w, backend, protocol)
    if key not in _FITTED:  # a refit costs seconds (class selection); the file decides when it is stale
        profile = CollectiveProfile.load(path)
        fp = {**profile.fingerprint, "source": str(path)}
        _FITTED.clear()
        _FITTED[key] = fit_collective_model(profile.measurements(), fp, world_size=w, backend=backend,
                                            protocol=protocol)
    return _FITTED[key]


def load_step_model(world_size: int, backend: str = "gloo", profile_root: str | Path = "profiles",
                    *, dtype: str = "float32", keep_awake: bool = True) -> tuple[CollectiveModel, str]:
    """The ``step`` model of the profile, or (a profile measured before the step protocol) its
    ``warm`` model, with a note saying which; measures nothing (a predict-only run's choice).
    ``CollectiveProfileError`` when the profile holds neither."""
    try:
        return (load_collective_model(world_size, backend, profile_root, dtype=dtype, protocol="step",
                                      keep_awake=keep_awake), "step protocol")
    except CollectiveProfileError:
        cm = load_collective_model(world_size, backend, profile_root, dtype=dtype, protocol="warm", keep_awake=keep_awake)
        return cm, "its warm rows (no 'step' rows: measured before that protocol)"


#: the last model fitted in this process, keyed by its profile file's path, mtime and size, and the protocol
#: (an in-memory cache only: fitted models are derived data, never pickled)
_FITTED: dict[tuple, CollectiveModel] = {}


def to_json(model: CollectiveModel) -> str:
    """Fitted L2 parameters and L3 classes as text (for reports; models are refitted, never pickled)."""
    return json.dumps({op: {"alpha_s": e.alpha_s_, "beta_bytes_per_s": e.beta_bytes_per_s_,
                            "l3": model.l3_class.get(op)} for op, e in model.l2.items()}, indent=2)
