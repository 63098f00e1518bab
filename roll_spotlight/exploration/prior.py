"""Population prior over prompts' reward distributions, learnt across the prompts of a batch.

Why: after a few seeds, a prompt's own rewards say little about what more seeds would show. A
prompt whose first eight seeds sit in a tight cluster at 0.15 may be a narrow unimodal prompt (more
seeds change little) or a bimodal one whose rare mode has not shown yet (more seeds pay a lot). The
reward model is shared by all prompts, so the other prompts of the batch tell how often each case
happens. This module is that empirical-Bayes prior: the "donors" are the explored prompts, each
represented by its empirical reward distribution, and a prompt's posterior over donors weighs each
donor by how well it explains the prompt's rewards:

    w_j  proportional to  exp(tempering * sum_i log f_j(x_i)),   f_j = smoothed histogram of donor j

``f_j`` is donor j's histogram on ``bins`` equal bins over the observed reward range, smoothed by a
Gaussian of ``bandwidth_bins`` bins and mixed with a uniform ``floor`` (a donor seen with four seeds
must not rule out a value it has not produced yet). A prompt is never its own donor. The predictive
draw from the prior picks a donor by ``w`` and resamples one of its rewards, so binary prompts are
predicted by binary donors (0/1 values, nothing in between) and continuous ones by continuous donors.

Each donor's density is itself shrunk toward the pooled histogram of all donors with weight
``donor_strength`` (and its draws toward the pooled rewards the same way): a donor seen four times
has not shown every value it can produce.

Invariants: every donor's density is normalised over the bins; ``_pool_smoothed`` is the sum of the
donor rows; rows are rebuilt from the raw rewards whenever the reward range grows, so the bins always
cover every observed reward. The range grows with a margin to keep rebuilds rare.

Measured (``python -m benchmarks.planner_bench``, method ``planner_population``): on the synthetic mix it is
within noise of the pooled posterior at about twice the decision time, so it is opt-in
(``PlannerConfig.posterior = "population"``). It picks a donor per hypothetical reward; picking one
per Monte Carlo row with these likelihood weights (tempering 0.5 to 1, no donor shrinkage) was
tried and lost 2-3% at 24 seeds per prompt on tuning seeds 100..139.

``DonorPool`` is the default ("pooled") posterior's base measure: the same donors, uniformly
weighted, one per Monte Carlo row (its docstring says why).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from roll_spotlight.checks import require_each, require_int, require_number


@dataclass(frozen=True)
class PriorConfig:
    """Settings of the population prior (``PlannerConfig.prior``)."""

    bins: int = 32
    bandwidth_bins: float = 1.0
    floor: float = 0.02
    tempering: float = 1.0
    range_margin: float = 0.1
    donor_strength: float = 2.0

    def __post_init__(self) -> None:
        require_int("PlannerConfig.prior.bins", self.bins, ">= 2")
        require_each(self, "PlannerConfig.prior", ("bandwidth_bins", "tempering"), require_number, ">= 0")
        require_number("PlannerConfig.prior.floor", self.floor, "(0, 1]")
        require_number("PlannerConfig.prior.donor_strength", self.donor_strength)


class DonorPool:
    """Every explored prompt's rewards, one row per prompt: the base measure of the pooled posterior.

    Why rows and not one flat pool of rewards: a prompt's unseen rewards come from one reward
    distribution, not from the batch's marginal. Drawing each hypothetical reward independently
    from all pooled rewards mixes the 0s of one prompt with the 1s of another in the same
    hypothetical future, so every prompt is credited with extremes no single prompt would give it
    together (and a flat pool is dominated by the prompts explored most, the high-variance ones).
    ``draw`` therefore picks one donor prompt per Monte Carlo row (uniformly: every explored
    prompt, abandoned ones included, is one sample of the prompt population) and resamples that
    row's base draws from that donor's rewards only, so the mixture over rows says which kind of
    prompt this may be and, given the kind, the draws are i.i.d. A constant donor gives a constant
    row. Measured on tuning seeds 100..139 (``python -m benchmarks.planner_bench --first-seed 100 --seeds
    40``): +1.4% selected variance at 8 explored seeds per prompt, +1% at 12, unchanged at 4, 6.4
    and 24; the same uniform-over-prompts donors drawn per reward instead of per row gain nothing,
    so keeping a row to one donor is what matters.

    ``draw(..., continuous=...)`` restricts the donors to one kind (``is_continuous``): a prompt
    whose rewards are continuous scores borrows from continuous donors only, a two-valued one from
    the others (the planner's ``kind_donors``; measured in ``planner.BanditPlanner``'s docstring).

    Invariant: rows are allocated in order and row j holds donor j's rewards in its first n[j]
    columns; ``_continuous[j]`` is ``is_continuous`` of those rewards; capacity doubles as rows or
    rewards are added (amortised O(1) per reward).
    """

    def __init__(self, capacity: int = 64, width: int = 8) -> None:
        self._rewards = np.zeros((capacity, width))
        self._n = np.zeros(capacity, dtype=np.int64)
        self._continuous = np.zeros(capacity, dtype=bool)
        self._rows = 0

    @property
    def rows(self) -> int:
        """Donor prompts (each holds at least one reward)."""
        return self._rows

    def append(self, row: int, reward: float) -> None:
        """Add one reward to donor ``row`` (a new row must be the next one: ``row == rows``)."""
        assert 0 <= row <= self._rows, (row, self._rows)
        rows, width = self._rewards.shape
        n = int(self._n[row]) if row < rows else 0
        self._grow(2 * rows if row == rows else rows, 2 * width if n == width else width)
        self._rewards[row, n] = reward
        self._n[row] = n + 1
        self._rows = max(self._rows, row + 1)
        if not self._continuous[row] and n >= 2:
            self._continuous[row] = is_continuous(self._rewards[row, : n + 1])

    def kinds(self, rows: int) -> np.ndarray:
        """``is_continuous`` of donor rows 0..rows-1."""
        return self._continuous[:rows]

    def draw(self, u_row: np.ndarray, u_value: np.ndarray, exclude: int | None = None,
             continuous: bool | None = None) -> np.ndarray | None:
        """Base draws of shape ``u_value.shape`` (D, w): row r from donor ``u_row[r]`` (uniform over donors).

        ``exclude`` (the prompt's own row) is never a donor: its own rewards enter the posterior
        through the Dirichlet-process weight instead. ``continuous`` (when not None) restricts the
        donors to those of that kind (``is_continuous``), unless there are none. None when there is
        no other donor.
        """
        eligible = np.ones(self._rows, dtype=bool)
        if exclude is not None and 0 <= exclude < self._rows:
            eligible[exclude] = False
        if continuous is not None:
            same = eligible & (self._continuous[: self._rows] == continuous)
            if same.any():
                eligible = same
        rows = np.flatnonzero(eligible)
        if rows.size == 0:
            return None
        donor = rows[np.minimum((u_row * rows.size).astype(np.int64), rows.size - 1)]
        n = self._n[donor][:, None]
        pick = np.minimum((u_value * n).astype(np.int64), n - 1)
        return self._rewards[donor[:, None], pick]

    def _grow(self, rows: int, width: int) -> None:
        old_rows, old_width = self._rewards.shape
        if (rows, width) == (old_rows, old_width):
            return
        self._rewards = _padded(self._rewards, (rows, width))
        self._n = _padded(self._n, (rows,))
        self._continuous = _padded(self._continuous, (rows,))


def _padded(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``values`` in the leading corner of zeros of ``shape``: a reward table grown in place."""
    out = np.zeros(shape, dtype=values.dtype)
    out[tuple(slice(0, n) for n in values.shape)] = values
    return out


def is_continuous(rewards) -> bool:
    """Three or more distinct values: a continuous-looking reward distribution. Binary rewards (pass /
    fail) never show a third value; a continuous score shows a new value with nearly every seed."""
    values = np.asarray(rewards, dtype=float)
    return values.size >= 3 and np.unique(values).size >= 3


class PopulationPrior:
    """Donor rows keyed by a small integer (the planner's arm index); see the module docstring."""

    def __init__(self, config: PriorConfig, capacity: int = 64) -> None:
        self.config = config
        self._rows = 0
        self._rewards = np.zeros((capacity, 8))  # row j: donor j's rewards in its first _n[j] columns
        self._n = np.zeros(capacity, dtype=np.int64)
        self._smoothed = np.zeros((capacity, config.bins))  # row j: donor j's kernel-smoothed counts
        self._pool_smoothed = np.zeros(config.bins)
        self._lo, self._hi = math.inf, -math.inf
        self._smoother = _gaussian_smoother(config.bins, config.bandwidth_bins)

    @property
    def donors(self) -> int:
        """Rows that hold at least one reward."""
        return int(np.count_nonzero(self._n[: self._rows]))

    def set_rewards(self, row: int, rewards: np.ndarray) -> None:
        """Replace donor ``row``'s rewards (rows are allocated in order: row <= current rows)."""
        assert 0 <= row <= self._rows, (row, self._rows)
        values = np.asarray(rewards, dtype=float)
        self._reserve(row + 1, values.size)
        self._rows = max(self._rows, row + 1)
        self._rewards[row, : values.size] = values
        self._n[row] = values.size
        if values.size and (values.min() < self._lo or values.max() > self._hi):
            self._widen(float(values.min()), float(values.max()))
        else:
            self._rebuild_row(row)

    def bin_counts(self, rewards: np.ndarray) -> np.ndarray:
        """Histogram of ``rewards`` on the current bins (values outside the range are clipped)."""
        return np.bincount(self._bin_of(rewards), minlength=self.config.bins).astype(float)

    def donor_weights(self, counts: np.ndarray, exclude: int | None) -> np.ndarray | None:
        """Posterior weights over the donor rows given a prompt's bin counts; None without donors."""
        rows = self._rows
        usable = self._n[:rows] > 0
        if exclude is not None and exclude < rows:
            usable[exclude] = False
        if not usable.any():
            return None
        loglik = np.where(usable, np.log(self._densities()) @ counts * self.config.tempering, -np.inf)
        weights = np.exp(loglik - loglik.max())
        return weights / weights.sum()

    def draw(self, weights: np.ndarray, u_donor: np.ndarray, u_value: np.ndarray) -> np.ndarray:
        """Rewards drawn from the donor mixture ``weights``, given uniforms of one shape.

        A donor's draw is one of its own rewards with probability n / (n + donor_strength), else a
        reward of the whole pool (the donor's own shrinkage: a donor seen four times is not trusted
        to have shown every value it can produce).
        """
        cumulative = np.cumsum(weights)
        donor = np.minimum(np.searchsorted(cumulative, u_donor * cumulative[-1], side="right"), weights.size - 1)
        n = self._n[donor]
        v = u_value * (n + self.config.donor_strength)
        own = v < n
        own_pick = np.minimum(v.astype(np.int64), np.maximum(n - 1, 0))
        pool_row, pool_col = self._pool_index(np.clip((v - n) / self.config.donor_strength, 0.0, 1.0))
        return np.where(own, self._rewards[donor, own_pick], self._rewards[pool_row, pool_col])

    # ---- internals --------------------------------------------------------------------------------

    def _bin_of(self, rewards: np.ndarray) -> np.ndarray:
        bins = self.config.bins
        width = max(self._hi - self._lo, 1e-12)
        idx = np.floor((np.asarray(rewards, dtype=float) - self._lo) / width * bins).astype(np.int64)
        return np.clip(idx, 0, bins - 1)

    def _widen(self, lo: float, hi: float) -> None:
        """Grow the binned range to cover [lo, hi] (plus a margin on a side that grew) and rebin."""
        margin = self.config.range_margin * (max(hi, self._hi) - min(lo, self._lo))
        if lo < self._lo:
            self._lo = lo - (margin if math.isfinite(self._lo) else 0.0)
        if hi > self._hi:
            self._hi = hi + (margin if math.isfinite(self._hi) else 0.0)
        for row in range(self._rows):
            self._rebuild_row(row)

    def _rebuild_row(self, row: int) -> None:
        n = int(self._n[row])
        self._pool_smoothed -= self._smoothed[row]
        self._smoothed[row] = self._smoother @ self.bin_counts(self._rewards[row, :n]) if n else 0.0
        self._pool_smoothed += self._smoothed[row]
        self._pool_cum = None

    def _densities(self) -> np.ndarray:
        """(rows, bins) predictive bin probabilities of every donor, shrunk to the pool, floored."""
        cfg, rows = self.config, self._rows
        total = max(float(self._n[:rows].sum()), 1.0)
        beta = cfg.donor_strength
        mixed = (self._smoothed[:rows] + beta * self._pool_smoothed / total) / (self._n[:rows, None] + beta)
        return ((1.0 - cfg.floor) * mixed + cfg.floor / cfg.bins) * cfg.bins

    def _pool_index(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row, column) of the pooled reward at quantile position ``u`` in [0, 1) of all rewards."""
        if self._pool_cum is None:
            self._pool_cum = np.cumsum(self._n[: self._rows])
        cum = self._pool_cum
        flat = np.minimum((u * cum[-1]).astype(np.int64), cum[-1] - 1)
        row = np.searchsorted(cum, flat, side="right")
        start = cum[row] - self._n[row]
        return row, flat - start

    def _reserve(self, rows: int, width: int) -> None:
        """Grow the row and column capacity (doubling) so ``rows`` x ``width`` fits."""
        cap_rows, cap_width = self._rewards.shape
        new_rows = cap_rows if rows <= cap_rows else max(rows, 2 * cap_rows)
        new_width = cap_width if width <= cap_width else max(width, 2 * cap_width)
        if (new_rows, new_width) == (cap_rows, cap_width):
            return
        self._rewards = _padded(self._rewards, (new_rows, new_width))
        self._n = _padded(self._n, (new_rows,))
        self._smoothed = _padded(self._smoothed, (new_rows, self.config.bins))


def _gaussian_smoother(bins: int, bandwidth: float) -> np.ndarray:
    """Column-stochastic (bins, bins) matrix: column b spreads one count in bin b over its neighbours."""
    centres = np.arange(bins)
    kernel = np.exp(-0.5 * ((centres[:, None] - centres[None, :]) / max(bandwidth, 1e-6)) ** 2)
    return kernel / kernel.sum(axis=0, keepdims=True)
