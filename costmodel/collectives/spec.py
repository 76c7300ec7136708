"""Collective descriptors: which collective, on how many ranks, moving which bytes.

A ``CollectiveSpec`` is the collectives' kernel descriptor: frozen, hashable, validated on
construction (every error names the field and its allowed range), and the one source of the
message shape for both the benchmark (``costmodel.collectives.rank``) and the models.

The message:

- ``all_to_all``: a [W, W] send matrix in bytes, row ``s`` = what rank ``s`` sends to each
  destination ``d`` (the diagonal stays home: a local copy). Run with
  ``torch.distributed.all_to_all_single`` and per-rank input/output split sizes, so uneven
  splits are the real thing.
- ``all_gather``, ``reduce_scatter``, ``all_reduce``: ``message_bytes`` = n in the
  convention of NCCL-tests (``doc/PERFORMANCE.md``, "Bus bandwidth"): the size of the
  buffer each rank holds: all_reduce's buffer, all_gather's gathered *output* (each rank
  contributes n/W), reduce_scatter's *input* (each rank keeps n/W).

Bytes a rank moves over the wire (NCCL-tests PERFORMANCE.md, the bus-bandwidth factors that
make busBw comparable to a link's bandwidth; they are the lower bound of a ring/optimal
algorithm's per-rank traffic, and the same for sends and receives):

- all_reduce: 2 (W-1)/W * n   (reduce-scatter then all-gather)
- all_gather: (W-1)/W * n     (every rank receives the W-1 chunks of n/W it lacks)
- reduce_scatter: (W-1)/W * n (every rank sends the W-1 chunks of n/W others keep)
- all_to_all: rank r's off-diagonal send plus receive bytes,
  sum_{d != r} S[r, d] + sum_{s != r} S[s, r] (the diagonal is a local copy).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

OPS = ("all_to_all", "all_gather", "reduce_scatter", "all_reduce")
BACKENDS = ("gloo", "nccl", "mpi")
DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "uint8": 1}
MAX_WORLD_SIZE = 1024  # a spec may describe a larger W than the host can run (predict-only what-if)
MAX_BYTES = float(2 ** 40)  # 1 TiB per rank: beyond any buffer a collective here is asked for


class CollectiveSpecError(ValueError):
    """A collective described with a field out of its allowed range."""


def check_world_size(world_size: object, *, field_name: str = "world_size") -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) \
            or not 1 <= int(world_size) <= MAX_WORLD_SIZE:
        raise CollectiveSpecError(f"{field_name} must be an integer in [1, {MAX_WORLD_SIZE}], got {world_size!r}")
    return int(world_size)


def check_bytes(value: object, *, field_name: str) -> float:
    """A finite, non-negative byte count below ``MAX_BYTES``."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise CollectiveSpecError(f"{field_name} must be a number of bytes, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(v) or not 0 <= v <= MAX_BYTES:
        raise CollectiveSpecError(f"{field_name} must be a finite byte count in [0, {MAX_BYTES:.0f}], got {value!r}")
    return v


def check_send_matrix(send_bytes: object, world_size: int | None = None, *,
                      field_name: str = "send_bytes") -> np.ndarray:
    """A [W, W] matrix of finite, non-negative bytes (float64), with the shape named on error."""
    try:
        m = np.asarray(send_bytes, dtype=np.float64)
    except (TypeError, ValueError):
        raise CollectiveSpecError(f"{field_name} must be a [W, W] numeric matrix of bytes, got {send_bytes!r}") from None
    w = m.shape[0] if m.ndim == 2 else None
    if m.ndim != 2 or m.shape[0] != m.shape[1] or (world_size is not None and m.shape[0] != world_size):
        want = f"[{world_size}, {world_size}]" if world_size is not None else "[W, W]"
        raise CollectiveSpecError(f"{field_name} must have shape {want} (row s = bytes rank s sends to each rank d), "
                                  f"got shape {list(m.shape)}")
    check_world_size(w, field_name=f"{field_name}.shape[0]")
    bad = ~np.isfinite(m) | (m < 0) | (m > MAX_BYTES)
    if bad.any():
        s, d = (int(i) for i in np.argwhere(bad)[0])
        raise CollectiveSpecError(f"{field_name}[{s}, {d}] must be a finite byte count in [0, {MAX_BYTES:.0f}], "
                                  f"got {m[s, d]!r}")
    return m


def all_to_all_bytes(send_bytes: np.ndarray) -> dict[str, np.ndarray]:
    """Per rank: off-diagonal bytes sent, received, and their sum (the bytes moved); the
    diagonal (kept home) separately."""
    m = check_send_matrix(send_bytes)
    home = np.diag(m).copy()
    sent = m.sum(axis=1) - home
    recv = m.sum(axis=0) - home
    return {"sent": sent, "recv": recv, "moved": sent + recv, "home": home}


