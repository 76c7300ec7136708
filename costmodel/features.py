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
"""

from __future__ import annotations

import operator
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from costmodel.kernels import DTYPE_BYTES, ELEMENTWISE_OPS, GROUPED_IMPLS, SCATTER_BACKENDS, KernelSpec, record_value

TILE = {"cpu": 64, "cuda": 128}  # output tile edge used for the tile/wave features


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


def _log(x: Any) -> np.ndarray:
    return np.log10(np.maximum(np.asarray(x, dtype=np.float64), 1e-30))


def _col(t: pd.DataFrame, name: str) -> np.ndarray:
    return t[name].to_numpy(dtype=np.float64)


def spmm_columns(t: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(src_cv, src_read_share) of spmm rows, unset cells filled as ``SpmmSpec.columns`` does
    (uniform random columns: CV 1/sqrt(m), share 1 - exp(-m), m = nnz/num_src)."""
    m = _col(t, "nnz") / _col(t, "num_src")
    cv = t["src_cv"].to_numpy(dtype=np.float64) if "src_cv" in t else np.full(len(t), np.nan)
    share = t["src_read_share"].to_numpy(dtype=np.float64) if "src_read_share" in t else np.full(len(t), np.nan)
    unset = np.isnan(cv) | np.isnan(share)
    return np.where(unset, 1.0 / np.sqrt(m), cv), np.where(unset, -np.expm1(-m), share)


def roofline_time_s(flops: np.ndarray, bytes_moved: np.ndarray, ceilings: Mapping[str, Any]) -> np.ndarray:
    """max(FLOPs/peak, bytes/bandwidth) + per-call overhead, in seconds."""
    compute = flops / float(ceilings["peak_flops_per_s"])
    memory = bytes_moved / float(ceilings["bandwidth_bytes_per_s"])
    return np.maximum(compute, memory) + float(ceilings["overhead_s"])


def _onehot(values: pd.Series, choices: Iterable[str], prefix: str) -> dict[str, np.ndarray]:
    v = values.astype(str).to_numpy()
    return {f"{prefix}_{c}": (v == c).astype(np.float64) for c in choices}


def _counts_matrix(column: pd.Series) -> np.ndarray:
    """Comma-separated per-expert counts -> [rows, max experts] floats, NaN-padded."""
    rows = [str(s).split(",") for s in column]
    widths = {len(r) for r in rows}
    if len(widths) == 1:
        return np.array(rows, dtype=np.float64)
    out = np.full((len(rows), max(widths)), np.nan)
    for i, r in enumerate(rows):
        out[i, : len(r)] = np.array(r, dtype=np.float64)
    return out


