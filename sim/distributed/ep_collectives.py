"""The all-to-all model an expert-parallel prediction uses, and a stand-in while none is profiled.

``collective_model_for`` asks ``costmodel.collectives.load_collective_model`` for the
collective profile of (world size, backend) on this device. Where that package or its
profile is not there, the EP experiment fits a latency-bandwidth all-to-all itself
(``LatencyBandwidthAllToAll``, Hockney's alpha-beta model: R. W. Hockney, "The
communication challenge for MPP", Parallel Computing 20(3), 1994) on a grid of uniform
all-to-alls timed in the same launch as its layers (``time_all_to_all_grid``): per rank
t_r = alpha + b_r / beta, b_r = the rank's off-diagonal send plus receive bytes (the
convention of ``costmodel.collectives.spec``). Its message sizes are a grid, never the
experiment's messages, so it predicts them as a held-out model would. It has the same
methods as the collective model (``levels``, ``predict_all_to_all_s``, ``predict_s``,
``extrapolating``); its L2 and L3 are the same fit.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

FALLBACK_FILE = "ep_all_to_all_fit.json"  # in the device profile's folder: derived data, refit by any measuring run


def off_rank_bytes(send_bytes: np.ndarray) -> np.ndarray:
    """[W] each rank's off-diagonal send plus receive bytes of a [W, W] send matrix."""
    m = np.asarray(send_bytes, dtype=np.float64)
    off = m - np.diag(np.diag(m))
    return off.sum(axis=1) + off.sum(axis=0)


@dataclass(frozen=True)
class LatencyBandwidthAllToAll:
    """t_r = alpha_s + (off-rank send + receive bytes of rank r) / beta_bytes_per_s, for W ranks."""

    alpha_s: float
    beta_bytes_per_s: float
    world_size: int
    fitted_bytes: tuple[float, float] | None = None  # per-rank bytes range of the fit (None: not fitted)
    source: str = "given"

    levels = ("L2", "L3")

    def predict_all_to_all_s(self, send_bytes: np.ndarray, level: str = "L3") -> np.ndarray:
        m = np.asarray(send_bytes, dtype=np.float64)
        if m.shape != (self.world_size, self.world_size):
            raise ValueError(f"send_bytes must be [{self.world_size}, {self.world_size}] (world_size={self.world_size}), "
                             f"got {list(m.shape)}")
        if level not in self.levels:
            raise ValueError(f"level must be one of {list(self.levels)}, got {level!r}")
        return self.alpha_s + off_rank_bytes(m) / self.beta_bytes_per_s

    def predict_s(self, op: str, bytes_per_rank: float, level: str = "L3") -> float:
        if op != "all_to_all":
            raise ValueError(f"op must be 'all_to_all' for this model, got {op!r}")
        return float(self.alpha_s + 2 * (self.world_size - 1) / self.world_size * bytes_per_rank / self.beta_bytes_per_s)

    def extrapolating(self, send_bytes: np.ndarray) -> str | None:
        m = np.asarray(send_bytes, dtype=np.float64)
        notes = []
        if m.shape[0] != self.world_size:
            notes.append(f"world size {m.shape[0]} beyond the fitted {self.world_size}")
        if self.fitted_bytes is not None:
            b = off_rank_bytes(m) if m.shape[0] == self.world_size else np.array([])
            lo, hi = self.fitted_bytes
            if b.size and (b.max() > hi or b[b > 0].min(initial=lo) < lo):
                notes.append(f"per-rank bytes {b.min():.0f}..{b.max():.0f} outside the fitted {lo:.0f}..{hi:.0f}")
        if self.source != "measured":
            notes.append(f"collective model: {self.source}")
        return "; ".join(notes) or None

    def to_dict(self) -> dict[str, Any]:
        return {"alpha_s": self.alpha_s, "beta_bytes_per_s": self.beta_bytes_per_s, "world_size": self.world_size,
                "fitted_bytes": list(self.fitted_bytes) if self.fitted_bytes else None, "source": self.source}


def fit_latency_bandwidth(samples: Sequence[tuple[np.ndarray, float]], world_size: int) -> LatencyBandwidthAllToAll:
    """Least squares of t = alpha + b / beta over (send matrix, slowest-rank seconds) samples,
    b the largest per-rank off-rank bytes; alpha and 1/beta kept >= 0."""
    b = np.array([off_rank_bytes(m).max() for m, _ in samples])
    t = np.array([s for _, s in samples])
    A = np.stack([np.ones_like(b), b], axis=1)
    (alpha, inv_beta), *_ = np.linalg.lstsq(A, t, rcond=None)
    if inv_beta <= 0:
        inv_beta = max(float(np.median(t / np.maximum(b, 1.0))), 1e-15)
    alpha = max(float(alpha), 0.0)
    return LatencyBandwidthAllToAll(alpha, 1.0 / float(inv_beta), world_size, (float(b.min()), float(b.max())), "measured")


def uniform_matrix(bytes_per_peer: int, world_size: int) -> np.ndarray:
    return np.full((world_size, world_size), float(bytes_per_peer))


