"""Synthetic per-prompt reward distributions for the planner benchmark and the bandit's tests.

(The simulator's synthetic reward of (prompt, seed, weight version), which emulated runs score
with too, is the package's `roll_spotlight.sim.synthetic_rewards`.)

The mix mimics what a reward model does to a batch of prompts: some prompts are saturated (every
seed scores 0, or every seed scores 1: no GRPO signal at all), binary rewards with any success rate
(GenEval-style pass/fail), continuous scores (OCR similarity-style, Beta-distributed), and bimodal
prompts where most seeds land in one mode and a few in another (the case where exploring many
seeds pays most). Rewards lie in [0, 1]. ``reward_of`` makes a seed's reward a pure function of
(bench seed, prompt, seed), as a real rollout is a pure function of its seed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class ConstantReward:
    value: float

    @property
    def variance(self) -> float:
        return 0.0

    def sample(self, rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray:
        return np.full(size, self.value, dtype=float)


@dataclass(frozen=True)
class Bernoulli:
    p: float

    @property
    def variance(self) -> float:
        return self.p * (1 - self.p)

    def sample(self, rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray:
        return (rng.random(size) < self.p).astype(float)


@dataclass(frozen=True)
class BetaReward:
    a: float
    b: float

    @property
    def mean(self) -> float:
        return self.a / (self.a + self.b)

    @property
    def variance(self) -> float:
        s = self.a + self.b
        return self.a * self.b / (s * s * (s + 1))

    def sample(self, rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray:
        return rng.beta(self.a, self.b, size)


@dataclass(frozen=True)
class Bimodal:
    """With probability ``w`` a draw from ``low``, else from ``high``."""

    w: float
    low: BetaReward
    high: BetaReward

    @property
    def variance(self) -> float:
        m1, m2 = self.low.mean, self.high.mean
        mean = self.w * m1 + (1 - self.w) * m2
        second = self.w * (self.low.variance + m1 * m1) + (1 - self.w) * (self.high.variance + m2 * m2)
        return second - mean * mean

    def sample(self, rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray:
        pick_low = rng.random(size) < self.w
        return np.where(pick_low, self.low.sample(rng, size), self.high.sample(rng, size))


RewardDist = ConstantReward | Bernoulli | BetaReward | Bimodal

MIX = (("constant", 0.2), ("bernoulli", 0.3), ("beta", 0.25), ("bimodal", 0.25))


def random_prompt(rng: np.random.Generator) -> RewardDist:
    """One prompt's reward distribution drawn from the ``MIX``."""
    kind = rng.choice([k for k, _ in MIX], p=[w for _, w in MIX])
    if kind == "constant":
        return ConstantReward(float(rng.integers(0, 2)))
    if kind == "bernoulli":
        return Bernoulli(float(rng.uniform(0.03, 0.97)))
    if kind == "beta":
        return BetaReward(float(rng.uniform(0.5, 8.0)), float(rng.uniform(0.5, 8.0)))
    w = float(rng.uniform(0.6, 0.95))
    low = BetaReward(float(rng.uniform(2, 6)), float(rng.uniform(10, 30)))
    high = BetaReward(float(rng.uniform(10, 30)), float(rng.uniform(2, 6)))
    return Bimodal(w, low, high) if rng.random() < 0.5 else Bimodal(1 - w, low, high)


def random_prompt_set(seed: int, n: int) -> list[RewardDist]:
    rng = np.random.default_rng([seed, 0xBA7C4])
    return [random_prompt(rng) for _ in range(n)]


def reward_of(bench_seed: int, prompt_index: int, dist: RewardDist, seed: int) -> float:
    """The reward of (prompt, seed): deterministic, as a rollout is a pure function of its seed."""
    rng = np.random.default_rng([bench_seed, prompt_index, seed])
    return float(dist.sample(rng, (1,))[0])


def population_variance(values: Sequence[float]) -> float:
    return float(np.var(np.asarray(values, dtype=float)))
