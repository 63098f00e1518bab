"""Reward interface, registry and combinators (numpy only; torch is never imported here).

A reward maps a batch of images and their prompts to one float per image::

    reward = build_reward("shapes", mode="strict")
    out = reward(images, prompts)       # images: uint8 (B, H, W, 3) or float torch (B, 3, H, W) in [0, 1]
    out.rewards                          # float64 (B,)
    out.info                             # {"strict": (B,), "partial": (B,)}

Names are resolved by the project's one resolver, `roll_spotlight.plugins`, in the group
`roll_spotlight.rewards`, in order: `register_reward` registrations, the built-ins (listed in
`plugins.BUILTINS`, dotted paths, so the registry works without `pip install`), entry points of the group (read once, lazily), and
finally a dotted path "pkg.mod:Class" (or "pkg.mod.Class"). An unknown name is a ValueError listing
the known names.
"""
from __future__ import annotations

import logging
import math
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roll_spotlight import plugins

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "roll_spotlight.rewards"


@dataclass(frozen=True)
class RewardOutput:
    """Per-sample rewards (float64, shape (B,)) and per-sample diagnostics of the same length."""

    rewards: np.ndarray
    info: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rewards = np.asarray(self.rewards, dtype=np.float64)
        if rewards.ndim != 1:
            raise ValueError(f"RewardOutput.rewards must be 1-D, got shape {rewards.shape}")
        object.__setattr__(self, "rewards", rewards)
        for key, value in self.info.items():
            if len(value) != len(rewards):
                raise ValueError(f"RewardOutput.info[{key!r}] has length {len(value)}, rewards {len(rewards)}")


def as_uint8_images(images: Any) -> np.ndarray:
    """The one place images are converted: returns uint8 (B, H, W, 3).

    Accepts uint8 numpy (B, H, W, 3), float numpy (B, H, W, 3) in [0, 1], or a floating torch tensor
    (B, 3, H, W) in [0, 1] (values are clamped; torch is only consulted if already imported).
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(images, torch.Tensor):
        if images.ndim != 4 or images.shape[1] != 3 or not images.is_floating_point():
            raise ValueError(f"a torch image batch must be float (B, 3, H, W), "
                             f"got {images.dtype} {tuple(images.shape)}")
        images = images.detach().float().clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy()
    if not isinstance(images, np.ndarray) or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must be (B, H, W, 3) numpy or (B, 3, H, W) torch, got {type(images).__name__} "
                         f"{getattr(images, 'shape', None)}")
    if images.dtype == np.uint8:
        return images
    if np.issubdtype(images.dtype, np.floating):
        return np.round(np.clip(images, 0.0, 1.0) * 255.0).astype(np.uint8)
    raise ValueError(f"numpy images must be uint8 or float in [0, 1], got {images.dtype}")


class Reward(ABC):
    """Template: `__call__` converts and checks, subclasses implement `score` on uint8 (B, H, W, 3)."""

    def __call__(self, images: Any, prompts: Sequence[str]) -> RewardOutput:
        batch = as_uint8_images(images)
        prompts = list(prompts)
        if len(prompts) != len(batch):
            raise ValueError(f"{type(self).__name__}: {len(batch)} images but {len(prompts)} prompts")
        out = self.score(batch, prompts)
        if not isinstance(out, RewardOutput):
            raise ValueError(f"{type(self).__name__}.score returned {type(out).__name__}, not RewardOutput")
        if out.rewards.shape != (len(batch),):
            raise ValueError(f"{type(self).__name__}.score returned rewards of shape {out.rewards.shape}, "
                             f"expected ({len(batch)},)")
        return out

    @abstractmethod
    def score(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        """Rewards of uint8 (B, H, W, 3) images for their prompts."""


def register_reward(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Class/factory decorator: makes `build_reward(name, ...)` call it. Re-registering the same
    object is a no-op; registering another object under a taken name is a ValueError."""

    def decorator(factory: Callable[..., Any]) -> Callable[..., Any]:
        return plugins.register(ENTRY_POINT_GROUP, name, factory)

    return decorator


def known_rewards() -> list[str]:
    return plugins.known_names(ENTRY_POINT_GROUP)


