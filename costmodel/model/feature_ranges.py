"""Fitted feature ranges, shared by the kernel models (``costmodel.model.models``) and the
collective models (``costmodel.collectives.models``): which query rows lie outside the range a
model was fitted over, and the query clipped into it."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

Ranges = Mapping[str, tuple[float, float]]


def outside_masks(feats: pd.DataFrame, ranges: Ranges, *, rel_tol: float, abs_tol: float) -> dict[str, np.ndarray]:
    """Per feature of ``ranges`` that ``feats`` has, which rows lie outside its [lo, hi] by more
    than ``abs_tol + rel_tol * (hi - lo)``."""
    out = {}
    for name, (lo, hi) in ranges.items():
        if name not in feats:
            continue
        values = feats[name].to_numpy(dtype=float)
        tol = abs_tol + rel_tol * (hi - lo)
        out[name] = (values < lo - tol) | (values > hi + tol)
    return out


def clip_to_ranges(feats: pd.DataFrame, ranges: Ranges) -> pd.DataFrame:
    """``feats`` with every column of ``ranges`` clipped into its [lo, hi]."""
    out = feats.copy()
    for name, (lo, hi) in ranges.items():
        if name in out:
            out[name] = out[name].clip(lo, hi)
    return out
