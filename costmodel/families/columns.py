"""Vectorised helpers for the families' ``features`` functions: columns of a kernel table
as float arrays, base-10 logs, one-hot encodings, and the index features every aggregation
family (gather, scatter, spmm) shares."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import pandas as pd

from costmodel.families.descriptor import DTYPE_BYTES


def log10(x: Any) -> np.ndarray:
    """log10, with zeros (and below 1e-30) clamped to 1e-30."""
    return np.log10(np.maximum(np.asarray(x, dtype=np.float64), 1e-30))


def column(t: pd.DataFrame, name: str) -> np.ndarray:
    return t[name].to_numpy(dtype=np.float64)


def elem_bytes(t: pd.DataFrame) -> np.ndarray:
    """Bytes per element of each row's dtype."""
    return t["dtype"].map(DTYPE_BYTES).to_numpy(dtype=np.float64)


def integer_dtype(t: pd.DataFrame) -> np.ndarray:
    """1.0 where the row's ``dtype`` is an integer type (int32, int64), else 0.0."""
    return t["dtype"].astype(str).str.startswith("int").to_numpy().astype(np.float64)


def onehot(values: pd.Series, choices: Iterable[str], prefix: str) -> dict[str, np.ndarray]:
    v = values.astype(str).to_numpy()
    return {f"{prefix}_{c}": (v == c).astype(np.float64) for c in choices}


def flag(values: pd.Series) -> np.ndarray:
    """A boolean column as read back from CSV (True/False/1/0 as text) -> 0/1."""
    return values.astype(str).str.lower().isin(["true", "1"]).to_numpy(dtype=np.float64)


#: the aggregation features whose training range is checked at prediction time
AGGREGATION_RANGE_FEATURES = ("log_rows", "log_width", "log_table_rows", "index_cv")


def aggregation_features(t: pd.DataFrame, rows: np.ndarray, table_rows: np.ndarray) -> dict[str, np.ndarray]:
    """Scatter volume rows*width*bytes, the table's bytes, width, rows per target and the
    index CV (skew): the features of gather, scatter and spmm."""
    width, elem = column(t, "width"), elem_bytes(t)
    return {
        "log_rows": log10(rows), "log_width": log10(width), "log_table_rows": log10(table_rows),
        "log_scatter_volume_bytes": log10(rows * width * elem),
        "log_table_bytes": log10(table_rows * width * elem),
        "log_rows_per_target": log10(rows / table_rows),
        "index_cv": column(t, "index_cv"), "log1p_index_cv": np.log1p(column(t, "index_cv")),
    }


def optional_column(t: pd.DataFrame, name: str, default: str) -> pd.Series:
    """An optional descriptor field as text, ``default`` where unset (empty, NaN, or a table
    from before the field existed)."""
    if name not in t.columns:
        return pd.Series(default, index=t.index)
    values = t[name].astype(object)  # a float column of NaNs cannot take a text fill value
    return values.where(values.notna(), default).astype(str)


def layout_features(t: pd.DataFrame) -> dict[str, np.ndarray]:
    """0/1 per row: A transposed, B transposed (unset = "nn")."""
    layout = optional_column(t, "layout", "nn")
    return {"trans_a": (layout.str[0] == "t").to_numpy(dtype=np.float64),
            "trans_b": (layout.str[1] == "t").to_numpy(dtype=np.float64)}


#: bytes of a 4 KiB page: rows whose stride is a multiple of it map to the same L1 sets
PAGE_BYTES = 4096


def page_strided_rows(stride_elems: np.ndarray, elem: np.ndarray) -> np.ndarray:
    """1.0 where a matrix's row stride in bytes is a multiple of 4 KiB, else 0.0.

    Rows that far apart land in the same sets of a set-associative L1 (and alias in the
    store-forwarding check, "4K aliasing": Intel 64 and IA-32 Architectures Optimization
    Reference Manual; U. Drepper, What Every Programmer Should Know About Memory, on cache
    associativity), so a kernel walking down a column of them evicts its own lines.
    Measured with ``scripts/bench_gemm_stride.py``: a GEMM of M = 4-16 rows whose B is stored
    [K, N] with such rows runs 1.15-1.26x the time per weight element of its neighbours on the
    EPYC VM (results/cpu_epyc/gemm_stride)."""
    stride_bytes = np.asarray(stride_elems, dtype=np.float64) * elem
    return (np.mod(stride_bytes, PAGE_BYTES) == 0).astype(np.float64)
