"""The rollout worker as a Ray actor: the worker loop over the queue actor, on the compute its
source gives (`worker.policy_source`), plus the worker's side of queue training (`InboxSink`)."""
from __future__ import annotations

import time
from typing import Sequence

import ray

from roll_spotlight.dispatch.requests import Lease
from roll_spotlight.training.micro_batches import GradientSum, TrainWork
from roll_spotlight.worker.policy_source import worker_compute


def pin_threads(threads: int) -> None:
    """Pin torch to ``threads`` intra-op threads (0: leave torch's default): on small CPU machines
    oversubscription makes a denoising step 20-40x slower (measured: 28 ms with 1 thread vs
    0.7-1.3 s with 2 threads on 2 busy cores)."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)


class InboxSink:
    """A worker's `worker_loop.GradientSink`: the open update's work from the inbox (fetched
    once per version) and the reports to it."""

    def __init__(self, inbox) -> None:
        self.inbox = inbox
        self._work: TrainWork | None = None

    def work(self, version: int) -> TrainWork | None:
        if self._work is None or self._work.weight_version != version:
            self._work = ray.get(self.inbox.work.remote(version))
        return self._work

    def report(self, worker: str, version: int, leases: Sequence[Lease], gradient: GradientSum) -> bool:
        results = [lease.result(None) for lease in leases]
        return bool(ray.get(self.inbox.report.remote(worker, version, results, gradient)))



@ray.remote(num_cpus=0, max_concurrency=4)
class RolloutWorker:
    """A worker on Ray: the worker loop (`worker.loop`) over the queue actor, on the
    policy it loads (`worker.compute.ModelCompute`); never pushed to.

    `serve()` runs the loop (in one of the actor's threads) until `stop()`, or until a preemption
    notice (`notify_preemption`) makes it commit the rollout in flight after the step in hand
    (another worker resumes it) and return. `unsaved_steps()` is what a kill now would throw away
    (the spot pool reads it just before it kills a worker, to count lost work). With an ``inbox``
    (queue training) it computes micro-batches of updates too. ``faults`` is deterministic
    failure injection for tests (`worker.faults`); `wait_held()` returns once it parked.

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
                 commit_every: int = 0, max_batch: int = 1, kinds=None, sp=None, group_name: str | None = None,
                 heartbeat_s: float = 5.0, inbox=None, faults=None):
        from roll_spotlight.dispatch.queue_actor import QueueClient
        from roll_spotlight.worker.loop import Signals, WorkerLoop

        pin_threads(threads)
        self.name = name
        self.compute = worker_compute(policy_path, store, commit_every, max_batch)
        signals = Signals()
        self.hold = None
        if faults is not None:
            from roll_spotlight.worker.faults import Hold

            self.hold = Hold(faults, signals.wake)
        sink = None
        if inbox is not None:  # queue training: this worker computes micro-batches of updates too
            from roll_spotlight.worker.actor import InboxSink

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
            self.loop.serve()
            return self.stats()
        t0 = time.time()
        group = self.compute.join_group(self.sp)
        self.counters["groups_joined"] += 1
        self.loop.events.append({"worker": self.name, "phase": "sp_join", "start": t0, "end": time.time(),
                                 "prefix": self.sp.prefix, "size": self.sp.size})
        try:
            self.loop.serve(group=group)
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
        node's object store: what a newcomer adopts (`worker.compute.ModelCompute`)."""
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
        """Test hook (`worker.faults`): True once the worker parked at its planned point."""
        return self.hold is not None and self.hold.held.wait(timeout_s)

    def stats(self) -> dict:
        return self.loop.counters | self.compute.counters | self.counters

    def timeline(self) -> list[dict]:
        return list(self.loop.events)
