"""The run's reward from its config section, and the task's strict scorer used by validation."""
from __future__ import annotations

from roll_spotlight.rewards.reward import Reward, SafeReward, WeightedReward, build_reward


def configured_reward(section) -> Reward:
    """The reward a `reward` section names (one name, or `weights` of several), wrapped in
    `SafeReward` so a failing or non-finite reward is counted and replaced, never crashes a step."""
    if section.weights:
        inner = WeightedReward(dict(section.weights), **section.kwargs)
    else:
        inner = build_reward(section.name, **section.kwargs)
    return SafeReward(inner, fallback=section.fallback)


def strict_scorer() -> Reward:
    """The shapes task's detector in strict mode: validation reports strict accuracy whatever the
    training reward is."""
    return build_reward("shapes", mode="strict")
