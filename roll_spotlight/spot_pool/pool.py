"""Elastic spot pool: rollout workers that come and go with spot nodes.

    SpotMarket (trace replay) --MarketSchedule--+
                                                +--> ElasticSpotPool.poll(now) --> WorkerLauncher
    ray.nodes() + node drains --RayNodeWatcher--+          |                    (RolloutWorker actors)
                                                           +--> CostLedger (GPU-seconds per pool)

What each market event does (docs/design.md, the preemption-aware scheduler):

- NODE_UP: start a rollout worker for the node; it pulls from the request queue.
- NOTICE: ``worker.notify_preemption(seconds_left)``: the worker stops pulling, finishes the
  denoising step it is in, commits (request id, step index, latent, seed, weight version) to the
  queue, which puts the request at the front of PENDING, and returns. The queue refuses it leases
  from then on.
- NODE_DOWN: kill the worker if it is still alive, then ``queue.worker_lost(name)``: leases it still
  held return to PENDING with their last committed state. Without a notice that state is the last
  checkpoint (workers checkpoint every ``commit_every`` steps) or step 0, so a kill throws away at
  most ``commit_every`` steps per lease (plus the step being computed).
- A worker actor that dies on its own (its process or node vanished under Ray) is a NODE_DOWN
  without notice: the same requeue.

Node lifecycle in the pool (every move goes through ``_move`` and ``TRANSITIONS``)::

    (absent) --NODE_UP--> SERVING --NOTICE--> NOTIFIED --NODE_DOWN--> GONE
                             \\                                         ^
                              +------- NODE_DOWN / actor death --------+

The pool reads no clock: ``poll(now)`` applies, in order, every event due at ``now`` (seconds on
the event source's clock: wall seconds since the window start for a ``MarketSchedule``), so tests
drive it with made-up times. Notices are told the time left from ``now`` to the node's deadline.
The ledger bills each node from its NODE_UP to its NODE_DOWN at the events' own times (an actor
death or ``close`` at ``now``), times ``bill_scale``: pass the market's compression to bill in
trace seconds.
"""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Protocol

from roll_spotlight.checks import require, require_each, require_int, require_number
from roll_spotlight.spot.ledger import CostLedger
from roll_spotlight.spot.market import EventKind, MarketEvent

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------
# Configuration, lifecycle, counters


@dataclass(frozen=True)
class SpotPoolConfig:
    """``no_notice``: ignore every NOTICE (a plain kill at NODE_DOWN). ``min_notice_s``: a NOTICE
    with no more time left than this is ignored too (it cannot be met). ``unknown_notice_s``: the
    time left told to a worker when the source knows no deadline. ``bill_scale``: ledger seconds
    per pool-clock second. ``name_prefix``: worker names are ``<prefix>-<node id>``.
    ``gpus_per_node``: GPUs billed per node (the launcher runs one worker per GPU)."""

    no_notice: bool = False
    min_notice_s: float = 0.0
    unknown_notice_s: float = 30.0
    bill_scale: float = 1.0
    name_prefix: str = "spot"
    gpus_per_node: int = 1

    def __post_init__(self) -> None:
        require_number("spot_pool.min_notice_s", self.min_notice_s, ">= 0")
        require_each(self, "spot_pool", ("unknown_notice_s", "bill_scale"), require_number)
        require(bool(self.name_prefix), "spot_pool.name_prefix", self.name_prefix, "must be a non-empty string")
        require_int("spot.gpus_per_node", self.gpus_per_node)


class NodeState(enum.Enum):
    SERVING = "serving"
    NOTIFIED = "notified"
    GONE = "gone"


TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.SERVING: frozenset({NodeState.NOTIFIED, NodeState.GONE}),
    NodeState.NOTIFIED: frozenset({NodeState.GONE}),
    NodeState.GONE: frozenset(),
}


@dataclass
class PoolNode:
    node_id: str
    zone: str
    worker: str
    state: NodeState
    up_at: float
    down_at: float | None = None


@dataclass
class SpotPoolStats:
    """Counters over the pool's life. ``notices_ignored``: dropped by ``no_notice``;
    ``notices_late``: applied with too little time left to be of use. ``steps_lost``: denoising
    steps that killed workers had run but not yet handed to the queue (as read from the worker just
    before the kill)."""

    nodes_up: int = 0
    notices: int = 0
    notices_ignored: int = 0
    notices_late: int = 0
    preemptions: int = 0
    preempted_after_notice: int = 0
    actor_deaths: int = 0
    leases_requeued: int = 0
    steps_lost: int = 0
    events_ignored: int = 0


# ---------------------------------------------------------------------------------------------
# What the pool talks to


class EventSource(Protocol):
    """Where node events come from: ``due(now)`` returns the events due by ``now`` not returned
    before, in order; ``deadline(node_id)`` the node's kill time on the same clock, if known."""

    def due(self, now: float) -> list[MarketEvent]: ...
    def deadline(self, node_id: str) -> float | None: ...


class WorkerLauncher(Protocol):
    """Starts and ends the pool's workers (Ray actors in ``RayWorkerLauncher``)."""

    def start(self, name: str, node_id: str) -> None: ...
    def notify(self, name: str, seconds_left: float) -> None: ...
    def kill(self, name: str) -> int: ...  # steps the worker had not handed to the queue
    def requeue(self, name: str) -> int: ...  # queue.worker_lost(name): leases returned
    def dead(self) -> list[str]: ...  # workers whose actor died on its own since the last call
    def advance(self) -> int: ...  # work due on every poll (elastic SP: one regroup); leases requeued
    def stop_all(self) -> None: ...


# ---------------------------------------------------------------------------------------------
# The pool


