"""The simulator's model of the update through the queue (spot training): TRAIN micro-batch requests.

For a baseline whose ``training`` is ``Training.QUEUE`` the training phase submits one
TRAIN request per micro-batch (``MicroBatch``: ``train_micro_batch_images`` rows at one trained
step, chunk-major and step-minor as the runtime plans them). Every worker, on-demand or spot (an
SP group whose GPUs train data-parallel), pulls ``train_lease_micro_batches`` per GPU, computes
them in rounds of one micro-batch per GPU, and reports ONE gradient sum for the batch through
``RequestQueue.complete_all``. A spot worker's sum crosses the network into the trainer's node
(one link, first come first served); an on-demand one on the trainer's node crosses NVLink. When
every micro-batch is DONE the trainer adds, clips and steps (``optimizer_step_s``).

One lease batch::

    pull --compute rounds--> report in flight --arrives--> complete_all -> release the rest -> idle
            |                       \\--node reclaimed--> worker_lost: requeued, the sum is lost
            |--notice or regroup--> stop after the micro-batch in hand (now, if it cannot finish
            |                       and report before the deadline): report what finished
            \\--node reclaimed--> worker_lost: requeued, the partial sum is lost

Invariant: every micro-batch index of an iteration is in exactly one accepted report (the queue's
all-or-nothing ``complete_all``); ``QueueTrainer.log`` keeps every report so tests can check it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol

from roll_spotlight.dispatch.queue import RequestQueue
from roll_spotlight.dispatch.requests import Lease, RequestKind, RequestSpec, Schedule, plan_micro_batches
from roll_spotlight.elastic.group_plan import SPGroup
from roll_spotlight.sim.gpu_inventory import GpuKind, Member, Phase
from roll_spotlight.sim.costmodel import CostModel
from roll_spotlight.sim.events import EventHandle, EventLoop

TRAINER_NODE = "od0"   # the optimizer's owner: the first on-demand node
_EPS = 1e-9


@dataclass(frozen=True)
class TrainReport:
    """One gradient sum as it reached the trainer (accepted or refused)."""

    iteration: int
    worker: str
    kind: str
    indices: tuple[int, ...]
    accepted: bool
    at_s: float


@dataclass
class TrainRun:
    """A worker's lease batch: lease i runs on GPU ``i % degree`` in round ``i // degree``."""

    leases: list[Lease]
    start: float
    degree: int
    mb_s: float
    rounds_done: int | None = None          # set when the worker stops computing
    done_event: EventHandle | None = None
    stop_event: EventHandle | None = None
    report_event: EventHandle | None = None

    @property
    def token(self) -> int:
        return self.leases[0].lease_id

    @property
    def rounds(self) -> int:
        return math.ceil(len(self.leases) / self.degree)

    def finished(self) -> list[Lease]:
        return self.leases[: (self.rounds_done or 0) * self.degree]

    def gpu_s(self, until: float) -> float:
        """GPU-seconds computed by ``until`` (whole and partial micro-batches)."""
        return sum(min(max(until - self.start - (i // self.degree) * self.mb_s, 0.0), self.mb_s)
                   for i in range(len(self.leases)))

    def started(self, until: float) -> int:
        return min(len(self.leases), math.ceil((until - self.start) / self.mb_s - _EPS) * self.degree)

    def cancel(self) -> None:
        for handle in (self.done_event, self.stop_event, self.report_event):
            if handle is not None:
                handle.cancel()


class SimWorker(Protocol):
    """What the trainer reads of a simulated worker (``system.SimWorker``)."""

    wid: str
    group: SPGroup
    kind: GpuKind
    train: TrainRun | None

    @property
    def members(self) -> tuple[Member, ...]: ...


class TrainingHost(Protocol):
    """What the trainer needs of its simulation (``system.ClusterSimulation``, which imports this
    module; the protocol keeps the import one way)."""

    loop: EventLoop
    queue: RequestQueue
    cost: CostModel
    config: Any
    workers: Mapping[str, SimWorker]
    _lost_gpu_s: float
    _iteration: int
    _version: int

    def _schedule(self, kind: RequestKind) -> Schedule: ...
    def _set_phase(self, members: Iterable[Member], phase: Phase) -> None: ...
    def _worker_deadline(self, w: SimWorker) -> float | None: ...
    def _after_run(self, w: SimWorker) -> None: ...
    def _wake_all(self) -> None: ...
    def _train_done(self) -> None: ...


class QueueTrainer:
    """The training phase of ``Training.QUEUE`` for one simulation."""

    def __init__(self, sim: TrainingHost) -> None:
        self.sim = sim
        self.mb_s = sim.cost.train_micro_batch_s(sim.config.resolution)
        self.outstanding = 0
        self.ingress_free_at = 0.0
        self.log: list[TrainReport] = []
        self.lost_micro_batches = 0

    # ---- the phase
    def begin(self, images: int) -> None:
        """Submit the iteration's micro-batches (the weights being trained are the current version)."""
        sim, cost = self.sim, self.sim.cost
        schedule = sim._schedule(RequestKind.ROLLOUT)
        plan = plan_micro_batches(range(images), range(int(cost.trained_steps)), int(cost.train_micro_batch_images))
        specs = [RequestSpec.train(mb, schedule, sim._version, sim._iteration) for mb in plan]
        self.outstanding = len(specs)
        sim.queue.submit(specs)

    def pull(self, w: SimWorker) -> None:
        """Lease up to ``train_lease_micro_batches`` per GPU; a noticed worker only what it can
        compute and report before its deadline."""
        sim, now = self.sim, self.sim.loop.now
        per_gpu = int(sim.cost.train_lease_micro_batches)
        report_s = self._report_s(w)
        deadline = sim._worker_deadline(w)
        if deadline is not None:
            per_gpu = min(per_gpu, math.floor((deadline - now - report_s) / self.mb_s))
            if per_gpu < 1:
                return
        leases = sim.queue.pull(w.wid, per_gpu * w.group.degree, now=now, kinds={RequestKind.TRAIN},
                                est_duration_s=per_gpu * self.mb_s + report_s)
        if leases:
            self._start(w, leases)

    def _start(self, w: SimWorker, leases: list[Lease]) -> None:
        run = TrainRun(leases, self.sim.loop.now, w.group.degree, self.mb_s)
        w.train = run
        run.done_event = self.sim.loop.after(run.rounds * self.mb_s, self._on_stop, w.wid, run.token, run.rounds)
        busy = w.members[: len(leases)]
        self.sim._set_phase(busy, Phase.TRAIN)
        self.sim._set_phase(w.members[len(leases):], Phase.IDLE)

    # ---- stopping early: a notice, or the group is dissolved by a regroup
    def stop_for_notice(self, w: SimWorker, deadline: float) -> None:
        """Finish the micro-batch in hand if it and the report fit before ``deadline``, else report
        what already finished now; unstarted micro-batches go back to the queue (as the runtime's
        worker does: it asks before each micro-batch whether to stop). Later pulls get only what
        fits before the deadline (``pull``)."""
        run, now = w.train, self.sim.loop.now
        if run is None or run.rounds_done is not None:
            return
        report_s = self._report_s(w)
        done = math.floor((now - run.start) / self.mb_s + _EPS)
        end_in_hand = run.start + (done + 1) * self.mb_s
        if done < run.rounds and end_in_hand + report_s <= deadline:
            self._schedule_stop(w, end_in_hand, done + 1)
        else:
            self._schedule_stop(w, now, done)

    def stop_for_dissolve(self, w: SimWorker) -> float:
        """Stop after the micro-batch in hand and report; returns when the GPUs are free (about)."""
        run = w.train
        assert run is not None
        if run.rounds_done is not None:
            return self.busy_until(w)
        rounds = min(run.rounds, math.floor((self.sim.loop.now - run.start) / self.mb_s + _EPS) + 1)
        at = run.start + rounds * self.mb_s
        self._schedule_stop(w, at, rounds)
        return at + self._report_s(w)

    def _schedule_stop(self, w: SimWorker, at: float, rounds: int) -> None:
        run = w.train
        if run.stop_event is not None and run.stop_event.pending and run.stop_event.time <= at:
            return
        if run.stop_event is not None:
            run.stop_event.cancel()
        run.stop_event = self.sim.loop.schedule(at, self._on_stop, w.wid, run.token, rounds)

    def _on_stop(self, wid: str, token: int, rounds: int) -> None:
        """The worker stops computing after ``rounds`` rounds: what is partly done is lost."""
        w = self.sim.workers.get(wid)
        run = None if w is None else w.train
        if run is None or run.token != token or run.rounds_done is not None:
            return
        now = self.sim.loop.now
        for handle in (run.done_event, run.stop_event):
            if handle is not None:
                handle.cancel()
        run.rounds_done = rounds
        finished = len(run.finished())
        partial_s = run.gpu_s(now) - finished * self.mb_s
        if partial_s > _EPS:
            self.sim._lost_gpu_s += partial_s
            self.lost_micro_batches += run.started(now) - finished
        if finished:
            self._send(w)
        else:
            self._close(w)

    # ---- the report
    def _over_network(self, w: SimWorker) -> bool:
        return w.kind is GpuKind.SPOT or any(node != TRAINER_NODE for node, _ in w.members)

    def _report_s(self, w: SimWorker) -> float:
        return self.sim.cost.gradient_report_s(self._over_network(w), w.group.degree)

    def _send(self, w: SimWorker) -> None:
        """The group sums over NVLink, then the sum crosses its link; the trainer's network link
        carries one sum at a time."""
        cost, now = self.sim.cost, self.sim.loop.now
        network = self._over_network(w)
        link_s = cost.gradient_report_s(network)
        start = now + cost.gradient_report_s(network, w.group.degree) - link_s
        if network:
            start = max(start, self.ingress_free_at)
            self.ingress_free_at = start + link_s
        w.train.report_event = self.sim.loop.schedule(start + link_s, self._on_report, w.wid, w.train.token)
        self.sim._set_phase(w.members, Phase.REPORT)

    def _on_report(self, wid: str, token: int) -> None:
        sim = self.sim
        w = sim.workers.get(wid)
        run = None if w is None else w.train
        if run is None or run.token != token:
            return
        finished = run.finished()
        accepted = sim.queue.complete_all(wid, [lease.result(None) for lease in finished], now=sim.loop.now)
        self.log.append(TrainReport(sim._iteration, wid, w.kind.value,
                                    tuple(lease.request.micro_batch.index for lease in finished), accepted,
                                    sim.loop.now))
        if accepted:
            self.outstanding -= len(finished)
        else:
            sim._lost_gpu_s += len(finished) * self.mb_s
            self.lost_micro_batches += len(finished)
        self._close(w)
        if accepted and self.outstanding == 0:
            sim._train_done()

    def _close(self, w: SimWorker) -> None:
        """End the lease batch: unstarted (or abandoned) micro-batches go back to PENDING."""
        released = self.sim.queue.release(w.wid)
        w.train = None
        self.sim._after_run(w)
        if released:
            self.sim._wake_all()

    # ---- a kill
    def lose(self, w: SimWorker) -> None:
        """The node is gone without a report: everything since the last accepted report is lost
        (the queue requeues it)."""
        run, now = w.train, self.sim.loop.now
        assert run is not None
        run.cancel()
        if run.rounds_done is None:
            self.sim._lost_gpu_s += run.gpu_s(now)
            self.lost_micro_batches += run.started(now)
        else:
            self.sim._lost_gpu_s += len(run.finished()) * self.mb_s
            self.lost_micro_batches += len(run.finished())
        self.sim.queue.worker_lost(w.wid)
        w.train = None

    def busy_until(self, w: SimWorker) -> float:
        """When the worker's GPUs stop: its report's arrival, else its next stop."""
        run = w.train
        assert run is not None
        if run.rounds_done is not None:
            return run.report_event.time if run.report_event is not None else self.sim.loop.now
        return min(h.time for h in (run.done_event, run.stop_event) if h is not None and h.pending)

    # ---- results
    def summary(self, iterations: int) -> dict[str, float]:
        accepted = [r for r in self.log if r.accepted]
        trained = sum(len(r.indices) for r in accepted)
        on_spot = sum(len(r.indices) for r in accepted if r.kind == GpuKind.SPOT.value)
        return {"micro_batches_per_iteration": trained / iterations,
                "micro_batch_s": self.mb_s,
                "spot_share": on_spot / trained if trained else 0.0,
                "reports": len(accepted), "refused_reports": len(self.log) - len(accepted),
                "lost_micro_batches": self.lost_micro_batches}
