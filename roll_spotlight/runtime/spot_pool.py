"""Elastic spot pool: rollout workers that come and go with spot nodes.

    SpotMarket (trace replay) --MarketSchedule--+
                                                +--> ElasticSpotPool.poll(now) --> WorkerLauncher
    ray.nodes() + node drains --RayNodeWatcher--+          |                    (RolloutWorker actors)
                                                           +--> CostLedger (GPU-seconds per pool)

What each market event does (DESIGN.md section 4, the preemption-aware scheduler):

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

On a real cluster ``RayNodeWatcher`` turns ``ray.nodes()`` changes into the same events: a new
alive spot node is NODE_UP, a node that starts draining is NOTICE (deadline from the drain), a node
that is dead or gone is NODE_DOWN. What Ray exposes for this (checked on Ray 2.60 only):

- Spot nodes: the default label ``ray.io/market-type`` (set from ``RAY_NODE_MARKET_TYPE`` on the
  node, e.g. by KubeRay), a custom label ``spot``, or the ``spot_gpu`` resource of this project.
- Notice: the GCS ``DrainNode`` RPC with reason ``DRAIN_NODE_REASON_PREEMPTION`` and a deadline.
  Autoscaler v2 sends it; ``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION
  --deadline-remaining-seconds N`` (a hidden CLI command) sends it by hand; Ray 2.60 nodes started
  with ``ray start --block`` send it for themselves on SIGTERM when
  ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S`` > 0. A cloud's own notice (AWS's 2-minute warning, a
  GCP ACPI shutdown) reaches Ray only through one of those. The driver reads drains with the
  private ``ray._private.state.state.get_draining_nodes()`` -> {node id hex: deadline ms}; it
  carries no reason, so every drain counts as a notice (a node running our workers is not idle,
  so the autoscaler's idle drains do not hit it). A probe on a local 2.60 head node confirmed the
  drain shows up with its deadline while running actors keep running and new actors are no
  longer placed there; after the node dies ``ray.nodes()`` reports ``DeathReason`` 3
  (``AUTOSCALER_DRAIN_PREEMPTED``). Private API: it may move between Ray versions, and the watcher
  then sees only NODE_DOWN (kills without notice), which the queue also handles.

In training (a run's ``spot:`` section, ``RunConfig.spot``), ``start_training_pool`` builds the
run's market (``training_market``: the trace, or the synthetic market, capped at ``max_workers``
nodes), its price table and a ``TrainingSpotPool``: the pool on a clock (wall seconds since the
initial fleet was ready) plus a ledger that also bills the on-demand GPUs, so a run reports
on-demand vs spot cost side by side. The Ray backend polls it while it waits for rollouts, which is
the only time spot workers hold leases (they pull rollout and exploration requests, and both are
waited for by that loop), so a notice reaches a busy worker within one poll; events that fall due
while the driver trains or validates are applied at the next poll (a late notice to an idle worker
is dropped and its node simply goes at NODE_DOWN, losing nothing).
"""
from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from roll_spotlight.dispatch.queue import QueueStats
    from roll_spotlight.training.config import SpotConfig

from roll_spotlight.spot.ledger import CostLedger, CostReport
from roll_spotlight.spot.market import NOTICE_S_BY_PROVIDER, EventKind, MarketConfig, MarketEvent, SpotMarket
from roll_spotlight.spot.prices import Price, PriceTable, default_prices, prices_for_trace
from roll_spotlight.spot.replay import MIN_NOTICE_S  # the notice floor `spotlight replay` uses too
from roll_spotlight.spot.traces import Trace

log = logging.getLogger(__name__)

SPOT_RESOURCE = "spot_gpu"
MARKET_TYPE_LABEL = "ray.io/market-type"
ZONE_LABEL = "ray.io/availability-zone"
SPOT_LABEL = "spot"
_TRUE = frozenset({"1", "true", "yes", "spot"})


# ---------------------------------------------------------------------------------------------
# Configuration, lifecycle, counters


