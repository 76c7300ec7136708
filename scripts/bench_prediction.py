"""Benchmark: cost-model predictions per second, all levels, on a fitted profile.

    python scripts/bench_prediction.py [--n 200000] [--root profiles] [--threads N]

Three workloads, each timed end to end (kernel table, features and every level's model
included), median of 3 runs:

- *distinct descriptors*: the profile's own kernels (every family) with every size jittered
  by a random factor in [0.5, 2], so almost no descriptor repeats and ``CostModel.predict``'s
  de-duplication cannot help: the worst case;
- *MoE layer traces*: the traces of many MoE layers (random Dirichlet routings, random
  experts, top-k and widths), concatenated: the realistic case, where traces repeat kernels;
- *distinct, kernel table*: the distinct descriptors already as a kernel table (a DataFrame
  of descriptor fields, as a profile or a user's own shape sweep is), through
  ``CostModel.predict_table``: no Python object per kernel.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
import warnings

import numpy as np
import torch

from costmodel.families.descriptor import KernelSpec, from_record
from costmodel.measure.allocator import configure_allocator
from costmodel.measure.device import fingerprint
from costmodel.model.features import kernel_table
from costmodel.model.models import ExtrapolationWarning
from costmodel.model.predictor import CostModel
from costmodel.store.profile import DeviceProfile
from sim.workloads.moe_layer import DispatchPlan, MoEConfig, moe_trace


def jittered(spec: KernelSpec, rng: np.random.Generator) -> KernelSpec:
    """The descriptor with every size scaled by a random factor in [0.5, 2] (still valid)."""
    changes = {}
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if isinstance(value, bool) or not isinstance(value, (int, tuple)):
            continue
        if isinstance(value, tuple):
            changes[f.name] = tuple(int(round(v * rng.uniform(0.5, 2.0))) for v in value)
        else:
            changes[f.name] = max(1, int(round(value * rng.uniform(0.5, 2.0))))
    try:
        return dataclasses.replace(spec, **changes)
    except ValueError:  # a jitter broke a constraint (top-k k > cols, ...): keep the original
        return spec


def moe_traces(n_kernels: int, rng: np.random.Generator) -> list[KernelSpec]:
    specs: list[KernelSpec] = []
    backends = ("loop", "padded", "grouped")
    while len(specs) < n_kernels:
        experts = int(rng.choice([8, 16, 32, 64]))
        cfg = MoEConfig(tokens=int(rng.choice([512, 1024, 2048, 4096])), d_model=int(rng.choice([512, 768, 1024])),
                        d_ff=int(rng.choice([1024, 2048])), num_experts=experts, top_k=int(rng.choice([1, 2])),
                        backend=backends[len(specs) % 3])
        share = rng.dirichlet(np.full(experts, float(rng.choice([0.1, 1.0, 10.0]))))
        counts = rng.multinomial(cfg.tokens * cfg.top_k, share)
        counts = np.minimum(counts, cfg.tokens)
        if counts.sum() == 0:
            continue
        plan = DispatchPlan.from_counts(counts, np.full(cfg.tokens, counts.sum() / cfg.tokens))
        specs.extend(moe_trace(cfg, plan))
    return specs[:n_kernels]


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
    distinct = [jittered(from_record(records[i]), rng) for i in rng.integers(0, len(records), args.n)]
    traces = moe_traces(args.n, rng)
    warnings.simplefilter("ignore", ExtrapolationWarning)
    print(f"device: {fp.describe()}; {len(records)} profiled kernels")
    table = kernel_table(distinct)
    cases = (("distinct descriptors", distinct, lambda: model.predict(distinct)),
             ("MoE layer traces", traces, lambda: model.predict(traces)),
             ("distinct, kernel table", distinct, lambda: model.predict_table(table)))
    for label, specs, predict in cases:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            out = predict()
            times.append(time.perf_counter() - start)
        rate = len(specs) / statistics.median(times)
        print(f"{label:23s}: {len(specs):,} kernels ({len(set(specs)):,} distinct) x {out.shape[1]} levels "
              f"in {statistics.median(times):.2f} s (runs {', '.join(f'{t:.2f}' for t in times)}) "
              f"= {rate:,.0f} kernel predictions/s")


if __name__ == "__main__":
    main()
