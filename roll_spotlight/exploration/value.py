"""Value of exploring more seeds of one prompt: Monte Carlo look-ahead on the selected-k variance.

The quantity the planner maximises for a prompt is V = the variance of the k seeds that
``select_max_variance`` will pick from its explored rewards (topped up with fresh, unexplored seeds
when fewer than k are explored, since the training group always has k members). A pull adds m
rewards drawn from the prompt's reward distribution. Given D Monte Carlo rows of hypothetical future
rewards ``draws`` (shape (D, width), one row = one possible future, columns in the order they would be
observed), the expected V after c more seeds is the row mean of V(explored + first c columns).

Why a look-ahead over several pulls: V is flat while fewer than k seeds are explored (the group is
"all explored + fresh random seeds", whose expected variance does not change), then rises once the
selector has more than k to choose from. A one-pull gain would call the first pulls worthless, so the
index is the best gain *rate* over horizons of h = 1..H pulls:

    index = max_h (E[V(planned + h*m)] - E[V(planned)]) / (h * m)

(a standard fix for non-concave returns in greedy budgeted allocation). ``planned`` counts seeds
already issued but not yet observed: they are "hallucinated" as draws too, so two workers exploring
the same prompt at once are not both credited with the first, most valuable, pull.

Using the same rows for every horizon (common random numbers) makes the differences far less noisy
than the values; the pools are nested, so every row's gain is >= 0 exactly.

Two-valued prompts (pass / fail rewards) need no Monte Carlo: with a Beta posterior on the rate of
the high value, the count of high values among the next c seeds is Beta-binomial and the selected
variance depends on the pool only through that count (``binary_lookahead_gains``).
"""
from __future__ import annotations

import math

import numpy as np

from roll_spotlight.exploration.select import extreme_subset_variances


def horizon_pulls(explored: int, planned: int, k: int, m: int, cap: int) -> int:
    """Pulls to look ahead: enough to reach k + m seeds (one pull past the flat part), at most ``cap``."""
    need = math.ceil((k + m - explored - planned) / m)
    return max(1, min(cap, need))


def draws_needed(explored: int, planned: int, k: int, m: int, horizons: int) -> int:
    """Columns of ``draws`` the look-ahead reads."""
    return max(planned + horizons * m, k - explored)


def expected_selected_variance(explored_sorted: np.ndarray, draws: np.ndarray, k: int) -> float:
    """Mean over rows of the max-variance k-subset variance of explored + that row's draws."""
    rows = draws.shape[0]
    pool = np.concatenate([np.broadcast_to(explored_sorted, (rows, explored_sorted.shape[0])), draws], axis=1)
    assert pool.shape[1] >= k, (pool.shape, k)
    pool.sort(axis=1)
    return float(extreme_subset_variances(pool, k).max(axis=1).mean())


def lookahead_gains(explored_sorted: np.ndarray, draws: np.ndarray, k: int, planned: int,
                    m: int, horizons: int) -> tuple[float, np.ndarray]:
    """(E[V(planned)], gains): ``gains[h-1]`` = E[V(planned + h*m)] - E[V(planned)], h = 1..``horizons``."""
    s = explored_sorted.shape[0]
    assert draws.shape[1] >= draws_needed(s, planned, k, m, horizons), (draws.shape, s, planned, horizons)
    base = expected_selected_variance(explored_sorted, draws[:, : max(planned, k - s)], k)
    gains = np.empty(horizons)
    for h in range(1, horizons + 1):
        width = max(planned + h * m, k - s)
        gains[h - 1] = expected_selected_variance(explored_sorted, draws[:, :width], k) - base
    return base, gains


def best_rate(gains: np.ndarray, m: int) -> tuple[float, int]:
    """(max_h gains[h-1] / (h*m), that h): the best gain per explored seed and its horizon (0 if none > 0)."""
    rates = gains / (m * np.arange(1, gains.shape[0] + 1))
    h = int(np.argmax(rates))
    return (float(rates[h]), h + 1) if rates[h] > 0 else (0.0, 0)


def lookahead_gain_rate(explored_sorted: np.ndarray, draws: np.ndarray, k: int, planned: int,
                        m: int, horizons: int) -> float:
    """Best expected gain in selected variance per explored seed over 1..``horizons`` pulls."""
    return best_rate(lookahead_gains(explored_sorted, draws, k, planned, m, horizons)[1], m)[0]


def shrunk_predictive_draws(explored: np.ndarray, prior_draws: np.ndarray, prior_strength: float,
                            u_mix: np.ndarray, u_pick: np.ndarray) -> np.ndarray:
    """Draws from a Dirichlet-process posterior predictive whose base measure is ``prior_draws``.

    A new reward is a resample of one of the prompt's s explored rewards with probability
    s / (s + alpha), else the matching entry of ``prior_draws`` (draws from the population prior,
    ``prior.py``). The prompt's own rewards take over as they accumulate; with none, the prior alone.
    All arrays but ``explored`` share one shape.
    """
    s = explored.shape[0]
    if s == 0:
        return prior_draws
    own = explored[np.minimum((u_pick * s).astype(np.int64), s - 1)]
    return np.where(u_mix < prior_strength / (s + prior_strength), prior_draws, own)


def beta_binomial_pmf(n: int, a: float, b: float) -> np.ndarray:
    """P(X = x), x = 0..n, for X ~ BetaBinomial(n, a, b), a, b > 0 (by the ratio of successive terms)."""
    x = np.arange(n, dtype=float)
    ratios = (n - x) * (x + a) / ((x + 1) * (n - x - 1 + b))
    pmf = np.concatenate([[1.0], np.cumprod(ratios)])
    return pmf / pmf.sum()


def binary_selected_variance(highs: np.ndarray, pool: int, k: int, spread: float) -> np.ndarray:
    """``select_max_variance``'s variance on a pool of ``pool`` two-valued rewards, ``highs`` of them high:
    the best k-subset holds j high values, j as close to k/2 as the pool allows."""
    j = np.clip(k // 2, k - (pool - highs), highs)
    frac = j / k
    return frac * (1.0 - frac) * spread * spread


def binary_lookahead_gains(highs: int, lows: int, spread: float, a: float, b: float, k: int,
                           planned: int, m: int, horizons: int) -> tuple[float, np.ndarray]:
    """``lookahead_gains`` in closed form for a two-valued prompt (values ``spread`` apart): the rate of
    the high value is Beta(a + highs, b + lows) a posteriori, so the number of high values among the
    next c seeds (planned ones, pulls, the fresh top-up to k) is Beta-binomial. Exact: no Monte Carlo."""
    s = highs + lows

    def expected(future: int) -> float:
        pool = max(s + future, k)
        pmf = beta_binomial_pmf(pool - s, a + highs, b + lows)
        return float(pmf @ binary_selected_variance(highs + np.arange(pool - s + 1), pool, k, spread))

    base = expected(planned)
    gains = np.array([expected(planned + h * m) - base for h in range(1, horizons + 1)])
    return base, np.maximum(gains, 0.0)
