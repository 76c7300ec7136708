"""A small GEMM profile for the scripts that leave an experiment suite out and refit (one smooth
law, 50 GFLOP/s plus 10 us a call, so a fitted model predicts a left-out GEMM closely)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from costmodel.families.gemm import GemmSpec
from costmodel.measure.device import fingerprint
from costmodel.store.profile import DeviceProfile

CEIL = {"peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 1e-6, "ridge_flops_per_byte": 10.0}


def gemm_row(spec: GemmSpec, suite: str, tag: str) -> dict:
    return {"key": spec.key(), "round": 0, **spec.to_record(), "flops": spec.flops(), "bytes_moved": spec.bytes_moved(),
            "median_s": 1e-5 + spec.flops() / 5e10, "iqr_s": 1e-7, "noisy": False, "suite": suite, "tag": tag}


def gemm_profile(root: Path, extra_rows: list[dict]) -> DeviceProfile:
    """A profile under ``root`` with the bench grid (suite 'full': M from 1 to 2048, K = N in 64, 256,
    1024), ``extra_rows`` and ceilings."""
    p = DeviceProfile.open(root, fingerprint(torch.device("cpu"), "float32"))
    rows = [gemm_row(GemmSpec(int(m), k, k), "full", "grid") for m in np.geomspace(1, 2048, 12).round() for k in (64, 256, 1024)]
    p.append_measurements(rows + extra_rows)
    p.write_ceilings(CEIL)
    return p