def time_all_to_all_grid(rank: int, world_size: int, sizes: Sequence[int], *, repeats: int = 7, warmup: int = 2
                         ) -> list[tuple[int, float]]:
    """Inside a process group: (bytes per peer, median slowest-rank seconds) of a uniform float32
    ``all_to_all_single`` per size. Bounded: len(sizes) x (warmup + repeats) calls."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    out = []
    for size in sizes:
        n = max(1, int(size) // 4)
        send = torch.ones(world_size * n)
        recv = torch.empty_like(send)
        times = []
        for i in range(warmup + repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_to_all_single(recv, send)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if i >= warmup:
                times.append(float(elapsed.item()))
        out.append((n * 4, float(np.median(times))))
    return out


def fit_grid(timed: Sequence[tuple[int, float]], world_size: int) -> LatencyBandwidthAllToAll:
    return fit_latency_bandwidth([(uniform_matrix(b, world_size), s) for b, s in timed], world_size)


def save_fallback(folder: Path, model: LatencyBandwidthAllToAll, backend: str) -> Path:
    path = Path(folder) / FALLBACK_FILE
    data = json.loads(path.read_text()) if path.exists() else {}
    data[f"{backend}/W{model.world_size}"] = {**model.to_dict(), "saved": time.strftime("%Y-%m-%dT%H:%M:%S")}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    return path


def load_fallback(folder: Path, world_size: int, backend: str) -> LatencyBandwidthAllToAll | None:
    path = Path(folder) / FALLBACK_FILE
    if not path.exists():
        return None
    entry = json.loads(path.read_text()).get(f"{backend}/W{world_size}")
    if entry is None:
        return None
    fb = entry.get("fitted_bytes")
    return LatencyBandwidthAllToAll(float(entry["alpha_s"]), float(entry["beta_bytes_per_s"]), world_size,
                                    tuple(fb) if fb else None, "measured")


def collective_model_for(world_size: int, backend: str, profile_root: str | Path, *,
                         measure_if_missing: bool = False, protocol: str = "step",
                         keep_awake: bool = True) -> tuple[Any | None, str]:
    """(the profiled collective model, how it was found) or (None, why not):
    ``costmodel.collectives.load_collective_model`` on the rows of ``protocol`` (``step``: calls
    timed as a step makes them, the default for a layer's step; with ``measure_if_missing``, its
    default suite is measured first where the profile or its ``protocol`` rows are missing;
    without, a profile measured before the step protocol answers with its ``warm`` rows, and
    ``how`` says so). ``keep_awake``: the profile of ranks whose cores were kept awake
    (``costmodel.collectives.awake``), as the layers are measured by default."""
    try:
        from costmodel.collectives import CollectiveProfileError, load_collective_model, load_step_model  # noqa: PLC0415
    except ImportError as err:
        return None, f"costmodel.collectives has no collective model ({err})"
    where = f"collective profile {backend} W={world_size}{', cores kept awake' if keep_awake else ''} (costmodel.collectives)"
    try:
        if protocol == "step" and not measure_if_missing:
            cm, how = load_step_model(world_size, backend, str(profile_root), keep_awake=keep_awake)
            return cm, f"{where}, {how}"
        cm = load_collective_model(world_size=world_size, backend=backend, profile_root=str(profile_root),
                                   measure_if_missing=measure_if_missing, protocol=protocol, keep_awake=keep_awake)
    except CollectiveProfileError as err:
        return None, f"no collective profile for {backend} W={world_size}: {err}"
    return cm, f"{where}, {protocol} protocol"


def whatif_from(base: Any, world_size: int) -> Any:
    """A what-if all-to-all model for ``world_size`` ranks: the package's
    ``make_latency_bandwidth_model`` with ``base``'s fitted L2 all-to-all alpha and beta where
    ``base`` is a ``costmodel.collectives`` model, else ``whatif_model``."""
    l2 = getattr(base, "l2", {}).get("all_to_all") if isinstance(getattr(base, "l2", None), dict) else None
    if l2 is not None:
        from costmodel.collectives import make_latency_bandwidth_model  # noqa: PLC0415

        return make_latency_bandwidth_model(float(l2.alpha_s_), float(l2.beta_bytes_per_s_), world_size)
    return whatif_model(base, world_size)


def whatif_model(base: Any, world_size: int) -> LatencyBandwidthAllToAll:
    """A latency-bandwidth all-to-all for ``world_size`` ranks from a model of another size:
    alpha and beta read off ``base`` (two uniform messages), so it extrapolates in W."""
    W0 = int(getattr(base, "world_size", 2))
    small, large = 4096.0, 4 * 1024 * 1024.0
    t = [float(np.max(base.predict_all_to_all_s(uniform_matrix(b, W0), level="L3"))) for b in (small, large)]
    b = [off_rank_bytes(uniform_matrix(x, W0)).max() for x in (small, large)]
    inv_beta = max((t[1] - t[0]) / (b[1] - b[0]), 1e-15)
    alpha = max(t[0] - b[0] * inv_beta, 0.0)
    return LatencyBandwidthAllToAll(alpha, 1.0 / inv_beta, world_size, None,
                                    f"latency-bandwidth fitted to the W={W0} model, extrapolated to W={world_size}")
