"""What the multi-process experiments (``moe_ep``, ``gnn_partition``) report alike: the gain of
one variant over another (a load-aware expert placement over contiguous, METIS over random
partitioning), measured and predicted, and how often the straggler rank was predicted right;
the cores a run may pin its ranks to; the co-location factors of their ranks (``ep.colocation``,
``partition.colocation``: ``costmodel.colocation.MODES``); the frame of their per-rank
timeline plots; the console tail of a measured run; the collectives of a predict-only what-if:
the backend the predicted device's processes run (``collective_backend``), or a link the user
states (``ep.link``, ``partition.link``: ``check_link``, ``stated_link_model``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import matplotlib
import numpy as np
import pandas as pd

from costmodel.cli.config_schema import Interval
from experiments.common import console, plt, print_summary, print_table

GAIN_LEVELS = ("L0", "L2", "L3")

#: the torch.distributed backend between the processes of a device kind (what a collective
#: profile of that device is measured on): gloo between CPU processes, NCCL between GPUs
COLLECTIVE_BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def link_constraints(block: str) -> dict[str, Any]:
    """The schema of ``<block>.link`` (a stated link for measure=false what-ifs; null: none)."""
    return {f"{block}.link.latency_us": [Interval(float, 0, None, words="a number of microseconds >= 0"), None],
            f"{block}.link.bandwidth_gb_per_s": [Interval(float, 0, None, closed="neither",
                                                          words="a number of GB/s > 0"), None]}


def check_link(block: Mapping[str, Any], field: str, measuring: bool) -> dict[str, float] | None:
    """``<field>.link`` (fields checked by ``link_constraints``): None when not stated; both
    values or neither, and only for a predict-only run (a measured run times its collectives)."""
    link = block.get("link") or {}
    latency, bandwidth = link.get("latency_us"), link.get("bandwidth_gb_per_s")
    if latency is None and bandwidth is None:
        return None
    if measuring:
        raise ValueError(f"{field}.link states a link for measure=false what-ifs; a measured run times its own "
                         f"collectives: set measure=false or drop {field}.link")
    if latency is None or bandwidth is None:
        raise ValueError(f"{field}.link needs both latency_us and bandwidth_gb_per_s, got latency_us={latency!r}, "
                         f"bandwidth_gb_per_s={bandwidth!r}")
    return {"latency_us": float(latency), "bandwidth_gb_per_s": float(bandwidth)}


def collective_backend(fingerprint: Any) -> str:
    """The collective backend between processes of the device a profile ``fingerprint`` describes."""
    kind = str(getattr(fingerprint, "device_kind", "cpu"))
    if kind not in COLLECTIVE_BACKENDS:
        raise ValueError(f"no collective backend is known for device kind {kind!r} (known: {sorted(COLLECTIVE_BACKENDS)})")
    return COLLECTIVE_BACKENDS[kind]


def stated_link_model(link: Mapping[str, float], world_size: int, backend: str, field: str) -> tuple[Any, str]:
    """An L2-only all-to-all of the stated link: ``t = alpha + bytes moved / beta`` per rank
    (``costmodel.collectives.make_latency_bandwidth_model``; bytes moved = sent + received off
    the rank, so a full-duplex link of B GB/s each way is 2B), and how it was made."""
    from costmodel.collectives import make_latency_bandwidth_model  # noqa: PLC0415

    cm = make_latency_bandwidth_model(link["latency_us"] * 1e-6, link["bandwidth_gb_per_s"] * 1e9, world_size,
                                      backend=backend)
    return cm, (f"a stated link ({field}.link, not measured): alpha {link['latency_us']:g} us, "
                f"{link['bandwidth_gb_per_s']:g} GB/s moved per rank (sent + received), {backend} W={world_size}")


def missing_link_message(fingerprint: Any, backend: str, world_size: int, field: str) -> str:
    """What a what-if for another device kind says when no collective model of its backend is stored."""
    return (f"measure=false with profile {fingerprint.id} (a {fingerprint.device_kind} device) needs a {backend} "
            f"all-to-all model for W={world_size}, and this host's gloo collectives say nothing about it (the "
            f"collective bench runs gloo processes; an NCCL one is not built yet). State the link instead: "
            f"{field}.link.latency_us=... {field}.link.bandwidth_gb_per_s=... (bytes moved per rank per second, "
            f"sent + received; a full-duplex link of B GB/s each way is 2B)")


#: a predicted gain counts as right within this many points of the measured one (issue 27's target)
GAIN_TOLERANCE = 0.05


def round_columns(round_medians_s: Sequence[float]) -> dict[str, float]:
    """``measured_round{k}_s``: each measurement round's median step, for ``variant_gains``' noise."""
    return {f"measured_round{k}_s": float(m) for k, m in enumerate(round_medians_s)}


def variant_gains(df: pd.DataFrame, column: str, variant: str, baseline: str,
                  levels: Sequence[str] = GAIN_LEVELS) -> list[dict[str, Any]]:
    """Per point and backend, the gain 1 - step(variant) / step(baseline) of ``df``'s rows whose
    ``column`` names them: measured (where ``measured_s`` is there), predicted per level (where
    the baseline's prediction is positive), and whether the L3 gain has the measured one's sign.

    With the rounds' medians (``measured_round{k}_s``, two or more), the measured gain's noise:
    ``measured_gain_se``, the standard error of the per-round gains 1 - round(variant) /
    round(baseline) (their standard deviation over sqrt(rounds): the rounds sample the machine's
    spells, which the repeats inside one round do not), and whether L3 is within
    ``GAIN_TOLERANCE`` of the measured gain, and within max(``GAIN_TOLERANCE``, 2 se)."""
    out = []
    for (point, backend), g in df.groupby(["point", "backend"], sort=True):
        by = {r[column]: r for _, r in g.iterrows()}
        if variant not in by or baseline not in by:
            continue
        va, ba = by[variant], by[baseline]
        gain: dict[str, Any] = {"point": int(point), "value": va["value"], "backend": backend}
        if "measured_s" in va and pd.notna(va["measured_s"]):
            gain["measured_gain"] = 1 - va["measured_s"] / ba["measured_s"]
            rounds = sorted(c for c in va.index if c.startswith("measured_round") and pd.notna(va[c])
                            and c in ba.index and pd.notna(ba[c]))
            if len(rounds) >= 2:
                per_round = [1 - va[c] / ba[c] for c in rounds]
                gain["measured_gain_rounds"] = per_round
                gain["measured_gain_se"] = float(np.std(per_round, ddof=1) / np.sqrt(len(per_round)))
        gain.update({f"predicted_gain_{lv}": 1 - va[f"pred_{lv}_s"] / ba[f"pred_{lv}_s"]
                     for lv in levels if f"pred_{lv}_s" in ba and ba[f"pred_{lv}_s"] > 0})
        if "measured_gain" in gain and "predicted_gain_L3" in gain:
            off = abs(gain["predicted_gain_L3"] - gain["measured_gain"])
            gain["sign_agrees_L3"] = bool(np.sign(gain["measured_gain"]) == np.sign(gain["predicted_gain_L3"]))
            gain["within_tolerance_L3"] = bool(off <= GAIN_TOLERANCE)
            if "measured_gain_se" in gain:
                gain["within_noise_L3"] = bool(off <= max(GAIN_TOLERANCE, 2 * gain["measured_gain_se"]))
        out.append(gain)
    return out


def gain_summary(gains: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How many predicted L3 gains are within ``GAIN_TOLERANCE`` of the measured ones, within their
    noise (max of the tolerance and 2 se), of the right sign; the median measured noise (2 se)."""
    scored = [g for g in gains if "within_tolerance_L3" in g]
    noisy = [g for g in scored if "within_noise_L3" in g]
    out: dict[str, Any] = {"points": len(scored), "tolerance": GAIN_TOLERANCE,
                           "within_tolerance_L3": sum(g["within_tolerance_L3"] for g in scored),
                           "sign_agrees_L3": sum(g["sign_agrees_L3"] for g in scored)}
    if noisy:
        out["within_noise_L3"] = sum(g["within_noise_L3"] for g in noisy)
        out["median_two_se"] = float(np.median([2 * g["measured_gain_se"] for g in noisy]))
    return out


def print_gains(gains: Sequence[Mapping[str, Any]], summ: Mapping[str, Any], *, title: str, what: str) -> None:
    """The gains table (measured, its standard error where rounds give one, predicted at L3 and L2)
    and the line of ``print_gain_summary``; nothing without gains."""
    if not gains:
        return
    frame = pd.DataFrame(gains)
    columns = {"value": "", "backend": "", "measured_gain": ".2f", "measured_gain_se": ".2f",
               "predicted_gain_L3": ".2f", "predicted_gain_L2": ".2f"}
    print_table(frame, {c: f for c, f in columns.items() if c in frame}, title=title)
    print_gain_summary(summ, what)


def print_gain_summary(summ: Mapping[str, Any], what: str) -> None:
    if not summ.get("points"):
        return
    line = (f"{what}: L3 within {summ['tolerance'] * 100:.0f} points of the measured gain at {summ['within_tolerance_L3']} "
            f"of {summ['points']} points, same sign at {summ['sign_agrees_L3']}")
    if "within_noise_L3" in summ:
        line += (f"; the measured gains' noise (2 standard errors over the rounds) is {summ['median_two_se'] * 100:.1f} "
                 f"points at the median, and L3 is within max({summ['tolerance'] * 100:.0f} points, that noise) at "
                 f"{summ['within_noise_L3']} of {summ['points']}")
    console.print(line)


def straggler_summary(df: pd.DataFrame, rule: str) -> dict[str, Any]:
    """Points, points whose ranks differ beyond their noise (``straggler_clear``), and how many
    of those had the straggler predicted right; ``rule`` says how each side picks it."""
    clear = df[df["straggler_clear"]]
    return {"points": int(len(df)), "clear_points": int(len(clear)),
            "agree": int((clear["straggler_pred"] == clear["straggler_measured"]).sum()), "rule": rule}


def usable_cores() -> int:
    """The cores this process may run on (one pinned core per rank)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def print_straggler_and_summary(straggler: Mapping[str, Any], summ: dict[str, Any], out: Path) -> dict[str, Any]:
    """The console tail of a measured multi-process run: how often the straggler was predicted
    right (``straggler_summary``), the summary, where the outputs are. Returns ``summ``."""
    console.print(f"straggler predicted = measured at {straggler['agree']} of {straggler['clear_points']} points whose "
                  f"ranks differ beyond their noise ({straggler['points']} points in all)")
    print_summary(summ)
    console.print(f"outputs in {out}")
    return summ


def timeline_grid(points: Sequence[Mapping[str, Any]], row_key: str,
                  height: Callable[[int], float]) -> tuple[list[Any], list[Any], Any, Any]:
    """The frame of a per-rank timeline plot: one row per value of ``row_key`` (placement,
    partitioner) and one column each for the least and the most skewed swept value; the
    figure is 6.5 in wide per column and ``height(rows)`` high. Returns (rows, columns, fig, axes)."""
    rows = list(dict.fromkeys(p[row_key] for p in points))
    values = sorted({p["value"] for p in points}, key=float)
    cols = [values[0], values[-1]] if len(values) > 1 else values[:1]
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(6.5 * len(cols), height(len(rows))), squeeze=False)
    return rows, cols, fig, axes


def label_timeline_axis(ax: Any, ticks: Sequence[float], labels: Sequence[str], title: str) -> None:
    """One panel's rank labels (top to bottom), title and time axis."""
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=8)
    ax.set_xlabel("time from the step's start [ms]", fontsize=8)
    ax.grid(True, axis="x", alpha=0.2)


