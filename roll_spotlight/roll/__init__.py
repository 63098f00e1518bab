"""ROLL host adapter: run Spotlight's Flow-GRPO loop as a ROLL pipeline.

Importing this package never imports ROLL, torch or ray, so it works where ROLL is absent (ROLL is
installed from its repository, not PyPI). The classes that subclass ROLL's bases live in modules
that import ``roll`` at the top (``config``, ``workers``, ``pipeline``) and are reached through the
lazy attributes below::

    from roll_spotlight.roll import SpotlightConfig, SpotlightPipeline   # imports ROLL here

ROLL-free parts: `sections` (the typed Spotlight sections and recipe validation), `environment`
(`check_environment`), `strategy` (the diffusers strategies the workers build).
"""
from __future__ import annotations

import importlib
from typing import Any

from roll_spotlight.roll.environment import (
    EnvironmentProblem,
    EnvironmentReport,
    check_environment,
    roll_available,
)

_LAZY = {
    "SpotlightConfig": "roll_spotlight.roll.config",
    "SpotlightPipeline": "roll_spotlight.roll.pipeline",
    "DiTTrainerWorker": "roll_spotlight.roll.workers",
    "DiTRolloutWorker": "roll_spotlight.roll.workers",
    "DiTRewardWorker": "roll_spotlight.roll.workers",
}

__all__ = ["EnvironmentProblem", "EnvironmentReport", "check_environment", "roll_available", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'roll_spotlight.roll' has no attribute {name!r}")
    if not roll_available():
        check_environment()  # raises EnvironmentProblem with install instructions
    return getattr(importlib.import_module(module), name)
