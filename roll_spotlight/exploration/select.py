"""Seed selection: which k of a prompt's explored seeds become its training group.

Flow-GRPO normalises rewards within a group, so a group whose rewards spread widely carries the
strongest learning signal. ``select_max_variance`` returns the k rewards of largest population
variance (ddof=0, the statistic the advantage uses).

Why scanning j is exact: k^2 * variance = (1/2) * sum over pairs (x - y)^2. As a function of one
member y that pair sum is convex, so if an unselected reward lies below y and another above it,
swapping y for one of them never lowers the variance. Repeating, some optimum is "extreme" in the
sorted order: the bottom k-j plus the top j values for some j in 0..k. One sort plus a prefix-sum
scan over the k+1 candidates is therefore optimal: O(n log n).

Determinism (ties): values are ordered by (reward, index), a stable sort. Candidate j takes the
first k-j and the last j positions of that order. Among candidates of equal variance (within a
relative 1e-12) the smallest j wins, and among index sets holding the same multiset of reward
values the lowest indices win. The result is returned sorted ascending. Consequences: k == n
returns every index; k == 1 (variance 0 for every choice) returns the index of the smallest reward,
its lowest index if tied; all-equal rewards return ``range(k)``.

``select_pps`` (`exploration.unbiased`) draws the k at random instead, each seed with probability
``pps_inclusion`` growing with its reward's distance from the pool mean; weighted by k / (n pi)
(Horvitz-Thompson), the selected group's gradient is then unbiased for the whole pool's, which a
deterministic selection (inclusion 0 or 1) cannot be.

The other selectors exist as baselines for benchmarks and ablations. ``get_selector(name)`` resolves
a name from ``SELECTORS``; every selector is called as ``selector(rewards, k, seed)``.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

Selector = Callable[[Sequence[float], int, int], np.ndarray]

_REL_TIE = 1e-12
PPS_FLOOR = 0.1


def _as_rewards(rewards: Sequence[float] | np.ndarray, k: int) -> np.ndarray:
    """Validate user input: a finite 1-D float array and 1 <= k <= n."""
    values = np.asarray(rewards, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"rewards must be 1-D, got shape {values.shape}")
    n = values.shape[0]
    if isinstance(k, bool) or int(k) != k or not 1 <= k <= n:
        raise ValueError(f"k must be an integer with 1 <= k <= n, got k={k}, n={n}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"rewards must be finite, got {values[~np.isfinite(values)][:3]} among n={n}")
    return values


def extreme_subset_variances(sorted_values: np.ndarray, k: int) -> np.ndarray:
    """Population variance of each candidate "bottom k-j + top j" subset, j = 0..k.

    ``sorted_values`` has shape (n,) or (batch, n), sorted ascending along the last axis, n >= k.
    Returns shape (k+1,) or (batch, k+1). Values are centred on their mean first so the
    E[x^2] - E[x]^2 form does not cancel catastrophically for rewards far from zero.
    """
    x = np.atleast_2d(sorted_values)
    n = x.shape[1]
    assert n >= k >= 1, (n, k)
    x = x - x.mean(axis=1, keepdims=True)
    zeros = np.zeros((x.shape[0], 1))
    c1 = np.concatenate([zeros, np.cumsum(x, axis=1)], axis=1)
    c2 = np.concatenate([zeros, np.cumsum(x * x, axis=1)], axis=1)
    j = np.arange(k + 1)
    s1 = c1[:, k - j] + c1[:, [n]] - c1[:, n - j]
    s2 = c2[:, k - j] + c2[:, [n]] - c2[:, n - j]
    var = np.maximum(s2 / k - (s1 / k) ** 2, 0.0)
    return var if np.ndim(sorted_values) == 2 else var[0]


def _best_j(variances: np.ndarray) -> int:
    """Smallest j whose variance equals the maximum within a relative tolerance."""
    best = float(variances.max())
    return int(np.flatnonzero(variances >= best - _REL_TIE * max(best, 1.0))[0])


def _lowest_indices_for_positions(values: np.ndarray, order: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Map chosen sorted positions to original indices, preferring the lowest index among equal values.

    Within a run of equal values the stable order lists indices ascending, so taking the first c
    positions of each run (c = how many the candidate used from that run) keeps the same multiset of
    values with the lowest indices.
    """
    sorted_vals = values[order]
    run_start = np.searchsorted(sorted_vals, sorted_vals[positions], side="left")
    starts, counts = np.unique(run_start, return_counts=True)
    picked = np.concatenate([np.arange(s, s + c) for s, c in zip(starts, counts)])
    return np.sort(order[picked])


