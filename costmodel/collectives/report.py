"""Held-out fit report of the collective models: per op and level, the absolute percentage
error of per-rank seconds on message sizes the model did not see.

Outer loop: leave one message size out (``LeaveOneGroupOut`` with groups = the suite's size,
so every row of that size, all patterns and ranks, is scored by a model fitted without it;
the smallest and largest sizes are therefore scored in extrapolation). L3's model class is
chosen inside each outer fold on the training sizes only (``models.select_l3``), so the
choice never sees the scored size. Rows: median, p90 and max APE, per op and level, over all
the op's rows and, for all_to_all, per split pattern (imbalance), with the noise floor beside
them (``noise_rel_iqr_pct``: the median over the slice's rows of IQR/median over repeats).
One table per timing protocol the profile holds (``warm``: medians; ``step``: means of calls
made inside a step, ``models.TARGETS``).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
from sklearn.base import clone
from sklearn.model_selection import LeaveOneGroupOut

from costmodel.collectives.models import (TARGETS, LatencyBandwidth, ape, candidates, frame_features, select_l3,
                                          training_rows)


def heldout_predictions(frame: pd.DataFrame, protocol: str = "warm") -> pd.DataFrame:
    """Profile rows of ``protocol`` with ``pred_L2`` and ``pred_L3`` from models that never saw their size."""
    rows = training_rows(frame, protocol)
    out = []
    for op, part in rows.groupby("op"):
        part = part.copy()
        X, y, g = frame_features(part), part["target_s"].to_numpy(float), part["group"].to_numpy()
        part["pred_L2"] = np.nan
        part["pred_L3"] = np.nan
        part["l3_class"] = ""
        if len(np.unique(g)) < 3:
            out.append(part)
            continue
        for tr, te in LeaveOneGroupOut().split(X, y, g):
            idx = part.index[te]
            part.loc[idx, "pred_L2"] = LatencyBandwidth().fit(X.iloc[tr], y[tr]).predict(X.iloc[te])
            name, _ = select_l3(X.iloc[tr], y[tr], g[tr])
            part.loc[idx, "pred_L3"] = clone(candidates()[name]).fit(X.iloc[tr], y[tr]).predict(X.iloc[te])
            part.loc[idx, "l3_class"] = name
        out.append(part)
    return pd.concat(out, ignore_index=True) if out else rows


def _summary(part: pd.DataFrame, level: str) -> dict:
    e = ape(part[f"pred_{level}"], part["target_s"]) * 100
    e = e[np.isfinite(e)]
    if len(e) == 0:
        return {"median_ape_pct": np.nan, "p90_ape_pct": np.nan, "max_ape_pct": np.nan, "within_10pct": np.nan}
    return {"median_ape_pct": float(np.median(e)), "p90_ape_pct": float(np.percentile(e, 90)),
            "max_ape_pct": float(e.max()), "within_10pct": float(np.mean(e <= 10))}


def fit_report(frame: pd.DataFrame, *, print_table: bool = True) -> pd.DataFrame:
    """The held-out table (one row per protocol, op, slice and level); printed unless told not to."""
    kinds = frame["protocol"] if "protocol" in frame else pd.Series("warm", index=frame.index)
    table = []
    for protocol in [p for p in TARGETS if (kinds == p).any()]:
        table += _protocol_table(heldout_predictions(frame, protocol), protocol)
    out = pd.DataFrame(table)
    if print_table and len(out):
        print("held-out (leave one message size out) APE of per-rank seconds, % (warm: medians of calls back to "
              "back; step: means of calls inside a step)")
        print(out.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    return out


def _protocol_table(pred: pd.DataFrame, protocol: str) -> list[dict]:
    table = []
    for op, part in pred.groupby("op"):
        slices = [("all", part)]
        if op == "all_to_all":
            slices += [(p, s) for p, s in part.groupby("pattern")]
        for name, s in slices:
            for level in ("L2", "L3"):
                row = {"protocol": protocol, "op": op, "slice": name, "level": level, "rows": len(s), "sizes": s["group"].nunique(),
                       "noise_rel_iqr_pct": float(np.median(s["rel_iqr"]) * 100)}
                row.update(_summary(s, level))
                if level == "L3":
                    classes = Counter(s["l3_class"])
                    row["model"] = ",".join(f"{k}x{v}" for k, v in classes.most_common() if k)
                else:
                    row["model"] = "alpha+bytes/beta"
                table.append(row)
    return table
