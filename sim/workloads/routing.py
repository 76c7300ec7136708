"""MoE routing generators and imbalance metrics: pure, seeded, vectorised.

A generator is a small frozen dataclass (instantiated by Hydra from conf/routing/*.yaml)
that gives each expert a popularity; ``route`` then draws, for every token, ``top_k``
*distinct* experts with probability proportional to popularity (Gumbel-top-k: the top k
of log p + Gumbel noise is a draw without replacement, Kool, van Hoof & Welling, ICML
2019), gate weights (softmax of the perturbed scores over the chosen experts), and
optionally enforces an expert capacity, dropping assignments past it in token order as
the Switch Transformer does (Fedus, Zoph & Shazeer, JMLR 2022):
capacity = ceil(capacity_factor * tokens * top_k / experts).

Generators and their concentration knob (uniform -> nearly all tokens on one expert):

- ``UniformRouting``: every expert equally popular;
- ``ZipfRouting(exponent)``: p_i ~ (i+1)^-exponent; 0 is uniform;
- ``DirichletRouting(concentration)``: p ~ Dirichlet(concentration * 1); large is near
  uniform, small concentrates;
- ``HotExpertRouting(hot_fraction, hot_share)``: a fraction of experts takes a share of
  the traffic;
- ``RoundRobinRouting``: deterministic, perfectly balanced assignment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _rng(seed: int | np.random.Generator) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


@dataclass(frozen=True)
class UniformRouting:
    def probabilities(self, num_experts: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(num_experts, 1.0 / num_experts)


@dataclass(frozen=True)
class ZipfRouting:
    exponent: float = 1.0  # 0 = uniform; larger concentrates on expert 0

    def __post_init__(self) -> None:
        if not (isinstance(self.exponent, (int, float)) and 0 <= self.exponent <= 50):
            raise ValueError(f"routing.exponent must be in [0, 50], got {self.exponent!r}")

    def probabilities(self, num_experts: int, rng: np.random.Generator) -> np.ndarray:
        w = np.arange(1, num_experts + 1, dtype=np.float64) ** (-float(self.exponent))
        return w / w.sum()


@dataclass(frozen=True)
class DirichletRouting:
    concentration: float = 1.0  # large = near uniform, small = a few experts take most

    def __post_init__(self) -> None:
        if not (isinstance(self.concentration, (int, float)) and 1e-3 <= self.concentration <= 1e6):
            raise ValueError(f"routing.concentration must be in [0.001, 1e6], got {self.concentration!r}")

    def probabilities(self, num_experts: int, rng: np.random.Generator) -> np.ndarray:
        p = rng.dirichlet(np.full(num_experts, float(self.concentration)))
        p = np.maximum(p, 1e-12)  # Gumbel-top-k needs log p finite
        return p / p.sum()


@dataclass(frozen=True)
class HotExpertRouting:
    hot_fraction: float = 0.125  # share of experts that are hot, in (0, 1]
    hot_share: float = 0.5  # share of traffic they receive, in [0, 1)

    def __post_init__(self) -> None:
        if not (0 < self.hot_fraction <= 1):
            raise ValueError(f"routing.hot_fraction must be in (0, 1], got {self.hot_fraction!r}")
        if not (0 <= self.hot_share < 1):
            raise ValueError(f"routing.hot_share must be in [0, 1), got {self.hot_share!r}")

    def probabilities(self, num_experts: int, rng: np.random.Generator) -> np.ndarray:
        hot = max(1, int(round(self.hot_fraction * num_experts)))
        if hot == num_experts:
            return np.full(num_experts, 1.0 / num_experts)
        p = np.full(num_experts, (1.0 - self.hot_share) / (num_experts - hot))
        p[:hot] = self.hot_share / hot
        return p


@dataclass(frozen=True)
class RoundRobinRouting:
    """Token t takes experts (t*k + j) mod E, j < k: exactly balanced, no randomness."""

    def probabilities(self, num_experts: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(num_experts, 1.0 / num_experts)


RoutingGenerator = UniformRouting | ZipfRouting | DirichletRouting | HotExpertRouting | RoundRobinRouting


@dataclass(frozen=True)
class Routing:
    """Routed assignments of ``tokens`` tokens to ``num_experts`` experts.

    ``expert_ids`` and ``gates`` are [tokens, top_k]; ``kept`` marks assignments that
    survived the capacity limit (all True without one).
    """

    expert_ids: np.ndarray
    gates: np.ndarray
    kept: np.ndarray
    num_experts: int

    @property
    def tokens(self) -> int:
        return int(self.expert_ids.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.expert_ids.shape[1])

    def expert_counts(self) -> np.ndarray:
        """Kept tokens per expert (the per-expert GEMM row counts)."""
        return np.bincount(self.expert_ids[self.kept], minlength=self.num_experts)

    def flat_assignments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(expert id, token index, gate) of every kept assignment, token-major order."""
        token = np.broadcast_to(np.arange(self.tokens)[:, None], self.expert_ids.shape)
        return self.expert_ids[self.kept], token[self.kept], self.gates[self.kept].astype(np.float32)

    def metrics(self) -> dict[str, float]:
        return imbalance_metrics(self.expert_counts(), dropped=int((~self.kept).sum()), assigned=self.kept.size)


