"""The resolved run-time context shared by every entry point (conf/base.yaml).

``check_cfg`` validates device, dtype, threads, allocator, seed, timing, limits and the
measuring lock without side effects; ``Runtime.from_cfg`` runs it before any work starts,
then sets torch's thread count and the host allocator mode, and computes the device
fingerprint and the profile folder that belongs to it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from hydra.utils import to_absolute_path

from costmodel.measure.allocator import configure_allocator
from costmodel.measure.bench import SizeLimits
from costmodel.measure.device import Fingerprint, check_dtype, check_threads, device_of, fingerprint, resolve_device
from costmodel.measure.timing import TimingConfig
from costmodel.store.locks import MeasureLockConfig, check_lock_path, measuring
from costmodel.store.profile import DeviceProfile

#: torch's CPU threads when this process started (all cores, or what OMP_NUM_THREADS says):
#: what ``threads: null`` means, whatever an earlier run in the same process set (a Hydra
#: sweep of gnn_partition, which sets 1, then gnn_degree, runs in one process)
DEFAULT_THREADS = torch.get_num_threads()


def _abs(path: str) -> Path:
    try:
        return Path(to_absolute_path(path))
    except ValueError:  # outside a Hydra app (tests, notebooks)
        return Path(path).absolute()


def check_cfg(cfg: Mapping[str, Any], constraints: Mapping[str, Any] | None = None) -> torch.device:
    """Validate conf/base.yaml's keys (device, dtype, threads, allocator, seed, timing, limits,
    measure_lock) against ``costmodel.cli.config_schema.BASE_CONSTRAINTS``, with the caller's
    ``constraints`` (an experiment's fields) in the same pass and the same error format, then
    what is derived from them: the device ``device`` resolves to, whether ``dtype`` computes
    there, that ``limits`` has that device type. Changes nothing in the process (no thread
    count or allocator is set, so a multirun can check every job's config up front); returns
    the device."""
    from costmodel.cli.config_schema import BASE_CONSTRAINTS, check

    check(cfg, {**BASE_CONSTRAINTS, **dict(constraints or {})})
    device = resolve_device(str(cfg["device"]))
    check_dtype(str(cfg["dtype"]), device)
    lock_path = (cfg.get("measure_lock") or {}).get("path")
    if lock_path is not None:  # its folder must exist (derived: the file system says)
        check_lock_path(lock_path)
    limits = (cfg.get("limits") or {}).get(device.type)
    if not isinstance(limits, Mapping):
        raise ValueError(f"limits.{device.type} must be a mapping of max_flops, max_bytes (and max_call_s) for "
                         f"this device, got {limits!r}")
    return device


def timing_config(values: Mapping[str, Any]) -> TimingConfig:
    """``TimingConfig(**values)`` with every key and type checked (the schema's ``timing.*``
    constraints), naming the ``timing.`` field."""
    from costmodel.cli.config_schema import BASE_CONSTRAINTS, check

    check({"timing": dict(values)}, {k: v for k, v in BASE_CONSTRAINTS.items() if k.split(".")[0] == "timing"})
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
    def from_cfg(cls, cfg: Mapping[str, Any], *, timing_overrides: Mapping[str, Any] | None = None,
                 checked: bool = False) -> "Runtime":
        """The runtime of a config; ``checked=True`` when ``check_cfg`` already passed on it
        (an experiment's ``validate`` at the entry point): it is not checked again."""
        device = device_of(str(cfg["device"])) if checked else check_cfg(cfg)
        configure_allocator(str(cfg.get("allocator", "steady")))
        dtype = str(cfg["dtype"])
        threads = cfg.get("threads") if checked else check_threads(cfg.get("threads"))
        torch.set_num_threads(threads if threads is not None else DEFAULT_THREADS)
        timing_cfg = {**dict(cfg["timing"]), **dict(timing_overrides or {})}
        limits = cfg["limits"][device.type]
        timing = TimingConfig(**timing_cfg) if checked and not timing_overrides else timing_config(timing_cfg)
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

    @classmethod
    def from_base_yaml(cls, base_yaml: str | Path, *, threads: int | None, profile_root: str | Path,
                       device: str = "cpu") -> "Runtime":
        """conf/base.yaml's runtime (timing, limits, allocator, lock) with a script's device,
        threads and profile root: what the bench scripts outside Hydra measure with."""
        from omegaconf import OmegaConf  # noqa: PLC0415 - only the scripts need it

        cfg = OmegaConf.to_container(OmegaConf.load(Path(base_yaml)), resolve=True)
        cfg.update(device=device, threads=threads)
        cfg["profile"]["root"] = str(Path(profile_root).absolute())
        return cls.from_cfg(cfg)

    def open_profile(self, *, create: bool = True) -> DeviceProfile:
        return DeviceProfile.open(self.profile_root, self.fingerprint, create=create)

    def measuring(self, what: str) -> AbstractContextManager[dict[str, Any]]:
        """Hold this machine's measuring lock while timing (``measure_lock`` in conf/base.yaml):
        ``with rt.measuring("moe_skew: timing layers") as note: ...``; ``note`` is for provenance."""
        return measuring(what, self.measure_lock)