@dataclass(frozen=True)
class SpotPoolConfig:
    """``no_notice``: ignore every NOTICE (a plain kill at NODE_DOWN). ``min_notice_s``: a NOTICE
    with no more time left than this is ignored too (it cannot be met). ``unknown_notice_s``: the
    time left told to a worker when the source knows no deadline. ``bill_scale``: ledger seconds
    per pool-clock second. ``name_prefix``: worker names are ``<prefix>-<node id>``."""

    no_notice: bool = False
    min_notice_s: float = 0.0
    unknown_notice_s: float = 30.0
    bill_scale: float = 1.0
    name_prefix: str = "spot"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.min_notice_s) and self.min_notice_s >= 0):
            raise ValueError(f"spot_pool.min_notice_s must be finite and >= 0, got {self.min_notice_s!r}")
        if not (math.isfinite(self.unknown_notice_s) and self.unknown_notice_s > 0):
            raise ValueError(f"spot_pool.unknown_notice_s must be finite and > 0, got {self.unknown_notice_s!r}")
        if not (math.isfinite(self.bill_scale) and self.bill_scale > 0):
            raise ValueError(f"spot_pool.bill_scale must be finite and > 0, got {self.bill_scale!r}")
        if not self.name_prefix:
            raise ValueError("spot_pool.name_prefix must be a non-empty string")


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
    def stop_all(self) -> None: ...


class MarketSchedule:
    """A ``SpotMarket`` as an event source, on its wall clock (seconds since the window start)."""

    def __init__(self, market: SpotMarket) -> None:
        self.market = market
        self._next = 0
        scale, t0 = market.config.compression, market.window_start_s
        self._deadlines = {life.node_id: (life.down_s - t0) / scale
                           for life in market.lives if life.down_s is not None}

    def due(self, now: float) -> list[MarketEvent]:
        events = self.market.events
        start = self._next
        while self._next < len(events) and events[self._next].time_s <= now:
            self._next += 1
        return list(events[start:self._next])

    def deadline(self, node_id: str) -> float | None:
        return self._deadlines.get(node_id)

    @property
    def exhausted(self) -> bool:
        return self._next >= len(self.market.events)


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
        """Is ``worker`` one of this pool's workers (alive or gone)?"""
        return worker in self._by_worker

    def poll(self, now: float) -> list[MarketEvent]:
        """Handle actor deaths, then apply every event due by ``now``; returns those events."""
        for worker in self.launcher.dead():
            self._actor_died(worker, now)
        events = self.source.due(now)
        for event in events:
            self.apply(event, now)
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
            self.ledger.start(event.node_id, _spot_pool_name(event.zone), event.time_s * self.config.bill_scale)
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


# ---------------------------------------------------------------------------------------------
# Ray shell: rollout worker actors


