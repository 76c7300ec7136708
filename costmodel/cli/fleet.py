"""`python -m costmodel fleet PROFILE_ROOT [--out DIR]`: every device profile under a root, side by side.

A lab's profiles are one folder per device fingerprint, possibly written by many machines
at once on a shared file system (every profile file is written atomically, so a reader
sees complete files). Nothing is unpickled from the root: each profile's models come from
this user's model cache (``costmodel.store.model_cache``), fitted from its measurements on a
miss, and nothing is written into the profiles. For each profile found under the root
(any depth):

- ceilings: measured peak FLOP/s, memory bandwidth, per-call overhead (and the cold-call
  overhead of a cold-cache profile), ridge point = peak / bandwidth (Williams, Waterman &
  Patterson, "Roofline", CACM 2009);
- per-family achieved efficiency: the median, over the profile's kernels of a family, of
  achieved FLOP/s / peak (bytes/s / bandwidth for kernels without arithmetic: gather,
  sort, histogram, copies; ``costmodel.model.models.kernel_work``);
- the same reference workloads predicted on each device at L0 (FLOPs / peak) and L3 (the
  device's fitted model), with each level's ranking of the devices: where the two
  rankings differ, FLOPs would have bought the wrong device.

Layering: this module is part of ``costmodel`` and imports nothing of ``sim`` (``sim``
depends on ``costmodel``, never the reverse). The workloads are kernel traces
(``costmodel.families`` descriptors) that the caller passes in as ``workloads_for(dtype)
-> {name: trace}``; the command line's are ``sim.workloads.reference.reference_workloads`` (the
``moe_skew`` default layer at three routing concentrations, the ``gnn_degree`` default
layer, and a dense MLP), named in ``main`` only as the command's default.

Bad input, said before anything is fitted where it can be, and the rest of the fleet
kept: a corrupt profile is skipped with a warning naming it and why, and so is an
inconsistent one (a fingerprint.json whose stored id is not the id its fields give, e.g.
edited to name another device, or a folder not named by that id), one whose fingerprint
names a dtype or cache mode this code does not know, and a folder that cannot be read
(its profiles cannot even be found): each is listed as skipped and in no table. A
profile whose models cannot be read or fitted keeps its ceilings and efficiency, without
L3, with a warning. An empty root is an error, and so is ``--out`` naming a file. Names
read from profiles are printed as they are, never as rich markup.
Outputs in ``--out`` (default outputs/fleet/<time>): fleet_ceilings.csv,
fleet_efficiency.csv, fleet_predictions.csv, fleet.png; rich tables on the console.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from rich.table import Table  # noqa: E402

from costmodel.cli.console import literal, make_console  # noqa: E402
from costmodel.measure.device import Fingerprint  # noqa: E402
from costmodel.families.descriptor import FLOAT_DTYPES, KernelSpec  # noqa: E402
from costmodel.model.composition import composition_s  # noqa: E402
from costmodel.model.models import ExtrapolationWarning, counted_in_bytes, kernel_work  # noqa: E402
from costmodel.store.model_cache import ModelCacheWarning  # noqa: E402
from costmodel.model.predictor import MIN_ROWS_TO_FIT, CostModel  # noqa: E402
from costmodel.store.profile import FINGERPRINT, DeviceProfile, ProfileError  # noqa: E402

log = logging.getLogger(__name__)
console = make_console(width=160)
LEVELS = ("L0", "L3")
#: fingerprint values this code can predict for (the reference traces are built in the dtype)
CACHE_MODES = ("warm", "cold")
#: the command line's workloads, ``module:function`` (see ``main``); the library never imports it
DEFAULT_WORKLOADS = "sim.workloads.reference:reference_workloads"

#: ``workloads_for(dtype) -> {workload name: kernel trace}``
WorkloadsFor = Callable[[str], Mapping[str, Sequence[KernelSpec]]]


class FleetError(RuntimeError):
    """The profile root holds no usable device profile."""


@dataclass
class Device:
    """One profile of the fleet, read once."""

    label: str
    path: Path
    fingerprint: Fingerprint
    ceilings: Mapping[str, Any]
    kernels: pd.DataFrame
    model: CostModel | None
    notes: list[str] = field(default_factory=list)


def find_profiles(root: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Every folder under ``root`` (any depth) holding a fingerprint.json, sorted, and every
    folder that could not be listed, with why (a profile in it cannot even be found).
    Symbolic links to folders are not followed (as ``Path.rglob``)."""
    unreadable: list[tuple[Path, str]] = []

    def failed(err: OSError) -> None:
        unreadable.append((Path(err.filename if err.filename is not None else root),
                           f"cannot list this folder ({err.strerror or type(err).__name__}): any profile in it is left out"))

    found = {Path(folder) for folder, _, files in os.walk(root, onerror=failed) if FINGERPRINT in files}
    return sorted(found), sorted(unreadable)


