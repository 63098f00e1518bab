"""Ray actors of the runtime: trainer, rollout workers, reward workers.

What each starts from is a source (`runtime.policy_source`): a policy to load, or an
`runtime.emulated.Emulation` (emulated GPUs: the same actors, every compute phase waiting its
calibrated duration).

Simulated GPUs are Ray custom resources: on-demand actors ask for `ondemand_gpu`, spot actors for
`spot_gpu` (both fractional-capable). On a real GPU cluster the same code runs with those
resources declared on the GPU nodes (see deploy/kuberay). Every actor pins torch to
`threads` intra-op threads: on small CPU machines oversubscription makes a denoising step 20-40x
slower (measured: 28 ms with 1 thread vs 0.7-1.3 s with 2 threads on 2 busy cores).
"""
from __future__ import annotations

import logging
import time

import ray

from roll_spotlight.config.run import ONDEMAND_RESOURCE, SPOT_RESOURCE
from roll_spotlight.runtime.policy_source import trainer_core, worker_compute

log = logging.getLogger(__name__)
ONDEMAND, SPOT = ONDEMAND_RESOURCE, SPOT_RESOURCE  # the Ray resources on-demand and spot actors ask for


def _torch_setup(threads: int) -> None:
    import torch

    if threads > 0:
        torch.set_num_threads(threads)


@ray.remote(num_cpus=0)
class TrainerActor:
    """Policy, optimiser, reference and validation; publishes each new weight version."""

    def __init__(self, cfg_data: dict, policy_path, store, threads: int = 1):
        from roll_spotlight.config.strict import from_dict
        from roll_spotlight.config.run import RunConfig

        _torch_setup(threads)
        cfg = from_dict(RunConfig, cfg_data)
        self.core = trainer_core(cfg, policy_path)
        self.store = store
        self.queue = None  # queue training (use_queue_training)
        self.events: list[dict] = []
        self.publish()

    def _record(self, phase: str, start: float) -> None:
        self.events.append({"worker": "trainer", "phase": phase, "start": start, "end": time.time()})

    def publish(self) -> int:
        self.store.publish(self.core.weight_version, self.core.policy.published_state())
        return self.core.weight_version

    def use_queue_training(self, queue, inbox) -> None:
        """Train each update through the queue: the rollout workers pull its micro-batches too."""
        self.queue = self.core.queue_training(queue, inbox)

    def train(self, outputs, prompts, group_ids, rewards, baselines=None):
        """One update (a `training.grpo.UpdateResult`), then its weights published."""
        t0 = time.time()
        result = self.core.train(outputs, prompts, group_ids, rewards, baselines, queue=self.queue)
        self._record("train", t0)
        t0 = time.time()
        self.publish()
        self._record("publish", t0)
        return result

    def evaluate(self):
        t0 = time.time()
        result = self.core.evaluate()
        self._record("validate", t0)
        return result

    def weight_version(self) -> int:
        return self.core.weight_version

    def save(self, path: str) -> None:
        self.core.save(path)

    def load(self, path: str) -> int:
        self.core.load(path)
        return self.publish()

    def timeline(self) -> list[dict]:
        return list(self.events)


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
    (`runtime.emulated.Emulation`): score stand-in images in the reward model's modelled time.
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
            from roll_spotlight.runtime.emulated import EmulatedReward

            self.reward_fn = EmulatedReward.servers(emulation, cfg.reward.world_size)
        self.events: list[dict] = []
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
        t0 = time.time()
        out = self.reward_fn(images, list(prompts))
        self.counters["batches"] += 1
        self.counters["samples"] += len(prompts)
        self.events.append({"worker": "reward", "phase": "reward", "start": t0, "end": time.time()})
        if batch_id is not None:
            self._results[batch_id] = out
            while len(self._results) > self.KEEP_RESULTS:
                self._results.pop(next(iter(self._results)))
        return out

    def stats(self) -> dict:
        return dict(self.counters) | {"restarted": self.restarted}

    def timeline(self) -> list[dict]:
        return list(self.events)