class RayWorkerLauncher:
    """Spot ``RolloutWorker`` actors on Ray. Each asks for one unit of ``resource``; with
    ``node_affinity`` it is pinned to the node the event names (a real cluster, node ids in hex).
    ``worker_kwargs(node_id)`` gives extra ``RolloutWorker`` arguments per node (tests inject
    ``hold_at_step`` on one node this way). ``policy_path`` is what workers load
    (``actors.load_policy``): the tiny base checkpoint, or a model section for a real model each
    node loads from its own disk (a CUDA device adds ``num_gpus=1`` to the actor's request).

    ``sp_degree`` > 1: a node gets an SP rollout group (``runtime.sp_group``) of that many workers
    instead of one; the group is one worker to the pool and the queue (its leader's name), a
    notice goes to every member, and a kill or a member's death ends the whole group (it cannot
    run without that member; a notice would have committed its lease first)."""

    def __init__(self, policy_path, queue, store, *, resource: str = SPOT_RESOURCE, threads: int = 1,
                 commit_every: int = 0, node_affinity: bool = False, probe_timeout_s: float = 2.0,
                 stop_timeout_s: float = 60.0, sp_degree: int = 1, sp_timeout_s: float = 60.0,
                 worker_kwargs: Callable[[str], Mapping[str, object]] | None = None) -> None:
        if commit_every < 0:
            raise ValueError(f"commit_every must be >= 0, got {commit_every!r}")
        if sp_degree < 1:
            raise ValueError(f"sp_degree must be >= 1, got {sp_degree!r}")
        self.sp_degree, self.sp_timeout_s = sp_degree, sp_timeout_s
        self.followers: dict[str, list] = {}  # group name -> its other members' handles
        self._follower_serving: dict[str, list] = {}
        self._rendezvous = None
        self._groups_started = 0
        self.policy_path, self.queue, self.store = policy_path, queue, store
        self.resource, self.threads, self.commit_every = resource, threads, commit_every
        self.node_affinity = node_affinity
        self.probe_timeout_s, self.stop_timeout_s = probe_timeout_s, stop_timeout_s
        self.worker_kwargs = worker_kwargs or (lambda node_id: {})
        self.workers: dict[str, object] = {}
        self._serving: dict[str, object] = {}  # name -> ObjectRef of serve()
        self._ready: dict[str, list] = {}  # name -> ObjectRefs that resolve once its actors' __init__ ran
        self.finished: dict[str, dict] = {}  # name -> counters of a serve() that returned

    def start(self, name: str, node_id: str) -> None:
        from roll_spotlight.models.source import worker_gpus
        from roll_spotlight.runtime.actors import RolloutWorker

        options: dict[str, object] = {"resources": {self.resource: 1}, "num_gpus": worker_gpus(self.policy_path)}
        if self.node_affinity:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
        members = [{}]
        if self.sp_degree > 1:
            from roll_spotlight.runtime.sp_group import group_memberships

            self._groups_started += 1  # a fresh prefix per group: a restarted node never meets old keys
            members = [{"sp": m, "group_name": name} for m in group_memberships(
                self._rendezvous_address(), f"{name}#{self._groups_started}", self.sp_degree, self.sp_timeout_s)]
        handles = [RolloutWorker.options(**options).remote(
            name if rank == 0 else f"{name}/sp{rank}", self.policy_path, self.queue, self.store, threads=self.threads,
            commit_every=self.commit_every, **self.worker_kwargs(node_id), **extra)
            for rank, extra in enumerate(members)]
        worker = handles[0]
        self.workers[name] = worker
        self._ready[name] = [h.stats.remote() for h in handles]
        self._serving[name] = worker.serve.remote()
        if len(handles) > 1:
            self.followers[name] = handles[1:]
            self._follower_serving[name] = [h.serve.remote() for h in handles[1:]]

    def _rendezvous_address(self):
        if self._rendezvous is None:
            from roll_spotlight.runtime.sp_group import open_rendezvous

            # loopback unless the workers may sit on other hosts (a real cluster's spot nodes)
            self._rendezvous = open_rendezvous(all_local=not self.node_affinity)
        return self._rendezvous.address

    def _end_group(self, name: str) -> None:
        """Kill a group's other members (its leader is handled by the caller)."""
        import ray

        for handle in self.followers.pop(name, []):
            ray.kill(handle, no_restart=True)
        self._follower_serving.pop(name, None)

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until every started worker has loaded its policy; False on timeout."""
        import ray

        refs = [ref for group in self._ready.values() for ref in group]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        return len(ready) == len(refs)

    def wait_stopped(self, name: str, timeout_s: float) -> dict | None:
        """The worker's counters once its ``serve()`` returned (after a notice or a stop), or None
        if it is still serving after ``timeout_s``."""
        import ray

        if name not in self.finished:
            done, _ = ray.wait([self._serving[name]], timeout=timeout_s)
            if not done:
                return None
            self.finished[name] = ray.get(self._serving.pop(name))
        return self.finished[name]

    def notify(self, name: str, seconds_left: float) -> None:
        for worker in [self.workers[name], *self.followers.get(name, [])]:
            worker.notify_preemption.remote(seconds_left)

    def kill(self, name: str) -> int:
        import ray

        worker = self.workers.pop(name)
        unsaved = self._unsaved_steps(name, worker)
        ray.kill(worker, no_restart=True)
        self._end_group(name)
        self._serving.pop(name, None)
        self._ready.pop(name, None)
        return unsaved

    def _unsaved_steps(self, name: str, worker) -> int:
        """What the worker would lose if killed now; 0 when it is still starting or already dead."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        refs = self._ready[name]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        if len(ready) < len(refs):
            return 0
        try:
            return int(ray.get(worker.unsaved_steps.remote(), timeout=self.probe_timeout_s))
        except (RayActorError, GetTimeoutError):
            return 0

    def requeue(self, name: str) -> int:
        import ray

        return int(ray.get(self.queue.worker_lost.remote(name)))

    def dead(self) -> list[str]:
        """Workers whose ``serve()`` ended with the actor dead (not a notice or a stop); for an SP
        group, also a group one of whose members died (the rest of it is killed: it cannot go on)."""
        import ray
        from ray.exceptions import RayActorError, RayError

        refs = {ref: name for name, ref in self._serving.items()}
        if not refs:
            return []
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        died = []
        for ref in done:
            name = refs[ref]
            del self._serving[name]
            try:
                self.finished[name] = ray.get(ref)
            except RayError as err:  # RayActorError: the actor died; else serve() raised
                if not isinstance(err, RayActorError) and name not in self.followers:
                    raise  # a solo worker's serve() failing is a bug, not a preemption
                died.append(name)
                self._drop_group(name)
        for name in [n for n in self._follower_serving if n in self._serving]:
            if self._member_died(self._follower_serving[name]):
                died.append(name)
                self._serving.pop(name, None)
                self._drop_group(name)
        return died

    @staticmethod
    def _member_died(refs: list) -> bool:
        import ray
        from ray.exceptions import RayError

        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in done:
            try:
                ray.get(ref)
            except RayError:
                return True
        return False

    def _drop_group(self, name: str) -> None:
        import ray

        worker = self.workers.pop(name, None)
        if worker is not None and name in self.followers:
            ray.kill(worker, no_restart=True)  # a leader left waiting on a dead member
        self._end_group(name)
        self._ready.pop(name, None)

    def stop_all(self) -> None:
        """Ask every worker to stop after its lease, wait for that, then end the actors."""
        import ray

        members = [*self.workers.values(), *(h for group in self.followers.values() for h in group)]
        for worker in members:
            worker.stop.remote()
        refs = [*self._serving.values(), *(r for group in self._follower_serving.values() for r in group)]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=self.stop_timeout_s)
        for worker in members:
            ray.kill(worker, no_restart=True)
        self.workers.clear()
        self.followers.clear()
        self._follower_serving.clear()
        self._serving.clear()
        self._ready.clear()
        if self._rendezvous is not None:
            self._rendezvous.close()
            self._rendezvous = None