def load_device(path: Path) -> Device:
    """Read a profile and its models; ProfileError (or any read error) when it is corrupt or
    inconsistent: a fingerprint.json whose stored id its fields do not give, or a folder
    not named by that id."""
    profile = DeviceProfile.load(path)
    fp = profile.fingerprint
    # checked before anything is fitted: the reference traces are built in the profile's dtype
    if fp.dtype not in FLOAT_DTYPES:
        raise ProfileError(f"{path / FINGERPRINT}: dtype must be one of {list(FLOAT_DTYPES)}, got {fp.dtype!r}")
    if fp.cache not in CACHE_MODES:
        raise ProfileError(f"{path / FINGERPRINT}: cache must be one of {list(CACHE_MODES)}, got {fp.cache!r}")
    ceilings = profile.ceilings()
    if ceilings is None:
        raise ProfileError(f"{path} has no ceilings.json (its bench has not measured them yet)")
    for key in ("peak_flops_per_s", "bandwidth_bytes_per_s", "overhead_s"):
        value = ceilings.get(key)
        if not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
            raise ProfileError(f"{path / 'ceilings.json'} is corrupted: {key} must be a positive number, got {value!r}")
    kernels = profile.kernels()
    # DeviceProfile.load refused a fingerprint.json whose stored id its fields do not give
    if path.name != profile.fingerprint.id:
        raise ProfileError(f"{path}: the folder's name is not its fingerprint's id {profile.fingerprint.id!r} "
                           f"({profile.fingerprint.describe()}); a profile lives in <root>/<fingerprint id>, so this "
                           "one was renamed, copied or edited by hand and is left out of every table")
    notes: list[str] = []
    model = None
    if len(kernels) >= MIN_ROWS_TO_FIT:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the estimators' fitting chatter
                warnings.simplefilter("always", ModelCacheWarning)  # but a refused cache or an ignored pickle is said
                model = CostModel.load(profile)  # this user's cache; fitted from the measurements on a miss
        except Exception as err:  # a corrupt bundle or measurements no model fits: this profile has no L3
            reason = f"its cost models cannot be read or fitted ({type(err).__name__}: {err})"
            _warn(f"profile {path}: {reason}; shown without L3")
            notes.append(f"no L3: {reason}")
        else:
            if model.origin == "fitted":
                notes.append(f"fitted now on {len(kernels)} kernels (cached for this user, not in the profile)")
    else:
        notes.append(f"only {len(kernels)} kernels: no L3")
    return Device(path.name, path, fp, ceilings, kernels, model, notes)


def _warn(message: str) -> None:
    """A warning on the console (as it is: never read as markup) and in the log."""
    log.warning(message)
    console.print(literal(f"warning: {message}", style="yellow"))


def load_fleet(root: str | Path) -> tuple[list[Device], list[tuple[Path, str]]]:
    """Every readable profile under ``root``; corrupt ones, and folders that cannot be
    listed, are skipped with a warning naming them and why."""
    root = Path(root)
    if not root.is_dir():
        raise FleetError(f"profile root {root} does not exist or is not a folder")
    paths, unreadable = find_profiles(root)
    if any(folder == root for folder, _ in unreadable):
        raise FleetError(f"profile root {root} cannot be read: {dict(unreadable)[root]}")
    skipped: list[tuple[Path, str]] = []
    for folder, reason in unreadable:
        skipped.append((folder, reason))
        _warn(f"skipping folder {folder}: {reason}")
    if not paths:
        raise FleetError(f"no device profiles under {root} (looked for <profile>/{FINGERPRINT} at any depth"
                         + (f"; {len(unreadable)} folder(s) could not be read" if unreadable else "")
                         + "); write one with `python -m costmodel bench profile.root=...`")
    devices = []
    for path in paths:
        try:
            devices.append(load_device(path))
        except Exception as err:  # a corrupt file of any kind: skip this profile, keep the rest
            reason = f"{type(err).__name__}: {err}"
            skipped.append((path, reason))
            _warn(f"skipping profile {path}: {reason}")
    if not devices:
        raise FleetError(f"no readable device profile under {root}: all {len(paths)} were skipped")
    _label(devices)
    return devices, skipped


