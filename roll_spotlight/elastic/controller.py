"""The elastic SP controller: hosts the rendezvous store and drives every regroup.

Why the controller drives: gloo survivors notice a dead peer only when a collective touches it
(fast when the process died, a full process-group timeout when a node vanished without closing its
sockets), and ``new_group`` among survivors can hang. The controller (the Ray driver) sees
``RayActorError``/``ActorDiedError`` or a preemption notice, computes the next plan with the pure
planner, and tells exactly the members of changed groups to build raw process groups under a fresh
``gen{n}/sp{i}`` prefix of its rendezvous store (a file store on one host, a TCPStore across
hosts: see rendezvous.py). Rollouts advance in step chunks; the state committed at
each boundary (step index + full latent) is what a re-formed group resumes from.

Generations are the controller's, not the planner's: every formation *attempt* takes the next
number, so a retry after a member died mid-formation never reuses the failed attempt's prefix
(whose store keys and half-joined members are still there; STYLE rule 8).

Worker lifecycle (transitions only in :meth:`ElasticController._set_state`)::

    standby --> STANDBY ---------+
                                 | admit
    admit -----------------------+--> JOINING --weights loaded--> ACTIVE --preemption notice--> DRAINING
                                        |                          |                              |
                                        +--------- died ---------> GONE <---- drained/died -------+

(a STANDBY worker found dead, or given a preemption notice, goes to GONE too.)

A standby worker is a started process the controller already knows (node, GPU, device): admitting
it costs no identity queries on the recovery path, only its weights and the regroup.
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import time
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any, Callable, Iterable

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from roll_spotlight.elastic.comm import generation_prefix
from roll_spotlight.elastic.planner import Member, Plan, SPGroup, moves, plan_groups
from roll_spotlight.elastic.rendezvous import RendezvousHost
from roll_spotlight.elastic.rollout import RolloutRequest, SPRolloutState, start_state
from roll_spotlight.elastic.transfer import TransferMethod, TransferPlan, choose_method, choose_source

log = logging.getLogger(__name__)

__all__ = ["ControllerConfig", "ElasticController", "RegroupReport", "RolloutReport", "WorkerState"]

StepHook = Callable[[int, SPGroup], None]


class WorkerState(enum.Enum):
    STANDBY = "standby"
    JOINING = "joining"
    ACTIVE = "active"
    DRAINING = "draining"
    GONE = "gone"


_TRANSITIONS = {
    (None, WorkerState.STANDBY),
    (WorkerState.STANDBY, WorkerState.JOINING),
    (WorkerState.STANDBY, WorkerState.GONE),
    (None, WorkerState.JOINING),
    (WorkerState.JOINING, WorkerState.ACTIVE),
    (WorkerState.JOINING, WorkerState.GONE),
    (WorkerState.ACTIVE, WorkerState.DRAINING),
    (WorkerState.ACTIVE, WorkerState.GONE),
    (WorkerState.DRAINING, WorkerState.GONE),
}


@dataclass(frozen=True)
class ControllerConfig:
    """``transfer_method``: "auto" (collective on CUDA, object store on CPU) or a forced method."""

    num_heads: int
    preferred_degree: int
    pg_timeout_s: float = 10.0
    liveness_timeout_s: float = 5.0
    store_host: str = "127.0.0.1"
    steps_per_call: int = 1
    transfer_method: str = "auto"

    def __post_init__(self) -> None:
        if self.num_heads < 1 or self.preferred_degree < 1 or self.num_heads % self.preferred_degree:
            raise ValueError(f"preferred_degree={self.preferred_degree} must divide num_heads={self.num_heads}")
        if self.pg_timeout_s <= 0 or self.liveness_timeout_s <= 0:
            raise ValueError(f"pg_timeout_s={self.pg_timeout_s} and liveness_timeout_s="
                             f"{self.liveness_timeout_s} must be > 0")
        if self.steps_per_call < 1:
            raise ValueError(f"steps_per_call={self.steps_per_call} must be >= 1")
        allowed = ("auto",) + tuple(m.value for m in TransferMethod)
        if self.transfer_method not in allowed:
            raise ValueError(f"transfer_method={self.transfer_method!r} must be one of {allowed}")


@dataclass(frozen=True)
class RegroupReport:
    generation: int
    changed_groups: int
    moves: int
    seconds: float


@dataclass
class RolloutReport:
    """Final state, the SP degree each step ran at, and the regroups that happened on the way.
    ``lost``: every member lost during the rollout, in the order noticed, including members that
    died while a regroup was forming groups."""

    state: SPRolloutState
    degrees: list[int] = field(default_factory=list)
    regroups: list[RegroupReport] = field(default_factory=list)
    lost: list[Member] = field(default_factory=list)


class _GroupFailed(Exception):
    def __init__(self, dead: list[Member]) -> None:
        super().__init__(f"lost SP members {dead}")
        self.dead = dead


class ElasticController:
    """Owns the worker table, the current plan and the rendezvous store (hosted here)."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.rendezvous = RendezvousHost(config.store_host)
        self.plan: Plan | None = None
        self.last_regroup: RegroupReport | None = None
        self.handles: dict[Member, Any] = {}
        self.states: dict[Member, WorkerState] = {}
        self._known: dict[Any, tuple[Member, bool]] = {}  # handle -> (member, uses CUDA)
        self._transfer_ids = count()
        self._generations = count()  # one per formation attempt, failed ones included

    def close(self) -> None:
        """Remove the rendezvous (its directory on one host); also done when garbage-collected."""
        self.rendezvous.close()

    # lifecycle
    def _set_state(self, member: Member, new: WorkerState) -> None:
        old = self.states.get(member)
        assert (old, new) in _TRANSITIONS, f"{member}: {old} -> {new}"
        self.states[member] = new
        if new is WorkerState.GONE:
            handle = self.handles.pop(member, None)
            self._known.pop(handle, None)

    def active(self) -> list[Member]:
        return sorted(m for m, s in self.states.items() if s is WorkerState.ACTIVE)

    def add_workers(self, handles: Iterable[Any]) -> list[Member]:
        """Register workers that already hold current weights (the initial pool)."""
        handles = list(handles)
        members = ray.get([h.member.remote() for h in handles])
        for member, handle in zip(members, handles):
            self.handles[member] = handle
            self._set_state(member, WorkerState.JOINING)
            self._set_state(member, WorkerState.ACTIVE)
        return members

    def standby(self, handles: Iterable[Any]) -> list[Member]:
        """Register started workers that hold no current weights yet (kept alive for recovery):
        they prepare now (identity, device, object-store connection), off the recovery path."""
        handles = list(handles)
        members = []
        for handle, (member, cuda) in zip(handles, ray.get([h.prepare_standby.remote() for h in handles])):
            self._known[handle] = (member, cuda)
            self.handles[member] = handle
            self._set_state(member, WorkerState.STANDBY)
            members.append(member)
        return members

    def _identify(self, handle: Any) -> Member:
        if handle not in self._known:
            self._known[handle] = tuple(ray.get([handle.member.remote(), handle.uses_cuda.remote()]))
        return self._known[handle][0]

    def admit(self, handles: Iterable[Any], storage: Path | None = None) -> dict[Member, TransferPlan]:
        """Give newcomers current weights (same-node peer, else remote peer, else ``storage``),
        then regroup so they join SP groups. Returns the source used for each newcomer that
        survived its transfer. Standby workers (:meth:`standby`) are admitted without queries."""
        chosen: dict[Member, TransferPlan] = {}
        for handle in handles:
            member = self._identify(handle)
            if self.states.get(member) is WorkerState.GONE:
                raise ValueError(f"cannot admit {member}: it was removed (dead or drained)")
            self.handles[member] = handle
            self._set_state(member, WorkerState.JOINING)
            plan = self._transfer_weights(member, storage)
            if plan is not None:
                chosen[member] = plan
                self._set_state(member, WorkerState.ACTIVE)
        self.regroup()
        return chosen

    def notify_preemption(self, members: Iterable[Member]) -> None:
        """A provider notice: active members finish their current step chunk, then leave at the
        boundary; a standby member holds no work and leaves now; members already leaving are
        left as they are."""
        for member in members:
            state = self.states.get(member)
            if state is WorkerState.STANDBY:
                self._set_state(member, WorkerState.GONE)
            elif state not in (WorkerState.DRAINING, WorkerState.GONE):
                self._set_state(member, WorkerState.DRAINING)

    def remove(self, members: Iterable[Member]) -> None:
        for member in members:
            if self.states.get(member) is not WorkerState.GONE:
                self._set_state(member, WorkerState.GONE)

    # weights
    def _transfer_weights(self, member: Member, storage: Path | None) -> TransferPlan | None:
        """Copy weights into ``member`` from the cheapest live source; a peer that dies on the way
        is dropped and the next source tried. None if the newcomer itself died."""
        newcomer = self.handles[member]
        while True:
            peers = {f"{node}:{gpu}": node for node, gpu in self.active()}
            plan = choose_source(member[0], peers, storage is not None)
            method = self._method(plan, newcomer)
            try:
                seconds = self._copy(plan, method, newcomer, storage)
            except (RayActorError, RayTaskError):
                dead = self._find_dead([member] + ([_member_of(plan.peer)] if plan.peer else []))
                if not dead:
                    raise
                self.remove(dead)
                if member in dead:
                    return None
                continue
            log.info("newcomer %s got weights from %s %s via %s in %.3fs",
                     member, plan.source.value, plan.peer, method.value, seconds)
            return plan

    def _copy(self, plan: TransferPlan, method: TransferMethod, newcomer: Any, storage: Path | None) -> float:
        if method is TransferMethod.FILE:
            return ray.get(newcomer.load_weights_from_file.remote(str(storage)))
        return self._copy_from_peer(self.handles[_member_of(plan.peer)], newcomer, method)

    def _method(self, plan: TransferPlan, newcomer: Any) -> TransferMethod:
        if self.config.transfer_method != "auto" and plan.peer is not None:
            return TransferMethod(self.config.transfer_method)
        return choose_method(plan, cuda_available=self._known[newcomer][1])

    def _copy_from_peer(self, peer: Any, newcomer: Any, method: TransferMethod) -> float:
        if method is TransferMethod.OBJECT_STORE:
            # The peer's reply (the boxed reference) goes straight to the newcomer's call: Ray
            # resolves it there, so the driver waits for one round trip, not two.
            return ray.get(newcomer.load_weights_from_object.remote(peer.publish_weights.remote()))
        prefix = f"xfer{next(self._transfer_ids)}"
        args = (self.rendezvous.address, prefix)
        timeout = self.config.pg_timeout_s
        _, seconds = ray.get([peer.broadcast_weights.remote(*args, 0, timeout),
                              newcomer.broadcast_weights.remote(*args, 1, timeout)])
        return seconds

    # groups
    def regroup(self) -> RegroupReport | None:
        """Re-plan over the ACTIVE workers; members of changed groups join fresh process groups.
        A member that dies while groups form is removed and the formation retried under the next
        generation. Returns None when the plan is unchanged."""
        start = time.perf_counter()
        for _ in range(len(self.states) + 1):
            new = plan_groups(self._live(), num_heads=self.config.num_heads,
                              preferred_degree=self.config.preferred_degree, previous=self.plan)
            if new is self.plan:
                return None
            new = dataclasses.replace(new, generation=next(self._generations))
            try:
                changed = self._form(new)
            except _GroupFailed as failure:
                self.remove(failure.dead)
                continue
            report = RegroupReport(new.generation, changed, moves(self.plan, new), time.perf_counter() - start)
            self.plan, self.last_regroup = new, report
            log.info("regroup to generation %d: %d groups changed, %d moves, %.3fs",
                     report.generation, report.changed_groups, report.moves, report.seconds)
            return report
        raise RuntimeError("regroup did not converge: workers keep dying during group formation")

    def _live(self) -> dict[str, list[int]]:
        live: dict[str, list[int]] = {}
        for node, gpu in self.active():
            live.setdefault(node, []).append(gpu)
        return live

    def _form(self, new: Plan) -> int:
        kept = set(self.plan.groups) if self.plan is not None else set()
        calls = []
        for index, group in enumerate(new.groups):
            if group in kept:
                continue
            prefix = generation_prefix(new.generation, f"sp{index}")
            for rank, member in enumerate(group.members):
                calls.append((member, self.handles[member].join_group.remote(
                    self.rendezvous.address, prefix, rank, group.degree, self.config.pg_timeout_s)))
        self._gather(calls)
        return len({g for g in new.groups if g not in kept})

    # rollouts
    def run_rollout(self, request: RolloutRequest, *, state: SPRolloutState | None = None,
                    step_hook: StepHook | None = None) -> RolloutReport:
        """Denoise ``request`` on one SP group, surviving member loss and preemption notices:
        after a loss the survivors' re-formed group resumes from the last committed step."""
        if self.plan is None:
            self.regroup()
        report = RolloutReport(state=state or start_state(request))
        group = self._successor(None)
        while report.state.step < request.num_steps:
            if any(self.states[m] is WorkerState.DRAINING for m in self.states):
                group = self._after_loss(group, self._drained(), report)
            until = min(report.state.step + self.config.steps_per_call, request.num_steps)
            try:
                new_state = self._run_chunk(group, request, report.state, until, step_hook)
            except _GroupFailed as failure:
                group = self._after_loss(group, failure.dead, report)
                continue
            report.degrees.extend([group.degree] * (until - report.state.step))
            report.state = new_state
        return report

    def _drained(self) -> list[Member]:
        return [m for m, s in self.states.items() if s is WorkerState.DRAINING]

    def _after_loss(self, group: SPGroup, lost: list[Member], report: RolloutReport) -> SPGroup:
        """Drop ``lost``, regroup, and pick the group that carries on. ``report.lost`` gains
        ``lost`` and then every member the regroup itself dropped (died while groups formed)."""
        gone_before = self._gone()
        self.remove(lost)
        regroup = self.regroup()
        report.lost.extend(m for m in lost if m not in gone_before)
        report.lost.extend(sorted(self._gone() - gone_before - set(lost)))
        if regroup is not None:
            report.regroups.append(regroup)
        return self._successor(group)

    def _gone(self) -> set[Member]:
        return {m for m, s in self.states.items() if s is WorkerState.GONE}

    def _successor(self, old: SPGroup | None) -> SPGroup:
        """The current group sharing most members with ``old`` (the largest group for a new rollout)."""
        if self.plan is None or not self.plan.groups:
            raise RuntimeError("no live SP workers left")
        if old is None:
            return self.plan.groups[0]
        return max(self.plan.groups, key=lambda g: (len(set(g.members) & set(old.members)), g.degree))

    def _run_chunk(self, group: SPGroup, request: RolloutRequest, state: SPRolloutState, until: int,
                   step_hook: StepHook | None) -> SPRolloutState:
        calls = [(m, self.handles[m].denoise.remote(request, state, until)) for m in group.members]
        if step_hook is not None:
            step_hook(state.step, group)
        results = self._gather(calls)
        return results[group.members[0]]

    def _gather(self, calls: list[tuple[Member, Any]]) -> dict[Member, Any]:
        """Results per member; raises :class:`_GroupFailed` naming the dead if any call failed."""
        results: dict[Member, Any] = {}
        failed = False
        for member, ref in calls:
            try:
                results[member] = ray.get(ref)
            except (RayActorError, RayTaskError) as error:
                log.warning("SP call on %s failed: %s", member, type(error).__name__)
                failed = True
        if not failed:
            return results
        dead = self._find_dead([m for m, _ in calls])
        if not dead:
            raise RuntimeError(f"SP calls failed but every member of {[m for m, _ in calls]} is alive")
        raise _GroupFailed(dead)

    def _find_dead(self, members: list[Member]) -> list[Member]:
        pings = [(m, self.handles[m].ping.remote()) for m in members]
        dead = []
        for member, ref in pings:
            try:
                ray.get(ref, timeout=self.config.liveness_timeout_s)
            except (RayActorError, GetTimeoutError):
                dead.append(member)
        return dead


def _member_of(key: str | None) -> Member:
    assert key is not None
    node, gpu = key.rsplit(":", 1)
    return (node, int(gpu))
