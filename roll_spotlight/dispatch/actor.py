"""Ray shell around :class:`RequestQueue`: one actor holds the queue, workers call it.

No background thread: the actor is a plain sequential Ray actor (one call at a time, so the queue
needs no lock) and runs ``expire`` at the start of every call, with the real monotonic clock of
the actor's process. An idle queue therefore expires nothing until the next call, which is
harmless: nobody can pull an expired request before some call runs the expiry.

Times that cross process boundaries are *relative* (``seconds_left``), because monotonic clocks of
different processes and nodes are not comparable. The actor asks for ``num_cpus=0``: it does
almost no work and must not take a CPU slot from a rollout worker.
"""
from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass

import ray

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
    """The actor's body (usable without Ray in tests): a RequestQueue on the wall clock."""

    def __init__(self, config: QueueConfig | None = None, source: RequestSource | None = None) -> None:
        self._queue = RequestQueue(config, clock=time.monotonic, source=source)

    def _tick(self) -> RequestQueue:
        self._queue.expire()
        return self._queue

    def submit(self, specs: Iterable[RequestSpec]) -> list[int]:
        return self._tick().submit(specs)

    def pull(
        self,
        worker: str,
        n: int = 1,
        *,
        max_lease_s: float | None = None,
        est_duration_s: float | None = None,
        kinds: Collection[RequestKind] | None = None,
    ) -> list[Lease]:
        return self._tick().pull(
            worker, n, max_lease_s=max_lease_s, est_duration_s=est_duration_s, kinds=kinds
        )

    def heartbeat(self, worker: str) -> int:
        return self._tick().heartbeat(worker)

    def complete(self, result: RequestResult) -> bool:
        return self._tick().complete(result)

    def commit(self, worker: str, state: InFlightState) -> bool:
        return self._tick().commit(worker, state)

    def checkpoint(self, worker: str, state: InFlightState) -> bool:
        return self._tick().checkpoint(worker, state)

    def fail(self, request_id: int, lease_id: int, error: str) -> bool:
        return self._tick().fail(request_id, lease_id, error)

    def release(self, worker: str) -> int:
        return self._tick().release(worker)

    def worker_lost(self, worker: str) -> int:
        return self._tick().worker_lost(worker)

    def notify_preemption(self, worker: str, seconds_left: float) -> None:
        """``worker``'s node is reclaimed ``seconds_left`` from now (actor clock)."""
        self._tick().notify_preemption(worker, time.monotonic() + seconds_left)

    def clear_preemption(self, worker: str) -> None:
        self._tick().clear_preemption(worker)

    def cancel(self, kind: RequestKind = RequestKind.EXPLORE, iteration: int | None = None) -> int:
        return self._tick().cancel(kind, iteration)

    def counts(self) -> tuple[int, int]:
        """(pending, leased), in one call."""
        queue = self._tick()
        return queue.pending_count(), queue.leased_count()

    def done_ids(self) -> frozenset[int]:
        return self._tick().done_ids()

    def take_results(self) -> list[Completion]:
        return self._tick().take_results()

    def failed(self) -> list[FailedRequest]:
        return self._tick().failed()

    def stats(self) -> QueueStats:
        return self._tick().stats()

    def snapshot(self) -> QueueSnapshot:
        return self._tick().snapshot()

    def restore(self, snapshot: QueueSnapshot) -> None:
        self._queue.restore(snapshot)


QueueActor = ray.remote(num_cpus=0)(QueueServer)


def create_queue_actor(
    config: QueueConfig | None = None,
    *,
    name: str | None = None,
    source: RequestSource | None = None,
) -> ray.actor.ActorHandle:
    """Start the queue actor; ``name`` makes it findable with ``ray.get_actor(name)``."""
    options = {} if name is None else {"name": name}
    return QueueActor.options(**options).remote(config, source)


@dataclass(frozen=True)
class QueueClient:
    """A worker's blocking view of the queue actor. Picklable (a handle and a name), so the
    runtime can hand one to each rollout actor."""

    handle: ray.actor.ActorHandle
    worker: str

    def pull(
        self,
        n: int = 1,
        *,
        max_lease_s: float | None = None,
        est_duration_s: float | None = None,
        kinds: Collection[RequestKind] | None = None,
    ) -> list[Lease]:
        call = self.handle.pull.remote(
            self.worker, n, max_lease_s=max_lease_s, est_duration_s=est_duration_s, kinds=kinds
        )
        return ray.get(call)

    def complete(self, lease: Lease, output: object) -> bool:
        return ray.get(self.handle.complete.remote(lease.result(output)))

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
