"""The driver's side of elastic SP on the live rollout workers (`worker.actor.RolloutWorker`).
It calls Ray actors, so unlike the pure planner (`group_plan.py`) this module imports Ray.

The rollout workers are the persistent SP workers: a regroup never starts a process or reloads a
model. :class:`ElasticGroups` forms their SP groups (`worker.sp_group`) as the planner says and
re-forms them after losses and arrivals. One regroup (:meth:`ElasticGroups.regroup`):

    1. lost members leave the table (preempted; after a notice their groups committed the lease
       in hand at the step boundary, see `worker.sp_group`);
    2. newcomers take the current weights from the cheapest peer (`transfer.choose_source`: a
       same-node peer, else another node's; with no peer the weight store serves their first
       lease): zero-copy shared memory on CPU, a device-to-device broadcast on GPUs;
    3. the pure planner (`planner.plan_groups`) maps the live workers to groups of valid degrees,
       keeping survivors together; workers no group of at least ``min_degree`` can hold wait
       (``Plan.idle``) until newcomers let them merge;
    4. every group that changes is left by its surviving members (`leave_group`: commit after the
       step in hand), and the driver waits until its members' `serve()` returned (one deadline,
       ``timeout_s``, for all of them);
    5. each new group forms under a fresh generation prefix (`comm.generation_prefix`), which is
       also its name in the queue (a name that had a notice keeps being refused leases), and
       serves; the committed lease resumes on the first group that pulls it, at any degree.

Member lifecycle (the table holds ACTIVE members only):

    add / regroup(newcomers=...) --> ACTIVE --notice()--> (group commits) --regroup(lost=...)--> gone

A member that dies without a notice breaks its group: the survivors' collectives fail (at once
when the process died, `worker.sp_group`; after ``timeout_s`` when its host vanished without
closing its connections), their `serve()` raises, and the regroup hands the group's lease back to
the queue (`worker_lost`) before re-forming.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from itertools import count
from typing import Any, Iterable, Mapping

from roll_spotlight.checks import require, require_number
from roll_spotlight.elastic.comm import generation_prefix
from roll_spotlight.elastic.group_plan import Member, Plan, SPGroup, moves, plan_groups, valid_degrees
from roll_spotlight.elastic.rendezvous import group_memberships
from roll_spotlight.elastic.transfer import TransferMethod, TransferSource, choose_method, choose_source

log = logging.getLogger(__name__)

__all__ = ["ElasticGroups", "ElasticGroupsConfig", "RegroupReport"]


@dataclass(frozen=True)
class ElasticGroupsConfig:
    """``num_heads`` / ``num_tokens``: what Ulysses must divide (the model's head count and image
    tokens per request); ``preferred_degree``: the SP degree groups take when enough workers live
    (``elastic.sp_degree``); ``timeout_s``: group formation and collectives; ``cuda``: workers
    hold their policy on a GPU (weights then move device to device); ``name``: prefix of every
    group's store keys and queue name (several pools may share one rendezvous); ``min_degree``
    (``elastic.min_sp_degree``): the smallest group that can run, e.g. the degree a 1280x1280
    model needs to fit in memory; survivors below it wait for newcomers instead of re-forming."""

    num_heads: int
    preferred_degree: int
    num_tokens: int | None = None
    timeout_s: float = 60.0
    cuda: bool = False
    name: str = "elastic"
    min_degree: int = 1

    def __post_init__(self) -> None:
        degrees = valid_degrees(self.num_heads, self.preferred_degree, self.num_tokens)  # raises naming both
        require(self.min_degree in degrees, f"elastic.min_sp_degree={self.min_degree}", self.min_degree,
                f"must be one of the valid SP degrees {sorted(degrees)} (divisors of the heads and tokens up to "
                "elastic.sp_degree)")
        require_number("ElasticGroupsConfig.timeout_s", self.timeout_s)
        require(bool(self.name) and "/" not in self.name, "ElasticGroupsConfig.name", self.name,
                "must be a non-empty name without '/'")


@dataclass(frozen=True)
class RegroupReport:
    """One regroup: its generation, the groups it formed (their queue names), the members lost
    and admitted, where each newcomer's weights came from, and its phases in seconds."""

    generation: int
    formed: tuple[str, ...]
    moves: int
    lost: tuple[Member, ...]
    admitted: tuple[Member, ...]
    sources: Mapping[Member, TransferSource]
    leave_s: float
    transfer_s: float
    seconds: float
    broken: tuple[str, ...] = field(default=())  # groups that failed without a notice (lease requeued)


