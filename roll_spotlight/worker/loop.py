"""The one worker loop: what a worker does between two leases, whatever hosts it.

    until a stop, notice or leave (or nothing to lease and `idle()` says end):
        lease a batch of this worker's kinds        (reporting the last batch in the same call;
                                                     an SP group's leader pulls for the group)
        group the leases by shape (`Request.batch_shape`), then group by group:
        TRAIN: hold its weight version, compute the micro-batches into one gradient sum
               (`Compute.gradient_sum`), report it to the sink: all accepted or none
        other kinds: hold its weight version, denoise up to `Compute.max_batch` together
               (`Compute.denoise_batch`); at each step boundary the finished rows are kept for the
               next report, and free slots refill from the group, else from the queue (step-level
               batching); a notice or leave commits every row in flight, each on its own
        between steps and micro-batches: heartbeat the leases; a stop ends the batch after its
        rows finish, a notice or leave at the step boundary (finished ones completed, rows in
        flight committed, the rest released)

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

from roll_spotlight.dispatch.requests import InFlightState, Lease, MicroBatch, RequestKind, check_one_shape
from roll_spotlight.worker.outputs import Committed, Finished, StepReport

TRAIN_ONLY = (RequestKind.TRAIN,)
POLL_MIN_S, POLL_MAX_S = 0.002, 0.05  # idle polling backs off between these


class Compute(Protocol):
    """The work itself, with no queue in sight: a model (`worker.compute.ModelCompute`) or
    calibrated durations (`worker.emulated.EmulatedCompute`)."""

    def hold_version(self, version: int) -> None:
        """Have the weights of ``version`` in hand (fetch them if another version is held)."""

    max_batch: int
    """Rollout and explore leases it denoises in one forward per step (``sampling.max_batch``)."""

    def denoise_batch(self, leases: Sequence[Lease], at_boundary: Callable[[StepReport], Sequence[Lease] | None],
                      on_checkpoint: Callable[[InFlightState], None] | None, *,
                      decode: bool) -> list[tuple[Lease, Committed]]:
        """Denoise ``leases`` (one shape, at most ``max_batch``) and the leases ``at_boundary``
        returns at each step boundary, until no row is left or it returns None; the rows then in
        flight, each committed (`worker.engine.RolloutEngine.denoise_batch`)."""

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
    ``on_progress(kind, reached)`` observes each step boundary of a batch ("step", the step index
    its most advanced running row reached in its trajectory) and each micro-batch of the worker's
    life ("micro_batch", their count) before the loop reads its signals: deterministic failure
    injection parks there (`worker.faults`)."""

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
        self._rows: dict[int, tuple[int, int]] = {}  # request id -> (step reached, last step the queue holds)
        self._waiting: list[Lease] = []  # leased, not started
        self._done: list = []  # finished (lease, output) pairs not yet reported
        self._shape: tuple | None = None  # the batch in hand's (`Request.batch_shape`)
        self._refilling = True  # the batch in hand may still pull refills from the queue
        self._batch_rows = self._batch_steps = 0  # rows the batch in hand took in, and steps they ran
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

    def _lease(self, done: list, n: int | None = None) -> list:
        """Report the finished ``(lease, output)`` pairs of the last batch and lease the next one
        in one round trip (up to ``n``; None: ``max_batch`` for a batching worker, else the queue's
        ``dispatch.pull_batch``: a batch-1 worker amortises round trips over pulled leases, a
        batching one pulls what its slots take); an SP group's TRAIN batch is topped up to one
        pull's worth per rank (its ranks train data-parallel)."""
        kinds = self._kinds()
        n = n or (self.compute.max_batch if self.compute.max_batch > 1 else None)
        if done:
            _, leases = self._queue_call("complete_and_pull", done, n, kinds=kinds)
            self._unreported = 0
        else:
            leases = self._queue_call("pull_batch", n, kinds=kinds)
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
        """Run ``leases`` group by group (one shape each, in order of their first lease); returns
        the finished ``(lease, output)`` pairs for the next pull to report (a follower's list stays
        empty). A notice or leave in a batch, or a stop, notice or leave between two (on any rank
        of a group), ends the run: the leader completes what finished, its commits of the rows in
        flight are already in, and it releases the leases not started; returns []."""
        self._waiting, self._done = list(leases), []
        while self._waiting:
            group = self._next_group()
            if group[0].request.kind is RequestKind.TRAIN:
                ended = self._train_batch(group)
                if ended:
                    self._waiting = []  # the sum's release handed back every lease held
            else:
                ended = self._denoise(group)
            if ended or (self._waiting and self._any(self.signals.ending())):
                if self.leader:
                    self._report(self._done)
                    if self._waiting:
                        self._queue_call("release")  # the unstarted ones: every lease still held
                self._waiting, self._done = [], []
                return []
        return self._done

    def _next_group(self) -> list:
        """Take the next batch off the waiting leases: the first one's shape, up to ``max_batch``
        (a TRAIN group: every micro-batch of the update, one gradient sum)."""
        shape = self._waiting[0].request.batch_shape
        size = len(self._waiting) if shape[0] is RequestKind.TRAIN else self.compute.max_batch
        group = [lease for lease in self._waiting if lease.request.batch_shape == shape][:size]
        self._waiting = [lease for lease in self._waiting if all(lease is not g for g in group)]
        if group[0].request.kind is RequestKind.TRAIN and self._done and self.leader:
            self._report(self._done)  # before a sum that may end with a release of every lease held
            self._done = []
        return group

    def _denoise(self, batch: list) -> bool:
        """Denoise ``batch`` and its refills (`Compute.denoise_batch`); the leader commits the rows
        a notice or leave stopped. True if the batch ended so."""
        t0, kind = time.time(), batch[0].request.kind
        self._hold(batch[0].request.weight_version)
        self._shape, self._refilling, self._batch_rows, self._batch_steps = batch[0].request.batch_shape, True, 0, 0
        cpu0 = time.process_time()
        for lease in batch:
            self._start_row(lease)
        committed = self.compute.denoise_batch(batch, self._at_boundary, self._checkpoint if self.leader else None,
                                               decode=self.leader)
        for lease, outcome in committed:
            self._rows.pop(lease.request.request_id)
            self._count_steps(outcome.steps_run)
            if self.leader:
                self._queue_call("commit", outcome.state)
                self.counters["committed"] += 1
        self._queue_use["run_s"] += time.time() - t0
        self._record(kind.value, t0, rows=self._batch_rows, row_steps=self._batch_steps,
                     cpu_s=time.process_time() - cpu0)  # this process's CPU: what a sample costs the host
        if self.leader and committed:
            self._event("commit", time.time())
        return bool(committed)

    def _count_steps(self, steps: int) -> None:
        self.counters["steps"] += steps
        self._batch_steps += steps

    def _start_row(self, lease: Lease) -> None:
        start = lease.resume.step_index if lease.resume is not None else 0
        self._rows[lease.request.request_id] = (start, start)
        self._batch_rows += 1

    def _at_boundary(self, report: StepReport) -> list | None:
        """A step boundary of the batch in hand: keep what finished, count progress, then decide
        (collectively, in a group): None (a notice or leave: commit every row), [] (a stop: no
        refills), or the leases for the free slots."""
        for lease, outcome in report.finished:
            self._rows.pop(lease.request.request_id)
            self._count_steps(outcome.steps_run)
            if self.leader:
                self._done.append((lease, outcome.output))
                self._unreported += outcome.steps_run  # lost if killed before the batch is reported
                self.counters["completed"] += 1
        for request_id, step in report.running.items():
            self._rows[request_id] = (step, self._rows[request_id][1])
        if report.running and self.on_progress is not None:
            self.on_progress("step", max(report.running.values()))
        if self.leader:
            self._keep_leases()
        if self._any(self.signals.ending()):
            return None if self._any(self.signals.interrupting()) else []
        if not report.free or not (self._refilling or any(lease.request.batch_shape == self._shape
                                                           for lease in self._waiting)):
            return []
        refills, self._waiting, self._refilling = self._lead(lambda: self._refills(report.free))
        for lease in refills:
            self._start_row(lease)
        return refills

    def _refills(self, free: int) -> tuple[list, list, bool]:
        """(leases for ``free`` slots, the leases left waiting, whether to pull again): waiting
        ones of the batch's shape first, then, while none of another shape waits (they go next),
        a pull that reports what finished."""
        take = [lease for lease in self._waiting if lease.request.batch_shape == self._shape][:free]
        waiting = [lease for lease in self._waiting if all(lease is not t for t in take)]
        refilling, wanted = self._refilling and not waiting, free - len(take)
        if wanted and refilling:
            pulled = self._lease(self._done, wanted if self.compute.max_batch > 1 else None)
            self._done = []
            fits = [lease for lease in pulled if lease.request.batch_shape == self._shape]
            take, waiting = take + fits[:wanted], waiting + fits[wanted:] + [
                lease for lease in pulled if lease.request.batch_shape != self._shape]
            refilling = len(fits) == len(pulled) >= wanted  # else the queue ran dry, or another shape goes next
        return take, waiting, refilling

    def _train_batch(self, leases: list) -> bool:
        """Compute a batch of TRAIN leases into one gradient sum and report it (in an SP group
        every rank computes its share and the leader reports the group's sum). A stop, notice or
        leave between micro-batches ends the sum: what finished is reported, the rest handed
        back. A refused report (a lease revoked meanwhile) has the queue requeue it; an update
        that closed meanwhile runs nothing. True if it ended early (every lease held released)."""
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
        return ran < len(leases)

    def _between_micro_batches(self) -> bool:
        """After each micro-batch of a sum (each round, in a group): keep the batch's leases alive
        and say whether the sum must end here."""
        self._micro_batches_run += 1
        if self.on_progress is not None:
            self.on_progress("micro_batch", self._micro_batches_run)
        if self.leader:
            self._keep_leases()
        return self.signals.ending()

    def _checkpoint(self, state: InFlightState) -> None:
        self._queue_call("checkpoint", state)
        self._rows[state.request_id] = (self._rows[state.request_id][0], state.step_index)

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
        """Denoising steps of the rows in flight (and of finished, unreported ones) that the queue
        does not hold: what a kill right now would throw away. 0 on an SP group's other ranks
        (the leader counts the group's)."""
        if not self.leader:
            return 0
        return self._unreported + sum(reached - held for reached, held in tuple(self._rows.values()))

    def queue_use(self) -> dict:
        """The worker's time with the queue: ``calls`` (every pull, report, commit, checkpoint,
        heartbeat and release), ``queue_s`` their round trips but for the ``empty_pulls`` (pulls
        that leased nothing: idle polling, their ``idle_s`` apart), beside ``run_s`` (running
        leases); ``queue_s / (queue_s + run_s)`` is the queue's share of a busy worker's time."""
        return dict(self._queue_use)


# ---- a compute without a queue: leases in hand ----
def roll_out(compute: Compute, leases: Sequence[Lease], *, decode: bool = True) -> list:
    """Run ``leases`` (one shape) to the end on ``compute`` (or a `worker.engine.RolloutEngine`),
    ``max_batch`` at a time, refilling free slots from the rest; their outputs in the order given
    (None where ``decode`` is off). For hosts that are never stopped: an in-process backend, an
    on-demand ROLL rank, a reference rollout."""
    check_one_shape(leases)  # before anything starts
    waiting, outputs = list(leases), {}

    def refill(report: StepReport) -> list:
        outputs.update((lease.lease_id, finished.output) for lease, finished in report.finished)
        taken = waiting[:report.free]
        del waiting[:report.free]
        return taken

    first = waiting[:compute.max_batch]
    del waiting[:compute.max_batch]
    compute.denoise_batch(first, refill, None, decode=decode)
    return [outputs[lease.lease_id] for lease in leases]

