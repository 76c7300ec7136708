"""Do the runners read their operands where a layer would? Each kernel timed as the runner lays
its operands out now (side by side) and as it did until 2026-12-07 (every operand of a rotated
copy at the same offset), and the profile's rows re-measured where the two differ.

Until 2026-12-07, ``costmodel.measure.runners._rotations`` put every dense operand of a copy at
the same offset of the shared arena, so operands of one dtype read the same bytes: ``a + b``
and ``a * b`` read one buffer twice, from memory once and from cache the second time, and the
profile holds those kernels faster than a layer, whose operands are distinct tensors, runs
them. This script measures how much, per kernel kind (``costmodel.model.cold_start.kernel_kind``,
the family plus its op), on a sample of the profile's own kernels spread over their latency
range: both layouts timed in the same rounds, interleaved, each a median over repeats
(``costmodel.measure.timing.measure``). Only kernels whose runner has two or more dense
operands of one dtype can differ; the others are not timed.

With ``--remeasure``, every kernel of the profile whose kind's median ratio (now / before)
lies outside ``[1/threshold, threshold]`` is timed again by ``python -m costmodel bench``'s own
loop (``costmodel.measure.bench.measure_specs``, the profile's rounds and budget), its old rows
are dropped (``DeviceProfile.drop_measurements``), and the profile's provenance records what was
re-measured and why. Measure alone: nothing else may run.

    python scripts/bench_runner_layout.py                      # compare only
    python scripts/bench_runner_layout.py --threads 1 --remeasure
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
from rich.console import Console
from rich.table import Table

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS.parent))

from costmodel.families.descriptor import KernelSpec  # noqa: E402
from costmodel.measure import runners  # noqa: E402
from costmodel.measure.bench import SizeLimits, measure_specs  # noqa: E402
from costmodel.measure.runtime import Runtime  # noqa: E402
from costmodel.measure.timing import TimingConfig, measure  # noqa: E402
from costmodel.model.cold_start import kernel_kind  # noqa: E402
from costmodel.store.profile import DeviceProfile  # noqa: E402

Inputs = tuple[Any, ...]


def can_alias(spec: KernelSpec, inputs: Inputs) -> bool:
    """Whether the old layout put two operands on the same bytes: two or more dense operands
    of one dtype, rotated by size (a prefix-read runner always spaced them apart)."""
    if spec.read_prefix_numel():
        return False
    dtypes = [inputs[i].dtype for i in runners.dense_operands(inputs)]
    return len(dtypes) > len(set(dtypes))


def aliased_pool(inputs: Inputs, device: torch.device) -> list[Inputs]:
    """The rotation as it was until 2026-12-07: copy c of every dense operand at offset c x its size."""
    dense = runners.dense_operands(inputs)
    spans = {i: runners._aligned(inputs[i].numel()) for i in dense}
    arena = {i: runners._arena(inputs[i].dtype, str(device)) for i in dense}
    copies = min([runners.MAX_ROTATIONS] + [arena[i].numel() // spans[i] for i in dense])
    if copies < 2:
        return [inputs]
    return [tuple(runners._arena_view(t, arena[i], c * spans[i]) if i in spans else t for i, t in enumerate(inputs))
            for c in range(copies)]


def cycling(op: Callable[..., Any], pool: list[Inputs]) -> Callable[[], Any]:
    state = {"i": 0}

    def call() -> Any:
        args = pool[state["i"] % len(pool)]
        state["i"] += 1
        return op(*args)
    return call


def sample_kernels(table: pd.DataFrame, specs: Sequence[KernelSpec], per_kind: int, min_s: float,
                   max_s: float) -> list[tuple[str, KernelSpec, float]]:
    """Up to ``per_kind`` kernels of each kind whose runner can alias, spread over the kind's
    profiled latency range (quantiles), between ``min_s`` and ``max_s``."""
    rows = pd.DataFrame({"kind": [kernel_kind(s) for s in specs], "median_s": table["median_s"].to_numpy(),
                         "i": range(len(specs))})
    rows = rows[(rows["median_s"] >= min_s) & (rows["median_s"] <= max_s)]
    picked: list[tuple[str, KernelSpec, float]] = []
    for kind, group in rows.sort_values("median_s").groupby("kind", sort=True):
        _, inputs = runners._build(specs[int(group["i"].iloc[0])], torch.device("cpu"), 0)
        if not can_alias(specs[int(group["i"].iloc[0])], inputs):
            continue
        at = np.unique(np.linspace(0, len(group) - 1, min(per_kind, len(group))).round().astype(int))
        picked += [(str(kind), specs[int(group["i"].iloc[j])], float(group["median_s"].iloc[j])) for j in at]
    return picked


def compare(picked: list[tuple[str, KernelSpec, float]], rounds: int, timing: TimingConfig,
            device: torch.device, progress: Callable[[str], None]) -> pd.DataFrame:
    """Both layouts of every picked kernel, timed in ``rounds`` interleaved passes (the order
    of the two alternates), each the median of its rounds."""
    times: dict[tuple[int, str], list[float]] = {}
    for r in range(rounds):
        for n, (kind, spec, _) in enumerate(picked):
            progress(f"round {r + 1}/{rounds}: {n + 1}/{len(picked)} {spec.label()[:60]}")
            op, inputs = runners._build(spec, device, 0)
            layouts = {"now": runners.make_runner(spec, device, cold=True),
                       "aliased": cycling(op, aliased_pool(inputs, device))}
            for name in (list(layouts) if (r + n) % 2 == 0 else list(layouts)[::-1]):
                times.setdefault((n, name), []).append(measure(layouts[name], device=device, config=timing).median_s)
    out = []
    for n, (kind, spec, profiled_s) in enumerate(picked):
        now, before = float(np.median(times[(n, "now")])), float(np.median(times[(n, "aliased")]))
        out.append({"kind": kind, "key": spec.key(), "label": spec.label(), "bytes_moved": spec.bytes_moved(),
                    "profiled_s": profiled_s, "now_s": now, "aliased_s": before, "now_over_aliased": now / before,
                    "profiled_over_now": profiled_s / now})
    return pd.DataFrame(out)


def per_kind(rows: pd.DataFrame) -> pd.DataFrame:
    g = rows.groupby("kind")
    return pd.DataFrame({
        "kernels": g.size(),
        "now_over_aliased": g["now_over_aliased"].median(),
        "p10": g["now_over_aliased"].quantile(0.1),
        "p90": g["now_over_aliased"].quantile(0.9),
        "profiled_over_now": g["profiled_over_now"].median(),
    }).reset_index()


def remeasure(profile: DeviceProfile, kinds: set[str], device: torch.device, timing: TimingConfig,
              limits: SizeLimits, console: Console) -> dict[str, Any]:
    """Time again every profile kernel of ``kinds`` (its own suite and tag kept), then drop its
    rows from before; record it in the provenance."""
    table, specs = profile.kernels(), profile.specs()
    rows = [i for i, s in enumerate(specs) if kernel_kind(s) in kinds]
    chosen = table.iloc[rows].assign(tag=lambda t: t["tag"].fillna(""), spec=[specs[i] for i in rows])
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    t0 = time.perf_counter()
    measured = 0
    for (suite, tag), group in chosen.groupby(["suite", "tag"]):
        batch = [(str(tag), spec) for spec in group["spec"]]
        console.print(f"re-measuring {len(batch)} kernels of suite {suite} ({tag or 'no tag'})")
        measured += measure_specs(batch, profile, device=device, timing=timing, limits=limits, suite=str(suite),
                                  remeasure=True).measured
    dropped = profile.drop_measurements(set(chosen["key"]), measured_before=started)
    entry = {"runner_layout": {"what": "kernels re-measured with operands side by side (runners._rotations); "
                                       "their rows from the aliased layout dropped",
                               "kinds": sorted(kinds), "kernels": measured, "rows_dropped": dropped,
                               "seconds": round(time.perf_counter() - t0, 1),
                               "command": "python scripts/bench_runner_layout.py --remeasure"}}
    profile.add_provenance(entry)
    return entry["runner_layout"]


def table_of(kinds: pd.DataFrame, threshold: float) -> Table:
    t = Table(title="runner layout: now (operands side by side) / before (aliased), per kind")
    for col in ("kind", "n", "now/old", "p10-p90", "profile/now", "redo"):
        t.add_column(col, justify="left" if col == "kind" else "right", no_wrap=col == "kind")
    for r in kinds.itertuples():
        stale = not (1 / threshold <= r.now_over_aliased <= threshold)
        t.add_row(r.kind, str(r.kernels), f"{r.now_over_aliased:.2f}", f"{r.p10:.2f}-{r.p90:.2f}",
                  f"{r.profiled_over_now:.2f}", "yes" if stale else "")
    return t


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile-root", default="profiles")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (the profile's fingerprint); default all cores")
    ap.add_argument("--per-kind", type=int, default=8, help="kernels sampled per kind (>= 1)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved passes (>= 1)")
    ap.add_argument("--budget-s", type=float, default=0.05, help="timing budget per kernel, layout and round (> 0)")
    ap.add_argument("--threshold", type=float, default=1.1, help="re-measure a kind whose median ratio is outside "
                    "[1/threshold, threshold] (> 1)")
    ap.add_argument("--remeasure", action="store_true", help="re-measure the kinds that differ in the profile")
    ap.add_argument("--out", default="results/cpu_epyc/runner_layout")
    args = ap.parse_args(argv)
    if args.per_kind < 1 or args.rounds < 1:
        ap.error(f"--per-kind and --rounds must be >= 1, got {args.per_kind} and {args.rounds}")
    if not args.budget_s > 0:
        ap.error(f"--budget-s must be > 0, got {args.budget_s}")
    if not args.threshold > 1:
        ap.error(f"--threshold must be > 1, got {args.threshold}")
    if not Path(args.profile_root).is_dir():
        ap.error(f"--profile-root {args.profile_root} is not a folder of device profiles")
    return args


def runtime(args: argparse.Namespace) -> Runtime:
    """conf/base.yaml's runtime (timing, limits, allocator) with this run's threads and profile root."""
    return Runtime.from_base_yaml(SCRIPTS.parent / "conf" / "base.yaml", threads=args.threads,
                                  profile_root=args.profile_root)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    console = Console()
    rt = runtime(args)
    try:
        profile = rt.open_profile(create=False)
    except Exception as err:  # noqa: BLE001 - say which profile is missing and how to make one
        raise SystemExit(f"bench_runner_layout.py: error: no profile for this machine under {args.profile_root} "
                         f"({rt.fingerprint.id}): {err}") from None
    table, specs = profile.kernels(), profile.specs()
    picked = sample_kernels(table, specs, args.per_kind, 5e-6, 0.05)
    console.print(f"profile {rt.fingerprint.id}: {len(specs)} kernels, {len(picked)} sampled from kinds whose "
                  "runner has two operands of one dtype")
    with console.status("") as status:
        rows = compare(picked, args.rounds, TimingConfig(min_run_time_s=args.budget_s), rt.device,
                       lambda s: status.update(s))
    kinds = per_kind(rows)
    console.print(table_of(kinds, args.threshold))
    stale = {r.kind for r in kinds.itertuples() if not 1 / args.threshold <= r.now_over_aliased <= args.threshold}
    summary: dict[str, Any] = {"what": "runner operands side by side (now) against aliased (before 2026-12-07)",
                               "profile": rt.fingerprint.id, "threads": torch.get_num_threads(),
                               "rounds": args.rounds, "threshold": args.threshold,
                               "kinds": kinds.to_dict("records"), "kinds_to_remeasure": sorted(stale)}
    if args.remeasure and stale:
        with rt.measuring("bench_runner_layout: re-measuring"):
            summary["remeasured"] = remeasure(profile, stale, rt.device, rt.timing, rt.limits, console)
        console.print(f"re-measured: {summary['remeasured']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"t{torch.get_num_threads()}"
    rows.to_csv(out / f"kernels_{tag}.csv", index=False)
    (out / f"summary_{tag}.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"written: {out / f'kernels_{tag}.csv'}, {out / f'summary_{tag}.json'}")
    return summary


if __name__ == "__main__":
    main()
