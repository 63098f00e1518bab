"""Ray shell of the spot pool: spot rollout workers as actors, and a real cluster's spot nodes as
an event source for `roll_spotlight.spot.pool.ElasticSpotPool`.

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
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from roll_spotlight.spot.market import EventKind, MarketEvent

log = logging.getLogger(__name__)

SPOT_RESOURCE = "spot_gpu"
MARKET_TYPE_LABEL = "ray.io/market-type"
ZONE_LABEL = "ray.io/availability-zone"
SPOT_LABEL = "spot"
_TRUE = frozenset({"1", "true", "yes", "spot"})


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
        self.timelines: dict[str, list[dict]] = {}  # name -> phases of a worker that is gone

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
        self._keep_timeline(name, worker, "preempted")
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

    def _keep_timeline(self, name: str, worker, end: str) -> None:
        """The worker's phases read before it goes (a killed actor's timeline goes with it), plus
        a mark of how it ended: "preempted" (killed at NODE_DOWN) or "died" (on its own)."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        events = []
        if worker is not None:
            try:
                events = list(ray.get(worker.timeline.remote(), timeout=self.probe_timeout_s))
            except (RayActorError, GetTimeoutError):
                pass  # dead or stuck: its phases are lost, the mark below still says when it went
        now = time.time()
        self.timelines[name] = events + [{"worker": name, "phase": end, "start": now, "end": now}]

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
                self._keep_timeline(name, None, "died")
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
