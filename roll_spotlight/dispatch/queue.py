"""Pull-based, preemption-aware request queue: a pure state machine (no ray, no torch).

Each request moves through one lifecycle; every move goes through ``_move`` and the table
``TRANSITIONS`` below, so an illegal move is an assertion error, never a silent corruption::

                 submit
                   |
                   v        cancel
      +-------> PENDING ----------------------------> CANCELLED
      |            |                                      ^
      |          pull                                     | (returned after cancel)
      |            v                                      |
      +-------- LEASED ------------------------------------+
   commit,         |  \\
   release,        |   \\ fail / expire / worker_lost, on the max_attempts-th failure
   worker_lost,    |    +-------------------------------> FAILED
   expire, fail    |
                complete (current lease only)
                   v
                  DONE

Invariants (asserted by the property test):
- a request is in exactly one state; a LEASED request has exactly one live lease;
- only the holder of the *current* lease can complete a request, so every request is completed
  at most once; late or repeated completions are counted in ``duplicate_completions`` and ignored;
- a request returned to PENDING keeps its last committed :class:`InFlightState`, so the next pull
  resumes from the last committed step even when the worker simply died (expiry, worker loss).

Time is never read implicitly: every method takes ``now`` or asks the injected ``clock``, so tests
drive it with a :class:`ManualClock`. Expiry runs only when ``expire`` is called (the Ray actor
calls it on every request, so it costs O(log n) per expired lease: a deadline heap, not a scan).

Batches: ``pull(worker, n)`` leases up to ``n`` requests at once, each its own lease with its own
id; ``complete_many`` and ``complete_and_pull`` end several in one call. A batch is nothing more
than several leases of one worker: each ends on its own (complete, commit, fail), and
``worker_lost`` / ``release`` / expiry return whichever are still held.

All or nothing: ``complete_all`` ends several leases of one worker only if it still holds every
one of them. Training micro-batches need it: a worker reports one gradient *sum* over the
micro-batches it ran, which cannot be split, so a sum with one revoked lease in it (expired, or
requeued after the worker was declared lost) is refused whole and the worker's other leases in
it go back to PENDING, to be recomputed by whoever pulls them.
"""
from __future__ import annotations

import dataclasses
import enum
import heapq
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from roll_spotlight.checks import require, require_each, require_int, require_number
from roll_spotlight.dispatch.requests import (
    KIND_ORDER,
    Completion,
    FailedRequest,
    InFlightState,
    Lease,
    Request,
    RequestKind,
    RequestResult,
    RequestSource,
    RequestSpec,
)

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


class RequestState(enum.Enum):
    # Members are singletons, so identity hashing is exact, and it is C code: Enum's own
    # __hash__ (Python code) was the largest single cost of the state machine's dict updates.
    __hash__ = object.__hash__

    PENDING = "pending"
    LEASED = "leased"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


_S = RequestState
TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    _S.PENDING: frozenset({_S.LEASED, _S.CANCELLED}),
    _S.LEASED: frozenset({_S.DONE, _S.PENDING, _S.FAILED, _S.CANCELLED}),
    _S.DONE: frozenset(),
    _S.FAILED: frozenset(),
    _S.CANCELLED: frozenset(),
}


@dataclass(frozen=True)
class QueueConfig:
    """``lease_s``: a lease not heartbeated for this long is expired and its request requeued.
    ``max_attempts``: a request is leased at most this many times that end in failure (expiry,
    worker loss, reported failure); on that failure it becomes FAILED and is reported instead of
    retried forever. Commits and voluntary releases are not failures.
    ``pull_batch`` (the ``dispatch.pull_batch`` key): how many requests one batch pull leases
    (``pull_batch``, ``complete_and_pull`` on the server) when the caller names no count. 1 keeps
    one request per round trip; more amortises the queue's per-call cost over the batch, at the
    price of a worker holding requests it has not started (released on a notice, requeued when
    it is lost). Every lease of a batch has the same deadline: heartbeat while working through it."""

    lease_s: float = 30.0
    max_attempts: int = 3
    pull_batch: int = 1

    def __post_init__(self) -> None:  # the keys are the run config's dispatch.* (config.run.DispatchConfig)
        require_number("dispatch.lease_s", self.lease_s)
        require_each(self, "dispatch", ("max_attempts", "pull_batch"), require_int)


