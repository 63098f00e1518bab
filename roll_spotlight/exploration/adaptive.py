"""Is exploration buying anything? Per-round contrast measures and the adaptive budget controller.

Each explored round gives, per prompt, a pool of stale rewards and the selected subset of it. Two
things selection can buy are measured against what a *random* subset of the same pool would have
given (exactly, in expectation, so no extra randomness enters a run):

- contrast gain: sqrt(mean selected variance / mean expected random-subset variance), the ratio of
  the selected groups' reward std to random groups' (1.0: selection bought nothing). A random
  k-subset of n values drawn without replacement has expected population variance
  sigma^2 * n/(n-1) * (k-1)/k, sigma^2 being the pool's population variance;
- all-equal groups removed: the mean probability that a random k-subset is all equal (sum over the
  pool's distinct values of C(count, k) / C(n, k)) minus the share of selected groups all equal.

The third measure, whether the stale ranking survives the update (Spearman of stale against fresh
rewards of the same seeds), comes from ``rank.RankMonitor``.

``AdaptiveBudget`` turns these into a budget scale: it decides over the last ``window`` measured
rounds; exploration "buys" when (gain >= min_gain or removed >= min_equal_removed) and the
Spearman, where defined, is >= min_spearman. Buying restores the full budget; not buying halves
it, and a budget that no longer exceeds the group size (nothing left to select) stops exploration
(scale 0: spot workers serve rollouts only). Measurements are cleared whenever the scale changes
(they describe a pool size no longer in force). Once stopped, every ``probe_every``-th iteration
explores at the full budget so the decision can be revisited (0: never). Every decision has a
``reason`` string for the metrics. Pure numpy; deterministic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from roll_spotlight.checks import require_int


def random_subset_variance(values: Sequence[float], k: int) -> float:
    """Expected population variance of k of `values` drawn uniformly without replacement."""
    x = np.asarray(values, dtype=np.float64)
    n = x.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k}")
    if n < 2 or k < 2:
        return 0.0
    return float(x.var() * n / (n - 1) * (k - 1) / k)


def all_equal_probability(values: Sequence[float], k: int) -> float:
    """Probability that k of `values` drawn uniformly without replacement are all equal."""
    x = np.asarray(values, dtype=np.float64)
    n = x.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k}")
    _, counts = np.unique(x, return_counts=True)
    return float(sum(math.comb(int(c), k) for c in counts if c >= k) / math.comb(n, k))


@dataclass(frozen=True)
class RoundContrast:
    """What one round's selection bought over random subsets of the same pools (module docstring)."""

    prompts: int               # prompts explored at all
    selected_var: float        # mean over those prompts of the selected subset's population variance
    random_var: float          # mean of the expected variance of a random k-subset of the pool
    equal_random: float        # mean probability that a random k-subset is all equal
    equal_selected: float      # share of selected subsets that are all equal

    @property
    def gain(self) -> float:
        """Selected std over random std; 1.0 when neither has any spread, NaN with no prompt."""
        if self.prompts == 0:
            return math.nan
        if self.random_var <= 0:
            return 1.0
        return math.sqrt(self.selected_var / self.random_var)

    @property
    def equal_removed(self) -> float:
        return self.equal_random - self.equal_selected if self.prompts else math.nan


def round_contrast(pools: Mapping[object, Sequence[float]], selected: Mapping[object, Sequence[float]],
                   k: int) -> RoundContrast:
    """`pools`: each prompt's explored (stale) rewards; `selected`: the rewards of its chosen seeds.

    A prompt with fewer than k explored seeds (abandoned, or starved by the planner) had nothing to
    choose from: its group is its explored seeds plus fresh ones, a random group. It counts as
    buying nothing: the same estimate (the pool's variance, unbiased for a k-subset) on both sides,
    and its pool's all-equal indicator on both sides. Prompts explored not at all are skipped.
    """
    rows = []
    for key, pool in pools.items():
        pool = np.asarray(pool, dtype=np.float64)
        n = pool.shape[0]
        if n == 0:
            continue
        if n < k:
            var = float(pool.var() * n / (n - 1) * (k - 1) / k) if n >= 2 else 0.0
            equal = float(pool.max() == pool.min())
            rows.append((var, var, equal, equal))
            continue
        chosen = np.asarray(selected.get(key, ()), dtype=np.float64)
        if chosen.shape[0] != k:
            raise ValueError(f"prompt {key!r}: {n} explored seeds but {chosen.shape[0]} selected rewards (k={k})")
        rows.append((float(chosen.var()), random_subset_variance(pool, k), all_equal_probability(pool, k),
                     float(chosen.max() == chosen.min())))
    if not rows:
        return RoundContrast(0, math.nan, math.nan, math.nan, math.nan)
    sel, rnd, eq_r, eq_s = (float(np.mean(c)) for c in zip(*rows))
    return RoundContrast(len(rows), sel, rnd, eq_r, eq_s)


