"""Does a GEMM pay for its weight's row stride? Skinny GEMMs whose B rows lie a multiple of
4 KiB apart, timed beside neighbours whose rows do not, and (``--write``) measured into the
profile so the regression sees the contrast.

B's stored rows are ``n`` elements apart when B is [K, N] (layout "nn") and ``k`` apart when
it is [N, K] passed transposed ("nt", every ``nn.Linear``). A stride that is a multiple of
4 KiB maps every row to the same cache sets (``costmodel.families.columns.page_strided_rows``).
Model widths are powers of two, so the shapes users predict have such strides, while the
suites' random shapes almost never do: a held-out fit that never saw the difference predicted
``moe_ep``'s expert GEMMs (M 4-16, K x N 1024 x 2048) at 0.80x.

For every M and layout, the strided dimension steps through ``--widths`` (the other weight
dimension is ``--other``); each page-strided width is compared with its two neighbours in the
list, time per weight element, and the table gives the median ratio per M and layout. All
kernels are timed in ``--rounds`` interleaved passes (``costmodel.measure.timing.measure``,
cold operands), each a median of its rounds, the spread kept. Measure alone: nothing else may run.

    python scripts/bench_gemm_stride.py --threads 1
    python scripts/bench_gemm_stride.py --threads 2 --write     # and add the kernels to the profile
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

from costmodel.families.columns import PAGE_BYTES  # noqa: E402
from costmodel.families.gemm import GemmSpec  # noqa: E402
from costmodel.measure import runners  # noqa: E402
from costmodel.measure.bench import measure_specs  # noqa: E402
from costmodel.measure.runtime import Runtime  # noqa: E402
from costmodel.measure.timing import TimingConfig, measure  # noqa: E402

#: the suite and tag the written rows carry in the profile
SUITE, TAG = "gemm_stride", "stride_pairs"


def stride_specs(ms: Sequence[int], widths: Sequence[int], other: int, layouts: Sequence[str],
                 dtype: str = "float32") -> list[GemmSpec]:
    """Every M x layout x width: the width is B's row stride (N for "nn", K for "nt")."""
    out = []
    for layout in layouts:
        for m in ms:
            for w in widths:
                k, n = (other, w) if layout == "nn" else (w, other)
                out.append(GemmSpec(m, k, n, dtype, None if layout == "nn" else layout))
    return out


def stride_of(spec: GemmSpec) -> int:
    return spec.k if spec.layout == "nt" else spec.n


def page_strided(spec: GemmSpec) -> bool:
    return stride_of(spec) * spec.elem_bytes % PAGE_BYTES == 0


def time_all(specs: Sequence[GemmSpec], rounds: int, timing: TimingConfig, device: torch.device,
             progress: Callable[[str], None]) -> pd.DataFrame:
    """Median over ``rounds`` interleaved passes (every other pass in reverse order)."""
    times: dict[int, list[float]] = {i: [] for i in range(len(specs))}
    order = list(range(len(specs)))
    for r in range(rounds):
        for j, i in enumerate(order if r % 2 == 0 else order[::-1]):
            progress(f"round {r + 1}/{rounds}: {j + 1}/{len(specs)} {specs[i].label()[:60]}")
            times[i].append(measure(runners.make_runner(specs[i], device, cold=True), device=device,
                                    config=timing).median_s)
    rows = []
    for i, s in enumerate(specs):
        t = np.asarray(times[i])
        med = float(np.median(t))
        rows.append({"m": s.m, "k": s.k, "n": s.n, "layout": s.layout or "nn", "stride": stride_of(s),
                     "page_strided": page_strided(s), "median_s": med, "spread_pct": float(np.ptp(t) / med * 100),
                     "ns_per_weight": med / (s.k * s.n) * 1e9, "key": s.key()})
    return pd.DataFrame(rows)


def neighbour_ratios(rows: pd.DataFrame) -> pd.DataFrame:
    """Per page-strided kernel: its time per weight element over the median of its two
    neighbours' in the width list (same M and layout; the ends have one neighbour)."""
    out = []
    for (m, layout), g in rows.groupby(["m", "layout"], sort=True):
        g = g.sort_values("stride").reset_index(drop=True)
        for i in g.index[g["page_strided"]]:
            nb = [j for j in (i - 1, i + 1) if 0 <= j < len(g) and not g.at[j, "page_strided"]]
            if nb:
                out.append({"m": m, "layout": layout, "stride": int(g.at[i, "stride"]),
                            "ratio": float(g.at[i, "ns_per_weight"] / np.median(g.loc[nb, "ns_per_weight"]))})
    return pd.DataFrame(out, columns=["m", "layout", "stride", "ratio"])