def resolve_reward(name: str) -> Callable[..., Any]:
    """The factory behind a reward name (resolved by `roll_spotlight.plugins`, see the module doc)."""
    return plugins.resolve(ENTRY_POINT_GROUP, name)


def build_reward(name: str, **kwargs: Any) -> Reward:
    """Instantiate a reward by name with constructor kwargs."""
    reward = resolve_reward(name)(**kwargs)
    if not callable(reward):
        raise ValueError(f"reward {name!r} built a non-callable {type(reward).__name__}")
    return reward


class WeightedReward(Reward):
    """Sum of weighted component rewards; each component's rewards land in info[name] and its info
    in info["name/key"]. Constructor kwargs other than `components` are per-component kwargs keyed by
    component name, e.g. `WeightedReward({"shapes": 1.0, "brightness": 0.1}, shapes={"mode": "strict"})`.
    """

    def __init__(self, components: Mapping[str, float], **component_kwargs: Mapping[str, Any]) -> None:
        if not components:
            raise ValueError("WeightedReward.components must name at least one reward")
        for name, weight in components.items():
            if not (isinstance(weight, (int, float)) and math.isfinite(weight)):
                raise ValueError(f"WeightedReward.components[{name!r}]={weight!r} must be a finite number")
        for name in component_kwargs:
            if name not in components:
                raise ValueError(f"WeightedReward got kwargs for {name!r}, "
                                 f"which is not a component of {list(components)}")
        self.weights = {name: float(w) for name, w in components.items()}
        self.components = {name: build_reward(name, **component_kwargs.get(name, {})) for name in components}

    def score(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        total = np.zeros(len(images), dtype=np.float64)
        info: dict[str, np.ndarray] = {}
        for name, reward in self.components.items():
            out = reward(images, prompts)
            total += self.weights[name] * out.rewards
            info[name] = out.rewards
            info.update({f"{name}/{key}": value for key, value in out.info.items()})
        return RewardOutput(total, info)


class SafeReward(Reward):
    """Never lets a reward crash a training step.

    An exception in the inner reward gives `fallback` to the whole batch (counted in `failures`,
    one per failed call); a non-finite value gives `fallback` to that sample (counted in `nonfinite`,
    one per sample). Both are logged with `logging.warning`, and info["reward_fallback"] marks the
    affected samples (1.0) so a trainer can drop them.

    Choosing the fallback: it enters the group-relative advantage like any reward, so a value far
    below the group's rewards pushes the policy away from that sample. The default 0.0 is the
    minimum of the bounded rewards here (shapes, OCR, brightness are in [0, 1]), i.e. "treat a failed
    score as a failure"; for rewards of another scale pass a neutral value or drop flagged samples.
    On an exception, info holds only "reward_fallback" (the inner info keys are unknown).
    """

    def __init__(self, inner: Reward | str, fallback: float = 0.0, **inner_kwargs: Any) -> None:
        if not (isinstance(fallback, (int, float)) and math.isfinite(fallback)):
            raise ValueError(f"SafeReward.fallback={fallback!r} must be a finite number")
        if isinstance(inner, str):
            inner = build_reward(inner, **inner_kwargs)
        elif inner_kwargs:
            raise ValueError(f"SafeReward got kwargs {sorted(inner_kwargs)} for an already built inner reward")
        self.inner, self.fallback = inner, float(fallback)
        self.failures = 0
        self.nonfinite = 0

    def score(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        try:
            out = self.inner(images, prompts)
        except Exception as err:  # any failure of a reward model must not end the step
            self.failures += 1
            logger.warning("reward %s raised %s: %s; using fallback %s for %d samples (failures=%d)",
                           type(self.inner).__name__, type(err).__name__, err, self.fallback, len(images),
                           self.failures, exc_info=True)
            return RewardOutput(np.full(len(images), self.fallback), {"reward_fallback": np.ones(len(images))})
        bad = ~np.isfinite(out.rewards)
        if bad.any():
            self.nonfinite += int(bad.sum())
            logger.warning("reward %s gave %d non-finite values; using fallback %s (nonfinite=%d)",
                           type(self.inner).__name__, int(bad.sum()), self.fallback, self.nonfinite)
        rewards = np.where(bad, self.fallback, out.rewards)
        return RewardOutput(rewards, {**out.info, "reward_fallback": bad.astype(np.float64)})
