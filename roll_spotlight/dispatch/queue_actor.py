"""Ray shell around :class:`RequestQueue`: one actor holds the queue, workers call it.

No background thread: the actor is a plain sequential Ray actor (one call at a time, so the queue
needs no lock) and runs ``expire`` at the start of every call (O(log n): a deadline heap), with
the real monotonic clock of the actor's process. An idle queue therefore expires nothing until
the next call, which is harmless: nobody can pull an expired request before some call runs the
expiry.

Times that cross process boundaries are *relative* (``seconds_left``), because monotonic clocks of
different processes and nodes are not comparable. The actor asks for ``num_cpus=0``: it does
almost no work and must not take a CPU slot from a rollout worker.

Throughput: a call's cost is mostly Ray's (the RPC, task bookkeeping, pickling), not the queue's,
so a puller that wants thousands of requests a second from one actor batches: ``pull_batch``
leases ``dispatch.pull_batch`` requests in one call and ``complete_and_pull`` reports a batch and
leases the next in one call (one round trip and one journal record a batch).
"""
from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import ray

from roll_spotlight.dispatch.journal import JournalConfig, QueueJournal
from roll_spotlight.dispatch.queue import QueueConfig, QueueSnapshot, QueueStats, RequestQueue
from roll_spotlight.dispatch.requests import (
    Completion,
    FailedRequest,
    InFlightState,
    Lease,
    RequestKind,
    RequestResult,
    RequestSource,
    RequestSpec,
)


