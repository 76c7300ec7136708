"""Device resolution and fingerprint: which machine and software a measurement belongs to.

A fingerprint names everything that changes kernel latency enough that a profile measured
under one must not predict another: device name, torch version, BLAS backend, thread
count, CUDA and driver versions, dtype, host allocator mode and cache mode. (Optional backends such as torch-scatter are
recorded in a profile's provenance instead: installing one adds rows, it does not make
the existing rows wrong.)
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import subprocess
from dataclasses import MISSING, asdict, dataclass, fields
from functools import lru_cache

import torch

from costmodel.families.descriptor import FLOAT_DTYPES
from costmodel.measure.allocator import allocator_mode

DEVICE_KINDS = ("cpu", "cuda", "auto")


class ProfileMismatchError(RuntimeError):
    """A profile or model from one device fingerprint was asked to serve another."""


class InconsistentFingerprintError(ProfileMismatchError):
    """A stored fingerprint whose ``id`` is not the one its own fields give: the file was
    edited (or another code's fingerprint copied in), so which device its numbers belong
    to is unknown."""


def resolve_device(kind: str) -> torch.device:
    """'cpu', 'cuda' or 'auto' (cuda when available) -> torch.device, with a clear error."""
    if kind not in DEVICE_KINDS:
        raise ValueError(f"device must be one of {list(DEVICE_KINDS)}, got {kind!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but torch.cuda.is_available() is False on this machine")
    return device_of(kind)


def device_of(kind: str) -> torch.device:
    """The device of a ``device`` setting ``resolve_device`` already accepted ('auto': cuda
    when available), unchecked."""
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if kind == "auto" else kind)


def check_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The torch dtype for a name, refusing names this device cannot compute in."""
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype must be one of {list(FLOAT_DTYPES)}, got {dtype!r}")
    torch_dtype = getattr(torch, dtype)
    if device.type == "cuda" and dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"dtype={dtype!r} is not supported by {torch.cuda.get_device_name(device)}")
    try:  # a tiny matmul proves the dtype is usable here (e.g. float16 GEMM on old CPUs)
        a = torch.ones(2, 2, dtype=torch_dtype, device=device)
        (a @ a).sum().item()
    except RuntimeError as err:
        raise ValueError(f"dtype={dtype!r} is not supported on device {device}: {err}") from None
    return torch_dtype


def check_threads(threads: object, *, field: str = "threads") -> int | None:
    """A CPU thread count (positive integer) or None for torch's default, else a ValueError."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{field} must be a positive integer (>= 1) or null for torch's default, got {threads!r}")
    return threads


@lru_cache(maxsize=1)
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver_version() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


@dataclass(frozen=True)
class Fingerprint:
    device_kind: str
    device_name: str
    torch_version: str
    blas: str
    threads: int
    cuda_version: str
    driver_version: str
    dtype: str
    allocator: str = "system"
    cache: str = "warm"  # cold: every timed call reads its operands from memory (see runners)

    @property
    def id(self) -> str:
        """Folder-safe id: readable prefix plus a hash of every field."""
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]
        name = re.sub(r"[^a-z0-9]+", "-", self.device_name.lower()).strip("-")[:40]
        return f"{self.device_kind}-{name}-t{self.threads}-{self.dtype}-{digest}"

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "id": self.id}

    @classmethod
    def from_stored(cls, data: object, *, source: str = "fingerprint") -> "Fingerprint":
        """A fingerprint read back from ``to_dict``'s output, checked: every field present
        with its type (strings; threads a positive integer; device_kind cpu or cuda), no
        unknown field, and the stored ``id`` the one the fields give (else
        ``InconsistentFingerprintError``: an edited file must not pass for another device).
        ValueError for a malformed record."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: a fingerprint must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        stored_id = data.pop("id", None)
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"{source}: unknown fingerprint field(s) {unknown}; allowed: {names + ['id']}")
        required = [f.name for f in fields(cls) if f.default is MISSING]
        missing = [n for n in required if n not in data]
        if missing:
            raise ValueError(f"{source}: fingerprint field(s) missing: {missing}")
        for name, value in data.items():
            if name == "threads":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{source}: threads must be a positive integer, got {value!r}")
            elif not isinstance(value, str) or not value:
                raise ValueError(f"{source}: {name} must be a non-empty string, got {value!r}")
        if data["device_kind"] not in ("cpu", "cuda"):
            raise ValueError(f"{source}: device_kind must be 'cpu' or 'cuda', got {data['device_kind']!r}")
        fp = cls(**data)
        if stored_id is not None and stored_id != fp.id:
            raise InconsistentFingerprintError(
                f"{source}: stored id {stored_id!r} is not the id its fields give ({fp.id!r}): the fields were edited "
                f"or copied from another profile, so the numbers cannot be trusted to belong to {fp.describe()}; "
                "restore the file or measure this device again")
        return fp

    def describe(self) -> str:
        extra = f", CUDA {self.cuda_version}, driver {self.driver_version}" if self.device_kind == "cuda" else ""
        return (
            f"{self.device_name} ({self.device_kind}, {self.threads} threads, {self.dtype}, "
            f"torch {self.torch_version}, {self.blas}, {self.allocator} allocator, {self.cache} cache{extra})"
        )

    def differences(self, other: "Fingerprint") -> dict[str, tuple[object, object]]:
        mine, theirs = asdict(self), asdict(other)
        return {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]}


def fingerprint(device: torch.device, dtype: str, *, cold_cache: bool = True) -> Fingerprint:
    """Fingerprint of this process's device, libraries and thread count."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        blas = "cublas"
        cuda_version = str(torch.version.cuda)
        driver = _driver_version()
    else:
        name = _cpu_name()
        blas = "mkl" if torch.backends.mkl.is_available() else "openblas-or-other"
        if torch.backends.mkldnn.is_available():
            blas += "+onednn"
        cuda_version = driver = "none"
    return Fingerprint(
        device_kind=device.type,
        device_name=name,
        torch_version=torch.__version__,
        blas=blas,
        threads=torch.get_num_threads(),
        cuda_version=cuda_version,
        driver_version=driver,
        dtype=dtype,
        allocator=allocator_mode(),
        cache="cold" if cold_cache else "warm",
    )
