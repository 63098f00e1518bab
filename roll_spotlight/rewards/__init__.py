"""Rewards: a `Reward` interface, a name registry (built-ins, entry points, dotted paths) and the
rewards of this project (shapes detector, OCR, JPEG compressibility, brightness). numpy/PIL only."""
from roll_spotlight.rewards.reward import (
    ENTRY_POINT_GROUP,
    Reward,
    RewardOutput,
    SafeReward,
    WeightedReward,
    as_uint8_images,
    build_reward,
    known_rewards,
    register_reward,
    resolve_reward,
)
from roll_spotlight.rewards.jpeg import JpegCompressibility, MeanBrightness
from roll_spotlight.rewards.ocr import OcrReward
from roll_spotlight.rewards.shapes_reward import ShapesReward

__all__ = [
    "ENTRY_POINT_GROUP", "Reward", "RewardOutput", "SafeReward", "WeightedReward", "as_uint8_images",
    "build_reward", "known_rewards", "register_reward", "resolve_reward", "JpegCompressibility",
    "MeanBrightness", "OcrReward", "ShapesReward",
]