# ---------------------------------------------------------------------------------------------
# Ray shell: a real cluster's spot nodes as an event source


def is_spot_node(node: Mapping) -> bool:
    """A ``ray.nodes()`` entry of a spot node: market-type label, ``spot`` label or spot resource."""
    labels = node.get("Labels") or {}
    if str(labels.get(MARKET_TYPE_LABEL, "")).lower() == "spot":
        return True
    if str(labels.get(SPOT_LABEL, "")).lower() in _TRUE:
        return True
    return has_spot_resource(node)


def has_spot_resource(node: Mapping) -> bool:
    """A ``ray.nodes()`` entry that can host a spot worker: it declares ``SPOT_RESOURCE``."""
    return float((node.get("Resources") or {}).get(SPOT_RESOURCE, 0.0)) > 0


@dataclass
class _Watched:
    zone: str
    notified: bool = False
    deadline: float | None = None


@dataclass
class NodeDiff:
    """One observation's changes, in the market's order at one instant (departures first)."""

    notices: list[tuple[str, float | None]] = field(default_factory=list)  # (node id, deadline epoch s)
    downs: list[str] = field(default_factory=list)
    ups: list[tuple[str, str]] = field(default_factory=list)  # (node id, zone)


def diff_nodes(known: Mapping[str, bool], nodes: list[Mapping], draining: Mapping[str, int],
               is_spot: Callable[[Mapping], bool] = is_spot_node) -> NodeDiff:
    """Compare the ``known`` spot nodes (node id -> already notified) with a fresh ``ray.nodes()``
    list and the draining map (node id hex -> deadline in epoch ms, 0 = none). A node that is dead or absent is down; a
    known node that drains for the first time gets a notice; a new alive one is up (and, if it is
    already draining, notified at once). Dead nodes never seen alive are ignored."""
    alive = {n["NodeID"]: n for n in nodes if n.get("Alive") and is_spot(n)}
    diff = NodeDiff()
    diff.downs = [node_id for node_id in known if node_id not in alive]
    for node_id, node in alive.items():
        if node_id not in known:
            diff.ups.append((node_id, str((node.get("Labels") or {}).get(ZONE_LABEL, ""))))
        if node_id in draining and not known.get(node_id, False):
            deadline_ms = draining[node_id]
            diff.notices.append((node_id, deadline_ms / 1000.0 if deadline_ms > 0 else None))
    return diff


