"""The resolved run-time context shared by every entry point (conf/base.yaml).

``check_cfg`` validates device, dtype, threads, allocator, seed, timing, limits and the
measuring lock without side effects; ``Runtime.from_cfg`` runs it before any work starts,
then sets torch's thread count and the host allocator mode, and computes the device
fingerprint and the profile folder that belongs to it.
"""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from hydra.utils import to_absolute_path

from costmodel.measure.allocator import ALLOCATOR_MODES, configure_allocator
from costmodel.measure.bench import SizeLimits
from costmodel.measure.device import Fingerprint, check_dtype, check_threads, fingerprint, resolve_device
from costmodel.measure.timing import TimingConfig
from costmodel.store.locks import MeasureLockConfig, measuring
from costmodel.store.profile import DeviceProfile


def _abs(path: str) -> Path:
    try:
        return Path(to_absolute_path(path))
    except ValueError:  # outside a Hydra app (tests, notebooks)
        return Path(path).absolute()


def check_cfg(cfg: Mapping[str, Any]) -> torch.device:
    """Validate conf/base.yaml's keys (device, dtype, threads, allocator, seed, timing, limits)
    without changing anything in the process (no thread count or allocator is set, so a
    multirun can check every job's config up front); returns the device."""
    allocator = cfg.get("allocator", "steady")
    if allocator not in ALLOCATOR_MODES:
        raise ValueError(f"allocator must be one of {list(ALLOCATOR_MODES)}, got {allocator!r}")
    device = resolve_device(str(cfg["device"]))
    check_dtype(str(cfg["dtype"]), device)
    check_threads(cfg.get("threads"))
    seed = cfg.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    timing_config(cfg.get("timing") or {})
    MeasureLockConfig.from_cfg(cfg.get("measure_lock"))
    limits = (cfg.get("limits") or {}).get(device.type)
    if not isinstance(limits, Mapping):
        raise ValueError(f"limits.{device.type} must give max_flops, max_bytes (and max_call_s) for this device")
    for key in ("max_flops", "max_bytes", "max_call_s"):
        value = limits.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"limits.{device.type}.{key} must be a number > 0, got {value!r}")
    return device


def timing_config(values: Mapping[str, Any]) -> TimingConfig:
    """``TimingConfig(**values)`` with every key and type checked, naming the ``timing.`` field."""
    fields = {f.name: f for f in dataclasses.fields(TimingConfig)}
    for key, value in values.items():
        if key not in fields:
            raise ValueError(f"timing.{key} is not a timing setting; allowed: {sorted(fields)}")
        default = fields[key].default
        kinds = (bool,) if isinstance(default, bool) else (int,) if isinstance(default, int) else (int, float)
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            kind = "true or false" if kinds == (bool,) else "an integer" if kinds == (int,) else "a number"
            raise ValueError(f"timing.{key} must be {kind}, got {value!r}")
    return TimingConfig(**values)


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
        device = check_cfg(cfg)
        configure_allocator(str(cfg.get("allocator", "steady")))
        dtype = str(cfg["dtype"])
        threads = check_threads(cfg.get("threads"))
        if threads is not None:
            torch.set_num_threads(threads)
        timing_cfg = {**dict(cfg["timing"]), **dict(timing_overrides or {})}
        limits = cfg["limits"][device.type]
        timing = timing_config(timing_cfg)
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