@dataclass
class QueueStats:
    """Counters over the queue's life (they survive snapshot/restore)."""

    submitted: int = 0
    leases_granted: int = 0
    completed: int = 0
    duplicate_completions: int = 0
    commits: int = 0
    checkpoints: int = 0
    stale_commits: int = 0
    resumed_from_commit: int = 0
    releases: int = 0
    worker_losses: int = 0
    expirations: int = 0
    failed_attempts: int = 0
    failed: int = 0
    cancelled: int = 0
    refused_by_notice: int = 0
    from_source: int = 0
    refused_reports: int = 0


@dataclass(frozen=True)
class RequestRecord:
    """One request's full state as plain data (an item of :class:`QueueSnapshot`)."""

    request: Request
    state: RequestState
    failures: int
    resume: InFlightState | None
    completion: Completion | None
    result_taken: bool
    cancel_requested: bool
    last_error: str


@dataclass(frozen=True)
class QueueSnapshot:
    """Picklable queue contents and counters, for checkpoints. Leases are not kept: a restored
    queue runs in another process with another clock and other workers, so every LEASED request
    is restored as PENDING (with its committed state). Lease ids keep counting from
    ``next_lease_id``, so completions for pre-snapshot leases are rejected as duplicates."""

    records: tuple[RequestRecord, ...]
    stats: QueueStats
    next_request_id: int
    next_lease_id: int


@dataclass
class _LiveLease:
    lease_id: int
    worker: str
    deadline: float
    duration_s: float


@dataclass
class _Entry:
    request: Request
    state: RequestState = RequestState.PENDING
    failures: int = 0
    resume: InFlightState | None = None
    lease: _LiveLease | None = None
    queued_seq: int = -1
    cancel_requested: bool = False
    completion: Completion | None = None
    result_taken: bool = False
    last_error: str = ""


class ManualClock:
    """A clock that moves only when told to: ``clock.advance(5.0)``."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> float:
        assert dt >= 0, f"time cannot go backwards (dt={dt})"
        self.now += dt
        return self.now


@dataclass
class _PendingHeaps:
    """Per-kind heaps of (not_resumable, -priority, seq, request_id), with lazy deletion: an
    item is live only while its entry is PENDING with the same ``queued_seq``."""

    heaps: dict[RequestKind, list[tuple[int, int, int, int]]] = field(
        default_factory=lambda: {kind: [] for kind in RequestKind}
    )
    next_seq: int = 0

    def push(self, entry: _Entry) -> None:
        entry.queued_seq = self.next_seq
        self.next_seq += 1
        key = (0 if entry.resume is not None else 1, -entry.request.priority, entry.queued_seq)
        heapq.heappush(self.heaps[entry.request.kind], (*key, entry.request.request_id))

    def pop(self, kind: RequestKind, entries: dict[int, _Entry]) -> _Entry | None:
        heap = self.heaps[kind]
        while heap:
            *_, seq, request_id = heapq.heappop(heap)
            entry = entries.get(request_id)
            if entry is not None and entry.state is _S.PENDING and entry.queued_seq == seq:
                return entry
        return None


@dataclass
class _DeadlineHeap:
    """Live leases by deadline, so that ``expire`` (run on every actor call) costs O(log n) per
    expired lease instead of a scan of all leases: a heap of (deadline, lease_id, request_id)
    with lazy deletion. An item counts only while its request still holds that lease; a lease
    extended by a heartbeat is pushed again, with its new deadline, when its old item surfaces.
    Items of ended leases are dropped when they surface, or all at once by ``prune``."""

    heap: list[tuple[float, int, int]] = field(default_factory=list)
    limit: int = 64

    def push(self, entry: _Entry) -> None:
        lease = entry.lease
        heapq.heappush(self.heap, (lease.deadline, lease.lease_id, entry.request.request_id))

    def overdue(self, now: float, entries: dict[int, _Entry]) -> list[_Entry]:
        """Entries whose current lease's deadline is before ``now``, by (deadline, lease id)."""
        heap, found = self.heap, {}
        while heap and heap[0][0] < now:
            _, lease_id, request_id = heapq.heappop(heap)
            entry = entries.get(request_id)
            lease = None if entry is None else entry.lease
            if lease is None or lease.lease_id != lease_id:
                continue  # that lease ended
            if lease.deadline < now:
                found[lease_id] = entry
            else:  # extended since it was pushed
                heapq.heappush(heap, (lease.deadline, lease_id, request_id))
        return sorted(found.values(), key=lambda e: (e.lease.deadline, e.lease.lease_id))

    def prune(self, by_worker: dict[str, set[int]], entries: dict[int, _Entry]) -> None:
        """Rebuild from the live leases once the heap has grown past twice their number at the
        last rebuild (so a rebuild, O(live), follows at least as many pushes: amortised O(1))."""
        if len(self.heap) <= self.limit:
            return
        self.heap = [
            (entries[rid].lease.deadline, entries[rid].lease.lease_id, rid)
            for held in by_worker.values() for rid in held
        ]
        heapq.heapify(self.heap)
        self.limit = 2 * len(self.heap) + 64


