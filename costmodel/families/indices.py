"""Seeded index generators for gather/scatter microbenchmarks, with a tunable skew.

An index of ``num_rows`` entries into ``num_targets`` rows is drawn from a Zipf law
p_i ~ (i+1)^-s over a random permutation of the targets (so hot rows are not all at low
addresses). Skew is described by the coefficient of variation (CV) of the per-target hit
counts, the statistic the cost model sees; ``index_for_cv`` solves for the exponent that
gives a requested CV.

For multinomial counts, CV_realised^2 ~= CV_p^2 + N/E (the expected-count spread plus
the sampling noise of E draws over N targets; variance of a multinomial cell,
Var c_i = E p_i (1 - p_i)), so a CV below sqrt(N/E) cannot be asked for: it is the
uniform index's own noise floor; below it, a partly balanced index is used instead.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

MAX_EXPONENT = 6.0


def zipf_probabilities(num_targets: int, exponent: float) -> np.ndarray:
    """p_i proportional to (i+1)^-exponent, i in [0, num_targets)."""
    ranks = np.arange(1, num_targets + 1, dtype=np.float64)
    weights = ranks ** (-float(exponent))
    return weights / weights.sum()


def probability_cv(p: np.ndarray) -> float:
    """Coefficient of variation of expected counts under probabilities p."""
    return float(p.std() / p.mean())


def counts_cv(index: np.ndarray, num_targets: int) -> float:
    """Coefficient of variation of how often each target is hit by ``index``."""
    counts = np.bincount(index, minlength=num_targets).astype(np.float64)
    return float(counts.std() / counts.mean())


def exponent_for_cv(num_rows: int, num_targets: int, cv: float) -> float:
    """Zipf exponent whose index has (approximately) the requested realised CV."""
    target_p_cv = np.sqrt(max(cv * cv - num_targets / num_rows, 0.0))
    if target_p_cv <= 1e-9:
        return 0.0
    lo, hi = 0.0, MAX_EXPONENT
    if probability_cv(zipf_probabilities(num_targets, hi)) < target_p_cv:
        return hi  # the most skewed index this generator makes
    for _ in range(50):  # bisection: CV_p is increasing in the exponent
        mid = 0.5 * (lo + hi)
        if probability_cv(zipf_probabilities(num_targets, mid)) < target_p_cv:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def zipf_index(
    num_rows: int, num_targets: int, exponent: float, *, sorted: bool, seed: int
) -> np.ndarray:
    """int64 index of ``num_rows`` draws over ``num_targets`` rows with Zipf skew."""
    rng = np.random.default_rng(seed)
    p = zipf_probabilities(num_targets, exponent)
    permutation = rng.permutation(num_targets)
    index = permutation[rng.choice(num_targets, size=num_rows, p=p)].astype(np.int64)
    if sorted:
        index.sort()
    return index


@lru_cache(maxsize=16)  # suites reuse one index across backends and reductions
def index_for_cv(
    num_rows: int, num_targets: int, cv: float, *, sorted: bool, seed: int = 0
) -> tuple[np.ndarray, float]:
    """An index with approximately the requested hit-count CV, and the CV it realised.

    Below the uniform draw's noise floor sqrt(N/E) the index mixes a balanced part
    (targets taken in turn, CV ~ 0) with a uniform part: with a share q balanced,
    CV^2 ~= (1 - q) N/E, so q = 1 - cv^2 E/N.
    """
    floor_sq = num_targets / num_rows
    if cv * cv >= floor_sq:
        index = zipf_index(num_rows, num_targets, exponent_for_cv(num_rows, num_targets, cv), sorted=sorted, seed=seed)
    else:
        rng = np.random.default_rng(seed)
        n_balanced = int(round((1.0 - cv * cv / floor_sq) * num_rows))
        balanced = rng.permutation(num_targets)[np.arange(n_balanced) % num_targets]
        index = np.concatenate([balanced, rng.integers(0, num_targets, num_rows - n_balanced)]).astype(np.int64)
        if sorted:
            index.sort()
        else:
            rng.shuffle(index)
    index.setflags(write=False)  # shared by the cache
    return index, counts_cv(index, num_targets)


def realised_cv(num_rows: int, num_targets: int, cv: float, *, sorted: bool, seed: int = 0) -> float:
    """The CV an index asked for ``cv`` really has (rounded): what a descriptor should say."""
    return round(index_for_cv(num_rows, num_targets, float(cv), sorted=sorted, seed=seed)[1], 3)


def column_pattern(cv: float, share: float) -> tuple[float, float]:
    """(CV, read share) as a descriptor records them: rounded to 3 decimals, the share at
    least 0.001 (``SpmmSpec.src_read_share`` must be > 0)."""
    return round(float(cv), 3), max(round(float(share), 3), 0.001)


def pattern_of_counts(counts: np.ndarray) -> tuple[float, float]:
    """``column_pattern`` of per-target hit counts (how often each target is read)."""
    c = np.asarray(counts, dtype=np.float64)
    mean = c.mean() if c.size else 0.0
    return column_pattern(c.std() / mean if mean > 0 else 0.0, (c > 0).mean() if c.size else 1.0)


def read_share(index: np.ndarray, num_targets: int) -> float:
    """Share of the targets that ``index`` hits at least once."""
    return float(np.unique(index).size / num_targets)


def min_cv_for_share(share: float) -> float:
    """The least hit-count CV an index reading ``share`` of its targets can have.

    Equal counts on the share read and zero elsewhere: mean mu = s*c, variance
    s*c^2 - mu^2, so CV^2 = 1/s - 1."""
    return float(np.sqrt(max(1.0 / share - 1.0, 0.0)))


@lru_cache(maxsize=16)
def index_for_share(
    num_rows: int, num_targets: int, cv: float, share: float, *, seed: int = 0
) -> tuple[np.ndarray, float, float]:
    """An unsorted index that reads about ``share`` of its targets with about hit-count CV
    ``cv`` over all of them, and the (CV, share) it realised.

    Real graphs leave many nodes unread (R-MAT at a = 0.7 reads 38% of them) where a Zipf
    index of the same CV reads 92%, and the rows read set the cache footprint of a
    gather or sparse matmul. So the index is drawn over a random subset of u = share *
    num_targets targets with the CV that subset needs: counts that are zero off the subset
    and have CV_u over it have, over all targets, CV^2 = (1 + CV_u^2) * N/u - 1 (the
    moments of a mixture with zeros), so CV_u^2 = (CV^2 + 1) * u/N - 1 (clamped at 0: a CV
    below ``min_cv_for_share`` is not reachable at that share).
    """
    if not 0 < share <= 1:
        raise ValueError(f"read share must be in (0, 1], got {share!r}")
    subset = int(min(max(round(share * num_targets), 1), num_rows, num_targets))
    cv_subset = float(np.sqrt(max((cv * cv + 1.0) * subset / num_targets - 1.0, 0.0)))
    within, _ = index_for_cv(num_rows, subset, cv_subset, sorted=False, seed=seed)
    targets = np.random.default_rng(seed + 7919).permutation(num_targets)[:subset]
    index = targets[within].astype(np.int64)
    index.setflags(write=False)  # shared by the cache
    return index, counts_cv(index, num_targets), read_share(index, num_targets)