def _label(devices: Sequence[Device]) -> None:
    """Short readable labels; the fingerprint id's hash where two would read the same."""
    for d in devices:
        fp = d.fingerprint
        name = fp.device_name.replace("(R)", "").replace("Processor", "").replace("  ", " ").strip()
        d.label = f"{name} t{fp.threads} {fp.dtype} {fp.cache}"
    counts = pd.Series([d.label for d in devices]).value_counts()
    for d in devices:
        if counts[d.label] > 1:
            d.label += f" #{d.path.name[-6:]}"


# ----------------------------------------------------------------------------- tables


def ceilings_table(devices: Sequence[Device]) -> pd.DataFrame:
    rows = []
    for d in devices:
        c, fp = d.ceilings, d.fingerprint
        rows.append({
            "device": d.label, "kind": fp.device_kind, "torch": fp.torch_version, "threads": fp.threads, "dtype": fp.dtype,
            "cache": fp.cache, "kernels": len(d.kernels), "peak_gflops": c["peak_flops_per_s"] / 1e9,
            "bandwidth_gb_s": c["bandwidth_bytes_per_s"] / 1e9, "overhead_us": c["overhead_s"] * 1e6,
            "cold_call_us": c.get("cold_call_overhead_s", float("nan")) * 1e6,
            "ridge_flops_per_byte": c["peak_flops_per_s"] / c["bandwidth_bytes_per_s"],
            "notes": "; ".join(d.notes), "profile": d.path.name,
        })
    return pd.DataFrame(rows)


def efficiency_table(devices: Sequence[Device]) -> pd.DataFrame:
    """Per device and family: kernels, median achieved rate and its share of the ceiling."""
    rows = []
    for d in devices:
        k = d.kernels
        if k.empty:
            continue
        work = kernel_work(k)
        rate = work / k["median_s"].to_numpy(dtype=np.float64)
        by_bytes = counted_in_bytes(k)
        ceiling = np.where(by_bytes, d.ceilings["bandwidth_bytes_per_s"], d.ceilings["peak_flops_per_s"])
        frame = pd.DataFrame({"family": k["family"], "rate": rate, "share": rate / ceiling, "by_bytes": by_bytes})
        for family, g in frame.groupby("family"):
            bytes_work = bool(g["by_bytes"].all())
            rows.append({"device": d.label, "family": family, "kernels": len(g),
                         "ceiling": "bandwidth" if bytes_work else "peak",
                         "median_achieved": float(g["rate"].median()) / 1e9,
                         "unit": "GB/s" if bytes_work else "GFLOP/s",
                         "median_pct_of_ceiling": 100 * float(g["share"].median())})
    return pd.DataFrame(rows)


