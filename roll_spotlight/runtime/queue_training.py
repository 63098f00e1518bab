"""Training micro-batches through the request queue: the trainer's runner, the gradient inbox,
and the worker's side (`spot.training_phase: train | auto`; docs/design.md section 3).

    trainer (TrainerActor, ROLL rank 0)             on-demand and spot rollout workers
      QueueMicroBatches.run:
        inbox.open(work) ------------------------>  inbox.work(version)       (once per update)
        queue.submit(one TRAIN request per micro-batch)
        pull TRAIN leases, compute, complete_all    pull TRAIN leases -> compute_sum -> inbox.report
        ... until every micro-batch is DONE            inbox: queue.complete_all(leases) -> keep the sum
        own sums + inbox.take(version) -> combine -> .grad -> clip, step, publish (as before)

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

import logging
import time
from collections import Counter
from typing import Callable

import ray

from roll_spotlight.dispatch.actor import QueueClient
from roll_spotlight.dispatch.requests import RequestKind, RequestResult, RequestSpec, Schedule
from roll_spotlight.training.micro_batches import GradientSum, TrainWork, combine, compute_sum

log = logging.getLogger(__name__)
TRAINER = "trainer"  # the trainer's name in the queue
TRAIN_ONLY = (RequestKind.TRAIN,)
BY_WORKER = "train/by_worker"  # the trainer's per-worker accounting, split by `training_split`


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
    return GradientInbox.remote(queue)


class QueueMicroBatches:
    """The trainer's runner (`training.micro_batches`) for queue training: the update's
    micro-batches become TRAIN requests that the trainer pulls too (module docstring).

    `begin(version, schedule)` names the update before `FlowGRPOTrainer.step`; `last` holds the
    last update's accounting: micro-batches and compute seconds per worker, refused reports (the
    trainer's and the inbox's) and the wall time of the phase. `pulls` False leaves every micro-batch to the
    workers (tests that decide who computes what).
    """

    def __init__(self, queue, inbox, *, name: str = TRAINER, poll_s: float = 0.002, pulls: bool = True) -> None:
        self.queue, self.inbox, self.poll_s, self.pulls = queue, inbox, poll_s, pulls
        self.client = QueueClient(queue, name)
        self.version: int | None = None
        self.schedule: Schedule | None = None
        self.last: dict = {}

    def begin(self, version: int, schedule: Schedule) -> None:
        self.version, self.schedule, self.last = version, schedule, {}

    def run(self, trainer, batch, advantages, norm: int, plan) -> dict[str, float]:
        assert self.version is not None, "QueueMicroBatches.begin(version, schedule) before each update"
        if trainer.sync.world_size != 1:
            raise ValueError("queue training runs on one trainer rank (the others are workers that pull)")
        t0 = time.perf_counter()
        refused_before = self._inbox_refused()
        work = TrainWork(self.version, batch, advantages, norm, tuple(plan), trainer.cfg, self.schedule)
        ray.get(self.inbox.open.remote(work))  # before the requests exist: a puller finds the work
        ids = ray.get(self.queue.submit.remote(
            [RequestSpec.train(mb, self.schedule, self.version, work.iteration) for mb in plan]))
        params = trained_parameters(trainer.policy, trainer.params)
        own, refused = self._drain(trainer.loss, params, work, ids)
        sums = own + ray.get(self.inbox.take.remote(self.version))
        grads, totals = combine(sums, [mb.index for mb in plan], trainer.policy.device)
        for name, p in params.items():
            p.grad = grads.get(name)
        self.last = self._accounting(sums, refused + self._inbox_refused() - refused_before,
                                     time.perf_counter() - t0)
        self.version = None
        return totals

    def _drain(self, loss, params, work: TrainWork, ids: list[int]) -> tuple[list[GradientSum], int]:
        """Pull and compute TRAIN leases until every request of `ids` is DONE; the accepted sums."""
        own, refused, idle = [], 0, self.poll_s
        while True:
            leases = self.client.pull_batch(kinds=TRAIN_ONLY) if self.pulls else []
            if leases:
                idle = self.poll_s
                gradient = compute_sum(loss, params, work, [lease.request.micro_batch for lease in leases],
                                       self.client.worker)
                if self.client.complete_all(leases):
                    own.append(gradient)
                else:
                    refused += 1
                continue
            if ray.get(self.queue.unfinished.remote(ids)) == 0:
                return own, refused
            time.sleep(idle)  # others hold the rest: wait for their reports (or their leases back)
            idle = min(2 * idle, 0.05)

    def metrics(self) -> dict:
        """The last update's accounting as metrics: totals, and under ``train/by_worker`` the
        micro-batches and compute seconds per worker (the driver splits them by kind of worker).
        Empty for an update with nothing to train on (every group zero-std: no micro-batches)."""
        last = self.last
        if not last:
            return {}
        counts = last["micro_batches"]
        return {"train/micro_batches": float(sum(counts.values())),
                "train/micro_batches_trainer": float(counts.get(self.client.worker, 0)),
                "train/reports_refused": float(last["refused"]), "train/queue_phase_s": last["wall_s"],
                BY_WORKER: {w: (counts[w], last["seconds"][w]) for w in counts}}

    def _inbox_refused(self) -> int:
        return ray.get(self.inbox.stats.remote()).get("reports_refused", 0)

    def _accounting(self, sums: list[GradientSum], refused: int, seconds: float) -> dict:
        by_worker: Counter = Counter()
        busy: Counter = Counter()
        for s in sums:
            by_worker[s.worker] += len(s.indices)
            busy[s.worker] += s.seconds
        return {"micro_batches": dict(by_worker), "seconds": dict(busy), "refused": refused, "wall_s": seconds}


def training_split(by_worker: dict[str, tuple[int, float]], is_spot: Callable[[str], bool]) -> dict[str, float]:
    """Who computed an update's micro-batches (``by_worker``: name -> (micro-batches, compute
    seconds), `QueueMicroBatches.metrics`), by kind of worker (``is_spot``: the spot pool's), and
    the training time the spot workers saved, measured: their micro-batches at the on-demand
    participants' measured rate (micro-batches per second). The metrics every host reports."""
    spot = {w for w in by_worker if is_spot(w)}
    mb = {kind: sum(n for w, (n, _) in by_worker.items() if (w in spot) == (kind == "spot")) for kind in ("spot", "od")}
    od_rate = sum(n / s for w, (n, s) in by_worker.items() if w not in spot and s > 0)
    saved = mb["spot"] / od_rate if od_rate > 0 else 0.0
    return {"train/micro_batches_spot": float(mb["spot"]), "train/micro_batches_ondemand": float(mb["od"]),
            "train/workers": float(len(by_worker)), "train/spot_workers": float(len(spot)),
            "train/spot_saved_s": saved}


def trained_parameters(policy, trained) -> dict:
    """The policy's parameters that train (`trained`, a list of them), by name."""
    ids = {id(p) for p in trained}
    return {name: p for name, p in policy.named_parameters() if id(p) in ids}


class WorkerTraining:
    """A rollout worker's side of queue training: run TRAIN leases of one update into one sum and
    report it to the inbox. The worker holds the update's weight version before calling `run`."""

    def __init__(self, policy, inbox) -> None:
        self.policy, self.inbox = policy, inbox
        self._work: TrainWork | None = None
        self._loss = None
        self._params = None

    def work(self, version: int) -> TrainWork | None:
        if self._work is None or self._work.weight_version != version:
            self._work = ray.get(self.inbox.work.remote(version))
        return self._work

    def run(self, worker: str, leases: list, should_stop) -> tuple[int, bool]:
        """Compute `leases` (in order, asking `should_stop()` between micro-batches) and report the
        sum as `worker`; returns (leases run, accepted). An update already closed runs nothing."""
        from roll_spotlight.training.grpo import GRPOLoss, trainable_parameters

        version = leases[0].request.weight_version
        assert all(lease.request.weight_version == version for lease in leases), "one update per batch"
        work = self.work(version)
        if work is None:
            return 0, False
        if self._loss is None or self._loss.cfg != work.cfg:
            self._loss = GRPOLoss(self.policy, work.cfg)
            self._params = trained_parameters(self.policy, trainable_parameters(self.policy, work.cfg.trainable))
        gradient = compute_sum(self._loss, self._params, work, [lease.request.micro_batch for lease in leases],
                               worker, should_stop=should_stop)
        ran = leases[:len(gradient.indices)]
        results = [lease.result(None) for lease in ran]
        return len(ran), bool(ray.get(self.inbox.report.remote(worker, version, results, gradient)))