class QueueServer:
    """The actor's body (usable without Ray in tests): a RequestQueue on the wall clock.

    With a ``journal`` every mutating call is logged after it succeeds and a new server on the
    same journal (the restarted actor) rebuilds the queue exactly, live leases included (see
    :mod:`roll_spotlight.dispatch.journal`). Journalled calls pass ``now`` explicitly, so the
    replay does not depend on when it runs. A lazy ``source`` cannot be journalled (its answers
    depend on state outside the queue), so the two are exclusive.
    """

    def __init__(self, config: QueueConfig | None = None, source: RequestSource | None = None,
                 journal: JournalConfig | None = None) -> None:
        if journal is not None and source is not None:
            raise ValueError("a journalled queue cannot have a request source (its answers are not replayable)")
        self._queue = RequestQueue(config, clock=time.monotonic, source=source)
        self._journal = QueueJournal(journal) if journal is not None else None
        if self._journal is not None:
            self.recovered = self._journal.recover(self._queue)
            self._grace_after_recovery()

    def _grace_after_recovery(self) -> None:
        """Leases restored from the journal get a fresh deadline: their workers could not
        heartbeat while the queue was down."""
        now = time.monotonic()
        for worker in self._queue.lease_holders():
            self._call("heartbeat", worker=worker, now=now)

    def _call(self, method: str, *, record=lambda result: True, **kwargs):
        """Run a mutating queue method; journal it if it succeeded and ``record(result)`` (False
        only for calls that provably changed nothing: an empty pull, expire or heartbeat; rejected
        completions and commits are journalled too, since they move counters)."""
        result = getattr(self._queue, method)(**kwargs)
        if self._journal is not None and record(result):
            self._journal.append(self._queue, method, kwargs)
        return result

    def _tick(self) -> float:
        now = time.monotonic()
        self._call("expire", record=bool, now=now)
        return now

    def submit(self, specs: Iterable[RequestSpec]) -> list[int]:
        self._tick()
        return self._call("submit", specs=list(specs))

    def pull(self, worker: str, n: int = 1, max_train: int | None = None, **options) -> list[Lease]:
        """``RequestQueue.pull`` on the actor's clock; ``options`` are its lease options."""
        now = self._tick()
        refused = self._refusals()
        return self._call("pull", record=lambda leases: bool(leases) or self._refusals() > refused,
                          worker=worker, n=n, now=now, max_train=max_train,
                          **lease_options(**options))  # an empty pull changes nothing

    def pull_batch(self, worker: str, n: int | None = None, **options) -> list[Lease]:
        """``pull`` of up to ``n`` requests, ``QueueConfig.pull_batch`` (``dispatch.pull_batch``)
        when ``n`` is None. The count is resolved here, so the journal records it explicitly.
        ``n`` counts a batching worker's rollout slots; one gradient sum's TRAIN micro-batches are at
        most ``dispatch.pull_batch`` (the simulator's lease per GPU; an SP group tops up with ``pull``)."""
        return self.pull(worker, self._batch(n), max_train=self._queue.config.pull_batch, **options)

    def complete_many(self, results: Iterable[RequestResult]) -> list[bool]:
        """Several ``complete`` in one call (one journal record); one verdict per result."""
        now = self._tick()
        return self._call("complete_many", results=list(results), now=now)

    def complete_and_pull(self, worker: str, results: Iterable[RequestResult], n: int | None = None,
                          **options) -> tuple[list[bool], list[Lease]]:
        """A worker's steady state in one round trip and one journal record: complete the results
        of its last batch, lease the next (``n`` as in ``pull_batch``)."""
        now = self._tick()
        results, refused = list(results), self._refusals()
        return self._call("complete_and_pull",
                          record=lambda out: bool(results) or bool(out[1]) or self._refusals() > refused,
                          worker=worker, results=results, n=self._batch(n), now=now,
                          max_train=self._queue.config.pull_batch, **lease_options(**options))

    def _batch(self, n: int | None) -> int:
        return self._queue.config.pull_batch if n is None else n

    def _refusals(self) -> int:
        """Pulls refused by a notice so far (a refused pull moves that counter, so it is journalled)."""
        return self._queue.stats().refused_by_notice if self._journal is not None else 0

    def complete_all(self, worker: str, results: Iterable[RequestResult]) -> bool:
        """All of ``results`` or none (``RequestQueue.complete_all``): a gradient sum's leases."""
        now = self._tick()
        return self._call("complete_all", worker=worker, results=list(results), now=now)

    def set_order(self, workers: Iterable[str], order: Collection[RequestKind] | None) -> None:
        self._tick()
        self._call("set_order", workers=list(workers), order=None if order is None else tuple(order))

    def heartbeat(self, worker: str) -> int:
        now = self._tick()
        return self._call("heartbeat", record=bool, worker=worker, now=now)

    def complete(self, result: RequestResult) -> bool:
        now = self._tick()
        return self._call("complete", result=result, now=now)

    def commit(self, worker: str, state: InFlightState) -> bool:
        self._tick()
        return self._call("commit", worker=worker, state=state)

    def checkpoint(self, worker: str, state: InFlightState) -> bool:
        self._tick()
        return self._call("checkpoint", worker=worker, state=state)

    def fail(self, request_id: int, lease_id: int, error: str) -> bool:
        self._tick()
        return self._call("fail", record=bool, request_id=request_id, lease_id=lease_id, error=error)

    def release(self, worker: str) -> int:
        self._tick()
        return self._call("release", record=bool, worker=worker)

    def worker_lost(self, worker: str) -> int:
        self._tick()
        return self._call("worker_lost", worker=worker)

    def notify_preemption(self, worker: str, seconds_left: float) -> None:
        """``worker``'s node is reclaimed ``seconds_left`` from now (actor clock)."""
        now = self._tick()
        self._call("notify_preemption", worker=worker, deadline=now + seconds_left)

    def clear_preemption(self, worker: str) -> None:
        self._tick()
        self._call("clear_preemption", worker=worker)

    def cancel(self, kind: RequestKind = RequestKind.EXPLORE, iteration: int | None = None) -> int:
        self._tick()
        return self._call("cancel", kind=kind, iteration=iteration)

    def counts(self) -> tuple[int, int]:
        """(pending, leased), in one call."""
        self._tick()
        return self._queue.pending_count(), self._queue.leased_count()

    def unfinished(self, request_ids: Iterable[int]) -> int:
        self._tick()
        return self._queue.unfinished(request_ids)

    def done_ids(self) -> frozenset[int]:
        self._tick()
        return self._queue.done_ids()

    def take_results(self) -> list[Completion]:
        self._tick()
        return self._call("take_results", record=bool)

    def forget_finished(self) -> int:
        self._tick()
        return self._call("forget_finished", record=bool)

    def failed(self) -> list[FailedRequest]:
        self._tick()
        return self._queue.failed()

    def stats(self) -> QueueStats:
        self._tick()
        return self._queue.stats()

    def snapshot(self) -> QueueSnapshot:
        self._tick()
        return self._queue.snapshot()

    def leases_of(self, worker: str) -> list[Lease]:
        self._tick()
        return self._queue.leases_of(worker)

    def restore(self, snapshot: QueueSnapshot) -> None:
        self._call("restore", snapshot=snapshot)

    def ping(self) -> int:
        """Liveness; also how many journal records the (restarted) server replayed."""
        return getattr(self, "recovered", 0)


