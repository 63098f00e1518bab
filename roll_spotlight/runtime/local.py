"""In-process backend: the same queue, executor and trainer as the Ray runtime, in one process.

It is the reference implementation of the loop (and what `spotlight train` runs by default):
the distributed backend must produce what this one produces.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from roll_spotlight.dispatch.queue import QueueConfig, RequestQueue
from roll_spotlight.runtime.executor import Finished, RolloutExecutor
from roll_spotlight.runtime.trainer_core import TrainerCore
from roll_spotlight.training.config import RunConfig

WORKER = "local"


class LocalBackend:
    def __init__(self, cfg: RunConfig, policy):
        self.core = TrainerCore(cfg, policy)
        self.queue = RequestQueue(QueueConfig())
        self.executor = RolloutExecutor(policy)
        self._timeline: list[dict] = []

    @property
    def weight_version(self) -> int:
        return self.core.weight_version

    def _phase(self, phase: str, start: float) -> None:
        self._timeline.append({"worker": WORKER, "phase": phase, "start": start, "end": time.monotonic()})

    def rollouts(self, specs) -> list:
        t0 = time.monotonic()
        ids = self.queue.submit(specs)
        self.executor.invalidate()  # weights changed since the last iteration
        while leases := self.queue.pull(WORKER, 1):
            outcome = self.executor.run(leases[0])
            assert isinstance(outcome, Finished), "the local worker is never preempted"
            self.queue.complete(leases[0].result(outcome.output))
        done = {c.request.request_id: c.output for c in self.queue.take_results()}
        outputs = [done[i] for i in ids]
        self.queue.forget_finished()
        self._phase("rollout", t0)
        return outputs

    def score(self, images: np.ndarray, prompts: list[str]):
        t0 = time.monotonic()
        out = self.core.reward_fn(images, prompts)
        self._phase("reward", t0)
        return out

    def train(self, outputs, prompts, group_ids, rewards) -> dict:
        t0 = time.monotonic()
        metrics = self.core.train(outputs, prompts, group_ids, rewards)
        self._phase("train", t0)
        return metrics

    def evaluate(self):
        t0 = time.monotonic()
        result = self.core.evaluate()
        self._phase("validate", t0)
        return result

    def save_checkpoint(self, path: Path) -> None:
        self.core.save(path)

    def load_checkpoint(self, path: Path) -> None:
        self.core.load(path)

    def timeline(self) -> list[dict]:
        return list(self._timeline)

    def close(self) -> None:
        pass
