"""`python -m costmodel bench`: measure this device's ceilings and a suite into its profile."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf
from costmodel.cli.console import make_console
from rich.table import Table

from costmodel.families.scatter import scatter_backends_available, torch_scatter_version
from costmodel.measure.bench import MeasureInterrupted, measure_specs
from costmodel.measure.ceilings import device_memory_bytes, ensure_ceilings
from costmodel.measure.runtime import Runtime, check_cfg, timing_config
from costmodel.measure.suite import expand_suite

console = make_console()


def ceilings_table(ceilings: dict[str, Any]) -> Table:
    table = Table(title="measured ceilings")
    table.add_column("ceiling")
    table.add_column("value", justify="right")
    table.add_row("peak matmul", f"{ceilings['peak_flops_per_s'] / 1e9:,.1f} GFLOP/s ({ceilings['dtype']})")
    table.add_row("memory bandwidth (copy, read+write)", f"{ceilings['bandwidth_bytes_per_s'] / 1e9:,.1f} GB/s")
    table.add_row("per-call overhead", f"{ceilings['overhead_s'] * 1e6:,.1f} us")
    table.add_row("ridge point", f"{ceilings['ridge_flops_per_byte']:,.1f} FLOP/byte")
    return table


def trio_table(frame: pd.DataFrame, ceilings: dict[str, Any]) -> Table | None:
    if "tag" not in frame or not frame["tag"].astype(str).str.startswith("trio:").any():
        return None
    trio = frame[frame["tag"].astype(str).str.startswith("trio:")]
    table = Table(title="same FLOPs, different latency (equal 2MKN)")
    for col in ("shape", "M x K x N", "GFLOP", "latency ms", "GFLOP/s", "% of peak", "AI FLOP/B"):
        table.add_column(col, justify="right")
    for _, r in trio.iterrows():
        achieved = r["flops"] / r["median_s"]
        table.add_row(
            r["tag"].split(":", 1)[1], f"{int(r['m'])} x {int(r['k'])} x {int(r['n'])}", f"{r['flops'] / 1e9:.3f}",
            f"{r['median_s'] * 1e3:.3f}", f"{achieved / 1e9:.1f}",
            f"{100 * achieved / ceilings['peak_flops_per_s']:.1f}", f"{r['flops'] / r['bytes_moved']:.1f}",
        )
    return table


def family_table(frame: pd.DataFrame) -> Table:
    table = Table(title="profile contents")
    for col in ("family", "kernels", "noisy", "median latency range", "median rel. IQR"):
        table.add_column(col, justify="right")
    for family, g in frame.groupby("family"):
        table.add_row(
            str(family), str(len(g)), str(int(g["noisy"].sum())),
            f"{g['median_s'].min() * 1e6:,.1f} us .. {g['median_s'].max() * 1e3:,.2f} ms",
            f"{100 * g['rel_iqr'].median():.1f}%",
        )
    return table


def selected_families(value: Any) -> list[str] | None:
    """``bench.families``: null (every family of the suite), one family name, or a list of
    names (checked against the suite by ``expand_suite``)."""
    if value is None:
        return None
    if isinstance(value, str):  # bench.families=gemm: one family, not the letters g, e, m, m
        value = [value]
    elif OmegaConf.is_list(value):
        value = OmegaConf.to_container(value, resolve=True)
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(f, str) for f in value):
        raise ValueError(f"bench.families must be null (all), a family name or a non-empty list of family names, "
                         f"got {value!r}")
    return list(value)


def is_collective_suite(suite: dict[str, Any]) -> bool:
    """A collectives suite (``conf/suite/collectives.yaml``: ``ops`` and ``sizes``) is measured
    between processes by ``costmodel.collectives``, not kernel by kernel in this one."""
    return "ops" in suite and "sizes" in suite


def collective_world_size(cfg: DictConfig) -> int:
    """``bench.world_size``: ranks of a collectives suite (2 .. the cores this process may use)."""
    from costmodel.collectives.workers import usable_cores  # noqa: PLC0415

    value = (cfg.get("bench") or {}).get("world_size", 2)
    cores = len(usable_cores())
    if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= max(2, cores):
        raise ValueError(f"bench.world_size must be an integer in [2, {max(2, cores)}] (one pinned core per rank), "
                         f"got {value!r}")
    return value


def validate(cfg: DictConfig) -> list[tuple[str, Any]]:
    """Every check of ``run`` that measures nothing and sets nothing (also run on every job
    of a ``-m`` sweep before the first starts): base keys with the suite's timing, the
    families, and the whole suite expanded. Returns the (tag, descriptor) pairs; a
    collectives suite is checked by ``costmodel.collectives.suite.load_suite`` (no pairs)."""
    suite = OmegaConf.to_container(cfg.suite, resolve=True)
    assert isinstance(suite, dict)
    if is_collective_suite(suite):
        from costmodel.collectives.suite import load_suite  # noqa: PLC0415

        check_cfg(cfg)
        load_suite(suite, collective_world_size(cfg))
        return []
    device = check_cfg(cfg)
    timing_config({**OmegaConf.to_container(cfg.timing, resolve=True), **(suite.get("timing") or {})})  # type: ignore[arg-type]
    return expand_suite(
        suite,
        dtype=str(cfg.dtype),
        selected=selected_families(cfg.bench.families),
        scatter_backends=scatter_backends_available(),
        memory_bytes=device_memory_bytes(device),
    )


def run_collectives(cfg: DictConfig, suite: dict[str, Any]) -> dict[str, Any]:
    """``python -m costmodel bench suite=collectives [bench.world_size=2]``: the collectives
    suite on W gloo processes of this host (``costmodel.collectives.bench_collectives``),
    into the collective profile beside this device's profile (its fingerprint: this process's
    device, threads and allocator, plus backend, world size and the ranks' cores)."""
    from costmodel.collectives.bench import bench_collectives  # noqa: PLC0415
    from costmodel.collectives.report import fit_report  # noqa: PLC0415
    from costmodel.collectives.store import CollectiveProfile  # noqa: PLC0415

    rt = Runtime.from_cfg(cfg)
    result = bench_collectives(collective_world_size(cfg), suite, rt.profile_root, progress=bool(cfg.bench.progress))
    console.print(f"collectives: {result.rows_added} rows added ({result.rows_total} in all) in {result.wall_s:.1f} s, "
                  f"ranks {result.note}; profile {result.path}")
    fit_report(CollectiveProfile.load(result.path).measurements())  # held out by message size, printed
    return {"collectives": str(result.path), "rows_added": result.rows_added, "wall_s": result.wall_s}