class RayNodeWatcher:
    """``EventSource`` over a live Ray cluster (see the module docstring for what Ray exposes).
    ``nodes_fn`` and ``draining_fn`` default to ``ray.nodes`` and the GCS draining map; ``epoch``
    is the wall clock the drain deadlines are on. Events are stamped with the ``now`` they were
    seen at. A worker actor that dies while its node lives on is caught by the pool
    (``WorkerLauncher.dead``), not here."""

    def __init__(self, nodes_fn: Callable[[], list[Mapping]] | None = None,
                 draining_fn: Callable[[], Mapping[str, int]] | None = None, *,
                 is_spot: Callable[[Mapping], bool] = is_spot_node, epoch: Callable[[], float] = time.time) -> None:
        self._nodes_fn = nodes_fn or _ray_nodes
        self._draining_fn = draining_fn or _ray_draining_nodes
        self._is_spot, self._epoch = is_spot, epoch
        self._known: dict[str, _Watched] = {}

    def due(self, now: float) -> list[MarketEvent]:
        known = {node_id: watched.notified for node_id, watched in self._known.items()}
        diff = diff_nodes(known, self._nodes_fn(), self._draining_fn(), self._is_spot)
        offset = now - self._epoch()  # epoch seconds -> this clock
        new = {node_id for node_id, _ in diff.ups}
        events = [self._notice(node_id, deadline, offset, now)
                  for node_id, deadline in diff.notices if node_id not in new]
        events += [self._event(EventKind.NODE_DOWN, node_id, now) for node_id in diff.downs]
        for node_id in diff.downs:
            del self._known[node_id]
        for node_id, zone in diff.ups:
            self._known[node_id] = _Watched(zone)
        events += [self._event(EventKind.NODE_UP, node_id, now) for node_id, _ in diff.ups]
        events += [self._notice(node_id, deadline, offset, now)
                   for node_id, deadline in diff.notices if node_id in new]
        return events

    def deadline(self, node_id: str) -> float | None:
        watched = self._known.get(node_id)
        return None if watched is None else watched.deadline

    def _notice(self, node_id: str, deadline_epoch: float | None, offset: float, now: float) -> MarketEvent:
        watched = self._known[node_id]
        watched.notified = True
        watched.deadline = None if deadline_epoch is None else deadline_epoch + offset
        return self._event(EventKind.NOTICE, node_id, now)

    def _event(self, kind: EventKind, node_id: str, now: float) -> MarketEvent:
        zone = self._known[node_id].zone if node_id in self._known else ""
        return MarketEvent(now, kind, node_id, zone, now)


def _ray_nodes() -> list[Mapping]:
    import ray

    return ray.nodes()


def _ray_draining_nodes() -> Mapping[str, int]:
    """{node id hex: deadline epoch ms}; older Rays returned only the ids (no deadline: 0)."""
    from ray._private.state import state

    draining = state.get_draining_nodes()
    return draining if isinstance(draining, Mapping) else {node_id: 0 for node_id in draining}


# ---------------------------------------------------------------------------------------------
# Training: the market, prices and pool of a run's ``spot:`` section

