"""``CostModel``: fitted L0-L3 for one device profile, cached per user, never beside it.

Fitting reads a profile's measurements (``fit_profile``). Fitted models are derived data:
``load`` returns them from the user's model cache (``costmodel.store.model_cache``:
``$MOEGNN_MODEL_CACHE``, else ``$XDG_CACHE_HOME/moe-gnn-sim/models``, else
``~/.cache/moe-gnn-sim/models``, a folder only this user can write), keyed by the profile's
fingerprint id, its content hash, ``MODEL_VERSION`` and the scikit-learn version; on a miss
it fits them from the profile's measurements and stores them there. Nothing is ever
unpickled from, or written into, a profile folder by loading or fitting: profile folders are
shared data (one root serves many terminals, users and machines), and a pickle planted there
would run its code in whoever loads it. A ``models.joblib`` left in a profile folder by older
versions of this code is ignored (a ``ModelCacheWarning`` says so once); delete it at will.

Because the key holds the content hash, cached models are never stale: a profile that
changed (a bench, a refresh) is refitted on its next load. ``load`` still refuses a
profile of another fingerprint than expected (``ProfileMismatchError``).

Prediction is vectorised: many descriptors (or a ready kernel table) in, one DataFrame
out, a column per level.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import sklearn

from costmodel.families.descriptor import KernelSpec
from costmodel.measure.device import Fingerprint, ProfileMismatchError
from costmodel.model.features import kernel_table
from costmodel.model.models import make_levels
from costmodel.store import model_cache
from costmodel.store.model_cache import ModelCacheWarning
from costmodel.store.profile import DeviceProfile, ProfileError

LEVELS = ("L0", "L1", "L2", "L3")
#: what older versions of this code saved beside a profile: never loaded, only named in a warning
MODELS_FILE = "models.joblib"
MODELS_META = "models.json"
MIN_ROWS_TO_FIT = 10
#: Version of the kernel formulas and features the cached models were fitted with: bump it
#: when a FLOPs/bytes formula or a feature changes, so cached models are not used and refit.
#: 2: grouped_mm reads only the weights of experts that received tokens.
#: 3: spmm reads only the rows of X its columns name (src_read_share) and has column features.
#: 4: scatter backend index_put (accumulate), its own one-hot feature.
#: 5: GEMM and grouped GEMM operand layouts (trans_a, trans_b), grouped_mm's weight-gradient
#:    form, and the gather's aten op (index_select / index / gather) as features.
#: 6: L3 trend-plus-trees forms, and a separate extrapolator per family for queries outside
#:    the fitted range (chosen on a nested extrapolation split).
#: 7: extrapolators "edge" (the largest kernels' efficiency) and "roofline"; an extrapolator
#:    replaces the in-range form only when 10% better on the nested split.
#: 8: top-k's CPU selection path (ATen's partial sort when k*64 <= cols, else nth_element)
#:    as a feature.
#: 9: sort's CPU path (FBGEMM's radix sort for >= 32,768 integer keys, else std::stable_sort)
#:    as a feature.
#: 10: elementwise's integer data as a feature.
#: 11: GEMM's B rows a multiple of 4 KiB apart (cache-set conflicts) as a feature.
#: 12: reductions along a dimension (elementwise reduce_inner / reduce_outer, ``reduced``).
MODEL_VERSION = 12


class StaleModelError(RuntimeError):
    """Models fitted on an older version of the profile. Kept for callers that catch it:
    ``CostModel.load`` no longer raises it (cached models are keyed by the profile's content)."""


class ModelVersionError(StaleModelError):
    """Models fitted with other kernel features than this code computes. Kept for callers
    that catch it: ``CostModel.load`` no longer raises it (``MODEL_VERSION`` is in the key)."""


def training_table(profile: DeviceProfile) -> tuple[pd.DataFrame, np.ndarray, Mapping[str, Any]]:
    """(kernel table, measured seconds, ceilings) of a profile, with clear errors."""
    frame = profile.kernels()
    ceilings = profile.ceilings()
    if ceilings is None:
        raise ProfileError(f"profile {profile.path} has no ceilings.json; run `python -m costmodel bench`")
    if len(frame) < MIN_ROWS_TO_FIT:
        raise ProfileError(
            f"profile {profile.path} has {len(frame)} measured kernels; at least {MIN_ROWS_TO_FIT} are needed "
            "to fit (run `python -m costmodel bench`)"
        )
    return frame, frame["median_s"].to_numpy(dtype=np.float64), ceilings


@dataclass
class CostModel:
    """Fitted levels plus the ceilings and fingerprint they belong to."""

    fingerprint: Fingerprint
    ceilings: Mapping[str, Any]
    levels: dict[str, Any]
    profile_hash: str
    meta: dict[str, Any] = field(default_factory=dict)
    #: what the freshness check of this run saw and did (``costmodel.measure.freshness``); not persisted
    freshness: dict[str, Any] = field(default_factory=dict)
    #: the profile's measured kernels (key -> median seconds, refresh-scaled) as fitted, cached
    #: with the models: L3 of a measured kernel is its measurement
    measured_s: dict[str, float] = field(default_factory=dict)
    #: where these models came from in this process: "fitted" now, or "cache"; not persisted
    origin: str = "fitted"

    # ------------------------------------------------------------------ fitting
    @classmethod
    def fit_profile(cls, profile: DeviceProfile, *, cv_folds: int = 4) -> "CostModel":
        """Fit every level on the profile's measurements (in memory; ``save`` caches them)."""
        content_hash = profile.content_hash()  # before reading: a bench appending meanwhile makes it a miss later
        X, y, ceilings = training_table(profile)
        levels = {name: model.fit(X, y) for name, model in make_levels(ceilings, cv_folds=cv_folds).items()}
        l3 = levels["L3"]
        meta = {
            "fitted_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "n_rows": int(len(X)),
            "families": sorted(X["family"].unique()),
            "l3_form": l3.chosen_,
            "l3_cv_median_ape_pct": l3.cv_median_ape_pct_,
            "sklearn": sklearn.__version__,
            "model_version": MODEL_VERSION,
        }
        return cls(profile.fingerprint, dict(ceilings), levels, content_hash, meta,
                   measured_s=dict(zip(X["key"], y)) if "key" in X else {})

    # ------------------------------------------------------------------ persistence
    def cache_name(self) -> str:
        """This model's file name in the user's model cache."""
        version = int(self.meta.get("model_version", MODEL_VERSION))
        return model_cache.entry_name(self.fingerprint.id, self.profile_hash, version)

    def save(self, profile: DeviceProfile) -> Path | None:
        """Store these models in the user's model cache (never in the profile folder, which
        stays untouched and may be read-only); the cache entry, or None when the cache is
        refused (a ``ModelCacheWarning`` says why; the models still work, uncached)."""
        if profile.fingerprint != self.fingerprint:
            raise ProfileMismatchError(f"refusing to cache models of {self.fingerprint.id} as {profile.path}'s, "
                                       f"a profile of {profile.fingerprint.id}")
        bundle = {"levels": self.levels, "ceilings": dict(self.ceilings), "measured_s": dict(self.measured_s),
                  "meta": {"profile_hash": self.profile_hash, "fingerprint": self.fingerprint.to_dict(),
                           "profile": str(profile.path), **self.meta}}
        return model_cache.write(self.cache_name(), bundle)

    @classmethod
    def cached(cls, profile: DeviceProfile) -> "CostModel | None":
        """The models of ``profile``'s current content from the user's model cache, or None."""
        _warn_leftover(profile)
        name = model_cache.entry_name(profile.fingerprint.id, profile.content_hash(), MODEL_VERSION)
        bundle = model_cache.read(name)
        if not isinstance(bundle, dict) or not {"levels", "ceilings", "meta"} <= set(bundle):
            return None
        meta = dict(bundle["meta"])
        stored = dict(meta.pop("fingerprint", {}))
        stored.pop("id", None)
        try:
            fp = Fingerprint(**stored)
        except TypeError:  # written by another version of this code: a miss
            return None
        if fp != profile.fingerprint or meta.get("model_version") != MODEL_VERSION:
            return None
        profile_hash = meta.pop("profile_hash", None)
        meta.pop("profile", None)
        return cls(fp, bundle["ceilings"], bundle["levels"], profile_hash, meta,
                   measured_s=dict(bundle.get("measured_s", {})), origin="cache")

    @classmethod
    def load(cls, profile: DeviceProfile, *, expected: Fingerprint | None = None, allow_stale: bool = False,
             fit_missing: bool = True, cv_folds: int = 4) -> "CostModel":
        """The fitted models of ``profile``: from the user's model cache, else fitted now from
        the profile's measurements and cached (``fit_missing=False``: a ``ProfileError``
        instead). Refuses a profile of another fingerprint than ``expected``. Nothing is read
        from or written into the profile folder beyond its measurements, ceilings and
        provenance. ``allow_stale`` is accepted for older callers and has no effect: cached
        models are keyed by the profile's content, so none is ever stale."""
        del allow_stale
        if expected is not None and profile.fingerprint != expected:
            raise ProfileMismatchError(
                f"profile {profile.path} is for another device; differences (profile, this process): "
                f"{profile.fingerprint.differences(expected)}"
            )
        model = cls.cached(profile)
        if model is not None:
            return model
        if not fit_missing:
            raise ProfileError(f"no fitted models of {profile.path} in the model cache {model_cache.cache_dir()}; "
                               "they are fitted from the profile's measurements on first use")
        model = cls.fit_profile(profile, cv_folds=cv_folds)
        model.save(profile)
        return model

    # ------------------------------------------------------------------ prediction
    def predict_table(self, table: pd.DataFrame, levels: Sequence[str] = LEVELS, *,
                      keys: Sequence[str] | None = None) -> pd.DataFrame:
        """Predicted seconds per kernel-table row, one column per level.

        With ``keys`` (each row's descriptor key), L3 of a kernel the profile measured is
        that measurement (``measured_s``: the median of its rounds, following any refresh
        of its family) and the fitted regression's prediction elsewhere: a regression over a
        whole family smooths single kernels by 5-15% (a per-family GP or tree ensemble does not
        pass through its training points; results/cpu_epyc/moe_final1: L3 0.96-1.15x the
        kernels it was fitted on), which a profile that holds the exact kernel need not do.
        Without ``keys`` every row is predicted by the regression (what held-out and
        cross-validated errors evaluate)."""
        for name in levels:
            if name not in self.levels:
                raise ValueError(f"unknown cost-model level {name!r}; allowed: {list(self.levels)}")
        out = pd.DataFrame({name: self.levels[name].predict(table) for name in levels}, index=table.index)
        if keys is not None and "L3" in out and self.measured_s:
            if len(keys) != len(table):
                raise ValueError(f"{len(keys)} keys for {len(table)} kernel-table rows")
            measured = np.fromiter((self.measured_s.get(k, np.nan) for k in keys), dtype=np.float64, count=len(keys))
            hit = ~np.isnan(measured)
            out.loc[hit, "L3"] = measured[hit]
        return out

    def predict(self, specs: Iterable[KernelSpec], levels: Sequence[str] = LEVELS) -> pd.DataFrame:
        """Predicted seconds per descriptor (vectorised), one column per level.

        Descriptors are hashable, so each distinct one is featurised and predicted once
        and the result broadcast back (a layer trace repeats kernels: one GEMM shape per
        expert, the same small ops in every layer)."""
        unique: dict[KernelSpec, int] = {}
        inverse = np.fromiter((unique.setdefault(s, len(unique)) for s in specs), dtype=np.int64)
        if not unique:
            return pd.DataFrame(columns=list(levels), dtype=float)
        distinct = self.predict_table(kernel_table(unique), levels, keys=[s.key() for s in unique])
        return pd.DataFrame(distinct.to_numpy()[inverse], columns=distinct.columns)


def _warn_leftover(profile: DeviceProfile) -> None:
    """Name a pickle that older code left in the profile folder: it is never loaded."""
    leftover = profile.path / MODELS_FILE
    if leftover.exists():
        warnings.warn(f"ignoring {leftover}: fitted models are never loaded from a profile folder (shared data; "
                      f"a pickle runs code when loaded); they are fitted from the measurements and cached in "
                      f"{model_cache.cache_dir()}. The file can be deleted.", ModelCacheWarning, stacklevel=3)
