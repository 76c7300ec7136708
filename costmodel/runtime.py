"""The resolved run-time context shared by every entry point (conf/base.yaml).

``Runtime.from_cfg`` validates device, dtype, threads, timing and measuring-lock settings
before any work starts, sets torch's thread count and the host allocator mode, and computes the device
fingerprint and the profile folder that belongs to it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from hydra.utils import to_absolute_path

from costmodel.allocator import configure_allocator
from costmodel.bench import SizeLimits
from costmodel.device import Fingerprint, check_dtype, fingerprint, resolve_device
from costmodel.locks import MeasureLockConfig, measuring
from costmodel.profile import DeviceProfile
from costmodel.timing import TimingConfig


def _abs(path: str) -> Path:
    try:
        return Path(to_absolute_path(path))
    except ValueError:  # outside a Hydra app (tests, notebooks)
        return Path(path).absolute()


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    dtype: str
    fingerprint: Fingerprint
    timing: TimingConfig
    limits: SizeLimits
    profile_root: Path
    seed: int
    measure_lock: MeasureLockConfig = field(default_factory=MeasureLockConfig)

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any], *, timing_overrides: Mapping[str, Any] | None = None) -> "Runtime":
        configure_allocator(str(cfg.get("allocator", "steady")))
        device = resolve_device(str(cfg["device"]))
        dtype = str(cfg["dtype"])
        check_dtype(dtype, device)
        threads = cfg.get("threads")
        if threads is not None:
            if not isinstance(threads, int) or threads < 1:
                raise ValueError(f"threads must be a positive integer or null, got {threads!r}")
            torch.set_num_threads(threads)
        timing_cfg = {**dict(cfg["timing"]), **dict(timing_overrides or {})}
        limits = cfg["limits"][device.type]
        timing = TimingConfig(**timing_cfg)
        measure_lock = MeasureLockConfig.from_cfg(cfg.get("measure_lock"))
        return cls(
            device=device,
            dtype=dtype,
            fingerprint=fingerprint(device, dtype, cold_cache=timing.cold_cache),
            timing=timing,
            limits=SizeLimits(max_flops=float(limits["max_flops"]), max_bytes=float(limits["max_bytes"]),
                              max_call_s=float(limits.get("max_call_s", float("inf")))),
            profile_root=_abs(str(cfg["profile"]["root"])),
            seed=int(cfg.get("seed", 0)),
            measure_lock=measure_lock,
        )

    def open_profile(self, *, create: bool = True) -> DeviceProfile:
        return DeviceProfile.open(self.profile_root, self.fingerprint, create=create)

    def measuring(self, what: str) -> AbstractContextManager[dict[str, Any]]:
        """Hold this machine's measuring lock while timing (``measure_lock`` in conf/base.yaml):
        ``with rt.measuring("moe_skew: timing layers") as note: ...``; ``note`` is for provenance."""
        return measuring(what, self.measure_lock)