def bus_factor(op: str, world_size: int) -> float:
    """NCCL-tests' bus-bandwidth factor: bytes a rank moves per byte of n (PERFORMANCE.md)."""
    w = check_world_size(world_size)
    if op == "all_reduce":
        return 2.0 * (w - 1) / w
    if op in ("all_gather", "reduce_scatter"):
        return (w - 1) / w
    raise CollectiveSpecError(f"op must be one of {list(OPS[1:])} for a bus factor "
                              f"(all_to_all moves what its send matrix says), got {op!r}")


def uniform_send_matrix(bytes_per_rank: float, world_size: int) -> np.ndarray:
    """Each rank sends ``bytes_per_rank`` in all, split evenly over the W ranks (itself included)."""
    w = check_world_size(world_size)
    n = check_bytes(bytes_per_rank, field_name="bytes_per_rank")
    return np.full((w, w), n / w)


@dataclass(frozen=True)
class CollectiveSpec:
    """One collective call. ``send_bytes`` (all_to_all) is a tuple of rows, so the spec hashes."""

    op: str
    world_size: int
    backend: str = "gloo"
    dtype: str = "float32"
    message_bytes: float = 0.0  # n per rank (NCCL-tests convention); for all_to_all: max row sum
    send_bytes: tuple[tuple[float, ...], ...] | None = None  # all_to_all only
    pattern: str = ""  # how the suite made it (e.g. "peer0.9", "skew4"), for tables
    nominal_bytes: float = field(default=0.0)  # the suite's size axis (grouping for held-out CV)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise CollectiveSpecError(f"op must be one of {list(OPS)}, got {self.op!r}")
        w = check_world_size(self.world_size)
        object.__setattr__(self, "world_size", w)
        if self.backend not in BACKENDS:
            raise CollectiveSpecError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        if self.dtype not in DTYPE_BYTES:
            raise CollectiveSpecError(f"dtype must be one of {list(DTYPE_BYTES)}, got {self.dtype!r}")
        es = DTYPE_BYTES[self.dtype]
        if self.op == "all_to_all":
            if self.send_bytes is None:
                raise CollectiveSpecError("send_bytes is required for op='all_to_all': a [W, W] matrix of bytes")
            m = check_send_matrix(self.send_bytes, w)
            if np.any(np.mod(m, es) != 0):
                raise CollectiveSpecError(f"send_bytes entries must be multiples of the {self.dtype} element size "
                                          f"({es} B), got {m.tolist()}")
            object.__setattr__(self, "send_bytes", tuple(tuple(float(x) for x in row) for row in m))
            object.__setattr__(self, "message_bytes", float(m.sum(axis=1).max()))
        else:
            if self.send_bytes is not None:
                raise CollectiveSpecError(f"send_bytes is only for op='all_to_all'; {self.op} takes message_bytes")
            n = check_bytes(self.message_bytes, field_name="message_bytes")
            chunk = es * (w if self.op in ("all_gather", "reduce_scatter") else 1)
            if n % chunk != 0:
                raise CollectiveSpecError(f"message_bytes for {self.op} must be a multiple of {chunk} B "
                                          f"({self.dtype} element size x {'world_size' if chunk != es else '1'}), "
                                          f"got {self.message_bytes!r}")
            object.__setattr__(self, "message_bytes", n)
        nominal = check_bytes(self.nominal_bytes or self.message_bytes, field_name="nominal_bytes")
        object.__setattr__(self, "nominal_bytes", nominal)

    @property
    def matrix(self) -> np.ndarray:
        if self.send_bytes is not None:
            return np.array(self.send_bytes, dtype=np.float64)
        raise CollectiveSpecError(f"{self.op} has no send matrix (only all_to_all does)")

    def per_rank_bytes(self) -> dict[str, np.ndarray]:
        """Per rank: bytes sent, received and moved over the wire (module docstring's formulas)."""
        w = self.world_size
        if self.op == "all_to_all":
            return all_to_all_bytes(self.matrix)
        moved = bus_factor(self.op, w) * self.message_bytes
        half = np.full(w, moved / 2.0)
        return {"sent": half, "recv": half.copy(), "moved": np.full(w, moved), "home": np.zeros(w)}

    def bytes_moved(self) -> np.ndarray:
        return self.per_rank_bytes()["moved"]

    def key(self) -> str:
        """Stable text id of the call (for tables and de-duplication)."""
        if self.op == "all_to_all":
            body = json.dumps([[int(x) for x in row] for row in self.send_bytes])  # type: ignore[union-attr]
        else:
            body = str(int(self.message_bytes))
        return f"{self.op}|w{self.world_size}|{self.backend}|{self.dtype}|{body}"
