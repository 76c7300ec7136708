"""What the multi-process experiments (``moe_ep``, ``gnn_partition``) report alike: the gain of
one variant over another (a load-aware expert placement over contiguous, METIS over random
partitioning), measured and predicted, and how often the straggler rank was predicted right."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

GAIN_LEVELS = ("L0", "L2", "L3")


def variant_gains(df: pd.DataFrame, column: str, variant: str, baseline: str,
                  levels: Sequence[str] = GAIN_LEVELS) -> list[dict[str, Any]]:
    """Per point and backend, the gain 1 - step(variant) / step(baseline) of ``df``'s rows whose
    ``column`` names them: measured (where ``measured_s`` is there), predicted per level (where
    the baseline's prediction is positive), and whether the L3 gain has the measured one's sign."""
    out = []
    for (point, backend), g in df.groupby(["point", "backend"], sort=True):
        by = {r[column]: r for _, r in g.iterrows()}
        if variant not in by or baseline not in by:
            continue
        va, ba = by[variant], by[baseline]
        gain: dict[str, Any] = {"point": int(point), "value": va["value"], "backend": backend}
        if "measured_s" in va and pd.notna(va["measured_s"]):
            gain["measured_gain"] = 1 - va["measured_s"] / ba["measured_s"]
        gain.update({f"predicted_gain_{lv}": 1 - va[f"pred_{lv}_s"] / ba[f"pred_{lv}_s"]
                     for lv in levels if f"pred_{lv}_s" in ba and ba[f"pred_{lv}_s"] > 0})
        if "measured_gain" in gain and "predicted_gain_L3" in gain:
            gain["sign_agrees_L3"] = bool(np.sign(gain["measured_gain"]) == np.sign(gain["predicted_gain_L3"]))
        out.append(gain)
    return out


def straggler_summary(df: pd.DataFrame, rule: str) -> dict[str, Any]:
    """Points, points whose ranks differ beyond their noise (``straggler_clear``), and how many
    of those had the straggler predicted right; ``rule`` says how each side picks it."""
    clear = df[df["straggler_clear"]]
    return {"points": int(len(df)), "clear_points": int(len(clear)),
            "agree": int((clear["straggler_pred"] == clear["straggler_measured"]).sum()), "rule": rule}
