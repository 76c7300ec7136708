"""Does averaging L3's forms predict unseen kernels better than the single best form?

L3 chooses, per family, the form with the lowest grouped-CV error. ``FittedCostModel`` can
also score the averages of the best two and three forms (``averaged_top``, off by default) and
choose one where its CV error is the lowest. This script scores that choice where it matters,
on kernels the fit never saw: for every experiment suite of a profile, the suite's own kernels
are left out (``scripts/heldout_by_suite.py``'s folds, the experiments' own exclusion rule) and
predicted by L3 fitted two ways on the same rows:

- ``single``: single forms only (the default: the fold's own L3, not fitted again);
- ``averaged``: single forms and averages (``averaged_top=(2, 3)``);
- ``margin``: read off the two, no fit of its own: the average where ``averaged`` chose one
  whose CV error is at most ``MARGIN`` of the best single form's, else the single form (is a
  clear CV win a held-out win?).

Per suite and family it reports kernels, median APE, the time-weighted APE (what a layer that
runs each kernel once sees) and median predicted / profiled for each, and which form each
chose. It measures nothing; one to four minutes per suite on the EPYC VM. ``--resummarise DIR``
re-reads DIR/kernels.csv and rewrites its summary without fitting.

    python scripts/bench_l3_averaging.py profiles/cpu-amd-epyc-t2-float32-ad7428cec8 --suites gnn hf_moe moe pyg_conv --out results/cpu_epyc/l3_averaging/two_threads
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from costmodel.store.profile import DeviceProfile  # noqa: E402
from heldout_by_suite import BENCH_SUITES, fold  # noqa: E402
from sim.predict.heldout import IGNORED_REFRESH_POLICIES, OWN_TAGS  # noqa: E402

#: ``single`` is L3 as fitted by default (single forms only), the fold's own L3 reused
VARIANTS = {"single": {}, "averaged": {"averaged_top": (2, 3)}}
#: ``margin``: an average counts only where its CV error is at most this share of the best single form's
MARGIN = 0.95
SCORED = ("single", "averaged", "margin")


def with_margin(kernels: pd.DataFrame, margin: float = MARGIN) -> pd.DataFrame:
    """``kernels`` with the ``margin`` variant: ``averaged``'s prediction and form where it chose an
    average at most ``margin`` times the best single form's CV error, else ``single``'s."""
    clear = (kernels["form_averaged"].astype(str).str.startswith("avg:")
             & (kernels["cv_averaged_chosen_pct"] <= margin * kernels["cv_averaged_best_single_pct"]))
    return kernels.assign(pred_margin_s=np.where(clear, kernels["pred_averaged_s"], kernels["pred_single_s"]),
                          form_margin=np.where(clear, kernels["form_averaged"], kernels["form_single"]))


def summarise(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per suite (family "(all)") and per (suite, family): kernels, and per variant the median
    APE, the time-weighted APE, the median ratio predicted / profiled and the forms chosen."""
    def stats(g: pd.DataFrame) -> pd.Series:
        out: dict = {"kernels": len(g)}
        for name in SCORED:
            ratio = g[f"pred_{name}_s"] / g["profiled_s"]
            out[f"{name}_median_ape_pct"] = float((100 * (ratio - 1).abs()).median())
            out[f"{name}_weighted_ape_pct"] = float(100 * ((ratio - 1).abs() * g["profiled_s"]).sum() / g["profiled_s"].sum())
            out[f"{name}_median_ratio"] = float(ratio.median())
            out[f"{name}_forms"] = " ".join(sorted(set(g[f"form_{name}"].astype(str))))
        return pd.Series(out)

    per_suite = kernels.groupby("suite").apply(stats, include_groups=False).reset_index().assign(family="(all)")
    per_family = kernels.groupby(["suite", "family"]).apply(stats, include_groups=False).reset_index()
    return pd.concat([per_suite, per_family], ignore_index=True).sort_values(["suite", "kernels"],
                                                                           ascending=[True, False])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", type=Path, nargs="?", help="a profile folder (read only)")
    ap.add_argument("--suites", nargs="*", help="experiment suites to leave out (default: every non-bench suite)")
    ap.add_argument("--cv-folds", type=int, default=4, help="L3's form-selection folds (default 4)")
    ap.add_argument("--out", type=Path, help="write summary.csv, kernels.csv and summary.json here")
    ap.add_argument("--resummarise", type=Path, metavar="DIR",
                    help="re-read DIR/kernels.csv (an earlier --out) and rewrite DIR's summary; fits nothing")
    args = ap.parse_args(argv)
    if args.resummarise is not None:
        path = args.resummarise / "kernels.csv"
        if not path.is_file():
            ap.error(f"--resummarise: {path} does not exist (give the --out folder of an earlier run)")
        previous = json.loads((args.resummarise / "summary.json").read_text()) if (args.resummarise / "summary.json").is_file() else {}
        report(pd.read_csv(path), args.resummarise, previous.get("profile", "?"), previous.get("suites", []))
        return 0
    if args.profile is None:
        ap.error("give a profile folder (or --resummarise DIR)")
    if args.cv_folds < 2:
        ap.error(f"--cv-folds must be >= 2, got {args.cv_folds}")
    if not (args.profile / "measurements.csv").is_file():
        ap.error(f"{args.profile}: not a profile folder (no measurements.csv)")

    profile = DeviceProfile.load(args.profile)
    table = profile.kernels(ignore_refresh_policies=IGNORED_REFRESH_POLICIES)
    ceilings = dict(profile.ceilings() or {})
    if not ceilings:
        ap.error(f"{args.profile} has no ceilings.json: run `python -m costmodel bench` on its device first")
    # suites with kernels of their own layers (bench-style suites such as gemm_stride have none)
    own = table[table["tag"].astype(str).isin(OWN_TAGS)]
    present = sorted(set(own["suite"].astype(str)) - set(BENCH_SUITES))
    suites = args.suites or present
    unknown = sorted(set(suites) - set(present))
    if unknown:
        ap.error(f"--suites: {unknown} have no layer kernels in {args.profile.name}; its experiment suites are {present}")

    rows = []
    for i, suite in enumerate(suites, 1):
        start = time.perf_counter()
        rows.append(fold(profile, table, suite, ceilings, args.cv_folds, l3_variants=VARIANTS))
        print(f"[{i}/{len(suites)}] {suite}: {len(rows[-1])} kernels left out and predicted both ways in "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    report(pd.concat(rows, ignore_index=True), args.out, args.profile.name, suites)
    return 0


def report(kernels: pd.DataFrame, out: Path | None, profile: str, suites: list[str]) -> None:
    """Print the per-suite and per-family table and the pooled comparison; write them to ``out``."""
    kernels = with_margin(kernels)
    summary = summarise(kernels)
    cols = ["suite", "family", "kernels"] + [f"{v}_{c}" for v in SCORED for c in ("median_ape_pct", "weighted_ape_pct")]
    with pd.option_context("display.width", 220, "display.max_rows", 500, "display.max_colwidth", 80):
        print(f"\nheld out per experiment suite, {profile}: L3 with single forms only, with averages of its best "
              f"forms, and with averages only where CV puts them {100 * (1 - MARGIN):.0f}% ahead (APE against the "
              "profiled time: median and time-weighted)")
        print(summary[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        print("\nforms chosen:")
        print(summary[summary["family"] != "(all)"][["suite", "family"] + [f"{v}_forms" for v in SCORED]]
              .to_string(index=False))
    all_rows = summary[summary["family"] == "(all)"]
    pooled = {v: float((100 * (kernels[f"pred_{v}_s"] / kernels["profiled_s"] - 1).abs()).median()) for v in SCORED}
    near = kernels.groupby(["suite", "family"]).first()
    chose = near["form_averaged"].astype(str).str.startswith("avg:")
    clear = near["form_margin"].astype(str).str.startswith("avg:")
    print(f"\npooled median APE: single {pooled['single']:.1f}%, averaged {pooled['averaged']:.1f}%, margin "
          f"{pooled['margin']:.1f}%; suites better averaged: "
          f"{int((all_rows['averaged_median_ape_pct'] < all_rows['single_median_ape_pct']).sum())} of {len(all_rows)}; "
          f"averages chosen in {int(chose.sum())} of {len(near)} families, {int(clear.sum())} of them "
          f"{100 * (1 - MARGIN):.0f}% or more ahead in CV")
    if out:
        out.mkdir(parents=True, exist_ok=True)
        summary.to_csv(out / "summary.csv", index=False)
        kernels.drop(columns=["pred_margin_s", "form_margin"]).to_csv(out / "kernels.csv", index=False)
        (out / "summary.json").write_text(json.dumps({
            "profile": profile, "suites": suites, "scoring": "held-out (leave one experiment suite out)",
            "variants": {**{k: v for k, v in VARIANTS.items()}, "margin": f"averaged where CV <= {MARGIN} x best single"},
            "pooled_median_ape_pct": pooled, "families_averaged": int(chose.sum()),
            "families_averaged_clearly": int(clear.sum()), "families": int(len(near)),
            "per_suite": all_rows.drop(columns="family").to_dict("records")}, indent=2, default=str))
        print(f"written to {out}")


if __name__ == "__main__":
    raise SystemExit(main())
