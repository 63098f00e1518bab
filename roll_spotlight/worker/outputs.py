"""What a rollout lease ends with, in a module that imports neither torch nor ray.

It crosses process boundaries: rollout workers send it to the queue actor in ``complete``, and
unpickling a class imports its module. Defined next to the executor (which imports torch), the
queue actor imported torch on its first completion and answered no call for 2-8 s on a loaded
2-core host (measured in the replay harness); here it costs the queue nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RolloutOutput:
    """What a finished request returns: everything training needs, as numpy (cheap to ship)."""

    request_id: int
    seed: int
    latents: np.ndarray  # (T+1, N, C) float32, x_0 (noise) .. x_T
    log_probs: np.ndarray  # (T,) float32, 0 on ODE steps
    noised: np.ndarray  # (T,) bool
    image: np.ndarray  # (H, W, 3) uint8
    weight_version: int
    resumed_from: int  # step the final lease started at (0 = not resumed)


@dataclass(frozen=True)
class Committed:
    """A lease stopped early (a notice or a leave): the state the queue resumes from elsewhere."""

    state: object  # dispatch.requests.InFlightState
    steps_run: int


@dataclass(frozen=True)
class Finished:
    output: RolloutOutput | None  # None when run with decode=False (an SP follower)
    steps_run: int


@dataclass(frozen=True)
class StepReport:
    """A batch at a step boundary (`worker.engine.RolloutEngine.denoise_batch`): the rows that
    finished, as ``(lease, Finished)``; the step each running row reached, by request id; and how many
    slots are free for the worker loop to refill."""

    finished: list
    running: dict
    free: int