def trace_seconds(model: CostModel, trace: Sequence[KernelSpec], level: str) -> float:
    """Predicted seconds of one trace at ``level``: its kernels' predictions summed, plus the
    host's cost of each call among other kinds, and the cold start of each distinct kind and later
    calls' re-cooling on a cold-cache profile (``costmodel.model.composition``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)  # a reference layer may lie past the profile
        per_kernel = model.predict(trace, [level])[level].to_numpy(dtype=np.float64)
    return float(per_kernel.sum() + composition_s(model, level, trace))


def predictions_table(devices: Sequence[Device], workloads_for: WorkloadsFor) -> pd.DataFrame:
    """Per workload and device: L0 and L3 predicted seconds and each level's device ranking
    (1 = fastest, among the devices that could predict it). ``workloads_for(dtype)`` gives
    {name: trace} in that dtype (called once per dtype)."""
    rows = []
    by_dtype: dict[str, Mapping[str, Sequence[KernelSpec]]] = {}
    for d in devices:
        dtype = d.fingerprint.dtype
        if dtype not in by_dtype:
            by_dtype[dtype] = workloads_for(dtype)
        for name, trace in by_dtype[dtype].items():
            row: dict[str, Any] = {"workload": name, "device": d.label, "note": ""}
            for lv in LEVELS:
                if d.model is None:
                    row[f"{lv}_s"], row["note"] = float("nan"), "no fitted model"
                    continue
                try:
                    row[f"{lv}_s"] = trace_seconds(d.model, trace, lv)
                except ValueError as err:  # e.g. a profile without this workload's kernel families
                    row[f"{lv}_s"], row["note"] = float("nan"), str(err).split(";")[0]
                except Exception as err:  # a model that loaded but cannot predict: this device, not the fleet
                    row[f"{lv}_s"], row["note"] = float("nan"), f"{lv} failed: {type(err).__name__}: {err}"
                    _warn(f"profile {d.path}: {lv} of {name!r} failed ({type(err).__name__}: {err})")
            rows.append(row)
    df = pd.DataFrame(rows, columns=["workload", "device", "note", *(f"{lv}_s" for lv in LEVELS)])
    for lv in LEVELS:
        df[f"rank_{lv}"] = df.groupby("workload")[f"{lv}_s"].rank(method="min").astype("Int64")
    df["rankings_differ"] = df["rank_L0"] != df["rank_L3"]
    return df


# ----------------------------------------------------------------------------- output


def _table(df: pd.DataFrame, columns: Mapping[str, str], title: str) -> None:
    """A rich table; every title and cell as it is (device names and notes come from files)."""
    table = Table(title=literal(title))
    for col in columns:
        table.add_column(literal(col), justify="right")
    for _, row in df.iterrows():
        cells = []
        for col, spec in columns.items():
            v = row[col]
            if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
                cells.append("-")
            elif spec == "ms":
                cells.append(f"{v * 1e3:,.3f}")
            else:
                cells.append(str(v) if spec == "" else format(v, spec))
        table.add_row(*(literal(c) for c in cells))
    console.print(table)


def _as_text(label: object) -> str:
    """A label matplotlib draws as it is: ``$`` escaped, so a name is never read as mathtext."""
    return str(label).replace("$", r"\$")


def plot_fleet(ceil: pd.DataFrame, eff: pd.DataFrame, pred: pd.DataFrame, path: Path) -> None:
    """Three panels, devices side by side: ceilings, per-family efficiency, predicted latency."""
    devices = list(ceil["device"])
    width = 0.8 / max(len(devices), 1)
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.5))
    metrics = [("peak_gflops", "peak GFLOP/s"), ("bandwidth_gb_s", "bandwidth GB/s"), ("ridge_flops_per_byte", "ridge FLOP/B"),
               ("overhead_us", "overhead us")]
    for i, dev in enumerate(devices):
        row = ceil[ceil["device"] == dev].iloc[0]
        xs = np.arange(len(metrics)) + (i - (len(devices) - 1) / 2) * width
        axes[0].bar(xs, [row[m] for m, _ in metrics], width, label=_as_text(dev), color=f"C{i}")
    axes[0].set_xticks(range(len(metrics)), [label for _, label in metrics], fontsize=8)
    axes[0].set_yscale("log")
    axes[0].set_title("measured ceilings", fontsize=10)
    families = sorted(eff["family"].unique()) if len(eff) else []
    for i, dev in enumerate(devices):
        g = eff[eff["device"] == dev].set_index("family") if len(eff) else pd.DataFrame()
        xs = np.arange(len(families)) + (i - (len(devices) - 1) / 2) * width
        axes[1].bar(xs, [g["median_pct_of_ceiling"].get(f, np.nan) if len(g) else np.nan for f in families], width,
                    color=f"C{i}")
    axes[1].set_xticks(range(len(families)), families, rotation=45, ha="right", fontsize=8)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("median achieved / ceiling [%]")
    axes[1].set_title("per-family achieved efficiency (peak, or bandwidth for byte-bound families)", fontsize=10)
    names = list(dict.fromkeys(pred["workload"]))
    for i, dev in enumerate(devices):
        g = pred[pred["device"] == dev].set_index("workload")
        xs = np.arange(len(names)) + (i - (len(devices) - 1) / 2) * width
        axes[2].bar(xs, [g["L3_s"].get(n, np.nan) * 1e3 for n in names], width, color=f"C{i}")
        axes[2].scatter(xs, [g["L0_s"].get(n, np.nan) * 1e3 for n in names], marker="_", s=200, color="k", zorder=3,
                        label="L0 = FLOPs / peak" if i == 0 else None)
    axes[2].set_xticks(range(len(names)), [_as_text(n) for n in names], rotation=30, ha="right", fontsize=7)
    axes[2].set_yscale("log")
    axes[2].set_ylabel("predicted latency [ms]")
    axes[2].set_title("reference workloads: L3 (bars) vs L0 (black ticks)", fontsize=10)
    axes[2].legend(fontsize=7)
    axes[0].legend(fontsize=7, loc="lower left")
    for ax in axes:
        ax.grid(True, axis="y", which="both", alpha=0.2)
    fig.suptitle("device fleet, side by side", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def check_out(out: str | Path | None) -> Path:
    """The output folder (default outputs/fleet/<time>), checked before any profile is read
    or fitted: not an existing file, and below a folder this user can write (created later,
    once there is something to write). ``FleetError`` naming ``--out`` otherwise."""
    path = Path(out) if out is not None else Path("outputs") / "fleet" / time.strftime("%Y-%m-%d_%H-%M-%S")
    if path.exists() and not path.is_dir():
        raise FleetError(f"--out {path} is an existing file, not a folder: name a folder (created if missing)")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise FleetError(f"--out {path}: {parent} is a file, so no folder can be made below it; name another folder")
    if not path.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise FleetError(f"--out {path}: no folder can be created in {parent} (not writable by this user); "
                         "name a folder you can write")
    return path


def _make_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise FleetError(f"--out {out} cannot be created ({err.strerror or type(err).__name__}: "
                         f"{err.filename or out}); name a folder you can write") from None


def run(root: str | Path, out: str | Path | None = None, *, workloads_for: WorkloadsFor) -> dict[str, pd.DataFrame]:
    """The fleet report: tables printed and written, the plot drawn; returns the tables.

    ``workloads_for(dtype) -> {name: trace}`` gives the workloads every device predicts
    (e.g. ``sim.workloads.reference.reference_workloads``), called once per dtype of the fleet."""
    if not callable(workloads_for):
        raise TypeError(f"workloads_for must be a callable dtype -> {{name: trace}}, got {type(workloads_for).__name__}")
    out = check_out(out)
    devices, skipped = load_fleet(root)
    ceil = ceilings_table(devices)
    eff = efficiency_table(devices)
    pred = predictions_table(devices, workloads_for)
    _make_out(out)
    ceil.to_csv(out / "fleet_ceilings.csv", index=False)
    eff.to_csv(out / "fleet_efficiency.csv", index=False)
    pred.to_csv(out / "fleet_predictions.csv", index=False)
    plot_fleet(ceil, eff, pred, out / "fleet.png")

    _table(ceil, {"device": "", "kind": "", "kernels": "", "peak_gflops": ".1f", "bandwidth_gb_s": ".1f",
                  "overhead_us": ".2f", "cold_call_us": ".1f", "ridge_flops_per_byte": ".1f", "notes": ""},
           title=f"{len(devices)} device profiles under {root}: measured ceilings")
    if len(eff):
        wide = eff.assign(cell=[f"{p:.1f}% ({r:.1f} {u})" for p, r, u in
                                zip(eff["median_pct_of_ceiling"], eff["median_achieved"], eff["unit"])])
        wide = wide.pivot(index="device", columns="family", values="cell").reset_index()
        _table(wide, {c: "" for c in wide.columns},
               title="per-family achieved efficiency: median % of the ceiling (median achieved rate)")
    _table(pred, {"workload": "", "device": "", "L0_s": "ms", "rank_L0": "", "L3_s": "ms", "rank_L3": "", "note": ""},
           title="reference workloads predicted on each device (ms) and each level's device ranking (1 = fastest)")
    differ = pred[pred["rankings_differ"] & pred["rank_L0"].notna() & pred["rank_L3"].notna()]["workload"].unique()
    message = (f"L0 ranks the devices differently from L3 for {len(differ)} of {pred['workload'].nunique()} workloads"
               + (f": {', '.join(map(str, differ))}" if len(differ) else ""))
    console.print(literal(message))
    log.info(message)
    if skipped:
        console.print(literal(f"{len(skipped)} profile(s) or folder(s) skipped: {', '.join(str(p) for p, _ in skipped)}",
                              style="yellow"))
    console.print(literal(f"outputs in {out}"))
    return {"ceilings": ceil, "efficiency": eff, "predictions": pred,
            "skipped": pd.DataFrame(skipped, columns=["path", "reason"])}


def _default_workloads() -> WorkloadsFor:
    """The command line's workloads (``DEFAULT_WORKLOADS``), looked up by name when the
    command runs: the one place this module names ``sim``, and only as the command's
    default; a caller that wires the command (``costmodel.__main__``) can pass its own."""
    from importlib import import_module

    module, _, function = DEFAULT_WORKLOADS.partition(":")
    return getattr(import_module(module), function)


def main(argv: Sequence[str], *, workloads_for: WorkloadsFor | None = None) -> None:
    """``python -m costmodel fleet ROOT [--out DIR]``: bad input is one ``error:`` line and exit 2."""
    parser = argparse.ArgumentParser(prog="python -m costmodel fleet", description=__doc__.splitlines()[0])
    parser.add_argument("root", help="folder holding device profiles (any depth)")
    parser.add_argument("--out", default=None, help="output folder (default outputs/fleet/<time>); not an existing file")
    args = parser.parse_args(list(argv))
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[logging.NullHandler()])
    try:
        check_out(args.out)  # before the workloads are built
        run(args.root, args.out, workloads_for=workloads_for or _default_workloads())
    except FleetError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
