"""Synthetic rewards for the exploration planner in simulation.

The simulator does not generate images, so explored rewards are *synthetic*: each prompt gets a
reward distribution (mean and spread drawn once from the run seed), each (prompt, seed) a reward
drawn from it, and each weight version a small drift, so stale (theta_t) and fresh (theta_t+1)
rewards of one seed are correlated but not equal. A fraction of prompts has zero spread (all seeds
score the same: a saturated OCR prompt), which is what the planner should learn to abandon.

These numbers only steer the planner's choices of which prompts to explore; they say nothing about
convergence, which the simulator does not model (docs/design.md section 6).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from roll_spotlight.checks import require_each, require_number

_MASK64 = (1 << 64) - 1


def _mix(*keys: int) -> int:
    """A 64-bit hash of integer keys (splitmix64 chain): cheap, stable across processes."""
    x = 0x9E3779B97F4A7C15
    for key in keys:
        x = (x ^ (key & _MASK64)) & _MASK64
        x = (x + 0x9E3779B97F4A7C15) & _MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 31
    return x


def _normal(*keys: int) -> float:
    """A standard normal draw determined by ``keys`` (Box-Muller on two hashed uniforms)."""
    h1, h2 = _mix(*keys, 1), _mix(*keys, 2)
    u1 = ((h1 >> 11) + 1) / float(1 << 53)
    u2 = (h2 >> 11) / float(1 << 53)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


@dataclass(frozen=True)
class SyntheticRewardConfig:
    zero_variance_fraction: float = 0.2
    mean_spread: float = 0.25
    seed_spread: float = 0.2
    version_drift: float = 0.05

    def __post_init__(self) -> None:
        require_number("SyntheticRewardConfig.zero_variance_fraction", self.zero_variance_fraction, "[0, 1]")
        require_each(self, "SyntheticRewardConfig", ("mean_spread", "seed_spread", "version_drift"), require_number,
                     ">= 0")


class SyntheticRewards:
    """Deterministic reward of (prompt, seed, weight version) in [0, 1]."""

    def __init__(self, seed: int, config: SyntheticRewardConfig | None = None) -> None:
        self.seed = int(seed)
        self.config = config or SyntheticRewardConfig()
        self._prompts: dict[int, tuple[float, float]] = {}

    def prompt_distribution(self, prompt_id: int) -> tuple[float, float]:
        """(mean, spread) of a prompt's rewards; spread 0 for saturated prompts."""
        if prompt_id not in self._prompts:
            rng = np.random.default_rng([self.seed, 1, prompt_id])
            if rng.random() < self.config.zero_variance_fraction:
                self._prompts[prompt_id] = (float(rng.integers(0, 2)), 0.0)
            else:
                mean = float(np.clip(0.5 + self.config.mean_spread * rng.standard_normal(), 0.05, 0.95))
                self._prompts[prompt_id] = (mean, self.config.seed_spread * float(rng.uniform(0.3, 1.0)))
        return self._prompts[prompt_id]

    def reward(self, prompt_id: int, seed: int, weight_version: int) -> float:
        mean, spread = self.prompt_distribution(prompt_id)
        if spread == 0.0:
            return mean
        base = _normal(self.seed, 2, prompt_id, seed)
        drift = _normal(self.seed, 3, prompt_id, seed, weight_version)
        value = mean + spread * (base + self.config.version_drift * drift)
        return min(1.0, max(0.0, value))
