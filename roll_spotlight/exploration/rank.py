"""Does the stale-weight seed ranking survive one update? A rank-correlation monitor.

Spotlight explores seeds with the weights of iteration t and trains iteration t+1 on the seeds that
looked high-contrast. That only works while the reward ranking of seeds under the stale weights
agrees with the ranking under the fresh ones. Each iteration gives the comparison for free: the
rollout of t+1 regenerates the chosen seeds with fresh weights, and their stale rewards are known.

``RankMonitor.update(stale, fresh, groups)`` computes Spearman's rho (average ranks for ties) and
Kendall's tau-b over the (stale, fresh) pairs. Pass ``groups`` (the prompt of each pair) to measure
the correlation *within* prompts, which is what the selector relies on; without it, differences
between prompts inflate the correlation. Grouped statistics: rho is the pair-weighted mean of the
per-group rhos; tau-b is stratified (concordance and tie counts summed over groups, pairs across
groups ignored). Groups with fewer than two pairs or constant rewards contribute nothing.

Fallback: when the monitored statistic drops below ``threshold`` the monitor switches the fallback
on (``"fresh"``: explore with fresh weights on the critical path, or ``"random"``: train on random
seeds) and logs a warning that says so; when it is back at or above the threshold it switches the
fallback off. Fewer than ``min_pairs`` usable pairs, or an undefined statistic, leave the state as
it was. ``history`` keeps one dict per update for plotting.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from roll_spotlight.checks import require_choice, require_int, require_number

logger = logging.getLogger(__name__)

FALLBACKS = ("fresh", "random")
STATISTICS = ("spearman", "kendall")


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing the mean of the ranks they span."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    new_run = np.r_[True, ordered[1:] != ordered[:-1]]
    starts = np.flatnonzero(new_run)
    ends = np.r_[starts[1:], values.shape[0]]
    mean_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(values.shape[0])
    ranks[order] = mean_rank[np.cumsum(new_run) - 1]
    return ranks


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation of the average ranks; NaN when either side is constant or n < 2."""
    a, b = _pair_arrays(x, y)
    if a.shape[0] < 2:
        return math.nan
    ra, rb = average_ranks(a) - (a.shape[0] + 1) / 2.0, average_ranks(b) - (a.shape[0] + 1) / 2.0
    denom = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return float(ra @ rb) / denom if denom > 0 else math.nan


def _kendall_counts(a: np.ndarray, b: np.ndarray, chunk: int = 512) -> tuple[float, float, float]:
    """(concordant - discordant, pairs untied in a, pairs untied in b) over i < j; O(n^2) in chunks."""
    num = tx = ty = 0.0
    for lo in range(0, a.shape[0], chunk):
        sa = np.sign(a[lo:lo + chunk, None] - a[None, :])
        sb = np.sign(b[lo:lo + chunk, None] - b[None, :])
        num += float((sa * sb).sum())
        tx += float(np.abs(sa).sum())
        ty += float(np.abs(sb).sum())
    return num / 2, tx / 2, ty / 2


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b (tie-corrected); NaN when either side is constant or n < 2."""
    a, b = _pair_arrays(x, y)
    num, tx, ty = _kendall_counts(a, b)
    return num / math.sqrt(tx * ty) if tx > 0 and ty > 0 else math.nan


def _pair_arrays(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"stale and fresh rewards must be 1-D of equal length, got {a.shape} and {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("stale and fresh rewards must be finite")
    return a, b


def grouped_correlations(a: np.ndarray, b: np.ndarray, groups: Sequence[Hashable]) -> tuple[float, float, int]:
    """(pair-weighted mean within-group rho, stratified tau-b, pairs in informative groups)."""
    if len(groups) != a.shape[0]:
        raise ValueError(f"groups must label every pair: {len(groups)} labels for {a.shape[0]} pairs")
    index: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        index.setdefault(g, []).append(i)
    rho_sum = weight = num = tx = ty = 0.0
    for members in index.values():
        ga, gb = a[members], b[members]
        rho = spearman_rho(ga, gb)
        if math.isnan(rho):
            continue
        rho_sum, weight = rho_sum + rho * len(members), weight + len(members)
        n_, x_, y_ = _kendall_counts(ga, gb)
        num, tx, ty = num + n_, tx + x_, ty + y_
    rho = rho_sum / weight if weight else math.nan
    tau = num / math.sqrt(tx * ty) if tx > 0 and ty > 0 else math.nan
    return rho, tau, int(weight)


@dataclass(frozen=True)
class RankReport:
    spearman: float
    kendall: float
    n: int
    fallback_active: bool
    message: str


@dataclass(frozen=True)
class RankMonitorConfig:
    threshold: float = 0.5
    fallback: str = "fresh"
    min_pairs: int = 8
    statistic: str = "spearman"

    def __post_init__(self) -> None:
        require_number("RankMonitorConfig.threshold", self.threshold, "[-1, 1]")
        require_choice("RankMonitorConfig.fallback", self.fallback, FALLBACKS)
        require_int("RankMonitorConfig.min_pairs", self.min_pairs, ">= 2")
        require_choice("RankMonitorConfig.statistic", self.statistic, STATISTICS)


class RankMonitor:
    """Tracks stale-vs-fresh rank correlation per iteration and decides whether to fall back."""

    def __init__(self, threshold: float = 0.5, fallback: str = "fresh", min_pairs: int = 8,
                 statistic: str = "spearman") -> None:
        self.config = RankMonitorConfig(threshold, fallback, min_pairs, statistic)
        self.fallback_active = False
        self.history: list[dict] = []

    @classmethod
    def from_config(cls, config: RankMonitorConfig) -> "RankMonitor":
        return cls(config.threshold, config.fallback, config.min_pairs, config.statistic)

    def update(self, stale_rewards: Sequence[float], fresh_rewards: Sequence[float],
               groups: Sequence[Hashable] | None = None) -> RankReport:
        a, b = _pair_arrays(stale_rewards, fresh_rewards)
        if groups is None:
            rho, tau, n = spearman_rho(a, b), kendall_tau_b(a, b), a.shape[0]
        else:
            rho, tau, n = grouped_correlations(a, b, groups)
        message = self._decide(rho if self.config.statistic == "spearman" else tau, n)
        report = RankReport(rho, tau, n, self.fallback_active, message)
        self.history.append({"iteration": len(self.history), "spearman": rho, "kendall": tau, "n": n,
                             "fallback_active": self.fallback_active})
        return report

    def _decide(self, value: float, n: int) -> str:
        cfg = self.config
        name = cfg.statistic
        if n < cfg.min_pairs or math.isnan(value):
            return f"{n} usable pairs (need {cfg.min_pairs}) or {name} undefined; fallback unchanged"
        if value < cfg.threshold:
            message = f"stale-vs-fresh {name}={value:.3f} < threshold {cfg.threshold:.3f}"
            if not self.fallback_active:
                self.fallback_active = True
                logger.warning("%s: switching the %r fallback on", message, cfg.fallback)
                return f"{message}: switching the {cfg.fallback!r} fallback on"
            return f"{message}: {cfg.fallback!r} fallback stays on"
        if self.fallback_active:
            self.fallback_active = False
            logger.info("stale-vs-fresh %s=%.3f >= threshold %.3f: fallback off", name, value, cfg.threshold)
            return f"{name}={value:.3f} >= threshold {cfg.threshold:.3f}: fallback off"
        return f"{name}={value:.3f} >= threshold {cfg.threshold:.3f}"
