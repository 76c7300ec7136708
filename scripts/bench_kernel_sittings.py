"""Why is held out further off than replay? Context and sitting, measured on an experiment's kernels.

An experiment's held-out score rests on profile rows measured in other sittings (the bench suite,
the calibration's neighbours), while its replay sums the same kernels timed minutes ago beside
the layers (``sim.predict.paired``). On the EPYC profile the held-out regression puts the
``moe`` and ``hf_moe`` suites' own kernels at 0.94x their rows and their neighbours, measured
minutes before them, at 0.99x and 1.07x (``scripts/heldout_by_suite.py``, then with
``--tags heldout_neighbour``). Two explanations predict different things:

- **context**: a kernel timed between layers (caches and allocator churned, cores hot) runs
  slower than the same kernel timed bench-style. Then ``after_load / bench`` > 1.
- **sitting**: the VM's speed moves between sittings by more than the within-sitting noise, and
  each row keeps the speed of its sitting. Then ``after_load / bench`` ~ 1, and the same kernel
  timed in two sittings differs by more than two timings within one.

For the kernels of the chosen (suite, tag) groups of a profile, each sitting times every kernel
twice per round, in a shuffled order: bench-style (``make_runner`` with rotating cold operands,
``measure`` as the bench calls it) and after ``--load-s`` seconds of layer-like load (2048^2
GEMMs on every thread plus ``timing.cpu_evict_bytes`` written per GEMM) with no retries, as the
paired rounds time them; which comes first alternates. Per (group, family) it prints the
context ratio, the median per-kernel deviation between the two timings of one sitting and
between sittings, and now / profiled. It measures; run nothing else meanwhile.

    python scripts/bench_kernel_sittings.py PROFILE --groups moe:paired moe:heldout_neighbour \\
        --sittings 2 --gap-s 300 --out results/cpu_epyc/kernel_sittings
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel.measure.allocator import configure_allocator  # noqa: E402
from costmodel.measure.runners import make_runner  # noqa: E402
from costmodel.measure.timing import TimingConfig, evict_caches, measure  # noqa: E402
from costmodel.store.profile import DeviceProfile  # noqa: E402
from sim.predict.heldout import IGNORED_REFRESH_POLICIES  # noqa: E402

LOAD_GEMM_SIZE = 2048  # a layer-like load: square GEMMs on every thread, then an eviction


def group_kernels(profile: DeviceProfile, groups: list[tuple[str, str]], families: list[str] | None,
                  max_s: float) -> pd.DataFrame:
    """The profile's kernels of each (suite, tag) group (a kernel's group is that of its first row,
    the sitting that measured it), with their profiled seconds as the held-out fit reads them."""
    table = profile.kernels(ignore_refresh_policies=IGNORED_REFRESH_POLICIES)
    parts = []
    for suite, tag in groups:
        g = table[(table["suite"].astype(str) == suite) & (table["tag"].astype(str) == tag)
                  & (table["median_s"] <= max_s)]
        if families:
            g = g[g["family"].isin(families)]
        parts.append(g.assign(group=f"{suite}:{tag}"))
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return out[["group", "key", "family", "median_s"]].rename(columns={"median_s": "profiled_s"})


def layer_like_load(seconds: float, cfg: TimingConfig) -> None:
    a, b = torch.randn(LOAD_GEMM_SIZE, LOAD_GEMM_SIZE), torch.randn(LOAD_GEMM_SIZE, LOAD_GEMM_SIZE)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        evict_caches(torch.device("cpu"), cfg)


def time_sitting(specs: list, *, rounds: int, load_s: float, cfg: TimingConfig, seed: int,
                 label: str) -> tuple[np.ndarray, np.ndarray]:
    """(bench-style, after-load) median seconds per kernel: the median of its ``rounds`` rounds."""
    device = torch.device("cpu")
    paired_cfg = replace(cfg, retries=0)
    bench = [[] for _ in specs]
    loaded = [[] for _ in specs]
    start = time.perf_counter()
    for r in range(rounds):
        order = list(range(len(specs)))
        random.Random(seed * 1000 + r).shuffle(order)
        for n, i in enumerate(order):
            for mode in (("bench", "load") if (i + r) % 2 == 0 else ("load", "bench")):
                if mode == "load":
                    layer_like_load(load_s, cfg)
                runner = make_runner(specs[i], device, cold=True)
                if mode == "bench":
                    runner()  # the bench's size check calls it once before measuring
                m = measure(runner, device=device, config=cfg if mode == "bench" else paired_cfg)
                (bench if mode == "bench" else loaded)[i].append(m.median_s)
                runner = None
            if (n + 1) % 25 == 0 or n + 1 == len(order):
                print(f"{label} round {r + 1}/{rounds}: {n + 1}/{len(order)} kernels, "
                      f"{time.perf_counter() - start:.0f} s", flush=True)
    return np.array([np.median(b) for b in bench]), np.array([np.median(x) for x in loaded])


def median_abs_log_dev_pct(ratio: pd.Series) -> float:
    """The median per-kernel distance of ``ratio`` from 1, in percent of log (a symmetric spread)."""
    return float(100 * np.median(np.abs(np.log(ratio.to_numpy(dtype=np.float64)))))


def summarise(rows: pd.DataFrame, sittings: int) -> pd.DataFrame:
    """Per (group, family): context ratio, within-sitting and between-sitting per-kernel spread,
    and now / profiled, from the per-kernel columns ``bench_s_<k>`` and ``load_s_<k>``."""
    out = []
    for (group, family), g in rows.groupby(["group", "family"]):
        context = g["load_s_0"] / g["bench_s_0"]
        rec = {"group": group, "family": family, "kernels": len(g),
               "after_load_over_bench": float(context.median()),
               "within_sitting_dev_pct": median_abs_log_dev_pct(context),
               "now_over_profiled": float((g["bench_s_0"] / g["profiled_s"]).median())}
        if sittings > 1:
            between = g[f"bench_s_{sittings - 1}"] / g["bench_s_0"]
            rec["last_over_first_sitting"] = float(between.median())
            rec["between_sittings_dev_pct"] = median_abs_log_dev_pct(between / between.median())
        out.append(rec)
    return pd.DataFrame(out)


def parse_group(text: str) -> tuple[str, str]:
    suite, sep, tag = text.partition(":")
    if not sep or not suite or not tag:
        raise argparse.ArgumentTypeError(f"a group is SUITE:TAG (e.g. moe:paired), got {text!r}")
    return suite, tag


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", type=Path, help="a profile folder of this machine (read only)")
    ap.add_argument("--groups", nargs="+", type=parse_group, default=[("moe", "paired"), ("moe", "heldout_neighbour")],
                    help="SUITE:TAG groups of profile rows to time (default moe:paired moe:heldout_neighbour)")
    ap.add_argument("--families", nargs="*", help="only these kernel families (default all of the groups')")
    ap.add_argument("--max-ms", type=float, default=20.0, help="skip kernels profiled slower than this (default 20)")
    ap.add_argument("--sittings", type=int, default=2, help="sittings, --gap-s apart (default 2)")
    ap.add_argument("--gap-s", type=float, default=300.0, help="idle seconds between sittings (default 300)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per sitting (default 2)")
    ap.add_argument("--load-s", type=float, default=0.6, help="seconds of layer-like load before each loaded timing")
    ap.add_argument("--threads", type=int, help="torch threads (default: the profile's)")
    ap.add_argument("--out", type=Path, help="write kernels.csv, sittings.csv and summary.json here")
    args = ap.parse_args(argv)
    for name, low in (("sittings", 1), ("rounds", 1), ("threads", 1)):
        if getattr(args, name) is not None and getattr(args, name) < low:
            ap.error(f"--{name} must be an integer >= {low}, got {getattr(args, name)}")
    for name in ("gap_s", "load_s", "max_ms"):
        if not np.isfinite(getattr(args, name)) or getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be a finite number >= 0, got {getattr(args, name)}")

    profile = DeviceProfile.load(args.profile)
    table = profile.kernels()
    present = sorted({f"{s}:{t}" for s, t in zip(table["suite"].astype(str), table["tag"].astype(str))})
    unknown = [f"{s}:{t}" for s, t in args.groups if f"{s}:{t}" not in present]
    if unknown:
        ap.error(f"--groups: {unknown} not in {args.profile.name}; its groups are {present}")
    rows = group_kernels(profile, args.groups, args.families, args.max_ms / 1e3)
    if rows.empty:
        ap.error(f"no kernel of {args.profile.name} is in --groups {args.groups} with --families {args.families} "
                 f"and profiled at <= {args.max_ms:g} ms")
    fp = profile.fingerprint
    if fp.device_kind != "cpu":
        ap.error(f"{args.profile.name} is a {fp.device_kind} profile; this script times CPU kernels")
    configure_allocator(fp.allocator)
    torch.set_num_threads(args.threads or fp.threads)
    specs_by_key = {s.key(): s for s in profile.specs()}
    specs = [specs_by_key[k] for k in rows["key"]]
    cfg = TimingConfig().per_round()
    print(f"{len(rows)} kernels ({rows.groupby('group').size().to_dict()}), {args.sittings} sittings of "
          f"{args.rounds} rounds, each kernel timed bench-style and after {args.load_s:g} s of load", flush=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    for k in range(args.sittings):
        if k:
            print(f"idle {args.gap_s:.0f} s before sitting {k + 1}", flush=True)
            time.sleep(args.gap_s)
        rows[f"bench_s_{k}"], rows[f"load_s_{k}"] = time_sitting(
            specs, rounds=args.rounds, load_s=args.load_s, cfg=cfg, seed=k, label=f"sitting {k + 1}/{args.sittings}")
    summary = summarise(rows, args.sittings)
    with pd.option_context("display.width", 200):
        print("\nafter_load_over_bench: a kernel timed after layer-like load / the same timed bench-style (context);"
              "\n*_dev_pct: median per-kernel |log ratio| within a sitting (the two timings) and between sittings"
              "\n(after removing the group's median shift); now_over_profiled: bench-style now / the profile row")
        print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        rows.to_csv(args.out / "kernels.csv", index=False)
        summary.to_csv(args.out / "sittings.csv", index=False)
        (args.out / "summary.json").write_text(json.dumps({
            "profile": args.profile.name, "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "groups": [f"{s}:{t}" for s, t in args.groups], "sittings": args.sittings, "gap_s": args.gap_s,
            "rounds": args.rounds, "load_s": args.load_s, "threads": torch.get_num_threads(),
            "per_group": summary.to_dict("records")}, indent=2))
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
