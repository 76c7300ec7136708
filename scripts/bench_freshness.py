"""How noisy is the freshness check itself? The run-to-run spread of its per-family ratios.

``calibration.tolerance`` must sit above the noise of the check (or every run refreshes for
nothing) and below the drift it is meant to catch. This runs the check ``--repeats`` times
back to back on one profile (minutes apart at most, so the machine has not drifted much) and
prints, per family, the ratios and their spread (max - min, and the largest distance from 1).

    python scripts/bench_freshness.py PROFILE_FOLDER [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel.measure.allocator import configure_allocator  # noqa: E402
from costmodel.measure.freshness import check_freshness  # noqa: E402
from costmodel.store.profile import DeviceProfile  # noqa: E402
from costmodel.measure.timing import TimingConfig  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    profile = DeviceProfile.load(args.profile)
    configure_allocator(profile.fingerprint.allocator)
    kernels = profile.kernels()
    timing = TimingConfig(cold_cache=profile.fingerprint.cache == "cold")
    runs = [check_freshness(kernels, device=torch.device("cpu"), timing=timing).family_ratio
            for _ in range(args.repeats)]
    out = {}
    for family in sorted(runs[0]):
        ratios = np.array([r[family] for r in runs])
        out[family] = {"ratios": [round(float(x), 3) for x in ratios], "spread": round(float(ratios.max() - ratios.min()), 3),
                       "max_abs_log_dev_pct": round(float(100 * np.abs(np.log(ratios / np.median(ratios))).max()), 1)}
        print(f"{family:>14}: ratios {out[family]['ratios']}  spread {out[family]['spread']:.3f}  "
              f"largest deviation from their median {out[family]['max_abs_log_dev_pct']:.1f}%")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
