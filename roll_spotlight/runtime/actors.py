"""Ray actors of the runtime's trainer side: the trainer and the reward workers (the rollout worker
is `worker.actor.RolloutWorker`).

What each starts from is a source (`worker.policy_source`): a policy to load, or an
`worker.emulated.Emulation` (emulated GPUs: the same actors, every compute phase waiting its
calibrated duration).

Simulated GPUs are Ray custom resources: on-demand actors ask for `ondemand_gpu`, spot actors for
`spot_gpu` (both fractional-capable). On a real GPU cluster the same code runs with those
resources declared on the GPU nodes (see deploy/kuberay). Every actor pins torch to `threads`
intra-op threads (`worker.actor.pin_threads`).
"""
from __future__ import annotations

import logging

import ray

from roll_spotlight.config.run import ONDEMAND_RESOURCE, SPOT_RESOURCE
from roll_spotlight.timeline import Timeline
from roll_spotlight.worker.actor import pin_threads

log = logging.getLogger(__name__)
ONDEMAND, SPOT = ONDEMAND_RESOURCE, SPOT_RESOURCE  # the Ray resources on-demand and spot actors ask for


@ray.remote(num_cpus=0)
class TrainerActor:
    """Policy, optimiser, reference and validation; publishes each new weight version."""

    def __init__(self, cfg_data: dict, policy_path, store, threads: int = 1):
        from roll_spotlight.config.strict import from_dict
        from roll_spotlight.config.run import RunConfig
        from roll_spotlight.runtime.trainer_core import build_trainer_core

        pin_threads(threads)
        cfg = from_dict(RunConfig, cfg_data)
        self.core = build_trainer_core(cfg, policy_path)
        self.store = store
        self.queue = None  # queue training (use_queue_training)
        self.phases = Timeline("trainer")
        self.publish()

    def publish(self) -> int:
        self.store.publish(self.core.weight_version, self.core.policy.published_state())
        return self.core.weight_version

    def use_queue_training(self, queue, inbox) -> None:
        """Train each update through the queue: the rollout workers pull its micro-batches too."""
        self.queue = self.core.queue_training(queue, inbox)

    def train(self, outputs, prompts, group_ids, rewards, baselines=None):
        """One update (a `training.grpo.UpdateResult`), then its weights published."""
        with self.phases.phase("train"):
            result = self.core.train(outputs, prompts, group_ids, rewards, baselines, queue=self.queue)
        with self.phases.phase("publish"):
            self.publish()
        return result

    def evaluate(self):
        with self.phases.phase("validate"):
            return self.core.evaluate()

    def score_validation(self, images):
        return self.core.score_validation(images)

    def weight_version(self) -> int:
        return self.core.weight_version

    def save(self, path: str) -> None:
        self.core.save(path)

    def load(self, path: str) -> int:
        self.core.load(path)
        return self.publish()

    def timeline(self) -> list[dict]:
        return list(self.phases.events)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=3)
class RewardActor:
    """Batched reward scoring (the configured reward behind SafeReward).

    Crash recovery: Ray restarts the actor when its process dies and re-sends the call that was
    running, so the driver's `score` simply returns later with the right rewards (a reward is a
    pure function of images and prompts, so the retried batch scores the same). A crash is not a
    reward error: the batch is retried, not given SafeReward's fallback. A batch that kills the
    process on every try (a native crash on some input) is retried 3 times, then the driver gets
    the RayActorError instead of a restart loop (the run stops; `--resume` continues it).

    No double counting: a call carrying a `batch_id` already scored in this life returns the
    stored result without scoring or counting again (a driver that retries on its own, or a retry
    of a call whose reply was lost). `counters` count each batch once per life of the actor.

    `crash_at_batch` is deterministic failure injection for tests: the first life of the actor
    dies (os._exit) when its crash_at_batch-th batch arrives, before scoring it. `emulation`
    (`worker.emulated.Emulation`): score stand-in images in the reward model's modelled time.
    """

    KEEP_RESULTS = 256  # recent batch results kept for repeated batch ids (streamed batches are small)

    def __init__(self, cfg_data: dict, crash_at_batch: int | None = None, emulation=None):
        from roll_spotlight.config.strict import from_dict
        from roll_spotlight.config.run import RunConfig

        cfg = from_dict(RunConfig, cfg_data)
        if emulation is None:
            from roll_spotlight.rewards.configured import configured_reward

            self.reward_fn = configured_reward(cfg.reward)
        else:  # emulated GPUs: the reward servers are emulated too
            from roll_spotlight.runtime.emulated_trainer import EmulatedReward

            self.reward_fn = EmulatedReward.servers(emulation, cfg.reward.world_size)
        self.phases = Timeline("reward")
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self._crash_at = None if self.restarted else crash_at_batch
        self._results: dict = {}
        self.counters = {"batches": 0, "samples": 0, "repeats": 0}

    def score(self, images, prompts, batch_id=None):
        if batch_id is not None and batch_id in self._results:
            self.counters["repeats"] += 1
            return self._results[batch_id]
        if self._crash_at is not None and self.counters["batches"] + 1 == self._crash_at:
            import os

            log.warning("reward actor: injected crash at batch %d", self._crash_at)
            os._exit(1)
        with self.phases.phase("reward"):
            out = self.reward_fn(images, list(prompts))
        self.counters["batches"] += 1
        self.counters["samples"] += len(prompts)
        if batch_id is not None:
            self._results[batch_id] = out
            while len(self._results) > self.KEEP_RESULTS:
                self._results.pop(next(iter(self._results)))
        return out

    def stats(self) -> dict:
        return dict(self.counters) | {"restarted": self.restarted}

    def timeline(self) -> list[dict]:
        return list(self.phases.events)