def per_m(ratios: pd.DataFrame) -> pd.DataFrame:
    g = ratios.groupby(["layout", "m"])["ratio"]
    return pd.DataFrame({"widths": g.size(), "median": g.median(), "min": g.min(), "max": g.max()}).reset_index()


def table_of(summary: pd.DataFrame) -> Table:
    t = Table(title="time per weight element, page-strided B rows / their neighbours' (median, min-max)")
    for col in ("layout", "M", "widths", "ratio", "min-max"):
        t.add_column(col, justify="left" if col == "layout" else "right")
    for r in summary.itertuples():
        t.add_row(r.layout, str(r.m), str(r.widths), f"{r.median:.2f}", f"{r.min:.2f}-{r.max:.2f}")
    return t


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{what} must be integers >= 1, got {text!r}")
    return values


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile-root", default="profiles")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (the profile's fingerprint); default all cores")
    ap.add_argument("--m", type=lambda s: _ints(s, "--m"), default=[2, 4, 8, 16, 64, 256], help="rows of A")
    ap.add_argument("--widths", type=lambda s: _ints(s, "--widths"),
                    default=[896, 1024, 1152, 1792, 2048, 2304, 3840, 4096, 4352],
                    help="B's row strides in elements, ascending, page-strided ones between unstrided neighbours")
    ap.add_argument("--other", type=int, default=1024, help="the other weight dimension (>= 1)")
    ap.add_argument("--layouts", default="nn,nt", help="among nn, nt")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved passes (>= 1)")
    ap.add_argument("--budget-s", type=float, default=0.05, help="timing budget per kernel and round (> 0)")
    ap.add_argument("--write", action="store_true", help=f"also measure the kernels into the profile (suite {SUITE})")
    ap.add_argument("--out", default="results/cpu_epyc/gemm_stride")
    args = ap.parse_args(argv)
    args.layouts = [v.strip() for v in args.layouts.split(",") if v.strip()]
    if not args.layouts or set(args.layouts) - {"nn", "nt"}:
        ap.error(f"--layouts must be among nn, nt, got {','.join(args.layouts)!r}")
    if args.rounds < 1 or args.other < 1:
        ap.error(f"--rounds and --other must be >= 1, got {args.rounds} and {args.other}")
    if not args.budget_s > 0:
        ap.error(f"--budget-s must be > 0, got {args.budget_s}")
    if args.widths != sorted(set(args.widths)):
        ap.error(f"--widths must be distinct and ascending, got {args.widths}")
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
    specs = stride_specs(args.m, args.widths, args.other, args.layouts)
    console.print(f"{len(specs)} GEMMs, {sum(map(page_strided, specs))} of them with page-strided B rows, "
                  f"{args.rounds} rounds, {torch.get_num_threads()} threads")
    t0 = time.perf_counter()
    with rt.measuring("bench_gemm_stride"), console.status("") as status:
        rows = time_all(specs, args.rounds, TimingConfig(min_run_time_s=args.budget_s), rt.device,
                        lambda s: status.update(s))
    ratios = neighbour_ratios(rows)
    summary_table = per_m(ratios)
    console.print(table_of(summary_table))
    summary: dict[str, Any] = {
        "what": "time per weight element of GEMMs whose B rows are a multiple of 4 KiB apart, over their "
                "unstrided neighbours' (same M and layout)",
        "threads": torch.get_num_threads(), "rounds": args.rounds, "budget_s": args.budget_s,
        "seconds": round(time.perf_counter() - t0, 1), "median_ratio": float(ratios["ratio"].median()),
        "per_m": summary_table.to_dict("records"), "median_spread_pct": float(rows["spread_pct"].median()),
    }
    if args.write:
        profile = rt.open_profile(create=False)
        with rt.measuring("bench_gemm_stride: writing the profile"):
            result = measure_specs([(TAG, s) for s in specs], profile, device=rt.device, timing=rt.timing,
                                   limits=rt.limits, suite=SUITE)
        profile.add_provenance({SUITE: {"what": "skinny GEMMs with and without page-strided B rows",
                                        "kernels": result.measured, "command": " ".join(["python"] + sys.argv)}})
        summary["written"] = {"profile": rt.fingerprint.id, "kernels": result.measured}
        console.print(f"measured into {profile.path}: {result.measured} kernels")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"t{torch.get_num_threads()}"
    rows.to_csv(out / f"kernels_{tag}.csv", index=False)
    (out / f"summary_{tag}.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"written: {out / f'kernels_{tag}.csv'}, {out / f'summary_{tag}.json'}")
    return summary


if __name__ == "__main__":
    main()