ONDEMAND_BILLING = "ondemand-gpus"  # the ledger entry of the trainer and on-demand rollout GPUs
BACKGROUND_POLL_S = 0.2  # how often a wall-clock training pool polls its market between driver polls
CONFIG_PRICE_SOURCE = "set in the run config ({key})"


def load_run_trace(spot: SpotConfig) -> Trace:
    """``spot.trace``, or the synthetic trace (Bamboo p3 statistics) seeded by ``spot.seed``."""
    from roll_spotlight.spot.synthetic import synthetic_trace
    from roll_spotlight.spot.traces import load_trace

    return load_trace(spot.trace) if spot.trace else synthetic_trace(seed=spot.seed)


def training_notice_s(spot: SpotConfig, provider: str) -> float:
    """The notice in wall seconds: as configured, else the provider's notice compressed like the
    trace, but at least ``MIN_NOTICE_S``."""
    if spot.notice_s is not None:
        return spot.notice_s
    return max(NOTICE_S_BY_PROVIDER[provider] / spot.compression, MIN_NOTICE_S)


def training_market(spot: SpotConfig, trace: Trace | None = None) -> SpotMarket:
    """The run's market: ``trace`` (default ``load_run_trace``) from ``start_s``, to its end,
    ``compression`` times faster, at most ``max_workers`` spot nodes alive (the market's cap:
    a node preempted frees its slot for the trace's next join)."""
    trace = trace if trace is not None else load_run_trace(spot)
    return SpotMarket(trace, MarketConfig(
        notice_s=training_notice_s(spot, trace.provider), victims=spot.victims, seed=spot.seed,
        compression=spot.compression, start_s=spot.start_s, cap_nodes=spot.max_workers, zones=spot.zones))


def training_prices(spot: SpotConfig, trace: Trace) -> PriceTable:
    """The trace's price table (``gpu_type``'s defaults when set), with the config's overrides."""
    return _with_config_prices(spot, default_prices(spot.gpu_type) if spot.gpu_type else prices_for_trace(trace))


def _with_config_prices(spot: SpotConfig, table: PriceTable) -> PriceTable:
    """``table`` with ``spot.ondemand_usd_per_gpu_hour`` / ``spot_usd_per_gpu_hour`` replacing its
    prices of that kind (every zone)."""
    prices = dict(table.prices)
    for kind, key in (("ondemand", "ondemand_usd_per_gpu_hour"), ("spot", "spot_usd_per_gpu_hour")):
        value = getattr(spot, key)
        if value is not None:
            prices = {pool: price for pool, price in prices.items() if pool.partition("/")[0] != kind}
            prices[kind] = Price(value, CONFIG_PRICE_SOURCE.format(key=f"spot.{key}"))
    return PriceTable(table.gpu_type, prices)


