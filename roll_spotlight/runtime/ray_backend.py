"""The distributed backend: the coordinator's phases on Ray actors.

    driver (coordinator) --submit--> QueueActor <--pull/complete/commit-- RolloutWorker x N
          |                                                                   |  fetch version v
          +--train/evaluate--> TrainerActor --publish v+1--> WeightStore <----+
          +--score---------->  RewardActor

Nothing is pushed to workers: they pull. The trainer publishes every version to the weight store,
which keeps the latest two (exploration on stale weights needs version t while t+1 trains).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray

from roll_spotlight.configuration import to_dict
from roll_spotlight.loopback import set_loopback_env
from roll_spotlight.runtime.actors import ONDEMAND, SPOT, RewardActor, RolloutWorker, TrainerActor
from roll_spotlight.training.config import RunConfig


@dataclass
class RayClusterConfig:
    """How the standalone host uses Ray. Counts are simulated GPUs (custom resources)."""

    address: str | None = None
    num_cpus: int = 2
    ondemand_workers: int = 2
    spot_workers: int = 0
    threads_per_actor: int = 1
    poll_s: float = 0.01

    def __post_init__(self) -> None:
        if self.ondemand_workers + self.spot_workers < 1:
            raise ValueError("runtime.ondemand_workers + runtime.spot_workers must be >= 1")
        if self.num_cpus < 1:
            raise ValueError(f"runtime.num_cpus must be >= 1, got {self.num_cpus}")


def init_ray(cluster: RayClusterConfig) -> None:
    """Join `address`, or start a local Ray bound to 127.0.0.1 with the simulated-GPU resources."""
    set_loopback_env()
    if ray.is_initialized():
        return
    if cluster.address:
        ray.init(address=cluster.address, log_to_driver=False)
        return
    resources = {ONDEMAND: float(cluster.ondemand_workers + 1), SPOT: float(max(cluster.spot_workers, 1))}
    ray.init(num_cpus=cluster.num_cpus, resources=resources, include_dashboard=False, log_to_driver=False)


class RayBackend:
    def __init__(self, cfg: RunConfig, policy_path: str | Path, cluster: RayClusterConfig | None = None):
        from roll_spotlight.dispatch.actor import create_queue_actor
        from roll_spotlight.weights import WeightStore

        self.cluster = cluster or RayClusterConfig()
        init_ray(self.cluster)
        data, path, threads = to_dict(cfg), str(policy_path), self.cluster.threads_per_actor
        self._path = path
        self.queue = create_queue_actor()
        self.store = WeightStore.create(keep=2)
        self.trainer = TrainerActor.options(resources={ONDEMAND: 1}).remote(data, path, self.store, threads)
        self.reward = RewardActor.remote(data)
        self.weight_version = ray.get(self.trainer.weight_version.remote())
        self.workers = {}
        self.serving = {}
        for i in range(self.cluster.ondemand_workers):
            self.add_worker(f"ondemand-{i}", ONDEMAND)
        for i in range(self.cluster.spot_workers):
            self.add_worker(f"spot-{i}", SPOT)
        self._events: list[dict] = []

    def add_worker(self, name: str, resource: str, **kwargs):
        worker = RolloutWorker.options(resources={resource: 1}, name=None).remote(
            name, self._policy_path(), self.queue, self.store, threads=self.cluster.threads_per_actor, **kwargs)
        self.workers[name] = worker
        self.serving[name] = worker.serve.remote()
        return worker

    def _policy_path(self) -> str:
        return self._path

    def explore(self, specs) -> list:
        """Explore requests carry the stale version; the weight store still holds it."""
        return self.rollouts(specs)

    def rollouts(self, specs) -> list:
        t0 = time.time()
        ids = ray.get(self.queue.submit.remote(specs))
        wanted, done = set(ids), {}
        while len(done) < len(wanted):
            for c in ray.get(self.queue.take_results.remote()):
                done[c.request.request_id] = c.output
            if len(done) < len(wanted):
                time.sleep(self.cluster.poll_s)
        self._events.append({"worker": "driver", "phase": "wait_rollouts", "start": t0, "end": time.time()})
        return [done[i] for i in ids]

    def score(self, images: np.ndarray, prompts: list[str]):
        return ray.get(self.reward.score.remote(images, prompts))

    def start_train(self, outputs, prompts, group_ids, rewards):
        return self.trainer.train.remote(outputs, prompts, group_ids, rewards)

    def training(self, handle) -> bool:
        ready, _ = ray.wait([handle], timeout=0)
        return not ready

    def finish_train(self, handle) -> dict:
        metrics = ray.get(handle)
        self.weight_version = ray.get(self.trainer.weight_version.remote())
        return metrics

    def train(self, outputs, prompts, group_ids, rewards) -> dict:
        return self.finish_train(self.start_train(outputs, prompts, group_ids, rewards))

    def evaluate(self):
        return ray.get(self.trainer.evaluate.remote())

    def save_checkpoint(self, path: Path) -> None:
        ray.get(self.trainer.save.remote(str(path)))

    def load_checkpoint(self, path: Path) -> None:
        ray.get(self.trainer.load.remote(str(path)))
        self.weight_version = ray.get(self.trainer.weight_version.remote())

    def timeline(self) -> list[dict]:
        events = list(self._events) + ray.get(self.trainer.timeline.remote()) + ray.get(self.reward.timeline.remote())
        for worker in self.workers.values():
            events += ray.get(worker.timeline.remote())
        return sorted(events, key=lambda e: e["start"])

    def close(self) -> None:
        for worker in self.workers.values():
            worker.stop.remote()
        ray.get(list(self.serving.values()))
