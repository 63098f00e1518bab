"""In-process backend: the same queue, rollout engine and trainer as the Ray runtime, in one process.

It is the reference implementation of the loop (and what `spotlight train` runs by default):
the distributed backend must produce what this one produces.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from roll_spotlight.dispatch.queue import QueueConfig, RequestQueue
from roll_spotlight.worker.engine import RolloutEngine, by_shape
from roll_spotlight.worker.loop import roll_out
from roll_spotlight.runtime.coordinator import rollouts_then_scores
from roll_spotlight.runtime.update_report import UpdateReport
from roll_spotlight.runtime.trainer_core import TrainerCore
from roll_spotlight.config.run import RunConfig
from roll_spotlight.timeline import Timeline

WORKER = "local"


def drain_local(queue: RequestQueue, specs, roll_out, max_batch: int = 1) -> list:
    """Submit `specs` to an in-process queue and run its leases here, up to `max_batch` of one shape
    at a time, with `roll_out(leases) -> outputs`; the outputs in the order of `specs`. The queue
    is left empty for the next batch."""
    ids = queue.submit(specs)
    while leases := queue.pull(WORKER, max_batch):
        for group in by_shape(leases):
            for lease, output in zip(group, roll_out(group)):
                queue.complete(lease.result(output))
    done = {c.request.request_id: c.output for c in queue.take_results()}
    queue.forget_finished()
    return [done[i] for i in ids]


class LocalBackend:
    def __init__(self, cfg: RunConfig, policy):
        self.core = TrainerCore(cfg, policy)
        self.queue = RequestQueue(QueueConfig())
        self.engine = RolloutEngine(policy, max_batch=cfg.sampling.max_batch)
        self.stale: RolloutEngine | None = None
        self.stale_version: int | None = None
        self._timeline = Timeline(WORKER, time.monotonic)
        self._version = self.core.weight_version

    @property
    def weight_version(self) -> int:
        """The version the loop sees: the update started by ``start_train`` counts from ``finish_train``.

        The update itself runs inside ``start_train`` (one process), but as on Ray and ROLL the loop
        must still see the pre-update version until ``finish_train``, so that stale exploration
        between the two names, and runs with, the weights the iteration's rollouts used.
        """
        return self._version

    def rollouts(self, specs, phase: str = "rollout") -> list:
        with self._timeline.phase(phase):
            self.engine.invalidate()  # weights changed since the last iteration
            return drain_local(self.queue, specs, self._roll_out, self.engine.max_batch)

    def _roll_out(self, leases):
        return roll_out(self._engine_for(leases[0].request.weight_version), leases)

    rollouts_scored = rollouts_then_scores  # no overlap in process

    def place_spot(self, share: float) -> int:
        """No spot workers in process."""
        return 0

    def explore(self, specs) -> list:
        return self.rollouts(specs, phase="explore")

    def _engine_for(self, version: int) -> RolloutEngine:
        """The current weights, or the copy kept from before the last update (stale exploration)."""
        if version == self.core.weight_version:
            return self.engine
        assert self.stale is not None and version == self.stale_version, f"weight version {version} is not held"
        return self.stale

    def score(self, images: np.ndarray, prompts: list[str]):
        with self._timeline.phase("reward"):
            return self.core.reward_fn(images, prompts)

    def start_train(self, outputs, prompts, group_ids, rewards, baselines=None):
        """Runs the update now; keeps the pre-update weights when exploration will need them.
        `baselines`: per-sample advantage baselines (`exploration.baseline: pool`), or None."""
        if self.core.cfg.exploration.mode == "stale":
            self._keep_stale_copy()
        with self._timeline.phase("train"):
            return self.core.train(outputs, prompts, group_ids, rewards, baselines)

    def training(self, handle) -> bool:
        """In one process exploration runs after the update, bounded by its seed budget only."""
        return True

    def finish_train(self, handle) -> UpdateReport:
        self._version = self.core.weight_version
        return UpdateReport(handle.metrics)

    def train(self, outputs, prompts, group_ids, rewards, baselines=None) -> UpdateReport:
        return self.finish_train(self.start_train(outputs, prompts, group_ids, rewards, baselines))

    def _keep_stale_copy(self) -> None:
        import copy

        if self.stale is None:
            self.stale = RolloutEngine(copy.deepcopy(self.core.policy), max_batch=self.engine.max_batch)
        self.stale.policy.load_published_state(self.core.policy.published_state())
        self.stale.invalidate()
        self.stale_version = self.core.weight_version

    def evaluate(self):
        """Validation through the rollout engine, as the Ray workers do (`RayBackend.evaluate`);
        with a weight average (`train.ema_decay`) the trainer validates it."""
        from roll_spotlight.training.evaluate import validation_specs

        if self.core.ema is not None:
            with self._timeline.phase("validate"):
                return self.core.evaluate()
        specs = validation_specs(self.core.val, self.core.cfg.sampling, self.core.weight_version)
        with self._timeline.phase("validate"):
            self.engine.invalidate()
            images = np.stack([o.image for o in drain_local(self.queue, specs, self._roll_out, self.engine.max_batch)])
        return self.core.score_validation(images)

    def save_checkpoint(self, path: Path) -> None:
        self.core.save(path)

    def load_checkpoint(self, path: Path) -> None:
        self.core.load(path)
        self._version = self.core.weight_version

    def timeline(self) -> list[dict]:
        return list(self._timeline.events)

    def close(self) -> None:
        pass
