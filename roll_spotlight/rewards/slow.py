"""`slow`: another reward made slower by a fixed time per image, to measure what a slow reward model
costs an iteration (`benchmarks/reward_overlap.py`) without one. Never useful for training."""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from roll_spotlight.rewards.reward import Reward, RewardOutput, build_reward


class SlowReward(Reward):
    """`inner`'s rewards after sleeping `seconds_per_image` per image of the batch."""

    def __init__(self, inner: str = "brightness", seconds_per_image: float = 0.5, **inner_kwargs: Any) -> None:
        if not seconds_per_image >= 0:
            raise ValueError(f"reward.kwargs.seconds_per_image must be >= 0, got {seconds_per_image!r}")
        self.inner, self.seconds_per_image = build_reward(inner, **inner_kwargs), float(seconds_per_image)

    def score(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        time.sleep(self.seconds_per_image * len(images))
        return self.inner(images, prompts)
