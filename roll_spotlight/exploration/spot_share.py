"""Where spot GPU-seconds go while an update trains: its micro-batches, or the next prompts' seeds
(`spot.training_phase: auto`).

During the training phase a spot worker either computes micro-batches of the update (queue
training: the phase ends sooner, for certain) or explores the next iteration's seeds (it pays only
where exploration pays). Each iteration this policy picks the share of spot workers that explore
first (the others train first; either kind falls through to the other when its own work runs out),
from the two values the run measures, both in seconds of an iteration per spot worker:

- training: the seconds the training spot workers saved, measured directly (their micro-batches
  at the on-demand participants' measured rate), divided by how many of them trained;
- exploration: what the adaptive controller's last measured round says selection recovered, as
  the rollout-and-train seconds an equivalent vanilla iteration would need for as many groups that
  carry signal: removed / (1 - equal_random) x (rollout_s + train_s), divided by the explorers.
  `removed` is the share of groups the selection rescued from being all equal (they would be
  dropped: no signal) and `equal_random` the share a random choice from the same pools leaves all
  equal. It is an upper bound (it assumes progress grows with signal-carrying samples; the tiny
  task's study found no fewer iterations, docs/learning.md), and it is 0 while the controller
  finds the stale ranking does not hold or has stopped exploring.

The larger value per worker wins the whole pool (share 1 or 0). The losing side is measured again
every `probe_every` iterations by giving it half the workers for one iteration; before both have
been measured, the split is half and half. Pure and deterministic; every decision has a reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Value:
    """One side's measured value: seconds of an iteration per spot worker, and when."""

    per_worker_s: float
    iteration: int


class SpotPlacement:
    """`explore_share(iteration)` before an update trains; `observe_training` after it, and
    `observe_exploration` once the round explored during it has been regenerated and measured."""

    def __init__(self, probe_every: int = 5) -> None:
        if probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {probe_every}")
        self.probe_every = probe_every
        self.train: Value | None = None
        self.explore: Value | None = None
        self.share = 0.5
        self.reason = "measuring both: half the spot workers explore first, half train first"
        self.shares: dict[int, float] = {}

    def explore_share(self, iteration: int) -> float:
        """The share of spot workers that explore first while `iteration`'s update trains."""
        share, reason = self._decide(iteration)
        self.share, self.reason = share, reason
        self.shares[iteration] = share
        return share

    def _decide(self, iteration: int) -> tuple[float, str]:
        if self.train is None or self.explore is None:
            missing = " and ".join(n for n, v in (("training", self.train), ("exploration", self.explore)) if v is None)
            return 0.5, f"measuring {missing}: half the spot workers explore first"
        train, explore = self.train.per_worker_s, self.explore.per_worker_s
        facts = f"training saves {train:.3g} s per spot worker, exploration is worth at most {explore:.3g} s"
        winner, loser = (("exploration", self.train) if explore > train else ("training", self.explore))
        if iteration - loser.iteration >= self.probe_every:
            return 0.5, f"{facts}; probing the other side: half the spot workers explore first"
        return (1.0, f"{facts}: every spot worker explores first") if winner == "exploration" else \
            (0.0, f"{facts}: every spot worker trains first")

    def observe_training(self, iteration: int, saved_s: float, workers: int) -> None:
        """Iteration `iteration`'s update: `workers` spot workers trained and saved `saved_s`."""
        if workers > 0:
            self.train = Value(saved_s / workers, iteration)

    def observe_exploration(self, iteration: int, removed: float, equal_random: float, iteration_s: float,
                            workers: int, buys: bool) -> None:
        """The round explored while `iteration`'s update trained, now measured: `workers` spot
        workers explored first; `buys` is the adaptive controller's verdict (False: worth 0)."""
        if workers <= 0 or math.isnan(removed):
            return
        recovered = max(removed, 0.0) / max(1.0 - equal_random, 1e-9) if buys else 0.0
        self.explore = Value(recovered * iteration_s / workers, iteration)

    def metrics(self) -> dict:
        out = {"spot/explore_share": self.share, "spot/placement": self.reason}
        if self.train is not None:
            out["spot/train_value_s"] = self.train.per_worker_s
        if self.explore is not None:
            out["spot/explore_value_s"] = self.explore.per_worker_s
        return out

    def state_dict(self) -> dict:
        return {"train": None if self.train is None else [self.train.per_worker_s, self.train.iteration],
                "explore": None if self.explore is None else [self.explore.per_worker_s, self.explore.iteration],
                "share": self.share, "reason": self.reason, "shares": {str(k): v for k, v in self.shares.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.train = None if state["train"] is None else Value(float(state["train"][0]), int(state["train"][1]))
        self.explore = None if state["explore"] is None else Value(float(state["explore"][0]), int(state["explore"][1]))
        self.share, self.reason = float(state["share"]), str(state["reason"])
        self.shares = {int(k): float(v) for k, v in state["shares"].items()}