def run(cfg: DictConfig) -> dict[str, Any]:
    tagged = validate(cfg)
    suite = OmegaConf.to_container(cfg.suite, resolve=True)
    assert isinstance(suite, dict)
    if is_collective_suite(suite):
        return run_collectives(cfg, suite)
    rt = Runtime.from_cfg(cfg, timing_overrides=suite.get("timing"))
    selected = selected_families(cfg.bench.families)
    profile = rt.open_profile()
    profile.require_writable("measure into this device's profile")
    console.print(f"device: {rt.fingerprint.describe()}\nprofile: {profile.path}")
    start = time.perf_counter()
    remeasure = bool(cfg.bench.remeasure)
    provenance: dict[str, Any] = {
        "command": " ".join(sys.argv), "suite": suite["name"], "families": selected,
        "torch_scatter": torch_scatter_version() or "absent", "timing": asdict(rt.timing),
    }
    with rt.measuring(f"bench suite={suite['name']}") as lock_note:
        provenance["measure_lock"] = lock_note
        ceilings = ensure_ceilings(profile, rt.device, rt.dtype, rt.timing, remeasure=remeasure)
        console.print(ceilings_table(ceilings))
        try:
            result = measure_specs(
                tagged, profile, device=rt.device, timing=rt.timing, limits=rt.limits, suite=str(suite["name"]),
                remeasure=remeasure, show_progress=bool(cfg.bench.progress),
            )
        except MeasureInterrupted as stop:
            profile.add_provenance({**provenance, "interrupted": str(stop), "wall_s": time.perf_counter() - start})
            raise
    wall_s = time.perf_counter() - start
    profile.add_provenance({
        **provenance, "measured": result.measured, "rows_added": result.rows, "already_present": result.already,
        "partially_present": result.partial, "skipped": len(result.skipped), "noisy": result.noisy, "wall_s": wall_s,
    })
    frame = profile.kernels()
    console.print(family_table(frame))
    trio = trio_table(frame, ceilings)
    if trio is not None:
        console.print(trio)
    for s in result.skipped:
        console.print(f"[yellow]skipped[/] {s['label']}: {s['reason']}")
    partial = f", {result.partial} partially measured (now resumed)" if result.partial else ""
    console.print(
        f"measured {result.measured} kernels ({result.rows} rows, {result.noisy} noisy); before this run "
        f"{result.already} were complete in the profile{partial}; {len(result.skipped)} skipped; "
        f"wall time {wall_s:.1f} s"
    )
    return {"profile": str(profile.path), "measured": result.measured, "wall_s": wall_s}