class TrainingSpotPool:
    """The spot side of one training run: the pool polled on ``clock``, and the run's ledger.

    Both pools bill on the pool clock times the pool's ``bill_scale`` (the market's compression,
    so GPU-seconds are trace seconds): the ``ondemand_gpus`` (trainer and on-demand rollout
    workers) from clock 0 to ``close``; each spot node from its NODE_UP to its NODE_DOWN (or
    ``close``). ``record`` counts the completions the backend collects: how many ran on spot
    workers, how many were resumed from a committed step, and repeated request ids (the queue
    promises none).
    """

    def __init__(self, pool: ElasticSpotPool, ledger: CostLedger, clock: Callable[[], float],
                 ondemand_gpus: int, *, background_poll_s: float | None = None) -> None:
        assert ondemand_gpus >= 1, "the trainer alone is one on-demand GPU"
        self.pool, self.ledger, self.clock = pool, ledger, clock
        self.ondemand_gpus = ondemand_gpus
        self._seen: set[int] = set()
        self.completed_on_spot = self.outputs_resumed = self.duplicate_completions = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        ledger.start(ONDEMAND_BILLING, "ondemand", 0.0, gpus=ondemand_gpus)
        if background_poll_s is not None:
            self._start_poller(background_poll_s)

    def _start_poller(self, interval_s: float) -> None:
        """The market runs on the wall clock whatever the driver is doing (validating, waiting for
        the trainer), so a daemon thread polls it too; otherwise a notice that falls due while the
        driver is busy arrives late and its node dies without committing."""
        def loop() -> None:
            while not self._stop.wait(interval_s):
                self.poll()

        self._poller = threading.Thread(target=loop, name="spot-pool-poller", daemon=True)
        self._poller.start()

    @property
    def bill_scale(self) -> float:
        return self.pool.config.bill_scale

    def poll(self) -> None:
        with self._lock:
            if not self._stop.is_set():
                self.pool.poll(self.clock())

    def record(self, completion) -> None:
        """Count one collected completion (a ``dispatch.requests.Completion``)."""
        with self._lock:
            self._record(completion)

    def _record(self, completion) -> None:
        request_id = completion.request.request_id
        if request_id in self._seen:
            self.duplicate_completions += 1
            return
        self._seen.add(request_id)
        self.completed_on_spot += self.pool.owns(completion.worker)
        self.outputs_resumed += completion.output.resumed_from > 0

    def cost(self) -> CostReport:
        return self.ledger.report(self.clock() * self.bill_scale)

    def metrics(self, queue: QueueStats) -> dict[str, float]:
        """Flat counters and costs so far, for a run's metrics row (TensorBoard-friendly keys)."""
        with self._lock:
            return self._metrics(queue)

    def _metrics(self, queue: QueueStats) -> dict[str, float]:
        stats = self.pool.stats
        counters = {
            "spot/workers_serving": self.pool.serving, "spot/nodes_started": stats.nodes_up,
            "spot/preemptions": stats.preemptions, "spot/notices": stats.notices,
            "spot/notices_late": stats.notices_late, "spot/actor_deaths": stats.actor_deaths,
            "spot/leases_requeued": stats.leases_requeued, "spot/steps_lost": stats.steps_lost,
            "spot/commits": queue.commits, "spot/checkpoints": queue.checkpoints,
            "spot/resumed_from_commit": queue.resumed_from_commit, "spot/outputs_resumed": self.outputs_resumed,
            "spot/completed_on_spot": self.completed_on_spot, "spot/requests_failed": queue.failed,
            "spot/duplicate_completions": self.duplicate_completions,
            "spot/late_completions_rejected": queue.duplicate_completions,
        }
        return counters | cost_metrics(self.cost(), self.bill_scale)

    def close(self) -> CostReport:
        """Stop every spot worker and all billing; returns the run's final cost."""
        with self._lock:
            self._stop.set()
        if self._poller is not None:
            self._poller.join()
        now = self.clock()
        self.pool.close(now)
        if ONDEMAND_BILLING in self.ledger.open_nodes:
            self.ledger.stop(ONDEMAND_BILLING, now * self.bill_scale)
        return self.ledger.report()


def cost_metrics(report: CostReport, bill_scale: float) -> dict[str, float]:
    """``cost/gpu_s/<pool>`` (billed seconds), ``cost/usd/<pool>``, the totals, and what the same
    GPU-hours would have cost on demand."""
    out: dict[str, float] = {"cost/bill_scale": bill_scale}
    for pool in report.pools:
        out[f"cost/gpu_s/{pool.pool}"] = pool.gpu_hours * 3600.0
        out[f"cost/usd/{pool.pool}"] = pool.usd
    return out | {"cost/usd": report.total_usd, "cost/all_ondemand_usd": report.ondemand_usd,
                  "cost/savings_usd": report.savings_usd, "cost/savings_fraction": report.savings_fraction}


def wall_clock() -> Callable[[], float]:
    """Seconds since this call (the monotonic clock)."""
    t0 = time.monotonic()
    return lambda: time.monotonic() - t0


