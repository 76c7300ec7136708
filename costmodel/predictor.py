"""``CostModel``: fitted L0-L3 for one device profile, persisted beside it.

Fitting reads a profile's measurements; the fitted bundle is saved as
``<profile>/models.joblib`` with ``models.json`` naming the profile's content hash and
fingerprint. Loading refuses a bundle from another fingerprint (``ProfileMismatchError``)
and reports a stale one (fitted before the profile changed) so callers can refit.

Prediction is vectorised: many descriptors (or a ready kernel table) in, one DataFrame
out, a column per level.
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import joblib
import numpy as np
import pandas as pd
import sklearn

from costmodel.device import Fingerprint, ProfileMismatchError
from costmodel.features import kernel_table
from costmodel.kernels import KernelSpec
from costmodel.models import make_levels
from costmodel.profile import DeviceProfile, ProfileError, atomic_write_bytes, atomic_write_json

LEVELS = ("L0", "L1", "L2", "L3")
MODELS_FILE = "models.joblib"
MODELS_META = "models.json"
MIN_ROWS_TO_FIT = 10
#: Version of the kernel formulas and features the saved models were fitted with: bump it
#: when a FLOPs/bytes formula or a feature changes, so saved models count as stale and refit.
#: 2: grouped_mm reads only the weights of experts that received tokens.
#: 3: spmm reads only the rows of X its columns name (src_read_share) and has column features.
#: 4: scatter backend index_put (accumulate), its own one-hot feature.
#: 5: GEMM and grouped GEMM operand layouts (trans_a, trans_b), grouped_mm's weight-gradient
#:    form, and the gather's aten op (index_select / index / gather) as features.
MODEL_VERSION = 5


class StaleModelError(RuntimeError):
    """The saved models were fitted on an older version of the profile."""


class ModelVersionError(StaleModelError):
    """The saved models were fitted with other kernel features than this code computes: they
    cannot predict (not even ``allow_stale``); refit."""


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
    #: what the freshness check of this run saw and did (``costmodel.freshness``); not persisted
    freshness: dict[str, Any] = field(default_factory=dict)
    #: the profile's measured kernels (key -> median seconds, refresh-scaled) as fitted, saved
    #: with the models: L3 of a measured kernel is its measurement
    measured_s: dict[str, float] = field(default_factory=dict)

    # ------------------------------------------------------------------ fitting
    @classmethod
    def fit_profile(cls, profile: DeviceProfile, *, cv_folds: int = 4) -> "CostModel":
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
        return cls(profile.fingerprint, dict(ceilings), levels, profile.content_hash(), meta,
                   measured_s=dict(zip(X["key"], y)) if "key" in X else {})

    # ------------------------------------------------------------------ persistence
    def save(self, profile: DeviceProfile) -> Path:
        if profile.fingerprint != self.fingerprint:
            raise ProfileMismatchError("refusing to save models beside another device's profile")
        path = profile.path / MODELS_FILE
        buf = io.BytesIO()
        joblib.dump({"levels": self.levels, "ceilings": dict(self.ceilings), "measured_s": dict(self.measured_s)}, buf)
        with profile.locked("saving fitted models"):  # the pair stays consistent under concurrent fits
            atomic_write_bytes(path, buf.getvalue())
            atomic_write_json(
                profile.path / MODELS_META,
                {"profile_hash": self.profile_hash, "fingerprint": self.fingerprint.to_dict(), **self.meta},
            )
        return path

    @classmethod
    def load(cls, profile: DeviceProfile, *, expected: Fingerprint | None = None, allow_stale: bool = False) -> "CostModel":
        """Saved models of ``profile``; refuses another fingerprint, and stale models unless allowed."""
        meta_file, model_file = profile.path / MODELS_META, profile.path / MODELS_FILE
        if not (meta_file.exists() and model_file.exists()):
            raise ProfileError(f"no fitted models in {profile.path}; run `python -m costmodel fit`")
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        stored = dict(meta.pop("fingerprint"))
        stored.pop("id", None)
        fp = Fingerprint(**stored)
        if expected is not None and fp != expected:
            raise ProfileMismatchError(
                f"models in {profile.path} were fitted for another device; differences (models, this process): "
                f"{fp.differences(expected)}"
            )
        if fp != profile.fingerprint:
            raise ProfileMismatchError(f"models in {profile.path} do not match the profile's own fingerprint")
        profile_hash = meta.pop("profile_hash")
        if profile_hash != profile.content_hash() and not allow_stale:
            raise StaleModelError(f"models in {profile.path} were fitted before the profile last changed; refit")
        version = meta.pop("model_version", 1)
        if version != MODEL_VERSION:  # other features: unusable even where staleness is allowed
            raise ModelVersionError(f"models in {profile.path} were fitted with kernel formulas v{version}; this code has "
                                  f"v{MODEL_VERSION}; refit")
        bundle = joblib.load(model_file)
        # saved beside the levels (the profile's kernels as fitted); models saved before
        # measured_s existed have none, and L3 is then the regression everywhere
        return cls(fp, bundle["ceilings"], bundle["levels"], profile_hash, meta,
                   measured_s=dict(bundle.get("measured_s", {})))

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
