"""Kernel table -> model features, vectorised over many kernels at once.

A *kernel table* is a DataFrame with one row per kernel: the descriptor fields
(``KernelSpec.to_record``) plus ``flops`` and ``bytes_moved``. ``kernel_table`` builds one
from descriptors; a profile's measurements already are one.

Features per family (all logs base 10, sizes in elements unless the name says bytes):

- every family: log FLOPs, log ideal bytes, log(arithmetic intensity / ridge point), log
  roofline time max(FLOPs/peak, bytes/bandwidth) + per-call overhead (Williams et al.
  2009), with the device's *measured* ceilings;
- gemm: log M, K, N, aspect log(M/N), output tiles and wave efficiency (tiles over
  ceil(tiles/units)*units: how well the tiles fill the parallel units, "wave
  quantization", NVIDIA's Matrix Multiplication Background guide), and whether it is a
  matrix-vector product (M or N = 1: BLAS switches to a GEMV kernel);
- grouped_gemm: experts, non-empty experts, total/max/mean tokens, imbalance (max/mean,
  CV) of the rows executed (a padded bmm executes max_n rows per expert), padding waste
  1 - sum/(E*max), implementation;
- gather / scatter / spmm: scatter volume rows*width*bytes, destination table bytes,
  width, index CV (skew), order, backend and reduction; spmm also the column skew and
  the bytes of the X rows it reads (its cache footprint);
- small ops: their sizes and op kind.

Each family's own features are defined in its module (``costmodel.families.<family>.features``).
"""

from __future__ import annotations

import operator
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from costmodel.families import family_of
from costmodel.families.columns import column, log10
from costmodel.families.descriptor import KernelSpec, record_value


def kernel_table(specs: Iterable[KernelSpec]) -> pd.DataFrame:
    """Descriptors -> kernel table (fields + flops + bytes_moved), in input order.

    Built column by column per descriptor class (the same cells as ``to_record``: tuples
    joined by commas), which is several times faster than one dict per row."""
    specs = list(specs)
    by_class: dict[type, list[int]] = {}
    for i, s in enumerate(specs):
        by_class.setdefault(type(s), []).append(i)
    parts = []
    for cls, rows in by_class.items():
        names = cls.field_names()
        get = operator.attrgetter(*names)
        values = [get(specs[i]) for i in rows]
        columns: dict[str, Any] = {"family": [cls.family] * len(rows)}
        for name, col in zip(names, zip(*values) if len(names) > 1 else [values]):
            columns[name] = [record_value(v) for v in col] if isinstance(col[0], tuple) else list(col)
        parts.append(pd.DataFrame(columns, index=rows))
    table = (pd.concat(parts).sort_index() if len(parts) > 1 else parts[0]) if parts else pd.DataFrame()
    table.index = pd.RangeIndex(len(specs))
    table["flops"] = np.fromiter((s.flops() for s in specs), dtype=np.float64, count=len(specs))
    table["bytes_moved"] = np.fromiter((s.bytes_moved() for s in specs), dtype=np.float64, count=len(specs))
    return table


def roofline_time_s(flops: np.ndarray, bytes_moved: np.ndarray, ceilings: Mapping[str, Any]) -> np.ndarray:
    """max(FLOPs/peak, bytes/bandwidth) + per-call overhead, in seconds."""
    compute = flops / float(ceilings["peak_flops_per_s"])
    memory = bytes_moved / float(ceilings["bandwidth_bytes_per_s"])
    return np.maximum(compute, memory) + float(ceilings["overhead_s"])


def log_efficiency(t: pd.DataFrame, seconds: Any, ceilings: Mapping[str, Any]) -> np.ndarray:
    """L3's target per row of ``t``: log10(measured ``seconds`` / roofline seconds)."""
    roof = roofline_time_s(t["flops"].to_numpy(float), t["bytes_moved"].to_numpy(float), ceilings)
    return np.log10(np.asarray(seconds, dtype=np.float64) / roof)


def family_features(t: pd.DataFrame, family: str, ceilings: Mapping[str, Any]) -> pd.DataFrame:
    """Feature matrix for rows of one family (index preserved): the features every family
    gets, then the family's own (``costmodel.families.<family>.features``)."""
    flops, nbytes = column(t, "flops"), column(t, "bytes_moved")
    ridge = float(ceilings["ridge_flops_per_byte"])
    f: dict[str, np.ndarray] = {
        "log_flops": log10(flops + 1.0),
        "log_bytes": log10(nbytes),
        "log_ai_over_ridge": log10((flops + 1e-3) / nbytes / ridge),
        "log_roofline_s": log10(roofline_time_s(flops, nbytes, ceilings)),
    }
    fam = family_of(family)
    f |= fam.features(t, ceilings)
    missing = [c for c in fam.range_features if c not in f]
    if missing:
        raise ValueError(f"kernel family {family!r} declares range features {missing} that its features "
                         f"({fam.module}.features) do not produce")
    return pd.DataFrame(f, index=t.index)


#: features of every family whose training range is checked at prediction time
COMMON_RANGE_FEATURES = ("log_flops", "log_bytes")


def range_features(family: str) -> tuple[str, ...]:
    """The features of ``family`` whose training range is checked at prediction time
    (extrapolation warnings): the common ones, then the ones the family declares
    (``register_family(..., range_features=...)``)."""
    return COMMON_RANGE_FEATURES + family_of(family).range_features
