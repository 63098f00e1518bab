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


def check_startup(cfg) -> None:
    """What can fail at start-up, checked before anything is written (no run directory yet).

    The config dataclasses already validated keys, types and values; this adds what needs the
    outside world: the model directory exists, the reward section builds (name known, kwargs
    accepted, files it names readable) and the spot trace parses. Errors name the key, or the
    file and line (a malformed trace raises TraceFormatError, a ValueError naming `file:line`).
    """
    from roll_spotlight.configuration import ConfigError

    if cfg.spot.enabled and cfg.spot.trace:
        from roll_spotlight.spot.traces import load_trace

        load_trace(cfg.spot.trace)
    if cfg.model.preset != "tiny" and not Path(cfg.model.path).is_dir():
        raise ConfigError(f"model.path: model directory {cfg.model.path!r} does not exist "
                          f"(preset {cfg.model.preset!r} loads a local diffusers directory)")
    try:
        build_reward_fn(cfg)
    except (ValueError, TypeError, OSError, ImportError) as err:
        key = "reward.weights" if cfg.reward.weights else "reward.kwargs"
        raise ConfigError(f"reward: cannot build reward {cfg.reward.name!r} ({key}={cfg.reward.kwargs!r}): "
                          f"{type(err).__name__}: {err}") from err


def strict_scorer():
    """The task's detector, for strict accuracy whatever the training reward is."""
    from roll_spotlight.rewards import build_reward

    return build_reward("shapes", mode="strict")


def starting_policy(cfg, *, progress: bool = True):
    """(policy, source): what a run starts from, and what its Ray workers load for it
    (`roll_spotlight.models.source`): the cached tiny base (pretrained first when missing) and its
    checkpoint path, or the real model loaded from `model.path` and its model section."""
    from roll_spotlight.models.source import policy_source

    if cfg.model.preset == "tiny":
        from roll_spotlight.training.pretrain import load_or_pretrain

        policy, meta = load_or_pretrain(cfg, progress=progress)
        return policy, meta["path"]
    from roll_spotlight.models import build_policy

    return build_policy(cfg.model), policy_source(cfg.model, None)


def run_training(cfg, run_dir: Path, *, policy=None, progress: bool = True, resume: Path | None = None):
    """Train `policy` (default: `starting_policy(cfg)`) for cfg.max_steps iterations."""
    from roll_spotlight.runtime.coordinator import Coordinator
    from roll_spotlight.runtime.local import LocalBackend

    if policy is None:
        policy, _ = starting_policy(cfg, progress=progress)
    coordinator = Coordinator(cfg, LocalBackend(cfg, policy), Path(run_dir), progress=progress)
    if resume is not None:
        coordinator.resume(resume)
    return coordinator.run()
