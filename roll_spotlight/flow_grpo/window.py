"""SDE window: noise (and hence a log-prob and a training signal) on only some denoising steps.

Steps in [start, end) are stochastic; all others are plain ODE steps. Training only on a few steps
cuts training cost proportionally, and noise early in the trajectory explores most (Flow-GRPO's
"sde window"). The window is chosen from an int seed so that every worker agrees on it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SdeWindow:
    """The half-open step range [start, end) that gets noise."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"SdeWindow(start={self.start}, end={self.end}) needs 0 <= start <= end")

    def __contains__(self, step: int) -> bool:
        return self.start <= step < self.end

    def mask(self, num_steps: int) -> torch.Tensor:
        """(num_steps,) bool, True on the noised steps."""
        if self.end > num_steps:
            raise ValueError(f"SdeWindow(start={self.start}, end={self.end}) exceeds num_steps={num_steps}")
        steps = torch.arange(num_steps)
        return (steps >= self.start) & (steps < self.end)


def sde_window_steps(
    num_steps: int,
    window_size: int,
    rng_or_seed: int | random.Random,
    *,
    within: tuple[int, int] | None = None,
) -> SdeWindow:
    """A window of `window_size` steps placed uniformly inside `within` (default: all steps).

    Deterministic for an int seed (Python's Mersenne Twister is specified across platforms).
    """
    lo, hi = within if within is not None else (0, num_steps)
    if not 0 <= lo <= hi <= num_steps:
        raise ValueError(f"within={within} must satisfy 0 <= lo <= hi <= num_steps={num_steps}")
    if not 0 < window_size <= hi - lo:
        raise ValueError(f"window_size={window_size} must be in [1, {hi - lo}] for the range [{lo}, {hi})")
    rng = rng_or_seed if isinstance(rng_or_seed, random.Random) else random.Random(int(rng_or_seed))
    start = rng.randint(lo, hi - window_size)
    return SdeWindow(start, start + window_size)
