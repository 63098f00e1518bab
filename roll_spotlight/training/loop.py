"""Run Flow-GRPO on one process: the coordinator's loop over the in-process backend.

`run_training` is what `spotlight train` runs without `--ray`; the Ray runtime runs the same
`Coordinator` loop over actors (see `roll_spotlight.runtime`).
"""
from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def build_reward_fn(cfg):
    """The configured reward, wrapped so a failing or non-finite reward never crashes a step."""
    from roll_spotlight.rewards import SafeReward, WeightedReward, build_reward

    if cfg.reward.weights:
        inner = WeightedReward(dict(cfg.reward.weights), **cfg.reward.kwargs)
    else:
        inner = build_reward(cfg.reward.name, **cfg.reward.kwargs)
    return SafeReward(inner, fallback=cfg.reward.fallback)


def strict_scorer():
    """The task's detector, for strict accuracy whatever the training reward is."""
    from roll_spotlight.rewards import build_reward

    return build_reward("shapes", mode="strict")


def run_training(cfg, run_dir: Path, *, policy=None, progress: bool = True, resume: Path | None = None):
    """Train `policy` (default: the cached tiny base) for cfg.max_steps iterations."""
    from roll_spotlight.runtime.coordinator import Coordinator
    from roll_spotlight.runtime.local import LocalBackend
    from roll_spotlight.training.pretrain import load_or_pretrain

    if policy is None:
        policy, _ = load_or_pretrain(cfg, progress=progress)
    coordinator = Coordinator(cfg, LocalBackend(cfg, policy), Path(run_dir), progress=progress)
    if resume is not None:
        coordinator.resume(resume)
    return coordinator.run()
