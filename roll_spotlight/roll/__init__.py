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

from roll_spotlight.lazy import lazy_exports
from roll_spotlight.roll.environment import (
    EnvironmentProblem,
    EnvironmentReport,
    check_environment,
    roll_available,
)

_LAZY = {
    "SpotlightConfig": "roll_spotlight.roll.spotlight_config",
    "SpotlightPipeline": "roll_spotlight.roll.pipeline",
    "DiTTrainerWorker": "roll_spotlight.roll.workers",
    "DiTRolloutWorker": "roll_spotlight.roll.workers",
    "DiTRewardWorker": "roll_spotlight.roll.workers",
}

__all__ = ["EnvironmentProblem", "EnvironmentReport", "check_environment", "roll_available", *_LAZY]


def _require_roll() -> None:
    if not roll_available():
        check_environment()  # raises EnvironmentProblem with install instructions


__getattr__ = lazy_exports(__name__, _LAZY, before=_require_roll)
