"""Exploration budget and exploration cost: how much spot-GPU time the planner may still spend.

Exploration for iteration t+1 runs on spot workers while iteration t trains, so its budget is the
worker time left before training ends:

    budget_s = predicted_train_s * workers

and it is re-estimated online: workers arrive or are preempted, the training step runs long or
short. ``ExplorationBudget.remaining_s`` is the smaller of two bounds, minus the predicted cost of the
work already in flight:

- clock bound:  max(0, predicted_train_s - elapsed) * workers   (time the workers still have);
- ledger bound: granted + max(0, predicted_train_s - elapsed) * workers - spent, where ``granted`` is
  the worker-seconds the workers have had so far (the integral of workers over elapsed time) and
  ``spent`` the measured exploration seconds. Spent time can never exceed granted time, so with a
  moving clock the clock bound is the binding one; the ledger bound keeps the total cost of pulls
  within ``predicted_train_s * workers`` when the caller's clock does not advance (tests, replays).

Invariant: ``remaining_s`` never goes up because of work being issued; it only rises when the caller
raises ``predicted_train_s`` or ``workers``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from roll_spotlight.checks import require, require_number


@dataclass
class SeedCostModel:
    """Predicted exploration seconds per seed, learnt online by an exponentially weighted average.

    One estimate for all prompts: a DiT rollout takes the same number of denoising steps for every
    prompt, so per-prompt costs would only add noise. ``observe`` takes the wall time of one seed
    (for a batched pull, the batch time divided by its seeds).
    """

    per_seed_s: float
    ewma: float = 0.2
    observed: int = 0

    def __post_init__(self) -> None:
        require_number("SeedCostModel.per_seed_s", self.per_seed_s)
        require_number("SeedCostModel.ewma", self.ewma, "(0, 1]")

    def predict(self, n_seeds: int) -> float:
        return n_seeds * self.per_seed_s

    def observe(self, duration_s: float) -> None:
        require_number("duration_s", duration_s, ">= 0")
        self.per_seed_s += self.ewma * (duration_s - self.per_seed_s)
        self.per_seed_s = max(self.per_seed_s, 1e-9)
        self.observed += 1


@dataclass
class ExplorationBudget:
    """Worker-seconds left for exploration before the current training step ends (see module doc)."""

    predicted_train_s: float
    workers: int
    start_s: float = 0.0
    granted_s: float = field(default=0.0, init=False)
    _clock_s: float = field(default=float("-inf"), init=False, repr=False)

    def __post_init__(self) -> None:
        require_number("predicted_train_s", self.predicted_train_s, ">= 0")
        _check_workers(self.workers)
        self._clock_s = self.start_s

    @property
    def now_s(self) -> float:
        return self._clock_s

    def elapsed_s(self) -> float:
        return self._clock_s - self.start_s

    def advance(self, now_s: float) -> None:
        """Move the clock to ``now_s`` (never backwards) and accrue the workers' time up to it."""
        end_s = self.start_s + self.predicted_train_s
        lo, hi = max(self._clock_s, self.start_s), min(now_s, end_s)
        if hi > lo:
            self.granted_s += self.workers * (hi - lo)
        self._clock_s = max(self._clock_s, now_s)

    def update(self, predicted_train_s: float | None = None, workers: int | None = None,
               elapsed_s: float | None = None, now_s: float | None = None) -> None:
        """Re-estimate; ``elapsed_s`` re-anchors the step start at ``now_s`` (default: latest clock)."""
        if now_s is not None:
            self.advance(now_s)
        if elapsed_s is not None:
            require_number("elapsed_s", elapsed_s, ">= 0")
            self.start_s = self._clock_s - elapsed_s
        if predicted_train_s is not None:
            require_number("predicted_train_s", predicted_train_s, ">= 0")
            self.predicted_train_s = float(predicted_train_s)
        if workers is not None:
            _check_workers(workers)
            self.workers = int(workers)

    def total_s(self) -> float:
        """Current estimate of the whole step's budget: granted so far plus what is still ahead."""
        return self.granted_s + self._ahead_s()

    def remaining_s(self, spent_s: float, in_flight_s: float) -> float:
        """Worker-seconds still free for new pulls at the current clock."""
        ahead = self._ahead_s()
        return min(ahead, self.granted_s + ahead - spent_s) - in_flight_s

    def _ahead_s(self) -> float:
        return max(0.0, self.predicted_train_s - self.elapsed_s()) * self.workers


def _check_workers(workers: int) -> None:
    require(not isinstance(workers, bool) and int(workers) == workers and workers >= 0, "workers", workers,
            "must be a whole number >= 0")