def family_features(t: pd.DataFrame, family: str, ceilings: Mapping[str, Any]) -> pd.DataFrame:
    """Feature matrix for rows of one family (index preserved)."""
    flops, nbytes = _col(t, "flops"), _col(t, "bytes_moved")
    elem = t["dtype"].map(DTYPE_BYTES).to_numpy(dtype=np.float64)
    ridge = float(ceilings["ridge_flops_per_byte"])
    f: dict[str, np.ndarray] = {
        "log_flops": _log(flops + 1.0),
        "log_bytes": _log(nbytes),
        "log_ai_over_ridge": _log((flops + 1e-3) / nbytes / ridge),
        "log_roofline_s": _log(roofline_time_s(flops, nbytes, ceilings)),
    }
    units = float(ceilings.get("parallel_units", 1))
    tile = TILE.get(str(ceilings.get("device_kind", "cpu")), 64)
    if family == "gemm":
        m, k, n = _col(t, "m"), _col(t, "k"), _col(t, "n")
        tiles = np.ceil(m / tile) * np.ceil(n / tile)
        f |= {
            "log_m": _log(m), "log_k": _log(k), "log_n": _log(n), "log_m_over_n": _log(m / n),
            "log_tiles": _log(tiles), "wave_eff": tiles / (np.ceil(tiles / units) * units),
            "gemv": ((m == 1) | (n == 1)).astype(np.float64),  # BLAS dispatches matrix-vector kernels
        }
    elif family == "grouped_gemm":
        counts = _counts_matrix(t["tokens_per_expert"])  # NaN past each row's expert count
        valid = ~np.isnan(counts)
        padded = t["impl"].astype(str).to_numpy() == "padded_bmm"
        experts = valid.sum(axis=1)
        mx = np.nanmax(counts, axis=1)
        useful = np.nansum(counts, axis=1)
        # ragged statistics of the rows the kernel *executes*: a padded bmm runs max_n rows
        # for every expert, so its groups are uniform whatever the routing was
        executed = np.where(padded[:, None] & valid, mx[:, None], counts)
        total = np.nansum(executed, axis=1)
        nonempty = (executed > 0).sum(axis=1)  # NaN > 0 is False
        cv = np.nanstd(executed, axis=1) / np.nanmean(executed, axis=1)
        k, n = _col(t, "k"), _col(t, "n")
        f |= {
            "log_experts": _log(experts), "log_nonempty": _log(nonempty), "log_total_tokens": _log(total),
            "log_max_tokens": _log(mx), "max_over_mean": mx / (total / experts), "tokens_cv": cv,
            "padding_waste": 1.0 - useful / (experts * mx), "log_mean_nonempty": _log(total / nonempty),
            "log_k": _log(k), "log_n": _log(n), **_onehot(t["impl"], GROUPED_IMPLS, "impl"),
        }
    elif family in ("gather", "scatter", "spmm"):
        rows = _col(t, "nnz" if family == "spmm" else "num_rows")
        width = _col(t, "width")
        table_rows = _col(t, "num_src" if family == "gather" else "num_dst")
        f |= {
            "log_rows": _log(rows), "log_width": _log(width), "log_table_rows": _log(table_rows),
            "log_scatter_volume_bytes": _log(rows * width * elem),
            "log_table_bytes": _log(table_rows * width * elem),
            "log_rows_per_target": _log(rows / table_rows),
            "index_cv": _col(t, "index_cv"), "log1p_index_cv": np.log1p(_col(t, "index_cv")),
        }
        if family == "spmm":
            src_cv, share = spmm_columns(t)
            f |= {"log1p_src_cv": np.log1p(src_cv), "src_read_share": share,
                  "log_src_read_bytes": _log(share * _col(t, "num_src") * width * elem)}
        else:
            f["sorted"] = t["sorted"].astype(str).str.lower().isin(["true", "1"]).to_numpy(dtype=np.float64)
        if family == "scatter":
            f |= _onehot(t["backend"], SCATTER_BACKENDS, "backend")
            f |= _onehot(t["reduce"], ("sum", "mean", "max", "copy"), "reduce")
    elif family == "elementwise":
        f |= {"log_numel": _log(_col(t, "numel")), **_onehot(t["op"], tuple(ELEMENTWISE_OPS), "op")}
    elif family in ("softmax", "topk"):
        f |= {"log_rows": _log(_col(t, "rows")), "log_cols": _log(_col(t, "cols"))}
        if family == "topk":
            f["log_k"] = _log(_col(t, "k"))
    elif family == "sort":
        f["log_n"] = _log(_col(t, "n"))
    elif family == "histogram":
        f |= {"log_n": _log(_col(t, "n")), "log_bins": _log(_col(t, "bins"))}
    return pd.DataFrame(f, index=t.index)


#: features whose training range is checked at prediction time (extrapolation warnings)
RANGE_FEATURES = (
    "log_flops", "log_bytes", "log_m", "log_k", "log_n", "log_total_tokens", "log_experts",
    "log_rows", "log_width", "log_table_rows", "index_cv", "log_numel", "log_cols", "log_n", "log_bins",
)
