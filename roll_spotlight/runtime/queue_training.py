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

An SP group of workers is one puller with one report (`group_sum`): its leader pulls a batch per
rank, the ranks compute in rounds (lease i on rank i % size, a collective stop check after each
round), the ranks' sums are sum-reduced onto the leader, which reports the finished leases and
releases the rest. A member killed without notice breaks the group; the regroup requeues its
leases (`elastic.groups`), and the partial sums die with it.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Callable

import ray
import torch

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
    report it to the inbox. The worker holds the update's weight version before calling `run`.

    An SP group's ranks train data-parallel (`group_sum`): every rank calls `run` with the same
    leases (its leader's pull, `group_batch`), and the leader reports one sum for the group."""

    def __init__(self, policy, inbox) -> None:
        self.policy, self.inbox = policy, inbox
        self._work: TrainWork | None = None
        self._loss = None
        self._params = None

    def work(self, version: int) -> TrainWork | None:
        if self._work is None or self._work.weight_version != version:
            self._work = ray.get(self.inbox.work.remote(version))
        return self._work

    def run(self, worker: str, leases: list, should_stop, group=None) -> tuple[int, bool]:
        """Compute `leases` (in order, asking `should_stop()` between micro-batches) and report the
        sum as `worker`; returns (leases run, accepted). An update already closed runs nothing.
        With `group` (a `runtime.sp_group.SPRolloutGroup`) the group computes them together and
        only its leader reports (the others return (leases run, False))."""
        version = leases[0].request.weight_version
        assert all(lease.request.weight_version == version for lease in leases), "one update per batch"
        work = self.work(version)
        closed = work is None if group is None else group.any(work is None)  # a group decides together
        if closed:
            return 0, False
        self._prepare(work)
        if group is None:
            gradient = compute_sum(self._loss, self._params, work, [lease.request.micro_batch for lease in leases],
                                   worker, should_stop=should_stop)
            ran = len(gradient.indices)
        else:
            ran, gradient = group_sum(self._loss, self._params, work, leases, group, worker, should_stop)
        if gradient is None:  # a follower: its part is in the leader's sum
            return ran, False
        results = [lease.result(None) for lease in leases[:ran]]
        return ran, bool(ray.get(self.inbox.report.remote(worker, version, results, gradient)))

    def _prepare(self, work: TrainWork) -> None:
        from roll_spotlight.training.grpo import GRPOLoss, trainable_parameters

        if self._loss is None or self._loss.cfg != work.cfg:
            self._loss = GRPOLoss(self.policy, work.cfg)
            self._params = trained_parameters(self.policy, trainable_parameters(self.policy, work.cfg.trainable))


def group_batch(leases: list, degree: int, pull: Callable[[int], list]) -> list:
    """An SP group leader's batch: a TRAIN pull is topped up with `pull(n)` (TRAIN only) to one
    pull's worth per rank, since the ranks train data-parallel; other kinds stay as pulled."""
    if degree == 1 or not leases or leases[0].request.kind is not RequestKind.TRAIN:
        return leases
    return leases + pull((degree - 1) * len(leases))


def group_sum(loss, params: dict, work: TrainWork, leases: list, group, worker: str,
              should_stop: Callable[[], bool]) -> tuple[int, GradientSum | None]:
    """An SP group's sum over `leases`, data-parallel (what `sim.training` models): lease i runs on
    rank i % degree in round i // degree, each rank into its own `compute_sum`; after every round
    the ranks' `should_stop()` are combined (any), so a notice to any member ends the sum after
    the round in hand on every rank. The ranks' sums are then sum-reduced onto the leader.
    Returns how many leases finished (always a prefix: `leases[:n]`) and, on the leader, one
    GradientSum covering exactly those (None on the other ranks). A member that dies makes the
    others' collectives raise: the group breaks and the regroup requeues its leases."""
    degree, rank = group.size, group.rank
    rounds = -(-len(leases) // degree)
    mine = [leases[i].request.micro_batch if (i := k * degree + rank) < len(leases) else None for k in range(rounds)]
    done = 0

    def stop() -> bool:
        nonlocal done
        done += 1
        return group.any(should_stop())

    start = time.perf_counter()
    with group.data_parallel():
        own = compute_sum(loss, params, work, mine, worker, should_stop=stop)
    finished = min(len(leases), done * degree)
    reduced = reduce_to_leader(own, params, group)
    if reduced is None:
        return finished, None
    packed, totals = reduced
    indices = tuple(lease.request.micro_batch.index for lease in leases[:finished])
    return finished, GradientSum(worker, indices, packed.arrays, totals, time.perf_counter() - start, packed.dtypes)


def reduce_to_leader(own: GradientSum, params: dict, group):
    """Every rank's `own` sum added onto the group's leader (two sum-reduces: the gradients as
    one float32 buffer, then which parameters have one and the loss totals in float64): on the
    leader (packed gradients, loss totals), None elsewhere. A parameter no rank has a gradient
    for stays absent (the optimiser skips it, as it would a None `.grad`)."""
    from roll_spotlight.elastic.comm import sum_to
    from roll_spotlight.training.micro_batches import LOSS_TOTALS
    from roll_spotlight.weights.codec import numpy_to_state_dict, state_dict_to_numpy
    from roll_spotlight.weights.packed import NumpyStateDict

    names, device = sorted(params), group.device
    grads = numpy_to_state_dict(NumpyStateDict(own.grads, own.kinds))
    flat = torch.cat([grads[n].to(device, torch.float32).reshape(-1) if n in grads
                      else torch.zeros(params[n].numel(), dtype=torch.float32, device=device) for n in names])
    meta = torch.tensor([float(n in grads) for n in names] + [own.totals[k] for k in LOSS_TOTALS],
                        dtype=torch.float64, device=device)
    sum_to(flat, 0, group.group)
    sum_to(meta, 0, group.group)
    if not group.leader:
        return None
    present = meta[:len(names)].tolist()
    out, offset = {}, 0
    for name, has in zip(names, present):
        p = params[name]
        if has:
            out[name] = flat[offset:offset + p.numel()].view(p.shape).to(p.dtype)
        offset += p.numel()
    return state_dict_to_numpy(out), dict(zip(LOSS_TOTALS, meta[len(names):].tolist()))