def start_training_pool(spot: SpotConfig, policy_path, queue, store, *, ondemand_gpus: int, threads: int = 1,
                        market: SpotMarket | None = None, clock: Callable[[], float] | None = None,
                        worker_kwargs: Callable[[str], Mapping[str, object]] | None = None,
                        ready_timeout_s: float = 120.0, sp_degree: int = 1,
                        sp_timeout_s: float = 60.0) -> TrainingSpotPool:
    """Start the run's spot pool on Ray: the market's initial fleet is started and loaded before
    the clock starts (nodes alive at the window start are in steady state, not cold-starting).
    ``market``, ``clock`` and ``worker_kwargs`` are for tests (a made-up market, a fake clock,
    failure injection); by default the market comes from ``spot`` and the clock is the wall.
    With ``spot.source: cluster`` the pool follows the Ray cluster's own spot nodes instead (see
    ``start_cluster_pool``). ``sp_degree`` > 1: each node runs one SP rollout group of that many
    workers (``RayWorkerLauncher``)."""
    if spot.source == "cluster" and market is None:
        return start_cluster_pool(spot, policy_path, queue, store, ondemand_gpus=ondemand_gpus, threads=threads,
                                  worker_kwargs=worker_kwargs, ready_timeout_s=ready_timeout_s, sp_degree=sp_degree,
                                  sp_timeout_s=sp_timeout_s)
    market = market if market is not None else training_market(spot)
    ledger = CostLedger(training_prices(spot, market.trace))
    launcher = RayWorkerLauncher(policy_path, queue, store, threads=threads, commit_every=spot.commit_every,
                                 worker_kwargs=worker_kwargs, sp_degree=sp_degree, sp_timeout_s=sp_timeout_s)
    pool = ElasticSpotPool(MarketSchedule(market), launcher, ledger,
                           SpotPoolConfig(bill_scale=market.config.compression))
    pool.poll(0.0)
    if not launcher.wait_ready(ready_timeout_s):
        log.warning("spot workers of the initial fleet were not ready after %.0f s; training goes on", ready_timeout_s)
    log.info("spot pool: market %s, %d events over %.0f wall s, notice %.1f s, %d initial worker(s)",
             market.trace.name, len(market), market.duration_s, market.notice_s, pool.serving)
    # a test's fake clock advances per poll, so only the wall clock gets the background poller
    return TrainingSpotPool(pool, ledger, clock or wall_clock(), ondemand_gpus,
                            background_poll_s=None if clock is not None else BACKGROUND_POLL_S)


def cluster_prices(spot: SpotConfig) -> PriceTable:
    """Prices of a live cluster's GPUs: ``gpu_type``'s defaults with the config's overrides."""
    return _with_config_prices(spot, default_prices(spot.gpu_type))


def start_cluster_pool(spot: SpotConfig, policy_path, queue, store, *, ondemand_gpus: int, threads: int = 1,
                       source: EventSource | None = None,
                       worker_kwargs: Callable[[str], Mapping[str, object]] | None = None,
                       ready_timeout_s: float = 120.0, sp_degree: int = 1,
                       sp_timeout_s: float = 60.0) -> TrainingSpotPool:
    """The spot pool of a real cluster: ``RayNodeWatcher`` turns the Ray nodes that carry the
    ``spot_gpu`` resource (what deploy/kuberay declares on spot nodes, and what the workers ask
    for) into events; each such node gets one worker pinned to it (node affinity); a preemption
    drain with its deadline is the notice. Billing is in wall seconds at ``cluster_prices``.
    ``source`` replaces the watcher (tests)."""
    ledger = CostLedger(cluster_prices(spot))
    launcher = RayWorkerLauncher(policy_path, queue, store, threads=threads, commit_every=spot.commit_every,
                                 node_affinity=True, worker_kwargs=worker_kwargs, sp_degree=sp_degree,
                                 sp_timeout_s=sp_timeout_s)
    pool = ElasticSpotPool(source or RayNodeWatcher(is_spot=has_spot_resource), launcher, ledger,
                           SpotPoolConfig(bill_scale=1.0))
    pool.poll(0.0)
    if not launcher.wait_ready(ready_timeout_s):
        log.warning("spot workers on the cluster's spot nodes were not ready after %.0f s; training goes on",
                    ready_timeout_s)
    log.info("spot pool: following the Ray cluster's spot nodes, %d worker(s) now", pool.serving)
    return TrainingSpotPool(pool, ledger, wall_clock(), ondemand_gpus, background_poll_s=BACKGROUND_POLL_S)