class RequestQueue:
    """The dispatch queue (docs/design.md section 4). Workers ``pull`` leases, ``heartbeat`` while
    working, and end each lease with ``complete``, ``commit`` (preempted: hand back the partial
    state), ``fail`` or, for all of a worker's leases at once, ``release`` / ``worker_lost``.
    ``complete_many`` and ``complete_and_pull`` are the batch forms (one call for a batch).

    Pull order across kinds: ``KIND_ORDER`` (ROLLOUT, TRAIN, EXPLORE: the critical path first),
    or the order ``set_order`` gave a worker; within a kind, committed partial rollouts first (the
    front of the queue: they hold a latent and were already paid for), then higher ``priority``,
    then first in first out.
    """

    def __init__(
        self,
        config: QueueConfig | None = None,
        clock: Clock = time.monotonic,
        source: RequestSource | None = None,
    ) -> None:
        self.config = config if config is not None else QueueConfig()
        self._clock = clock
        self._source = source
        self._reset()

    def _reset(self) -> None:
        self._entries: dict[int, _Entry] = {}
        self._pending = _PendingHeaps()
        self._deadlines = _DeadlineHeap()
        self._by_worker: dict[str, set[int]] = {}
        self._notices: dict[str, float] = {}
        self._orders: dict[str, tuple[RequestKind, ...]] = {}
        self._counts: Counter[tuple[RequestState, RequestKind]] = Counter()
        self._stats = QueueStats()
        self._next_request_id = 0
        self._next_lease_id = 0

    # ----------------------------------------------------------------- submission
    def submit(self, specs: Iterable[RequestSpec]) -> list[int]:
        """Add requests as PENDING; returns their new ids, in order."""
        ids = []
        for spec in specs:
            request = Request.from_spec(self._next_request_id, spec)
            self._next_request_id += 1
            entry = _Entry(request)
            self._entries[request.request_id] = entry
            self._counts[(_S.PENDING, request.kind)] += 1
            self._pending.push(entry)
            ids.append(request.request_id)
        self._stats.submitted += len(ids)
        return ids

    def set_source(self, source: RequestSource | None) -> None:
        self._source = source

    # ----------------------------------------------------------------- leasing
    def pull(
        self,
        worker: str,
        n: int = 1,
        *,
        now: float | None = None,
        max_lease_s: float | None = None,
        est_duration_s: float | None = None,
        kinds: Collection[RequestKind] | None = None,
        max_train: int | None = None,
    ) -> list[Lease]:
        """Lease up to ``n`` requests to ``worker``, in its kind order (``set_order``); a batch never
        mixes TRAIN with other kinds, and holds at most ``max_train`` TRAIN micro-batches (one
        gradient sum's, whatever rollout slots ``n`` counts). A worker with a pending preemption notice
        gets nothing unless it declares (``est_duration_s``) that it finishes before the notice
        deadline. ``kinds`` restricts what it accepts (an on-demand worker may refuse EXPLORE).
        When nothing at all is pending, the ``source`` (if any) is asked for new requests first."""
        _validate_pull(n, max_lease_s, kinds, max_train)
        now = self._now(now)
        if self._refused_by_notice(worker, now, est_duration_s):
            self._stats.refused_by_notice += 1
            return []
        if self._source is not None and self.pending_count() == 0:
            self._stats.from_source += len(self.submit(self._source.next_requests(worker, n)))
        order = self._orders.get(worker, KIND_ORDER)
        allowed = [kind for kind in order if kinds is None or kind in kinds]
        duration = self.config.lease_s if max_lease_s is None else max_lease_s
        leases: list[Lease] = []
        for kind in allowed:
            if leases and (kind is RequestKind.TRAIN) != (leases[0].request.kind is RequestKind.TRAIN):
                if self.pending_count(kind):
                    break  # a batch is all TRAIN or has none: TRAIN leases end together, as one sum
                continue
            most = n if kind is not RequestKind.TRAIN or max_train is None else min(n, max_train)
            while len(leases) < most and (entry := self._pending.pop(kind, self._entries)):
                leases.append(self._grant(entry, worker, now, duration))
        return leases

    def heartbeat(self, worker: str, now: float | None = None) -> int:
        """Extend every lease of ``worker`` by its duration from ``now``; returns how many."""
        now = self._now(now)
        for request_id in self._by_worker.get(worker, ()):
            entry = self._entries[request_id]
            lease = entry.lease
            assert lease is not None and lease.worker == worker
            earlier = now + lease.duration_s < lease.deadline
            lease.deadline = now + lease.duration_s
            if earlier:  # a later deadline is found lazily; an earlier one must be pushed now
                self._deadlines.push(entry)
        return len(self._by_worker.get(worker, ()))

    def set_order(self, workers: Iterable[str], order: Iterable[RequestKind] | None) -> None:
        """The kinds ``workers`` pull first: ``order`` lists every kind once, most wanted first;
        None restores ``KIND_ORDER``. A worker's own ``kinds`` filter still applies."""
        if order is not None:
            order = tuple(order)
            if sorted(k.value for k in order) != sorted(k.value for k in RequestKind):
                raise ValueError(f"set_order: order must list every RequestKind once, got {[k.value for k in order]}")
        for worker in workers:
            if order is None:
                self._orders.pop(worker, None)
            else:
                self._orders[worker] = order

    def notify_preemption(self, worker: str, deadline: float) -> None:
        """Record that ``worker``'s node will be reclaimed at ``deadline`` (queue clock)."""
        self._notices[worker] = deadline

    def clear_preemption(self, worker: str) -> None:
        self._notices.pop(worker, None)

    # ----------------------------------------------------------------- ending a lease
    def complete(self, result: RequestResult, now: float | None = None) -> bool:
        """Accept ``result`` iff it carries the request's current lease; otherwise (a second
        completion, a revoked or expired lease) count it as a duplicate and ignore it."""
        entry = self._issued_entry(result.request_id)
        if entry is None or not self._is_current(entry, result.lease_id):
            self._stats.duplicate_completions += 1
            return False
        lease = self._end_lease(entry)
        entry.completion = Completion(
            entry.request, result.output, lease.worker, lease.lease_id, self._now(now)
        )
        self._move(entry, _S.DONE)
        self._stats.completed += 1
        return True

    def complete_many(self, results: Iterable[RequestResult], now: float | None = None) -> list[bool]:
        """``complete`` each result in order (one call for a batch); one verdict per result. An
        id never issued is a ValueError before any result is applied (all or nothing)."""
        results = list(results)
        for result in results:
            self._issued_entry(result.request_id)
        now = self._now(now)
        return [self.complete(result, now) for result in results]

    def complete_and_pull(
        self,
        worker: str,
        results: Iterable[RequestResult],
        n: int = 1,
        *,
        now: float | None = None,
        max_lease_s: float | None = None,
        est_duration_s: float | None = None,
        kinds: Collection[RequestKind] | None = None,
        max_train: int | None = None,
    ) -> tuple[list[bool], list[Lease]]:
        """A worker's steady state in one call: ``complete_many(results)``, then ``pull`` up to
        ``n`` (same arguments and notice rule as ``pull``). Arguments are checked before anything
        changes, so a call that raises changed nothing."""
        _validate_pull(n, max_lease_s, kinds, max_train)
        now = self._now(now)
        accepted = self.complete_many(results, now)
        leases = self.pull(worker, n, now=now, max_lease_s=max_lease_s,
                           est_duration_s=est_duration_s, kinds=kinds, max_train=max_train)
        return accepted, leases

    def complete_all(self, worker: str, results: Iterable[RequestResult], now: float | None = None) -> bool:
        """Complete every result, or none: True iff ``worker`` holds the current lease of each (then
        all are DONE; their outputs are not kept: ``take_results`` never returns them, the caller
        keeps what the results stand for, e.g. a gradient sum). Otherwise nothing is accepted, the count goes to ``refused_reports``, and
        those of the results whose leases ``worker`` still holds return to PENDING (released, not
        failed): their work is in the refused sum, so it must be done again. An id never issued is
        a ValueError before anything changes."""
        results = list(results)
        entries = [self._issued_entry(r.request_id) for r in results]
        current = [e is not None and self._is_current(e, r.lease_id) and e.lease.worker == worker
                   for e, r in zip(entries, results)]
        if len({r.request_id for r in results}) == len(results) and all(current):
            now = self._now(now)
            for result, entry in zip(results, entries):
                self.complete(result, now)
                entry.completion, entry.result_taken = None, True  # the sum went elsewhere, not to results
            return True
        held = {e.request.request_id: e for e, ok in zip(entries, current) if ok}
        for entry in held.values():
            self._return_lease(entry, failure=False, error="")
        self._stats.releases += len(held)
        self._stats.refused_reports += 1
        return False

    def commit(self, worker: str, state: InFlightState) -> bool:
        """Preempted: end ``worker``'s lease on ``state.request_id`` and put the request at the
        front of PENDING with ``state``, so the next pull resumes it. False for a stale lease."""
        entry = self._leased_to(worker, state)
        if entry is None:
            return False
        entry.resume = state
        self._end_lease(entry)
        self._requeue(entry)
        self._stats.commits += 1
        return True

    def checkpoint(self, worker: str, state: InFlightState) -> bool:
        """Record ``state`` but keep the lease, so that if the worker dies without a word,
        expiry or ``worker_lost`` requeues the request from this step."""
        entry = self._leased_to(worker, state)
        if entry is None:
            return False
        entry.resume = state
        self._stats.checkpoints += 1
        return True

    def fail(self, request_id: int, lease_id: int, error: str) -> bool:
        """The lease holder reports that the request raised; counts as a failed attempt."""
        entry = self._issued_entry(request_id)
        if entry is None or not self._is_current(entry, lease_id):
            return False
        self._return_lease(entry, failure=True, error=error)
        return True

    def release(self, worker: str) -> int:
        """Voluntary hand-back of all of ``worker``'s leases (not a failure)."""
        released = self._revoke_worker(worker, failure=False, error="")
        self._stats.releases += released
        return released

    def worker_lost(self, worker: str) -> int:
        """``worker`` died: requeue all its leases (a failed attempt each) and forget its notice."""
        lost = self._revoke_worker(worker, failure=True, error=f"worker {worker!r} lost")
        self._notices.pop(worker, None)
        self._stats.worker_losses += lost
        return lost

    def expire(self, now: float | None = None) -> int:
        """Requeue every lease whose deadline has passed (a failed attempt each)."""
        now = self._now(now)
        overdue = self._deadlines.overdue(now, self._entries)
        for entry in overdue:
            logger.debug("lease %d of request %d expired", entry.lease.lease_id, entry.request.request_id)
            self._return_lease(entry, failure=True, error="lease expired")
        self._stats.expirations += len(overdue)
        return len(overdue)

    def cancel(self, kind: RequestKind = RequestKind.EXPLORE, iteration: int | None = None) -> int:
        """Drop pending requests of ``kind`` (and ``iteration`` if given). Leased ones may still
        complete; if they come back instead, they are cancelled then. Returns how many now."""
        dropped = 0
        for entry in self._entries.values():
            if entry.request.kind is not kind or iteration not in (None, entry.request.iteration):
                continue
            if entry.state is _S.PENDING:
                self._move(entry, _S.CANCELLED)
                dropped += 1
            elif entry.state is _S.LEASED:
                entry.cancel_requested = True
        self._stats.cancelled += dropped
        return dropped

    # ----------------------------------------------------------------- queries
    def pending_count(self, kind: RequestKind | None = None) -> int:
        return self._count(_S.PENDING, kind)

    def leased_count(self, kind: RequestKind | None = None) -> int:
        return self._count(_S.LEASED, kind)

    def state_of(self, request_id: int) -> RequestState:
        return self._entries[request_id].state

    def unfinished(self, request_ids: Iterable[int]) -> int:
        """How many of ``request_ids`` are not DONE (forgotten ones count as done)."""
        return sum(1 for rid in request_ids if (e := self._entries.get(rid)) is not None and e.state is not _S.DONE)

    def done_ids(self) -> frozenset[int]:
        return frozenset(rid for rid, e in self._entries.items() if e.state is _S.DONE)

    def lease_holders(self) -> list[str]:
        """Workers holding at least one live lease, sorted."""
        return sorted(self._by_worker)

    def leases_of(self, worker: str) -> list[Lease]:
        return [self._lease_view(self._entries[rid]) for rid in sorted(self._by_worker.get(worker, ()))]

    def results(self, request_ids: Iterable[int]) -> list[Completion]:
        """Completions of DONE requests whose results were not taken; KeyError naming the others."""
        request_ids = list(request_ids)
        entries = [self._entries.get(rid) for rid in request_ids]
        missing = [rid for rid, e in zip(request_ids, entries) if e is None or e.completion is None]
        if missing:
            raise KeyError(f"no stored result for request ids {missing} (not DONE, or already taken)")
        return [e.completion for e in entries]

    def take_results(self) -> list[Completion]:
        """Pop every stored completion (in request id order); the requests stay DONE."""
        taken = []
        for entry in self._entries.values():
            if entry.completion is not None:
                taken.append(entry.completion)
                entry.completion, entry.result_taken = None, True
        return sorted(taken, key=lambda c: c.request.request_id)

    def failed(self) -> list[FailedRequest]:
        return [
            FailedRequest(e.request, e.failures, e.last_error)
            for e in self._entries.values()
            if e.state is _S.FAILED
        ]

    def stats(self) -> QueueStats:
        return dataclasses.replace(self._stats)

    def forget_finished(self) -> int:
        """Drop DONE requests whose results were taken, and FAILED and CANCELLED ones, so a long
        run does not grow without bound. Late completions for them still count as duplicates."""
        finished = [
            rid
            for rid, e in self._entries.items()
            if (e.state is _S.DONE and e.result_taken) or e.state in (_S.FAILED, _S.CANCELLED)
        ]
        for rid in finished:
            entry = self._entries.pop(rid)
            self._counts[(entry.state, entry.request.kind)] -= 1
        return len(finished)

    # ----------------------------------------------------------------- checkpoints
    def snapshot(self) -> QueueSnapshot:
        records = tuple(
            RequestRecord(
                e.request, e.state, e.failures, e.resume, e.completion,
                e.result_taken, e.cancel_requested, e.last_error,
            )
            for e in self._entries.values()
        )
        return QueueSnapshot(records, self.stats(), self._next_request_id, self._next_lease_id)

    def restore(self, snapshot: QueueSnapshot) -> None:
        """Replace this queue's contents with ``snapshot`` (see :class:`QueueSnapshot`)."""
        self._reset()
        self._stats = dataclasses.replace(snapshot.stats)
        self._next_request_id = snapshot.next_request_id
        self._next_lease_id = snapshot.next_lease_id
        for record in snapshot.records:
            self._restore_record(record)

    def _restore_record(self, record: RequestRecord) -> None:
        entry = _Entry(
            record.request, record.state, record.failures, record.resume, None, -1,
            record.cancel_requested, record.completion, record.result_taken, record.last_error,
        )
        self._entries[record.request.request_id] = entry
        if entry.state is _S.LEASED:
            entry.state = _S.CANCELLED if entry.cancel_requested else _S.PENDING
        self._counts[(entry.state, entry.request.kind)] += 1
        if entry.state is _S.PENDING:
            self._pending.push(entry)

    # ----------------------------------------------------------------- internals
    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    def _move(self, entry: _Entry, to: RequestState) -> None:
        assert to in TRANSITIONS[entry.state], (
            f"illegal transition {entry.state.name} -> {to.name} of request {entry.request.request_id}"
        )
        self._counts[(entry.state, entry.request.kind)] -= 1
        self._counts[(to, entry.request.kind)] += 1
        entry.state = to

    def _count(self, state: RequestState, kind: RequestKind | None) -> int:
        kinds = RequestKind if kind is None else (kind,)
        return sum(self._counts[(state, k)] for k in kinds)

    def _refused_by_notice(self, worker: str, now: float, est_duration_s: float | None) -> bool:
        deadline = self._notices.get(worker)
        if deadline is None:
            return False
        return est_duration_s is None or now + est_duration_s > deadline

    def _grant(self, entry: _Entry, worker: str, now: float, duration: float) -> Lease:
        self._move(entry, _S.LEASED)
        entry.lease = _LiveLease(self._next_lease_id, worker, now + duration, duration)
        self._next_lease_id += 1
        self._by_worker.setdefault(worker, set()).add(entry.request.request_id)
        self._deadlines.push(entry)
        self._deadlines.prune(self._by_worker, self._entries)
        self._stats.leases_granted += 1
        self._stats.resumed_from_commit += entry.resume is not None
        return self._lease_view(entry)

    def _lease_view(self, entry: _Entry) -> Lease:
        lease = entry.lease
        assert lease is not None
        return Lease(
            lease.lease_id, entry.request, lease.worker, lease.deadline, entry.resume,
            attempt=entry.failures + 1,
        )

    def _end_lease(self, entry: _Entry) -> _LiveLease:
        lease = entry.lease
        assert entry.state is _S.LEASED and lease is not None
        held = self._by_worker[lease.worker]
        held.discard(entry.request.request_id)
        if not held:
            del self._by_worker[lease.worker]
        entry.lease = None
        return lease

    def _requeue(self, entry: _Entry) -> None:
        if entry.cancel_requested:
            self._move(entry, _S.CANCELLED)
            self._stats.cancelled += 1
            return
        self._move(entry, _S.PENDING)
        self._pending.push(entry)

    def _return_lease(self, entry: _Entry, *, failure: bool, error: str) -> None:
        self._end_lease(entry)
        if failure:
            entry.failures += 1
            entry.last_error = error
            self._stats.failed_attempts += 1
        if failure and entry.failures >= self.config.max_attempts and not entry.cancel_requested:
            logger.warning(
                "request %d failed %d times (last: %s); giving up",
                entry.request.request_id, entry.failures, error,
            )
            self._move(entry, _S.FAILED)
            self._stats.failed += 1
            return
        self._requeue(entry)

    def _revoke_worker(self, worker: str, *, failure: bool, error: str) -> int:
        held = sorted(self._by_worker.get(worker, ()))
        for request_id in held:
            self._return_lease(self._entries[request_id], failure=failure, error=error)
        return len(held)

    def _issued_entry(self, request_id: int) -> _Entry | None:
        """The entry, or None for an id issued earlier and since forgotten."""
        if not 0 <= request_id < self._next_request_id:
            raise ValueError(f"unknown request id {request_id} (ids issued: 0..{self._next_request_id - 1})")
        return self._entries.get(request_id)

    def _is_current(self, entry: _Entry, lease_id: int) -> bool:
        return entry.state is _S.LEASED and entry.lease is not None and entry.lease.lease_id == lease_id

    def _leased_to(self, worker: str, state: InFlightState) -> _Entry | None:
        entry = self._issued_entry(state.request_id)
        if entry is None or entry.state is not _S.LEASED or entry.lease.worker != worker:
            self._stats.stale_commits += 1
            return None
        _check_resumable(entry.request, state)
        return entry


def _validate_pull(n: int, max_lease_s: float | None, kinds: Collection[RequestKind] | None,
                   max_train: int | None = None) -> None:
    require_int("pull: n", n)
    require_int("pull: max_train", max_train, optional=True)
    require_number("pull: max_lease_s", max_lease_s, optional=True)
    require(kinds is None or all(isinstance(k, RequestKind) for k in kinds), "pull: kinds",
            kinds and sorted(map(str, kinds)), "must be RequestKind members")


def _check_resumable(request: Request, state: InFlightState) -> None:
    """A committed state must continue *this* trajectory: same seed and weights, a step inside
    the schedule (a finished rollout is completed, not committed)."""
    if state.seed != request.seed or state.weight_version != request.weight_version:
        raise ValueError(
            f"in-flight state of request {request.request_id} has seed={state.seed}, "
            f"weight_version={state.weight_version}; the request has seed={request.seed}, "
            f"weight_version={request.weight_version}"
        )
    if not 0 <= state.step_index < request.schedule.num_steps:
        raise ValueError(
            f"in-flight state of request {request.request_id}: step_index must be in "
            f"[0, {request.schedule.num_steps}), got {state.step_index}"
        )