def finish_timelines(fig: Any, handles: list[Any], *, wait_label: str, title: str, path: Path,
                     rect: tuple[float, float, float, float]) -> None:
    """The legend (the phases' ``handles`` and the hatched predicted wait), title, save."""
    handles = [*handles, matplotlib.patches.Patch(facecolor="white", edgecolor="k", hatch="///", label=wait_label)]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- co-location

def rank_colocation(rt: Any, world_size: int, mode: str, *, field: str, measuring: bool, what: str,
                    progress: bool = False, profile: Any = None) -> tuple[Any, str]:
    """``field``'s co-location factors for the ranks' cores (``costmodel.colocation.resolve_colocation``):
    the profile's (measured first when missing and measuring), measured anew, or none;
    ``profile``: the folder predicted from (measure=false; default this device's profile)."""
    from contextlib import nullcontext  # noqa: PLC0415

    from costmodel.collectives.workers import pick_cores  # noqa: PLC0415
    from costmodel.colocation import resolve_colocation  # noqa: PLC0415
    from costmodel.colocation.measure import quick_timing  # noqa: PLC0415

    if mode == "off":
        return None, f"{field}=off: every rank's kernels predicted as measured alone"
    if mode == "measure" and not measuring:  # predict-only measures nothing: the factors the last run measured
        colo, how = rank_colocation(rt, world_size, "profile", field=field, measuring=False, what=what,
                                    progress=progress, profile=profile)
        return colo, f"{field}=measure with measure=false (predicts only): the factors last measured; {how}"
    cores, note = pick_cores(world_size) if measuring else (None, "")
    if measuring and cores is None:
        return None, f"{field}={mode}: the ranks are {note}, so no placement to measure; predicted alone"
    profile = profile if profile is not None else rt.open_profile(create=measuring)
    with rt.measuring(f"{what}: co-location factors") if measuring else nullcontext():
        colo, how = resolve_colocation(mode, profile, measuring=measuring, cores=cores, field=field,
                                       timing=quick_timing(rt.timing), measure_lock=False, progress=progress)
    if colo is not None and not measuring:
        how += (f"; measured on {colo.placement.get('id', '?')}, applied to W={world_size} ranks "
                "(more co-running ranks may slow each other more: extrapolated)")
    return colo, how


def colocation_details(df: pd.DataFrame, colo: Any, how: str, mode: str) -> dict[str, Any]:
    """``details.colocation``: the mode, the factors, and the held-out L3 error with and without
    them (``df``: ``measured_s``, ``pred_L3_s`` and ``pred_alone_L3_s`` per point)."""
    out: dict[str, Any] = {"mode": mode, "how": how, "applied": colo is not None}
    if colo is None:
        return out
    out.update(colo.to_dict())
    meas = df["measured_s"].to_numpy(dtype=float)
    with_ = 100 * np.abs(df["pred_L3_s"].to_numpy(dtype=float) / meas - 1)
    without = 100 * np.abs(df["pred_alone_L3_s"].to_numpy(dtype=float) / meas - 1)
    out["median_ape_L3_pct"] = float(np.median(with_))
    out["median_ape_L3_pct_alone"] = float(np.median(without))
    out["median_pred_over_measured_L3"] = float(np.median(df["pred_L3_s"] / df["measured_s"]))
    out["median_pred_over_measured_L3_alone"] = float(np.median(df["pred_alone_L3_s"] / df["measured_s"]))
    return out