@ray.remote(num_cpus=0, max_concurrency=4)
class RolloutWorker:
    """A worker on Ray: the worker loop (`runtime.worker_loop`) over the queue actor, on the
    policy it loads (`runtime.compute.ModelCompute`); never pushed to.

    `serve()` runs the loop (in one of the actor's threads) until `stop()`, or until a preemption
    notice (`notify_preemption`) makes it commit the rollout in flight after the step in hand
    (another worker resumes it) and return. `unsaved_steps()` is what a kill now would throw away
    (the spot pool reads it just before it kills a worker, to count lost work). With an ``inbox``
    (queue training) it computes micro-batches of updates too. ``faults`` is deterministic
    failure injection for tests (`runtime.faults`); `wait_held()` returns once it parked.

    `sp` (an `elastic.rendezvous.SPMembership`) makes the worker one rank of an SP rollout group:
    `serve()` first joins the group, then the group serves as one worker under ``group_name``,
    its leader's (rank 0) name in the queue. Regroups (driven by `elastic.groups.ElasticGroups`):
    `leave_group()` makes the worker's group commit after the step in hand and return from
    `serve()` like a notice does, but the worker stays (the queue is not told it goes away);
    `serve(sp=...)` then joins the next group with the weights in memory. A newcomer takes the
    current weights from a peer instead of the weight store: `publish_weights()` on the peer and
    `adopt_weights()` on the newcomer (CPU: the newcomer's parameters become views of the peer's
    object in the node's shared memory), or `send_weights()` / `receive_weights()` (GPU: a
    device-to-device broadcast).
    """

    def __init__(self, name: str, policy_path, queue, store, *, threads: int = 1,
                 commit_every: int = 0, kinds=None, sp=None, group_name: str | None = None,
                 heartbeat_s: float = 5.0, inbox=None, faults=None):
        from roll_spotlight.dispatch.queue_actor import QueueClient
        from roll_spotlight.runtime.worker_loop import Signals, WorkerLoop

        _torch_setup(threads)
        self.name = name
        self.compute = worker_compute(policy_path, store, commit_every)
        signals = Signals()
        self.hold = None
        if faults is not None:
            from roll_spotlight.runtime.faults import Hold

            self.hold = Hold(faults, signals.wake)
        sink = None
        if inbox is not None:  # queue training: this worker computes micro-batches of updates too
            from roll_spotlight.runtime.queue_training import InboxSink

            sink = InboxSink(inbox)
        self.loop = WorkerLoop(QueueClient(queue, name), self.compute, name=name, sink=sink, kinds=kinds,
                               heartbeat_s=heartbeat_s, signals=signals, on_progress=self.hold)
        self.sp = None
        self.counters = {"groups_joined": 0}
        if sp is not None:
            self._set_group(sp, group_name)

    def serve(self, sp=None, group_name: str | None = None) -> dict:
        """The pull loop; returns the worker's counters when it stops or is preempted.

        ``sp`` (with ``group_name``) joins a new SP rollout group for this call, replacing the one
        given at construction: after a group member's notice made the group commit and return,
        its surviving workers re-form a group under a fresh prefix with their weights still in
        memory (no new process, no reload), and the committed lease resumes on it. Give the new
        group a fresh ``group_name`` too: the queue keeps refusing leases to a name that had a
        notice (the old group's)."""
        if sp is not None:
            self._set_group(sp, group_name)
        if self.sp is None:
            self.loop.run()
            return self.stats()
        t0 = time.time()
        group = self.compute.join_group(self.sp)
        self.counters["groups_joined"] += 1
        self.loop.events.append({"worker": self.name, "phase": "sp_join", "start": t0, "end": time.time(),
                                 "prefix": self.sp.prefix, "size": self.sp.size})
        try:
            self.loop.run(group=group)
        finally:
            group.close()
        return self.stats()

    def _set_group(self, sp, group_name: str | None) -> None:
        from roll_spotlight.dispatch.queue_actor import QueueClient

        self.sp = sp
        self.loop.client = QueueClient(self.loop.client.handle, group_name or self.name)
        self.counters["sp_size"] = sp.size

    def notify_preemption(self, seconds_left: float) -> None:
        """A preemption notice: stop after the current step and commit (see `serve`). The queue
        hears of it under the name it knows: the worker's, or its SP group's."""
        self.loop.notice(seconds_left)

    def stop(self) -> None:
        self.loop.signals.set(self.loop.signals.stop)

    def leave_group(self) -> None:
        """End this `serve()` for a regroup: the group commits after the step in hand (collective,
        as on a notice) and returns; the worker keeps its weights for its next group."""
        self.loop.signals.set(self.loop.signals.leave)

    # ---- newcomer weights from a peer (elastic.transfer) ----

    def weight_version(self) -> int | None:
        return self.compute.version

    def prepare_standby(self) -> int:
        """Pay a new process's first-use costs before it is on a critical path: map the node's
        shared-memory object store (about 60 ms for a first read of a large object) and run one
        discarded warm-up rollout. The spot launcher admits a node's workers into SP groups only
        after this. Returns the process id."""
        import os

        import numpy as np

        ray.get(ray.put(np.zeros(1 << 18, dtype=np.uint8)))  # above Ray's inline limit: a store object
        self.compute.warm_up()
        return os.getpid()

    def publish_weights(self) -> tuple[int | None, list]:
        """This worker's weight version and a boxed reference to its published state in the
        node's object store: what a newcomer adopts (`runtime.compute.ModelCompute`)."""
        return self.compute.publish_weights()

    def adopt_weights(self, published: tuple[int, list]) -> float:
        """Take a peer's `publish_weights()`; returns the seconds spent."""
        return self.compute.adopt_weights(published)

    def send_weights(self, rendezvous, prefix: str, timeout_s: float) -> int | None:
        """The peer's side of a device-to-device copy (GPU); returns the version sent."""
        return self.compute.send_weights(rendezvous, prefix, timeout_s)

    def receive_weights(self, rendezvous, prefix: str, version: int, timeout_s: float) -> float:
        """The newcomer's side of :meth:`send_weights`; returns the seconds spent."""
        return self.compute.receive_weights(rendezvous, prefix, version, timeout_s)

    def unsaved_steps(self) -> int:
        return self.loop.unsaved_steps()

    def queue_use(self) -> dict:
        return self.loop.queue_use()

    def wait_held(self, timeout_s: float) -> bool:
        """Test hook (`runtime.faults`): True once the worker parked at its planned point."""
        return self.hold is not None and self.hold.held.wait(timeout_s)

    def stats(self) -> dict:
        return self.loop.counters | self.compute.counters | self.counters

    def timeline(self) -> list[dict]:
        return list(self.loop.events)
