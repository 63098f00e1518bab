"""Prompt screening: draw the batch away from prompts whose next group will likely be all equal.

An all-equal group has zero advantage and buys nothing (GRESO, arXiv 2506.02177; DAPO's dynamic
sampling). A prompt's rewards so far (trained groups, seeds spot GPUs explored with stale weights),
weighted `decay ** age`, are the data of a Dirichlet-process posterior (concentration `alpha`,
continuous base measure) whose predictive gives the probability that the next k are all equal:

    P = [sum_v c_v^(k) + alpha (k-1)!] / (C + alpha)^(k),   x^(k) = x (x+1) ... (x+k-1)

(c_v the weight of each value seen, C their sum; an unseen prompt gets 1/k for alpha 1). The draw
keeps B of C candidates, candidate p with pi_p proportional to max(1 - P_p, floor), capped at 1, by
systematic sampling: no prompt starves, a skipped one is only deferred. `weights` B / (C pi_p) are
Horvitz-Thompson weights: the batch's weighted mean of any per-prompt quantity is unbiased for the
candidates' mean, what a uniform draw estimates (`exploration.unbiased`). Pure numpy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

import numpy as np

from roll_spotlight.exploration.select import inclusion_probabilities, systematic_sample


def all_equal_predictive(counts: Mapping[float, float], k: int, alpha: float = 1.0) -> float:
    """Probability that the next k rewards are all equal, given weighted counts of those seen."""
    assert k >= 1 and alpha > 0, (k, alpha)
    if k == 1:
        return 1.0
    total = sum(counts.values()) + alpha
    log_denominator = math.lgamma(total + k) - math.lgamma(total)
    seen = sum(math.exp(math.lgamma(c + k) - math.lgamma(c) - log_denominator) for c in counts.values() if c > 0)
    return min(1.0, seen + alpha * math.exp(math.lgamma(k) - log_denominator))


class PromptHistory:
    """Each prompt's rewards, weighted `decay ** age`; `all_equal` is the predictive above."""

    def __init__(self, decay: float, alpha: float = 1.0, prune: float = 1e-3):
        self.decay, self.alpha, self.prune = decay, alpha, prune
        self.counts: dict[Hashable, dict[float, float]] = {}

    def observe(self, prompt: Hashable, rewards: Sequence[float]) -> None:
        counts = self.counts.setdefault(prompt, {})
        for r in rewards:
            counts[float(r)] = counts.get(float(r), 0.0) + 1.0

    def advance(self) -> None:
        """One iteration older: every weight times `decay`, negligible ones dropped."""
        aged = {p: {v: c * self.decay for v, c in counts.items()} for p, counts in self.counts.items()}
        self.counts = {p: kept for p, c in aged.items() if (kept := {v: w for v, w in c.items() if w >= self.prune})}

    def all_equal(self, prompt: Hashable, k: int) -> float:
        return all_equal_predictive(self.counts.get(prompt, {}), k, self.alpha)

    def state_dict(self) -> dict:
        return {"prompts": [[p, list(c.items())] for p, c in self.counts.items()]}

    def load_state_dict(self, state: dict) -> None:
        self.counts = {p: {float(v): float(c) for v, c in items} for p, items in state["prompts"]}


@dataclass(frozen=True)
class ScreenedDraw:
    """Which candidates a screened draw kept, and what it predicted."""

    chosen: np.ndarray           # candidate indices, ascending
    inclusion: np.ndarray        # pi of the chosen candidates
    weights: np.ndarray          # Horvitz-Thompson weights B / (C pi) of the chosen candidates
    predicted: np.ndarray        # all-equal probability of every candidate
    baseline_share: float        # mean predicted all-equal share of the unscreened draw
    skipped: float               # share of the unscreened draw's prompts not kept

    def metrics(self) -> dict:
        return {"screen/predicted_unscreened": self.baseline_share,
                "screen/predicted_batch": float(self.predicted[self.chosen].mean()),
                "screen/skipped": self.skipped, "screen/max_weight": float(self.weights.max())}


def screen_draw(predicted: Sequence[float], batch: int, floor: float, rng: np.random.Generator) -> ScreenedDraw:
    """Keep `batch` of the candidates given their all-equal probabilities; the first `batch`
    candidates are the unscreened draw (what a run without the screen trains on)."""
    p = np.asarray(predicted, dtype=np.float64)
    pi_all = inclusion_probabilities(np.maximum(1.0 - p, floor), batch)
    chosen = systematic_sample(pi_all, rng)
    pi = pi_all[chosen]
    return ScreenedDraw(chosen, pi, batch / (len(p) * pi), p, float(p[:batch].mean()),
                        float(1.0 - np.isin(np.arange(batch), chosen).mean()))