def check_routing_shape(tokens: int, num_experts: int, top_k: int) -> None:
    for name, value in (("moe.tokens", tokens), ("moe.num_experts", num_experts), ("moe.top_k", top_k)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer (>= 1), got {value!r}")
    if top_k > num_experts:
        raise ValueError(f"moe.top_k must be in [1, moe.num_experts={num_experts}], got {top_k}")


def check_capacity_factor(capacity_factor: object) -> float | None:
    """``routing.capacity_factor``: a finite number > 0, or None for no capacity limit."""
    if capacity_factor is None:
        return None
    ok = isinstance(capacity_factor, (int, float, np.integer, np.floating)) and not isinstance(capacity_factor, bool)
    if not ok or not (math.isfinite(capacity_factor) and capacity_factor > 0):
        raise ValueError(f"routing.capacity_factor must be > 0 (a number such as 1.25) or null for no capacity limit, "
                         f"got {capacity_factor!r}")
    return float(capacity_factor)


def route(
    generator: RoutingGenerator,
    *,
    tokens: int,
    num_experts: int,
    top_k: int,
    seed: int | np.random.Generator,
    capacity_factor: float | None = None,
) -> Routing:
    """Draw a routing: top-k distinct experts per token, gates, capacity dropping."""
    check_routing_shape(tokens, num_experts, top_k)
    capacity_factor = check_capacity_factor(capacity_factor)
    rng = _rng(seed)
    if isinstance(generator, RoundRobinRouting):
        ids = (np.arange(tokens)[:, None] * top_k + np.arange(top_k)[None, :]) % num_experts
        gates = np.full((tokens, top_k), 1.0 / top_k)
    else:
        p = generator.probabilities(num_experts, rng)
        scores = np.log(p)[None, :] + rng.gumbel(size=(tokens, num_experts))
        ids = np.argpartition(-scores, top_k - 1, axis=1)[:, :top_k] if top_k < num_experts else np.tile(
            np.arange(num_experts), (tokens, 1)
        )
        chosen = np.take_along_axis(scores, ids, axis=1)
        order = np.argsort(-chosen, axis=1)  # highest score first, as a router's top-k
        ids = np.take_along_axis(ids, order, axis=1)
        chosen = np.take_along_axis(chosen, order, axis=1)
        e = np.exp(chosen - chosen.max(axis=1, keepdims=True))
        gates = e / e.sum(axis=1, keepdims=True)
    ids = ids.astype(np.int64)
    kept = np.ones(ids.shape, dtype=bool)
    if capacity_factor is not None:
        capacity = math.ceil(capacity_factor * tokens * top_k / num_experts)
        flat = ids.reshape(-1)  # token-major: earlier tokens claim capacity first
        onehot_rank = _rank_within_expert(flat, num_experts)
        kept = (onehot_rank < capacity).reshape(ids.shape)
    return Routing(expert_ids=ids, gates=gates.astype(np.float32), kept=kept, num_experts=num_experts)


def _rank_within_expert(flat_ids: np.ndarray, num_experts: int) -> np.ndarray:
    """For each assignment, how many earlier assignments went to the same expert."""
    order = np.argsort(flat_ids, kind="stable")
    counts = np.bincount(flat_ids, minlength=num_experts)
    starts = np.cumsum(counts) - counts
    rank_sorted = np.arange(flat_ids.size) - np.repeat(starts, counts)
    rank = np.empty_like(rank_sorted)
    rank[order] = rank_sorted
    return rank


def gini(values: np.ndarray) -> float:
    """Gini coefficient of non-negative values (0 = equal, -> 1 = one holds all)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    n = v.size
    if n == 0 or v.sum() == 0:
        return 0.0
    # G = sum_i (2i - n - 1) v_(i) / (n * sum v), i = 1..n on sorted values
    i = np.arange(1, n + 1)
    return float(np.sum((2 * i - n - 1) * v) / (n * v.sum()))


def imbalance_metrics(counts: np.ndarray, *, dropped: int = 0, assigned: int | None = None) -> dict[str, float]:
    """Load-imbalance statistics of per-expert token counts."""
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum()
    mean = c.mean()
    share = c / total if total > 0 else np.zeros_like(c)
    nz = share[share > 0]
    entropy = float(-(nz * np.log(nz)).sum() / np.log(c.size)) if c.size > 1 else 1.0
    assigned = int(total) + dropped if assigned is None else assigned
    return {
        "max_over_mean": float(c.max() / mean) if mean > 0 else 0.0,
        "cv": float(c.std() / mean) if mean > 0 else 0.0,
        "norm_entropy": entropy,
        "gini": gini(c),
        "experts_used": int((c > 0).sum()),
        "dropped_share": float(dropped / assigned) if assigned else 0.0,
    }
