"""The iteration loop behind ``SpotlightPipeline.run()``: the runtime's Coordinator on ROLL clusters.

There is one iteration loop, ``roll_spotlight.runtime.coordinator.Coordinator``, shared by every
host. This module supplies its backend for ROLL: `RollClusterBackend` runs each phase on the
pipeline's static ROLL clusters (rollout and reward data-parallel, trainer on one rank, weights
pushed to every rollout rank after each update). `drive` is the single switch point between the
pipeline and the loop.

Rollouts here are split statically by rank (``dispatch.mode: static``, ROLL's own way); the pull
queue, spot explorers and elastic SP belong to the runtime's Ray backend and pool, which a
pipeline supplies through ``make_spot_pool``.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)


def drive(pipeline):
    """Run the pipeline's iterations with the shared Coordinator; returns its RunResult."""
    from roll_spotlight.runtime.coordinator import Coordinator

    backend = RollClusterBackend(pipeline)
    try:
        return Coordinator(pipeline.run_config, backend, pipeline.run_dir, progress=False).run()
    finally:
        backend.close()


class RollClusterBackend:
    """The Coordinator's Backend over ROLL clusters ``trainer``, ``rollout`` and ``reward``."""

    def __init__(self, pipeline) -> None:
        self.trainer, self.rollout, self.reward = pipeline.trainer, pipeline.rollout, pipeline.reward
        self.tracker = pipeline.tracker
        self.weight_version = 0
        self._timeline: list[dict] = []

    def _phase(self, phase: str, start: float) -> None:
        self._timeline.append({"worker": "roll", "phase": phase, "start": start, "end": time.monotonic()})

    def rollouts(self, specs: list) -> list:
        t0 = time.monotonic()
        outputs = self.rollout.rollouts(list(specs))
        self._phase("rollout", t0)
        return outputs

    def score(self, images: np.ndarray, prompts: list[str]):
        from roll_spotlight.rewards import RewardOutput

        t0 = time.monotonic()
        pairs = self.reward.score(list(images), list(prompts))
        self._phase("reward", t0)
        rewards, fallback = (np.asarray(col, dtype=np.float64) for col in zip(*pairs))
        return RewardOutput(rewards, {"reward_fallback": fallback})

    def train(self, outputs: list, prompts: list[str], group_ids: np.ndarray, rewards: np.ndarray) -> dict:
        t0 = time.monotonic()
        metrics = self.trainer.train(outputs, prompts, group_ids, rewards)
        self._push_weights()
        self._phase("train", t0)
        self.tracker.log(values={k: v for k, v in metrics.items() if isinstance(v, (int, float))},
                         step=self.weight_version)
        return metrics

    def _push_weights(self) -> None:
        state, version = self.trainer.get_weights()
        self.rollout.load_weights(state, version)
        self.weight_version = version

    def evaluate(self):
        t0 = time.monotonic()
        result = self.trainer.evaluate()
        self._phase("validate", t0)
        return result

    def save_checkpoint(self, path: Path) -> None:
        self.trainer.save_checkpoint(str(path))

    def load_checkpoint(self, path: Path) -> None:
        self.trainer.load_checkpoint(str(path))
        self._push_weights()

    def timeline(self) -> list[dict]:
        return list(self._timeline)

    def close(self) -> None:
        pass