def _extreme_subset(values: np.ndarray, k: int, j: int) -> np.ndarray:
    """Indices of the bottom k-j plus top j rewards (ties: lowest indices), sorted ascending."""
    order = np.argsort(values, kind="stable")
    n = values.shape[0]
    positions = np.concatenate([np.arange(k - j), np.arange(n - j, n)])
    return _lowest_indices_for_positions(values, order, positions)


def select_max_variance(rewards: Sequence[float] | np.ndarray, k: int) -> np.ndarray:
    """Indices (ascending) of the k rewards with the largest population variance.

    Raises ValueError when k < 1 or k > n (the message names both) or a reward is not finite.
    """
    values = _as_rewards(rewards, k)
    j = _best_j(extreme_subset_variances(np.sort(values), k))
    return _extreme_subset(values, k, j)


def max_variance(rewards: Sequence[float] | np.ndarray, k: int) -> float:
    """The variance ``select_max_variance`` achieves (no index bookkeeping)."""
    values = _as_rewards(rewards, k)
    return float(extreme_subset_variances(np.sort(values), k).max())


def select_best_worst_halves(rewards: Sequence[float] | np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """The fixed j = ceil(k/2) candidate: the top ceil(k/2) and bottom floor(k/2) rewards.

    A common heuristic ("best and worst halves"; Sol-RL's top-k/2 + bottom-k/2, registered as
    ``"top_bottom"`` too); ``seed`` is unused (uniform selector signature).
    """
    values = _as_rewards(rewards, k)
    return _extreme_subset(values, k, k - k // 2)


def select_top(rewards: Sequence[float] | np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """The k largest rewards (best-of-n); ``seed`` is unused (uniform selector signature)."""
    values = _as_rewards(rewards, k)
    return _extreme_subset(values, k, k)


def select_random(rewards: Sequence[float] | np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """k indices uniformly without replacement, deterministic in ``seed``; sorted ascending."""
    values = _as_rewards(rewards, k)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(values.shape[0], size=k, replace=False))


def inclusion_probabilities(sizes: Sequence[float], n: int) -> np.ndarray:
    """pi proportional to `sizes` (all > 0), summing to n, none above 1 (the excess spread over the rest)."""
    s = np.asarray(sizes, dtype=np.float64)
    assert s.ndim == 1 and np.all(s > 0) and 1 <= n <= len(s), (s, n)
    pi, capped = np.zeros_like(s), np.zeros(len(s), dtype=bool)
    while True:
        free = ~capped
        pi[free] = (n - capped.sum()) * s[free] / s[free].sum()
        over = free & (pi >= 1.0)
        if not over.any():
            return pi
        capped |= over
        pi[capped] = 1.0


def systematic_sample(pi: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Exactly round(sum(pi)) distinct indices, index i with probability pi[i] (systematic sampling
    over a random order); returned ascending."""
    order = rng.permutation(len(pi))
    edges = np.cumsum(pi[order])
    points = rng.uniform() + np.arange(int(round(edges[-1])))
    return np.sort(order[np.minimum(np.searchsorted(edges, points, side="right"), len(pi) - 1)])


def pps_inclusion(rewards: Sequence[float] | np.ndarray, k: int, floor: float = PPS_FLOOR) -> np.ndarray:
    """Each seed's probability of being in ``select_pps``'s k: proportional to its reward's distance
    from the pool mean plus ``floor`` times the mean distance (uniform when all are equal)."""
    values = _as_rewards(rewards, k)
    dist = np.abs(values - values.mean())
    return inclusion_probabilities(dist + max(floor * dist.mean(), 1e-12), k)


def select_pps(rewards: Sequence[float] | np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """k seeds drawn with probability ``pps_inclusion`` (deterministic in ``seed``), ascending: the
    randomised selection whose Horvitz-Thompson weights k / (n pi) make it unbiased."""
    return systematic_sample(pps_inclusion(rewards, k), np.random.default_rng(seed))


def _select_max_variance_seeded(rewards: Sequence[float] | np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    return select_max_variance(rewards, k)


SELECTORS: dict[str, Selector] = {
    "max_variance": _select_max_variance_seeded,
    "best_worst_halves": select_best_worst_halves,
    "top_bottom": select_best_worst_halves,  # Sol-RL's name for it (`exploration.selection`)
    "random": select_random,
    "top": select_top,
    "pps": select_pps,  # `exploration.unbiased`: randomised, weighted by 1 / inclusion
}


def get_selector(name: str) -> Selector:
    """Resolve a selector by name; the error lists the known names."""
    try:
        return SELECTORS[name]
    except KeyError:
        raise ValueError(f"unknown selector {name!r}; known selectors: {sorted(SELECTORS)}") from None
