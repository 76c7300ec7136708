"""Benchmark: cost-model predictions per second, all levels, on a fitted profile.

    python scripts/bench_prediction.py [--n 200000] [profile overrides: --root profiles]

Descriptors are drawn at random from the profile's own kernels (so every family is
represented); timed end to end from descriptors (kernel table construction included) and
from a ready kernel table. Median of 3 runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import torch

from costmodel.allocator import configure_allocator
from costmodel.device import fingerprint
from costmodel.features import kernel_table
from costmodel.kernels import from_record
from costmodel.models import ExtrapolationWarning
from costmodel.predictor import CostModel
from costmodel.profile import DeviceProfile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--root", default="profiles")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    configure_allocator("steady")
    if args.threads:
        torch.set_num_threads(args.threads)
    fp = fingerprint(torch.device("cpu"), "float32")
    profile = DeviceProfile.open(args.root, fp, create=False)
    model = CostModel.load(profile, expected=fp, allow_stale=True)
    records = profile.kernels().to_dict("records")
    rng = np.random.default_rng(0)
    specs = [from_record(records[i]) for i in rng.integers(0, len(records), args.n)]
    warnings.simplefilter("ignore", ExtrapolationWarning)
    for label, fn in (("from descriptors", lambda: model.predict(specs)),
                      ("from a kernel table", lambda t=kernel_table(specs): model.predict_table(t))):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - start)
        rate = args.n / statistics.median(times)
        print(f"{label:20s}: {args.n:,} kernels x {out.shape[1]} levels in {statistics.median(times):.2f} s "
              f"= {rate:,.0f} kernel predictions/s")


if __name__ == "__main__":
    main()
