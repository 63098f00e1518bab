"""Training micro-batches through the request queue: the gradient inbox, the workers' side of it,
and the trainer's (`spot.training_phase: train | auto`; docs/design.md section 3b).

    trainer (TrainerActor, ROLL rank 0)               on-demand and spot workers (worker loop)
      QueueTraining.update(version, schedule)(plan):
        inbox.open(work) -------------------------->  InboxSink.work(version)      (once per update)
        queue.submit(one TRAIN request per micro-batch)
        its own worker loop: pull TRAIN leases,       pull TRAIN leases -> Compute.gradient_sum
          compute, queue.complete_all -> keep           -> inbox.report: queue.complete_all -> keep
        ... until every micro-batch is DONE
        own sums + inbox.take(version) --> UpdateSums --> the trainer combines, clips, steps

A worker reports one gradient sum over the micro-batches it ran, with the leases it covers; the
inbox keeps the sum only if the queue accepts every one of those leases at once
(`RequestQueue.complete_all`), so a late or repeated report, or one holding a lease that expired
or was requeued after a kill, is refused whole and its micro-batches are computed again. The
inbox receives a sum (the call's argument) before it asks the queue, so an accepted sum is never
lost with its worker. A notice makes a worker report what it finished and hand the rest back; a
kill without notice requeues its leases (the pool calls `worker_lost`) and its partial sum dies
with it. Each micro-batch therefore enters the update exactly once (`combine` asserts it), and the
update equals the one-trainer update up to float summation order.

The inbox is a separate actor (not the trainer, which is busy computing micro-batches, nor the
queue, which journals what it is sent) and owns each update's work while it is open.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import ray

from roll_spotlight.dispatch.queue_actor import QueueClient
from roll_spotlight.dispatch.requests import Lease, RequestResult, RequestSpec, Schedule
from roll_spotlight.worker.compute import ModelCompute
from roll_spotlight.runtime.update_report import TRAINER
from roll_spotlight.worker.loop import POLL_MIN_S, TRAIN_ONLY, WorkerLoop
from roll_spotlight.training.micro_batches import Contributions, GradientSum, TrainWork, UpdatePlan, UpdateSums

WAIT_MAX_S = 0.01  # the trainer's longest wait between polls for an update's last micro-batch


class GradientInboxServer:
    """The inbox's body (usable without Ray in tests when `queue` is a local QueueServer-like)."""

    def __init__(self, queue) -> None:
        self.queue = queue
        self._work: dict[int, TrainWork] = {}
        self._sums: dict[int, list[GradientSum]] = {}
        self.counters = Counter()

    def open(self, work: TrainWork) -> None:
        self._work[work.weight_version] = work
        self._sums[work.weight_version] = []

    def work(self, version: int) -> TrainWork | None:
        """The open update from `version`, or None once it closed (its leases are all DONE)."""
        return self._work.get(version)

    def report(self, worker: str, version: int, results: list[RequestResult], gradient: GradientSum) -> bool:
        """Keep `gradient` iff the queue accepts all of `results` (leases of `worker`) at once."""
        if version in self._work and self._complete_all(worker, results):
            self._sums[version].append(gradient)
            self.counters["reports_accepted"] += 1
            self.counters["micro_batches_accepted"] += len(results)
            return True
        self.counters["reports_refused"] += 1
        return False

    def _complete_all(self, worker: str, results: list[RequestResult]) -> bool:
        return bool(ray.get(self.queue.complete_all.remote(worker, results)))

    def take(self, version: int) -> list[GradientSum]:
        """The accepted sums of the update from `version`, which closes."""
        self._work.pop(version, None)
        return self._sums.pop(version, [])

    def stats(self) -> dict:
        return dict(self.counters)


GradientInbox = ray.remote(num_cpus=0)(GradientInboxServer)


def create_inbox(queue):
    """The run's gradient inbox, pinned to the driver's (on-demand) node as the queue is: on a spot
    node a preemption would take every accepted sum of the open update with it."""
    from roll_spotlight.driver_node import on_driver_node

    return GradientInbox.options(**on_driver_node()).remote(queue)


class _OwnSums:
    """The trainer's sink for one update: it reports straight to the queue (all leases or none)
    and keeps its accepted sums; a trainer ships no gradient to itself."""

    def __init__(self, client: QueueClient, work: TrainWork) -> None:
        self.client, self._work = client, work
        self.sums: list[GradientSum] = []
        self.refused = 0

    def work(self, version: int) -> TrainWork | None:
        return self._work if version == self._work.weight_version else None

    def report(self, worker: str, version: int, leases: Sequence[Lease], gradient: GradientSum) -> bool:
        accepted = self.client.complete_all(leases)
        if accepted:
            self.sums.append(gradient)
        else:
            self.refused += 1
        return accepted


class QueueTraining:
    """The trainer's side: `update(version, schedule)` is the `GradientSource` of one update.

    Its micro-batches become TRAIN requests that the trainer pulls too, with its own worker loop
    (TRAIN only) on ``compute`` (its policy, at the update's version); ``pulls`` False leaves
    every micro-batch to the workers (tests that decide who computes what)."""

    def __init__(self, queue, inbox, compute: ModelCompute, *, name: str = TRAINER, pulls: bool = True) -> None:
        self.queue, self.inbox, self.compute, self.pulls = queue, inbox, compute, pulls
        self.client = QueueClient(queue, name)

    def update(self, version: int, schedule: Schedule) -> _Update:
        return _Update(self, version, schedule)

    def gradient_sums(self, plan: UpdatePlan, version: int, schedule: Schedule) -> UpdateSums:
        """Submit the plan's micro-batches, compute what this trainer leases until every one is
        DONE, and gather the accepted sums (its own and the inbox's)."""
        t0 = time.perf_counter()
        refused_before = self._inbox_refused()
        work = TrainWork.of(plan, version, schedule)
        ray.get(self.inbox.open.remote(work))  # before the requests exist: a puller finds the work
        ids = ray.get(self.queue.submit.remote(
            [RequestSpec.train(mb, schedule, version, work.iteration) for mb in plan.micro_batches]))
        self.compute.version = version  # the trainer holds the weights the update starts from
        own = _OwnSums(self.client, work)

        def finished() -> bool:
            return ray.get(self.queue.unfinished.remote(ids)) == 0

        if self.pulls:
            WorkerLoop(self.client, self.compute, sink=own, kinds=TRAIN_ONLY).serve(idle=finished)
        else:  # each poll is a call to the queue actor the workers are calling: back off a little
            wait = POLL_MIN_S
            while not finished():
                time.sleep(wait)
                wait = min(2 * wait, WAIT_MAX_S)
        sums = own.sums + ray.get(self.inbox.take.remote(version))
        refused = own.refused + self._inbox_refused() - refused_before
        return UpdateSums(tuple(sums), Contributions.of(sums, refused, time.perf_counter() - t0))

    def _inbox_refused(self) -> int:
        return ray.get(self.inbox.stats.remote()).get("reports_refused", 0)


@dataclass(frozen=True)
class _Update:
    """`QueueTraining` bound to one update: a `training.micro_batches.GradientSource`."""

    training: QueueTraining
    version: int
    schedule: Schedule

    def __call__(self, plan: UpdatePlan) -> UpdateSums:
        return self.training.gradient_sums(plan, self.version, self.schedule)
