"""Discrete-event simulator of a whole cluster running Flow-GRPO iterations (docs/design.md section 6).

It answers time per iteration, GPU idle fractions and cost for vanilla / exploration on the
critical path / naive spot / Spotlight / Spotlight with spot training on one cluster and spot
trace, driving the runtime's own policies (request queue, exploration planner, SP group planner),
and for the whole job on spot GPUs restarted from checkpoints (``managed_job``).
Every number it produces is simulated; see ``costmodel`` for where each constant comes from.

The entry points (``simulate``, ``project``, ``time_to_target``, ``main``) live in ``api`` and are
loaded on first use, so ``python -m roll_spotlight.sim.api`` does not import ``api`` twice.
"""
from __future__ import annotations

from roll_spotlight.lazy import lazy_exports
from roll_spotlight.sim.baselines import BASELINES, BaselineSpec, get_baseline
from roll_spotlight.sim.costmodel import CONSTANTS, Constant, CostModel
from roll_spotlight.sim.events import EventLoop

_LAZY = dict.fromkeys(("main", "project", "simulate", "time_to_target"), "roll_spotlight.sim.api")
__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = ["BASELINES", "CONSTANTS", "BaselineSpec", "Constant", "CostModel", "EventLoop",
           "get_baseline", *sorted(_LAZY)]