class ElasticGroups:
    """Owns the table of live workers (member -> `RolloutWorker` handle), the current plan, and
    each serving member's `serve()` reference. ``rendezvous`` is a `RendezvousHost` (kept open by
    the caller), ``queue`` the queue actor (to requeue a broken group's lease)."""

    def __init__(self, config: ElasticGroupsConfig, rendezvous, queue) -> None:
        self.config, self.rendezvous, self.queue = config, rendezvous, queue
        self.workers: dict[Member, Any] = {}
        self.plan: Plan | None = None
        self.names: dict[SPGroup, str] = {}
        self.serving: dict[Member, Any] = {}  # member -> ObjectRef of its serve()
        self.finished: dict[Member, dict] = {}  # member -> counters of its last serve() that returned
        self.reports: list[RegroupReport] = []
        self.requeued = 0  # leases of broken groups handed back to the queue
        self._generations = count()
        self._transfers = count()

    # ---- the table ----

    def add(self, workers: Mapping[Member, Any]) -> None:
        """Workers that start with the pool (they load weights from the store on their first
        lease); call :meth:`regroup` to form their groups."""
        self.workers.update(workers)

    def notice(self, members: Iterable[Member], seconds_left: float) -> None:
        """A preemption notice to each of ``members``: their groups commit after the step in hand
        and stop; :meth:`regroup` with them as ``lost`` re-forms the survivors."""
        for member in members:
            self.workers[member].notify_preemption.remote(seconds_left)

    # ---- regroup ----

    def regroup(self, lost: Iterable[Member] = (), newcomers: Mapping[Member, Any] | None = None) -> RegroupReport | None:
        """Drop ``lost``, admit ``newcomers`` and re-form every group that changes (module
        docstring). Returns None when the groups stay as they are."""
        start = time.perf_counter()
        lost = tuple(sorted(m for m in set(lost) if m in self.workers))
        for member in lost:
            del self.workers[member]
        t_transfer = time.perf_counter()
        sources = self._admit(dict(newcomers or {}))
        transfer_s = time.perf_counter() - t_transfer
        live: dict[str, list[int]] = {}
        for node, gpu in sorted(self.workers):
            live.setdefault(node, []).append(gpu)
        new = plan_groups(live, num_heads=self.config.num_heads, preferred_degree=self.config.preferred_degree,
                          num_tokens=self.config.num_tokens, previous=self.plan, min_degree=self.config.min_degree)
        if new is self.plan:
            return None
        new = replace(new, generation=next(self._generations))
        kept = set(self.plan.groups) if self.plan is not None else set()
        t_leave = time.perf_counter()
        broken = self._leave([g for g in kept if g not in new.groups])
        leave_s = time.perf_counter() - t_leave
        formed = tuple(self._start(index, group, new.generation)
                       for index, group in enumerate(new.groups) if group not in kept)
        report = RegroupReport(new.generation, formed, moves(self.plan, new), lost, tuple(sorted(sources)),
                               sources, leave_s, transfer_s, time.perf_counter() - start, broken)
        self.plan = new
        self.reports.append(report)
        log.info("regroup to generation %d: formed %s, lost %s, admitted %s in %.3fs",
                 report.generation, formed, lost, report.admitted, report.seconds)
        return report

    def _leave(self, groups: list[SPGroup]) -> tuple[str, ...]:
        """Surviving members of ``groups`` leave them; wait until every member's serve() ended.
        A group whose members failed instead (one died without a notice) gets its lease requeued."""
        import ray
        from ray.exceptions import RayError

        for group in groups:
            for member in group.members:
                if member in self.workers:
                    self.workers[member].leave_group.remote()
        serving = {}  # ObjectRef of a member's serve() -> its group
        for group in groups:
            for member in group.members:
                if member in self.serving:
                    serving[self.serving.pop(member)] = (group, member)
        if serving:  # one deadline for all: members stuck on a vanished peer fail together
            ray.wait(list(serving), num_returns=len(serving), timeout=self.config.timeout_s)
        failed = set()
        for ref, (group, member) in serving.items():
            try:
                self.finished[member] = ray.get(ref, timeout=0)
            except RayError:  # the actor died, its serve() raised when a peer did, or it is stuck
                failed.add(group)
        broken = []
        for group in groups:
            name = self.names.pop(group)
            if group in failed:
                broken.append(name)
                self.requeued += int(ray.get(self.queue.worker_lost.remote(name)))
        return tuple(broken)

    def _start(self, index: int, group: SPGroup, generation: int) -> str:
        name = generation_prefix(generation, f"{self.config.name}/sp{index}")
        memberships = group_memberships(self.rendezvous.address, name, group.degree, self.config.timeout_s)
        for membership, member in zip(memberships, group.members):
            self.serving[member] = self.workers[member].serve.remote(sp=membership, group_name=name)
        self.names[group] = name
        return name

    # ---- newcomers' weights ----

    def _admit(self, newcomers: Mapping[Member, Any]) -> dict[Member, TransferSource]:
        """Copy the current weights into each newcomer from the cheapest peer; returns the source
        each used. Newcomers admitted earlier in the same call serve as peers for later ones. A
        copy that fails because the peer or the newcomer died on the way (a spot node that went
        during the copy) leaves the newcomer to load from storage on its first lease; a dead
        newcomer is then found by its group's serve() like any member that dies."""
        from ray.exceptions import RayError

        sources = {}
        for member in sorted(newcomers):
            peers = {f"{node}:{gpu}": node for node, gpu in self.workers}
            plan = choose_source(member[0], peers, storage_available=True)
            source = plan.source
            if plan.peer is not None:
                peer = self.workers[_member_of(plan.peer)]
                try:
                    self._copy(peer, newcomers[member], choose_method(plan, self.config.cuda))
                except RayError as err:
                    log.warning("weight copy %s -> %s failed (%s); the newcomer loads from storage",
                                plan.peer, member, type(err).__name__)
                    source = TransferSource.STORAGE
            sources[member] = source
            self.workers[member] = newcomers[member]
        return sources

    def _copy(self, peer, newcomer, method: TransferMethod) -> float:
        import ray

        if method is TransferMethod.OBJECT_STORE:
            # the peer's reply goes straight to the newcomer's call: one round trip for the driver
            return ray.get(newcomer.adopt_weights.remote(peer.publish_weights.remote()))
        assert method is TransferMethod.COLLECTIVE, method
        prefix = generation_prefix(next(self._transfers), f"{self.config.name}/weights")
        address, timeout = self.rendezvous.address, self.config.timeout_s
        version = ray.get(peer.weight_version.remote())
        sent, seconds = ray.get([peer.send_weights.remote(address, prefix, timeout),
                                 newcomer.receive_weights.remote(address, prefix, version, timeout)])
        if sent != version:
            raise RuntimeError(f"the peer moved from weight version {version} to {sent} during a copy")
        return seconds

    # ---- end ----

    def stop(self) -> dict[Member, dict]:
        """Stop every group after its lease in hand; the members' final counters."""
        import ray

        from ray.exceptions import RayError

        for worker in self.workers.values():
            worker.stop.remote()
        for member, ref in list(self.serving.items()):
            try:
                self.finished[member] = ray.get(ref, timeout=self.config.timeout_s)
            except RayError:  # a member that died, or a survivor of its group
                pass
        self.serving.clear()
        return {m: self.finished[m] for m in self.workers if m in self.finished}


def _member_of(key: str) -> Member:
    node, gpu = key.rsplit(":", 1)
    return (node, int(gpu))