@dataclass(frozen=True)
class AdaptiveConfig:
    seeds_per_prompt: int
    group_size: int
    min_gain: float = 1.05
    min_equal_removed: float = 0.05
    min_spearman: float = 0.3
    window: int = 3
    probe_every: int = 5

    def __post_init__(self) -> None:  # the exploration section checked its adaptive_* keys
        require_int("AdaptiveConfig.group_size", self.group_size)
        require_int("AdaptiveConfig.seeds_per_prompt", self.seeds_per_prompt, f">= {self.group_size}",
                    why="(group_size)")
        require_int("AdaptiveConfig.window", self.window)
        require_int("AdaptiveConfig.probe_every", self.probe_every, ">= 0")

    @classmethod
    def from_exploration(cls, cfg, group_size: int) -> "AdaptiveConfig":
        """From `config.run.ExplorationConfig` (its `adaptive_*` keys)."""
        return cls(cfg.seeds_per_prompt, group_size, cfg.adaptive_min_gain, cfg.adaptive_min_equal_removed,
                   cfg.adaptive_min_spearman, cfg.adaptive_window, cfg.adaptive_probe_every)


class AdaptiveBudget:
    """The exploration budget scale, lowered or stopped while exploration buys nothing (module doc)."""

    def __init__(self, config: AdaptiveConfig):
        self.config = config
        self.scale = 1.0
        self.reason = f"warming up: deciding after {config.window} measured rounds"
        self.buys = True  # the last decision's verdict (no decision yet: the rounds speak for themselves)
        self.records: list[tuple[float, float, float]] = []  # (gain, removed, spearman) since the last change
        self.history: list[dict] = []

    def seeds_per_prompt(self, iteration: int) -> int:
        """Explored seeds per prompt for the round of `iteration`'s prompts (0: do not explore)."""
        if self.scale > 0:
            return self._budget(self.scale)
        every = self.config.probe_every
        return self.config.seeds_per_prompt if every > 0 and iteration % every == 0 else 0

    def _budget(self, scale: float) -> int:
        return max(self.config.group_size, int(round(scale * self.config.seeds_per_prompt)))

    def observe(self, contrast: RoundContrast, spearman: float = math.nan) -> dict:
        """Record one measured round; decide when the window is full. Returns the metrics to log."""
        if contrast.prompts > 0:
            self.records.append((contrast.gain, contrast.equal_removed, spearman))
        if len(self.records) >= self.config.window:
            self._decide(self.records[-self.config.window:])
        out = {"explore/budget_scale": self.scale, "explore/reason": self.reason,
               "explore/contrast_gain": contrast.gain, "explore/equal_removed": contrast.equal_removed}
        self.history.append({k.split("/")[1]: v for k, v in out.items()} | {"spearman": spearman})
        return out

    def _decide(self, window: list[tuple[float, float, float]]) -> None:
        cfg = self.config
        gain = float(np.mean([r[0] for r in window]))
        removed = float(np.mean([r[1] for r in window]))
        ranks = [r[2] for r in window if not math.isnan(r[2])]
        rho = float(np.mean(ranks)) if ranks else math.nan
        contrast = gain >= cfg.min_gain or removed >= cfg.min_equal_removed
        ranked = math.isnan(rho) or rho >= cfg.min_spearman
        facts = (f"gain {gain:.3f} {'>=' if gain >= cfg.min_gain else '<'} {cfg.min_gain}, "
                 f"all-equal removed {removed:.3f} {'>=' if removed >= cfg.min_equal_removed else '<'} "
                 f"{cfg.min_equal_removed}, spearman "
                 + ("undefined" if math.isnan(rho) else f"{rho:.3f} {'>=' if ranked else '<'} {cfg.min_spearman}")
                 + f" over {len(window)} rounds")
        self.buys = contrast and ranked
        if self.buys:
            new, verdict = 1.0, "buys contrast: full budget"
        else:
            new = self.scale / 2 if self.scale > 0 else 0.0
            if new > 0 and self._budget(new) <= cfg.group_size:
                new = 0.0
            verdict = ("buys nothing: " if not contrast else "stale ranking does not hold: ") + (
                "exploration stopped (spot workers serve rollouts only)" if new == 0 else f"budget halved to {new:g}")
        self.reason = f"{verdict} ({facts})"
        if new != self.scale:
            self.records.clear()
        self.scale = new

    def state_dict(self) -> dict:
        return {"scale": self.scale, "reason": self.reason, "buys": self.buys, "records": [list(r) for r in self.records],
                "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.reason = str(state["reason"])
        self.buys = bool(state.get("buys", True))
        self.records = [tuple(float(x) for x in r) for r in state["records"]]
        self.history = list(state.get("history", []))


TARGETS = ("seeds", "prompts", "off")


class TargetSwitch:
    """What exploration chooses, from what the run measures (`exploration.adaptive`). Pure.

    Per iteration: `share`, the all-equal share of the unscreened draw; `value`, what a screened
    batch removed of it; `graded`, whether a reward other than 0 and 1 was seen. Over the last
    `window` iterations since the last change: share above `screen_above` -> "prompts" while the
    screen removes at least `min_value` (unmeasured counts), else "off" and a probe every
    `probe_every`; share below -> "seeds" for graded rewards, "off" for pass/fail ones, where
    seed selection trained worse (docs/learning.md). Every decision has a reason for the metrics.
    """

    def __init__(self, target: str, screen_above: float, min_value: float, window: int, probe_every: int):
        assert target in TARGETS, target
        self.target, self.screen_above, self.min_value = target, screen_above, min_value
        self.window, self.probe_every = window, probe_every
        self.records: list[tuple[float, float, bool]] = []  # (share, value, graded) since the last change
        self.reason = f"configured: {target}"

    def observe(self, share: float, value: float = math.nan, graded: bool = True) -> dict:
        """Record one iteration; decide when the window is full. Returns the metrics to log."""
        if not math.isnan(share):
            self.records.append((share, value, graded))
        if self.reason.endswith("no exploration") and self.probe_every and len(self.records) >= self.probe_every:
            self._change("prompts", f"probing the screen after {len(self.records)} iterations off")
        elif len(self.records) >= self.window:
            self._decide(self.records[-self.window:])
        return {"explore/target": self.target, "explore/switch": self.reason}

    def _decide(self, window: list[tuple[float, float, bool]]) -> None:
        share = float(np.mean([r[0] for r in window]))
        values = [r[1] for r in window if not math.isnan(r[1])]
        value = float(np.mean(values)) if values else math.nan
        facts = f"all-equal share {share:.3f} over {len(window)} iterations"
        if share <= self.screen_above:
            graded = all(r[2] for r in window)
            self._change("seeds" if graded else "off", f"{facts} <= {self.screen_above}: " + (
                "seed selection" if graded else "pass/fail rewards, no seed selection"))
        elif math.isnan(value) or value >= self.min_value:
            if not self.reason.endswith("no exploration"):
                self._change("prompts", f"{facts} > {self.screen_above}" + (
                    "" if math.isnan(value) else f", the screen removes {value:.3f}") + ": prompt screening")
        else:
            self._change("off", f"{facts}, but the screen removes {value:.3f} < {self.min_value}: no exploration")

    def _change(self, target: str, reason: str) -> None:
        if target != self.target:
            self.records.clear()
        self.target, self.reason = target, reason

    def state_dict(self) -> dict:
        return {"target": self.target, "reason": self.reason, "records": [list(r) for r in self.records]}

    def load_state_dict(self, state: dict) -> None:
        self.target, self.reason = state["target"], state["reason"]
        self.records = [(float(s), float(v), bool(g)) for s, v, g in state["records"]]