def lease_options(*, max_lease_s: float | None = None, est_duration_s: float | None = None,
                  kinds: Collection[RequestKind] | None = None) -> dict:
    """The lease options of ``RequestQueue.pull``, checked by name, ``kinds`` as a tuple (journalled)."""
    return {"max_lease_s": max_lease_s, "est_duration_s": est_duration_s,
            "kinds": None if kinds is None else tuple(kinds)}


QueueActor = ray.remote(num_cpus=0)(QueueServer)


def create_queue_actor(
    config: QueueConfig | None = None,
    *,
    name: str | None = None,
    source: RequestSource | None = None,
    journal: JournalConfig | str | Path | None = None,
    task_events: bool = False,
) -> ray.actor.ActorHandle:
    """Start the queue actor; ``name`` makes it findable with ``ray.get_actor(name)``.

    ``task_events`` False (the default) keeps the queue's calls out of Ray's task-event stream
    (the state API's task list, the timeline): thousands of calls a second at cluster scale, and
    recording each one was a large share of a call's cost on the actor and its callers.

    With a ``journal`` (a JournalConfig or a path on the actor's node) the actor is restarted by
    Ray when its process dies and calls in flight are retried (3 times): the restarted actor rebuilds the
    queue from the journal, so nothing submitted, leased, committed or completed is lost. Without
    one a dead queue stays dead (its state lived only in that process).
    """
    from roll_spotlight.driver_node import on_driver_node

    options: dict = {"enable_task_events": task_events} | ({} if name is None else {"name": name}) | on_driver_node()
    if journal is not None:
        journal = journal if isinstance(journal, JournalConfig) else JournalConfig(str(journal))
        options |= {"max_restarts": -1, "max_task_retries": 3}  # a call that kills it 4 times is an error
    return QueueActor.options(**options).remote(config, source, journal)


@dataclass(frozen=True)
class QueueClient:
    """A worker's blocking view of the queue actor. Picklable (a handle and a name), so the
    runtime can hand one to each rollout actor."""

    handle: ray.actor.ActorHandle
    worker: str

    def pull(self, n: int = 1, **options) -> list[Lease]:
        """Lease up to ``n`` requests; ``options``: the lease options of ``RequestQueue.pull``."""
        return ray.get(self.handle.pull.remote(self.worker, n, **options))

    def pull_batch(self, n: int | None = None, **options) -> list[Lease]:
        """Lease up to ``n`` requests in one round trip (the queue's ``dispatch.pull_batch`` when
        None). Work through them in order, heartbeat between them, and on a notice commit the one
        in flight, then ``release()`` the rest."""
        return ray.get(self.handle.pull_batch.remote(self.worker, n, **options))

    def complete(self, lease: Lease, output: object) -> bool:
        return ray.get(self.handle.complete.remote(lease.result(output)))

    def complete_many(self, done: Iterable[tuple[Lease, object]]) -> list[bool]:
        """Complete several ``(lease, output)`` pairs in one round trip; one verdict each."""
        return ray.get(self.handle.complete_many.remote([lease.result(output) for lease, output in done]))

    def complete_and_pull(self, done: Iterable[tuple[Lease, object]], n: int | None = None,
                          **options) -> tuple[list[bool], list[Lease]]:
        """Complete ``(lease, output)`` pairs and lease the next batch in one round trip; returns
        (one verdict per pair, the new leases)."""
        results = [lease.result(output) for lease, output in done]
        return ray.get(self.handle.complete_and_pull.remote(self.worker, results, n, **options))

    def complete_all(self, leases: Iterable[Lease]) -> bool:
        """End ``leases`` together or not at all (``RequestQueue.complete_all``); True if accepted."""
        return ray.get(self.handle.complete_all.remote(self.worker, [lease.result(None) for lease in leases]))

    def commit(self, state: InFlightState) -> bool:
        return ray.get(self.handle.commit.remote(self.worker, state))

    def checkpoint(self, state: InFlightState) -> bool:
        return ray.get(self.handle.checkpoint.remote(self.worker, state))

    def fail(self, lease: Lease, error: str) -> bool:
        return ray.get(self.handle.fail.remote(lease.request.request_id, lease.lease_id, error))

    def heartbeat(self) -> int:
        return ray.get(self.handle.heartbeat.remote(self.worker))

    def release(self) -> int:
        return ray.get(self.handle.release.remote(self.worker))

    def notify_preemption(self, seconds_left: float) -> None:
        """This worker goes ``seconds_left`` from now: the queue leases it nothing more. Not
        awaited: the worker commits its lease in flight meanwhile."""
        self.handle.notify_preemption.remote(self.worker, seconds_left)
