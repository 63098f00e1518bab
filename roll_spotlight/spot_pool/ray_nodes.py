"""Ray shell of the spot pool: spot rollout workers as actors, and a real cluster's spot nodes as
an event source for `roll_spotlight.spot_pool.pool.ElasticSpotPool`.

On a real cluster ``RayNodeWatcher`` turns ``ray.nodes()`` changes into the same events: a new
alive spot node is NODE_UP, a node that starts draining is NOTICE (deadline from the drain), a node
that is dead or gone is NODE_DOWN. What it reads of Ray (private API, checked on Ray 2.60) is in
docs/cluster.md, section 1.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from roll_spotlight.config.run import SPOT_RESOURCE
from roll_spotlight.spot.market import EventKind, MarketEvent
from roll_spotlight.spot_pool.pool import gpu_worker

log = logging.getLogger(__name__)

MARKET_TYPE_LABEL = "ray.io/market-type"
ZONE_LABEL = "ray.io/availability-zone"
SPOT_LABEL = "spot"
_TRUE = frozenset({"1", "true", "yes", "spot"})


# ---------------------------------------------------------------------------------------------
# Ray shell: rollout worker actors


class RayWorkerLauncher:
    """Spot ``RolloutWorker`` actors on Ray, ``gpus_per_node`` per spot node. Each asks for one
    unit of ``resource``; with ``node_affinity`` it is pinned to the node the event names (a real
    cluster, node ids in hex). ``worker_kwargs(node_id)`` gives extra ``RolloutWorker`` arguments
    per node (tests inject ``faults``, `worker.faults.FaultPlan`, on one node this way). ``policy_path`` is what workers
    load (``policy_source.load_policy``): the tiny base checkpoint, or a model section for a real model each
    node loads from its own disk (a CUDA device adds ``num_gpus=1`` to the actor's request).

    The pool's unit is a node (``name``); its workers are ``name`` and ``name/g1`` ... A node's
    workers are the members ``(node_id, gpu)`` of elastic SP:

    - ``elastic`` None (SP degree 1): each worker serves alone under its own name.
    - ``elastic`` given: an `elastic.groups.ElasticGroups` owns the members and forms SP groups
      across nodes as its planner says. A node's workers join once all of them loaded their policy
      (:meth:`advance`, called by the pool on every poll, so a slow load never blocks the pool);
      a notice makes their groups commit at once, and the survivors re-form at the end of the
      poll, in one regroup with every other notice, loss and arrival of that poll (re-forming
      after each would plan the next lost node of the same poll into a new group, whose members
      then wait out the rendezvous timeout for it);
      a kill without notice, or a member's own death, breaks its groups, whose leases that
      regroup hands back to the queue. ``regroups`` lists every `RegroupReport`.
    """

    def __init__(self, policy_path, queue, store, *, resource: str = SPOT_RESOURCE, threads: int = 1,
                 commit_every: int = 0, max_batch: int = 1, node_affinity: bool = False, probe_timeout_s: float = 2.0,
                 stop_timeout_s: float = 60.0, gpus_per_node: int = 1, elastic=None, inbox=None,
                 worker_kwargs: Callable[[str], Mapping[str, object]] | None = None) -> None:
        if commit_every < 0:
            raise ValueError(f"commit_every must be >= 0, got {commit_every!r}")
        if gpus_per_node < 1:
            raise ValueError(f"spot.gpus_per_node must be >= 1, got {gpus_per_node!r}")
        self.policy_path, self.queue, self.store = policy_path, queue, store
        self.resource, self.threads, self.commit_every, self.max_batch = resource, threads, commit_every, max_batch
        self.node_affinity, self.gpus_per_node = node_affinity, gpus_per_node
        self.probe_timeout_s, self.stop_timeout_s = probe_timeout_s, stop_timeout_s
        self.worker_kwargs = worker_kwargs or (lambda node_id: {})
        self.elastic_config = elastic
        self.inbox = inbox  # queue training: the workers also compute micro-batches of updates
        self.groups = None  # ElasticGroups, opened with the first node of an elastic launcher
        self._rendezvous = None
        self.nodes: dict[str, list[str]] = {}  # pool name -> its workers' names
        self.workers: dict[str, object] = {}  # worker name -> handle
        self.members: dict[str, tuple[str, int]] = {}  # worker name -> (node id, gpu)
        self._node_of: dict[str, str] = {}  # worker name -> pool name
        self._serving: dict[str, object] = {}  # worker name -> ObjectRef of its solo serve()
        self._ready: dict[str, object] = {}  # worker name -> ObjectRef resolved once __init__ ran
        self._pending: list[str] = []  # elastic nodes started but not yet in a group
        self._leaving: list[tuple[str, int]] = []  # noticed or lost members the next regroup drops
        self.finished: dict[str, dict] = {}  # worker name -> counters of a serve() that returned
        self.timelines: dict[str, list[dict]] = {}  # worker name -> phases of a worker that is gone

    @property
    def elastic(self) -> bool:
        return self.elastic_config is not None

    @property
    def regroups(self) -> list:
        return [] if self.groups is None else self.groups.reports

    def start(self, name: str, node_id: str) -> None:
        from roll_spotlight.worker.actor import RolloutWorker
        from roll_spotlight.worker.policy_source import worker_gpus

        options: dict[str, object] = {"resources": {self.resource: 1}, "num_gpus": worker_gpus(self.policy_path)}
        if self.node_affinity:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
        names = [gpu_worker(name, gpu) for gpu in range(self.gpus_per_node)]
        self.nodes[name] = names
        for gpu, worker in enumerate(names):
            handle = RolloutWorker.options(**options).remote(
                worker, self.policy_path, self.queue, self.store, threads=self.threads,
                commit_every=self.commit_every, max_batch=self.max_batch, inbox=self.inbox,
                **self.worker_kwargs(node_id))
            self.workers[worker], self.members[worker], self._node_of[worker] = handle, (node_id, gpu), name
            self._ready[worker] = handle.prepare_standby.remote()  # loaded and warmed up
            if not self.elastic:
                self._serving[worker] = handle.serve.remote()
        if self.elastic:
            self._pending.append(name)

    def advance(self) -> int:
        """One regroup for the poll: drop the members noticed or lost since the last one and admit
        every started node whose workers have all loaded their policy; returns the leases of the
        groups it found broken, handed back to the queue. Nothing to do without elastic SP."""
        ready = [name for name in self._pending if all(self._started(w) for w in self.nodes[name])]
        leaving, self._leaving = self._leaving, []
        if not (ready or leaving):
            return 0
        self._pending = [n for n in self._pending if n not in ready]
        newcomers = {self.members[w]: self.workers[w] for n in ready for w in self.nodes[n]}
        groups = self._elastic_groups()
        before = groups.requeued
        groups.regroup(lost=leaving, newcomers=newcomers)
        return groups.requeued - before

    def _elastic_groups(self):
        if self.groups is None:
            from roll_spotlight.elastic.groups import ElasticGroups
            from roll_spotlight.worker.sp_group import open_rendezvous

            # loopback unless the workers may sit on other hosts (a real cluster's spot nodes)
            self._rendezvous = open_rendezvous(all_local=not self.node_affinity)
            self.groups = ElasticGroups(self.elastic_config, self._rendezvous, self.queue)
        return self.groups

    def _grouped(self, name: str) -> list[tuple[str, int]]:
        """The node's members the groups still hold."""
        table = self.groups.workers if self.groups is not None else {}
        return [self.members[w] for w in self.nodes.get(name, []) if self.members[w] in table]

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until every started worker has loaded its policy (and, with elastic SP, joined
        its group); False on timeout."""
        import ray

        refs = list(self._ready.values())
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if self.elastic:
            self.advance()
        return len(ready) == len(refs)

    def wait_stopped(self, name: str, timeout_s: float) -> dict | None:
        """The node's first worker's counters once its ``serve()`` returned (after a notice or a
        stop), or None if it is still serving after ``timeout_s``."""
        import ray

        if self.elastic:
            return self.groups.finished.get(self.members[name]) if self.groups is not None else None
        if name not in self.finished:
            done, _ = ray.wait([self._serving[name]], timeout=timeout_s)
            if not done:
                return None
            self.finished[name] = ray.get(self._serving.pop(name))
        return self.finished[name]

    def notify(self, name: str, seconds_left: float) -> None:
        if name in self._pending:  # never joined a group: nothing in flight
            self._pending.remove(name)
        if not self.elastic:
            for worker in self.nodes[name]:
                self.workers[worker].notify_preemption.remote(seconds_left)
            return
        lost = self._grouped(name)
        if lost:
            self.groups.notice(lost, seconds_left)  # their groups commit after the step in hand
            self._lose(name)  # and the survivors re-form in this poll's `advance`

    def kill(self, name: str) -> int:
        unsaved = self.unsaved_steps(name)
        for worker in self.nodes[name]:
            # a worker still loading has no phases yet: do not wait on it for them
            self._keep_timeline(worker, self.workers.get(worker) if self._started(worker) else None, "preempted")
        self._end_node(name)
        self._lose(name)
        return unsaved

    def _lose(self, name: str) -> None:
        """Elastic SP: the node's members leave the groups in this poll's regroup (`advance`),
        which hands the lease of a group they broke back to the queue."""
        if name in self._pending:
            self._pending.remove(name)
        lost = self._grouped(name) if self.elastic else []
        self._leaving += [m for m in lost if m not in self._leaving]

    def _started(self, worker: str) -> bool:
        """Has the worker finished loading (and warming up)?"""
        import ray

        ref = self._ready.get(worker)
        return ref is not None and bool(ray.wait([ref], timeout=0)[0])

    def unsaved_steps(self, name: str) -> int:
        """What the node's workers would lose if killed now (a group's lease counted once, by its
        leader); 0 for a worker still starting or already dead."""
        import ray

        total = 0
        for worker in self.nodes[name]:
            handle = self.workers.get(worker)
            if handle is None or not self._started(worker):
                continue
            if self.elastic and not self._leads_a_group(self.members[worker]):
                continue
            try:
                total += int(ray.get(handle.unsaved_steps.remote(), timeout=self.probe_timeout_s))
            except _unreachable_actor_errors():
                pass  # dead, never placed, or stuck: nothing it holds can be read any more
        return total

    def _leads_a_group(self, member) -> bool:
        plan = self.groups.plan if self.groups is not None else None
        group = plan.group_of(member) if plan is not None else None
        return group is not None and group.members[0] == member

    def _keep_timeline(self, name: str, worker, end: str) -> None:
        """The worker's phases read before it goes (a killed actor's timeline goes with it), plus
        a mark of how it ended: "preempted" (killed at NODE_DOWN) or "died" (on its own)."""
        import ray

        events = []
        if worker is not None:
            try:
                events = list(ray.get(worker.timeline.remote(), timeout=self.probe_timeout_s))
            except _unreachable_actor_errors():
                pass  # dead or stuck: its phases are lost, the mark below still says when it went
        now = time.time()
        self.timelines[name] = events + [{"worker": name, "phase": end, "start": now, "end": now}]

    def requeue(self, name: str) -> int:
        """Leases the node's loss handed back to the queue now: its workers' own (solo); elastic,
        none here: the poll's regroup (`advance`) hands back those of the groups it broke."""
        import ray

        if self.elastic:
            self._lose(name)  # a node whose actor died on its own is lost here
            return 0
        return sum(int(ray.get(self.queue.worker_lost.remote(w))) for w in self.nodes[name])

    def dead(self) -> list[str]:
        """Nodes one of whose workers died on its own (not a notice or a stop); the node's other
        workers are ended too (the pool counts the node as gone)."""
        died = self._dead_elastic() if self.elastic else self._dead_solo()
        for name in died:
            self._keep_timeline(name, None, "died")
            self._end_node(name)
        return died

    def _dead_solo(self) -> list[str]:
        import ray
        from ray.exceptions import RayError

        refs = {ref: worker for worker, ref in self._serving.items()}
        if not refs:
            return []
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        died = []
        for ref in done:
            worker = refs[ref]
            del self._serving[worker]
            try:
                self.finished[worker] = ray.get(ref)
            except _dead_actor_errors():
                died.append(self._node_of[worker])
            except RayError:
                raise  # a solo worker's serve() failing is a bug, not a preemption
        return sorted(set(died))

    def _dead_elastic(self) -> list[str]:
        import ray
        from ray.exceptions import RayError

        if self.groups is None or not self.groups.serving:
            return []
        refs = {ref: member for member, ref in self.groups.serving.items()}
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        by_member = {m: w for w, m in self.members.items()}
        died = set()
        for ref in done:
            try:
                ray.get(ref)
            except _dead_actor_errors():  # this member's process is gone; a peer's serve() raises RayError
                died.add(self._node_of[by_member[refs[ref]]])
            except RayError:
                pass  # a survivor of a broken group: the dead member's regroup re-forms it
        return sorted(died)

    def _end_node(self, name: str) -> None:
        import ray

        for worker in self.nodes.get(name, []):
            handle = self.workers.pop(worker, None)
            if handle is not None:
                ray.kill(handle, no_restart=True)
            self._serving.pop(worker, None)
            self._ready.pop(worker, None)

    def stop_all(self) -> None:
        """Ask every worker to stop after its lease, wait for that, then end the actors."""
        import ray

        if self.groups is not None:
            self.groups.stop()
        for worker in self.workers.values():
            worker.stop.remote()
        refs = list(self._serving.values())
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=self.stop_timeout_s)
        for worker in self.workers.values():
            ray.kill(worker, no_restart=True)
        self.workers.clear()
        self._serving.clear()
        self._ready.clear()
        self._pending.clear()
        if self._rendezvous is not None:
            self._rendezvous.close()
            self._rendezvous = None


def _dead_actor_errors() -> tuple[type[BaseException], ...]:
    """What a call on an actor raises once it has no process: it died, or (pinned to a node
    that went before it was placed) it never got one."""
    from ray.exceptions import ActorUnschedulableError, RayActorError

    return (RayActorError, ActorUnschedulableError)


def _unreachable_actor_errors() -> tuple[type[BaseException], ...]:
    """``_dead_actor_errors`` plus a probe that timed out (a stuck actor)."""
    from ray.exceptions import GetTimeoutError

    return (*_dead_actor_errors(), GetTimeoutError)


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
