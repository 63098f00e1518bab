"""GenEval-like reward of the shapes world, scored by the programmatic detector.

`mode` picks what is optimised: "strict" (1 iff the whole scene is right; sparse, GenEval's
metric), "partial" (mean of per-criterion credits; dense, easier for a weak policy to climb), or
"mix" = strict_weight * strict + (1 - strict_weight) * partial. info always carries both.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from roll_spotlight.checks import require_choice, require_number
from roll_spotlight.rewards.reward import Reward, RewardOutput
from roll_spotlight.tasks.shapes.detect import DetectorConfig, score
from roll_spotlight.tasks.shapes.prompts import parse_prompt
from roll_spotlight.tasks.shapes.spec import SceneSpec

SHAPES_REWARD_MODES = ("partial", "strict", "mix")


@dataclass(frozen=True)
class ShapesRewardConfig:
    mode: str = "partial"
    strict_weight: float = 0.5
    detector: DetectorConfig = field(default_factory=DetectorConfig)

    def __post_init__(self) -> None:
        require_choice("ShapesReward.mode", self.mode, SHAPES_REWARD_MODES)
        require_number("ShapesReward.strict_weight", self.strict_weight, "[0, 1]")


@functools.lru_cache(maxsize=4096)
def _parse(prompt: str) -> SceneSpec:
    return parse_prompt(prompt)


class ShapesReward(Reward):
    """Detector-scored reward; a prompt outside the shapes grammar is a ValueError."""

    def __init__(self, mode: str = "partial", strict_weight: float = 0.5,
                 detector: DetectorConfig | None = None) -> None:
        self.config = ShapesRewardConfig(mode, strict_weight, detector or DetectorConfig())
        weight = {"partial": 0.0, "strict": 1.0, "mix": strict_weight}[mode]
        self._strict_weight = weight  # reward = weight * strict + (1 - weight) * partial

    def score(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        results = [score(image, _parse(prompt), self.config.detector) for image, prompt in zip(images, prompts)]
        strict = np.array([r.strict for r in results], dtype=np.float64)
        partial = np.array([r.partial for r in results], dtype=np.float64)
        rewards = self._strict_weight * strict + (1.0 - self._strict_weight) * partial
        return RewardOutput(rewards, {"strict": strict, "partial": partial})
