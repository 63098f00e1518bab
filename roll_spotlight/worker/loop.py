"""The one worker loop: what a worker does between two leases, whatever hosts it.

    until a stop, notice or leave (or nothing to lease and `idle()` says end):
        lease a batch of this worker's kinds        (reporting the last batch in the same call;
                                                     an SP group's leader pulls for the group)
        TRAIN batch: hold its weight version, compute the micro-batches into one gradient sum
                     (`Compute.gradient_sum`), report it to the sink: all accepted or none
        other kinds, lease by lease: hold its weight version, run it (`Compute.rollout`);
                     finished -> reported with the next pull; stopped by a notice -> committed
        between leases and micro-batches: heartbeat the batch's leases; a stop, notice or leave
        ends the batch (finished ones completed, the one in flight committed, the rest released)

Hosts supply the transport (a `dispatch.queue_actor.QueueClient` over the queue actor) and the compute
(`Compute`): the Ray rollout worker (`worker.actor`), the ROLL rollout strategy
(`roll.strategy`), the trainer pulling its own update's micro-batches (`runtime.queue_training`),
and emulated compute (`worker.emulated`). In an SP group (`worker.sp_group`) the leader alone
talks to the queue; every decision is a collective, so the ranks never disagree where a batch
ended.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from roll_spotlight.dispatch.requests import InFlightState, Lease, MicroBatch, RequestKind
from roll_spotlight.worker.outputs import Committed, Finished

TRAIN_ONLY = (RequestKind.TRAIN,)
POLL_MIN_S, POLL_MAX_S = 0.002, 0.05  # idle polling backs off between these


class Compute(Protocol):
    """The work itself, with no queue in sight: a model (`worker.compute.ModelCompute`) or
    calibrated durations (`worker.emulated.EmulatedCompute`)."""

    def hold_version(self, version: int) -> None:
        """Have the weights of ``version`` in hand (fetch them if another version is held)."""

    def rollout(self, lease: Lease, should_stop: Callable[[], bool],
                on_checkpoint: Callable[[InFlightState], None] | None, *, decode: bool) -> Committed | Finished:
        """Run a rollout or explore lease, asking ``should_stop()`` after every step but the last."""

    def gradient_sum(self, work, micro_batches: Sequence[MicroBatch], worker: str,
                     should_stop: Callable[[], bool], group=None) -> tuple[int, object | None]:
        """Compute ``micro_batches`` of ``work`` (a `training.micro_batches.TrainWork`) into one
        `GradientSum` named ``worker``, asking ``should_stop()`` after each (each round, in a
        group); (how many finished, the sum: None on an SP group's other ranks)."""


class GradientSink(Protocol):
    """Where a worker's gradient sums go: the run's gradient inbox, or the trainer itself."""

    def work(self, version: int):
        """The open update from ``version`` (a `TrainWork`), or None once it closed."""

    def report(self, worker: str, version: int, leases: Sequence[Lease], gradient) -> bool:
        """Hand in the sum over ``leases``; True if the queue accepted all of them."""


class Signals:
    """What ends a worker's loop, set from other threads: ``stop`` (after the lease in hand),
    ``notice`` (a preemption: commit after the step in hand), ``leave`` (a regroup: like a notice,
    but the worker stays for its next group). ``wake`` is set by any of them."""

    def __init__(self) -> None:
        self.stop, self.notice, self.leave, self.wake = (threading.Event() for _ in range(4))

    def set(self, event: threading.Event) -> None:
        event.set()
        self.wake.set()

    def begin(self) -> None:
        """A new run of the loop: a leave (and its wake) belonged to the last one."""
        self.leave.clear()
        if not (self.notice.is_set() or self.stop.is_set()):
            self.wake.clear()

    def ending(self) -> bool:
        return self.stop.is_set() or self.notice.is_set() or self.leave.is_set()

    def interrupting(self) -> bool:
        """A rollout in flight must stop after this step (a stop lets it finish)."""
        return self.notice.is_set() or self.leave.is_set()


class WorkerLoop:
    """One worker's pull loop over the queue (module docstring). ``name`` names the worker in
    its timeline; ``client.worker`` is the name the queue knows it by (its SP group's, in a group).
    ``kinds`` restricts what it leases (None: every kind); TRAIN only with a ``sink``.
    ``on_progress(kind, reached)`` observes each denoising step reached ("step", its index in the
    trajectory) and each micro-batch of the worker's life ("micro_batch", their count) before the
    loop reads its signals: deterministic failure injection parks there (`worker.faults`)."""

    def __init__(self, client, compute: Compute, *, name: str | None = None, sink: GradientSink | None = None,
                 kinds: Sequence[RequestKind] | None = None, heartbeat_s: float = 5.0,
                 signals: Signals | None = None, on_progress: Callable[[str, int], None] | None = None) -> None:
        self.client, self.compute, self.sink = client, compute, sink
        self.on_progress = on_progress
        self.name = name or client.worker
        self.kinds = tuple(kinds) if kinds is not None else None
        self.heartbeat_s = heartbeat_s  # keep well under the queue's lease_s (30 s by default)
        self.signals = signals or Signals()
        self.group = None
        self.counters = {"completed": 0, "committed": 0, "steps": 0, "micro_batches": 0,
                         "micro_batches_refused": 0, "micro_batches_released": 0}
        self.events: list[dict] = []
        self._queue_use = {"calls": 0, "queue_s": 0.0, "run_s": 0.0, "empty_pulls": 0, "idle_s": 0.0}
        self._progress: tuple[int, int] | None = None  # (steps reached, last step the queue holds)
        self._unreported = 0  # steps of finished leases whose results are not yet with the queue
        self._extended = 0.0  # time.monotonic() when the queue last extended this worker's leases
        self._last_call_s = 0.0
        self._queue_since = 0.0  # queue round trips since the last timeline event (it carries them)
        self._micro_batches_run = 0  # in this worker's life, rounds in an SP group

    @property
    def leader(self) -> bool:
        return self.group is None or self.group.leader

    def serve(self, idle: Callable[[], bool] = lambda: False, group=None) -> dict:
        """Lease and run until a signal ends the loop, or a pull leases nothing and ``idle()`` is
        True (a drain; it must answer alike on every rank of ``group``). Returns the counters.
        A failure in a group (a member died) abandons the group on the way out, so that every
        other rank fails at once too (`worker.sp_group`)."""
        self.signals.begin()
        self.group = group
        try:
            return self._serve(idle)
        except Exception as err:
            if group is not None:
                group.abandon(err)
            raise

    def _serve(self, idle: Callable[[], bool]) -> dict:
        done, wait = [], POLL_MIN_S
        while not self._any(self.signals.ending()):
            leases = self._lead(lambda: self._lease(done))
            done = []
            if not leases:
                if idle():
                    break
                if self.leader:  # an SP group's other ranks wait in the next collective
                    time.sleep(wait)
                    wait = min(2 * wait, POLL_MAX_S)
                continue
            wait = POLL_MIN_S
            done = self._run_batch(leases)
        if self.leader:
            self._report(done)
        return dict(self.counters)

    def notice(self, seconds_left: float) -> None:
        """A preemption notice: the queue hears of it under the name it knows (it leases this
        worker nothing more), and the loop commits after the step in hand."""
        self.client.notify_preemption(seconds_left)
        self._event("notice", time.time())
        self.signals.set(self.signals.notice)

    # ---- one group's collective decisions (a solo worker decides alone) ----
    def _any(self, flag: bool) -> bool:
        return flag if self.group is None else self.group.any(flag)

    def _lead(self, pull: Callable[[], list]) -> list:
        return pull() if self.group is None else self.group.lead(pull)

    # ---- leasing and reporting ----
    def _queue_call(self, method: str, *args, **kwargs):
        """``self.client.<method>(...)``, its time counted in `queue_use()`."""
        start = time.perf_counter()
        try:
            return getattr(self.client, method)(*args, **kwargs)
        finally:
            self._last_call_s = time.perf_counter() - start
            self._queue_use["calls"] += 1
            self._queue_use["queue_s"] += self._last_call_s
            self._queue_since += self._last_call_s

    def _kinds(self) -> tuple[RequestKind, ...] | None:
        """What this worker leases: its kinds, less training micro-batches without a sink."""
        if self.sink is not None:
            return self.kinds
        return tuple(k for k in (self.kinds or RequestKind) if k is not RequestKind.TRAIN)

    def _lease(self, done: list) -> list:
        """Report the finished ``(lease, output)`` pairs of the last batch and lease the next one
        in one round trip; an SP group's TRAIN batch is topped up to one pull's worth per rank
        (its ranks train data-parallel)."""
        kinds = self._kinds()
        if done:
            _, leases = self._queue_call("complete_and_pull", done, kinds=kinds)
            self._unreported = 0
        else:
            leases = self._queue_call("pull_batch", kinds=kinds)
        if not leases:  # idle polling: time with nothing to do, not the queue's cost
            self._queue_use["empty_pulls"] += 1
            self._queue_use["idle_s"] += self._last_call_s
            self._queue_use["queue_s"] -= self._last_call_s
            self._queue_since -= self._last_call_s
            return leases
        self._extended = time.monotonic()
        if self.group is not None and self.group.size > 1 and leases[0].request.kind is RequestKind.TRAIN:
            leases = leases + self._queue_call("pull", (self.group.size - 1) * len(leases), kinds=TRAIN_ONLY)
        return leases

    def _report(self, done: list) -> None:
        """Complete finished ``(lease, output)`` pairs without leasing more (the loop is ending)."""
        if done:
            self._queue_call("complete_many", done)
            self._unreported = 0

    def _keep_leases(self) -> None:
        """Extend the batch's unstarted leases (one heartbeat for all) when ``heartbeat_s`` has
        passed since the queue last did: a batch outlives one lease otherwise."""
        if time.monotonic() - self._extended >= self.heartbeat_s:
            self._queue_call("heartbeat")
            self._extended = time.monotonic()

    # ---- running a batch ----
    def _run_batch(self, leases: list) -> list:
        """Run ``leases`` in order; returns the finished ``(lease, output)`` pairs for the next pull
        to report (a follower's list stays empty). Between leases a stop, notice or leave (on any
        rank of a group) ends the batch: the leader completes what finished, its commit of the
        lease in flight is already in, and it releases the leases not started; returns []."""
        if leases[0].request.kind is RequestKind.TRAIN:  # a batch of TRAIN leases has no other kind
            self._train_batch(leases)
            return []
        done, started = [], 0
        for lease in leases:
            if started and self._any(self.signals.ending()):
                break
            if started and self.leader:
                self._keep_leases()
            started += 1
            outcome = self._run(lease)
            if not isinstance(outcome, Finished):
                break  # committed (a notice or leave in flight)
            if self.leader:
                done.append((lease, outcome.output))
        else:
            return done
        if self.leader:
            self._report(done)
            if started < len(leases):
                self._queue_call("release")  # the unstarted ones: every lease still held
        return []

    def _train_batch(self, leases: list) -> None:
        """Compute a batch of TRAIN leases into one gradient sum and report it (in an SP group
        every rank computes its share and the leader reports the group's sum). A stop, notice or
        leave between micro-batches ends the sum: what finished is reported, the rest handed
        back. A refused report (a lease revoked meanwhile) has the queue requeue it; an update
        that closed meanwhile runs nothing."""
        t0 = time.time()
        version = leases[0].request.weight_version
        assert all(lease.request.weight_version == version for lease in leases), "one update per batch"
        work = self.sink.work(version)
        ran, accepted = 0, False
        if not self._any(work is None):
            self._hold(version)
            ran, gradient = self.compute.gradient_sum(work, [lease.request.micro_batch for lease in leases],
                                                      self.client.worker, self._between_micro_batches, self.group)
            if self.leader:
                accepted = self.sink.report(self.client.worker, version, leases[:ran], gradient)
        if self.leader:
            self.counters["micro_batches" if accepted else "micro_batches_refused"] += ran
            if ran < len(leases):
                self.counters["micro_batches_released"] += self._queue_call("release")
        self._record("train", t0, micro_batches=ran, accepted=accepted)

    def _between_micro_batches(self) -> bool:
        """After each micro-batch of a sum (each round, in a group): keep the batch's leases alive
        and say whether the sum must end here."""
        self._micro_batches_run += 1
        if self.on_progress is not None:
            self.on_progress("micro_batch", self._micro_batches_run)
        if self.leader:
            self._keep_leases()
        return self.signals.ending()

    def _run(self, lease: Lease) -> Committed | Finished:
        """Run one lease; the leader commits it if it stopped early. Returns the outcome (a
        finished one is reported with the batch)."""
        t0 = time.time()
        start = lease.resume.step_index if lease.resume is not None else 0
        self._progress = (start, start)
        self._hold(lease.request.weight_version)
        should_stop = self._should_stop if self.group is None else (lambda: self.group.any(self._should_stop()))
        outcome = self.compute.rollout(lease, should_stop, self._checkpoint if self.leader else None,
                                       decode=self.leader)
        self._progress = None
        self.counters["steps"] += outcome.steps_run
        self._queue_use["run_s"] += time.time() - t0
        if self.leader and isinstance(outcome, Finished):
            self._unreported += outcome.steps_run  # lost if killed before the batch is reported
            self.counters["completed"] += 1
        elif self.leader:
            self._queue_call("commit", outcome.state)
            self.counters["committed"] += 1
        self._record(lease.request.kind.value, t0)
        if self.leader and not isinstance(outcome, Finished):
            self._event("commit", time.time())
        return outcome

    def _should_stop(self) -> bool:
        """Polled by the compute after every step but the last: counts progress."""
        step, durable = self._progress
        self._progress = (step + 1, durable)
        if self.on_progress is not None:
            self.on_progress("step", step + 1)
        return self.signals.interrupting()

    def _checkpoint(self, state: InFlightState) -> None:
        self._queue_call("checkpoint", state)
        self._progress = (self._progress[0], state.step_index)

    def _hold(self, version: int) -> None:
        """The compute holds ``version``; a fetch it took is a timeline phase of its own."""
        if version != self.compute.version:
            t0 = time.time()
            self.compute.hold_version(version)
            self._record("fetch", t0)

    def _record(self, phase: str, start: float, **extra) -> None:
        """A timeline phase, with the queue round trips since the last one (``queue_s``)."""
        queue_s, self._queue_since = self._queue_since, 0.0
        self.events.append({"worker": self.name, "phase": phase, "start": start, "end": time.time(),
                            "queue_s": queue_s} | extra)

    def _event(self, phase: str, at: float) -> None:
        self.events.append({"worker": self.name, "phase": phase, "start": at, "end": at})

    # ---- what the host reports ----
    def unsaved_steps(self) -> int:
        """Denoising steps of the lease in hand (and of finished, unreported ones) that the queue
        does not hold: what a kill right now would throw away. 0 on an SP group's other ranks
        (the leader counts the group's)."""
        if not self.leader:
            return 0
        progress = self._progress
        return self._unreported + (0 if progress is None else progress[0] - progress[1])

    def queue_use(self) -> dict:
        """The worker's time with the queue: ``calls`` (every pull, report, commit, checkpoint,
        heartbeat and release), ``queue_s`` their round trips but for the ``empty_pulls`` (pulls
        that leased nothing: idle polling, their ``idle_s`` apart), beside ``run_s`` (running
        leases); ``queue_s / (queue_s + run_s)`` is the queue's share of a busy worker's time."""
        return dict(self._queue_use)
