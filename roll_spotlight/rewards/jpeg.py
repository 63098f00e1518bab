"""Rule-based rewards with no model: JPEG compressibility (as in DDPO) and mean brightness.

`MeanBrightness` is deliberately trivial: its optimum is obvious and it moves within a few RL
iterations, so it checks the signs and gradients of the RL plumbing end to end.
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

from roll_spotlight.checks import require_int
from roll_spotlight.rewards.reward import Reward, RewardOutput


class JpegCompressibility(Reward):
    """Reward = -(JPEG size in kB, 1 kB = 1000 bytes) at `quality` (95 as in DDPO); higher = simpler."""

    def __init__(self, quality: int = 95) -> None:
        require_int("JpegCompressibility.quality", quality, "[1, 100]")
        self.quality = quality

    def _size_kb(self, image: np.ndarray) -> float:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=self.quality)
        return buffer.tell() / 1000.0

    def score(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        sizes = np.array([self._size_kb(image) for image in images], dtype=np.float64)
        return RewardOutput(-sizes, {"jpeg_kb": sizes})


class MeanBrightness(Reward):
    """Reward = mean pixel value in [0, 1]; ignores the prompt."""

    def score(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        return RewardOutput(images.reshape(len(images), -1).mean(axis=1) / 255.0)