class ElasticSpotPool:
    """Applies node events to spot workers (see the module docstring)."""

    def __init__(self, source: EventSource, launcher: WorkerLauncher, ledger: CostLedger | None = None,
                 config: SpotPoolConfig | None = None) -> None:
        self.source, self.launcher, self.ledger = source, launcher, ledger
        self.config = config or SpotPoolConfig()
        self.nodes: dict[str, PoolNode] = {}
        self._by_worker: dict[str, str] = {}
        self.stats = SpotPoolStats()

    @property
    def serving(self) -> int:
        """Workers expected to pull: started and not notified or gone."""
        return sum(node.state is NodeState.SERVING for node in self.nodes.values())

    def owns(self, worker: str) -> bool:
        """Is ``worker`` one of this pool's workers (alive or gone), on any GPU of its node?"""
        return worker in self._by_worker or node_worker(worker) in self._by_worker

    def poll(self, now: float) -> list[MarketEvent]:
        """Handle actor deaths, apply every event due by ``now``, then let the launcher advance
        (elastic SP: drop the lost, admit started nodes); returns the events."""
        for worker in self.launcher.dead():
            self._actor_died(worker, now)
        events = self.source.due(now)
        for event in events:
            self.apply(event, now)
        self.stats.leases_requeued += self.launcher.advance()
        return events

    def apply(self, event: MarketEvent, now: float) -> None:
        if event.kind is EventKind.NODE_UP:
            self._node_up(event)
        elif event.kind is EventKind.NOTICE:
            self._notice(event, now)
        elif event.kind is EventKind.NODE_DOWN:
            self._node_down(event.node_id, event.time_s, kill=True)
        else:
            raise AssertionError(f"unknown event kind {event.kind!r}")

    def close(self, now: float) -> None:
        """Stop every live worker (they finish their lease) and stop billing."""
        self.launcher.stop_all()
        for node in self.nodes.values():
            if node.state is not NodeState.GONE:
                self._bill_stop(node, now)

    # -- event handlers ------------------------------------------------------------------------

    def _node_up(self, event: MarketEvent) -> None:
        if event.node_id in self.nodes:
            self._ignore(event, "node id seen before")
            return
        worker = f"{self.config.name_prefix}-{event.node_id}"
        node = PoolNode(event.node_id, event.zone, worker, NodeState.SERVING, event.time_s)
        self.nodes[event.node_id], self._by_worker[worker] = node, event.node_id
        self.launcher.start(worker, event.node_id)
        if self.ledger is not None:
            self.ledger.start(event.node_id, _spot_pool_name(event.zone), event.time_s * self.config.bill_scale,
                              gpus=self.config.gpus_per_node)
        self.stats.nodes_up += 1

    def _notice(self, event: MarketEvent, now: float) -> None:
        node = self.nodes.get(event.node_id)
        if node is None or node.state is not NodeState.SERVING:
            self._ignore(event, "no serving worker on the node")
            return
        if self.config.no_notice:
            self.stats.notices_ignored += 1
            return
        deadline = self.source.deadline(event.node_id)
        seconds_left = self.config.unknown_notice_s if deadline is None else deadline - now
        if seconds_left <= self.config.min_notice_s:
            log.warning("notice of node %s applied %.3f s before its deadline (minimum %.3f s); ignored",
                        event.node_id, seconds_left, self.config.min_notice_s)
            self.stats.notices_late += 1
            return
        self.launcher.notify(node.worker, seconds_left)
        self._move(node, NodeState.NOTIFIED)
        self.stats.notices += 1

    def _node_down(self, node_id: str, at: float, *, kill: bool) -> None:
        node = self.nodes.get(node_id)
        if node is None or node.state is NodeState.GONE:
            self.stats.events_ignored += 1
            return
        notified = node.state is NodeState.NOTIFIED
        if kill:  # else the actor is already dead and its progress unknown
            self.stats.steps_lost += self.launcher.kill(node.worker)
        self.stats.leases_requeued += self.launcher.requeue(node.worker)
        self._move(node, NodeState.GONE)
        node.down_at = at
        self._bill_stop(node, at)
        self.stats.preemptions += 1
        self.stats.preempted_after_notice += notified

    def _actor_died(self, worker: str, now: float) -> None:
        node_id = self._by_worker.get(worker)
        assert node_id is not None, f"launcher reported unknown worker {worker!r}"
        log.warning("spot worker %s died before its node's NODE_DOWN; requeuing its leases", worker)
        self.stats.actor_deaths += 1
        self._node_down(node_id, now, kill=False)

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _move(node: PoolNode, to: NodeState) -> None:
        assert to in TRANSITIONS[node.state], f"illegal move {node.state.name} -> {to.name} of node {node.node_id}"
        node.state = to

    def _bill_stop(self, node: PoolNode, now: float) -> None:
        if self.ledger is not None and node.node_id in self.ledger.open_nodes:
            self.ledger.stop(node.node_id, now * self.config.bill_scale)

    def _ignore(self, event: MarketEvent, why: str) -> None:
        log.debug("ignoring %s of node %s: %s", event.kind.value, event.node_id, why)
        self.stats.events_ignored += 1


def _spot_pool_name(zone: str) -> str:
    return f"spot/{zone}" if zone else "spot"


def gpu_worker(name: str, gpu: int) -> str:
    """The name of the worker on GPU ``gpu`` of the node whose worker is ``name``."""
    return name if gpu == 0 else f"{name}/g{gpu}"


def node_worker(worker: str) -> str:
    """The node's worker name of ``worker`` (`gpu_worker`'s inverse)."""
    name, sep, gpu = worker.rpartition("/g")
    return name if sep and gpu.isdigit() else worker
