"""GPU inventory of a simulated cluster: who is alive, what each GPU is doing, what it costs.

On-demand GPUs live for the whole run, in nodes of ``gpus_per_ondemand_node``. Spot GPUs come and
go with the market: a node is granted (billing starts), boots and joins, may get a notice, and is
reclaimed (billing stops). The cluster holds at most ``spot_capacity`` spot GPUs; a node granted
beyond that is ignored for its whole life (the traces README's rule "cap the alive set at M").

Where a granted spot node's GPUs sit (what is "the same node" for SP groups and weight copies):

- ``gpus_per_spot_node > 1``: the node is a multi-GPU VM, its own host.
- ``gpus_per_spot_node == 1`` and ``spot_host_gpus > 1``: each trace instance is taken as one GPU
  slot on a shared multi-GPU host (GPU-granular spot capacity); a new GPU takes a free slot on the
  host with the most live GPUs, so it lands next to survivors. This is an *assumption* of the
  simulator, not something the traces say (their instances are single-GPU VMs).
- ``gpus_per_spot_node == 1`` and ``spot_host_gpus == 1``: single-GPU VMs; every SP group of
  degree > 1 crosses the network.

Every GPU carries one phase at a time; the :class:`GpuPhases` integrates phases into per-GPU
seconds (and, optionally, keeps the intervals for plotting). Spot lifecycle::

    granted --boot/join--> usable --(notice)--> usable, deadline set --reclaim--> gone
        \\____________________________________________________________________/
                                 reclaim at any point
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

Member = tuple[str, int]


class GpuKind(enum.Enum):
    ONDEMAND = "ondemand"
    SPOT = "spot"


class Phase(enum.Enum):
    IDLE = "idle"
    ROLLOUT = "rollout"
    EXPLORE = "explore"
    REWARD = "reward"      # scoring rollouts on the rollout GPUs (colocated reward)
    TRAIN = "train"
    SYNC = "sync"          # receiving new weights
    REPORT = "report"      # sending a gradient sum to the trainer (spot training)
    JOIN = "join"          # boot + process start + weight load of a newly granted node
    RESTART = "restart"    # cold restart of a broken SP group's survivors
    REGROUP = "regroup"    # forming an SP group (warm: sub-second; cold: NCCL init)


BUSY_PHASES = frozenset({Phase.ROLLOUT, Phase.EXPLORE, Phase.REWARD, Phase.TRAIN})


@dataclass(frozen=True)
class Interval:
    gpu: str
    start_s: float
    end_s: float
    phase: str


class GpuPhases:
    """Per-GPU phase bookkeeping: ``set(gpu, phase, now)`` closes the open interval and opens one."""

    def __init__(self, record: bool = False) -> None:
        self._open: dict[str, tuple[Phase, float]] = {}
        self._totals: dict[str, dict[Phase, float]] = {}
        self.record = record
        self.intervals: list[Interval] = []

    def set(self, gpu: str, phase: Phase, now: float) -> None:
        self.close(gpu, now)
        self._open[gpu] = (phase, now)

    def close(self, gpu: str, now: float) -> None:
        if gpu not in self._open:
            return
        phase, start = self._open.pop(gpu)
        assert now >= start - 1e-9, (gpu, start, now)
        totals = self._totals.setdefault(gpu, {})
        totals[phase] = totals.get(phase, 0.0) + (now - start)
        if self.record and now > start:
            self.intervals.append(Interval(gpu, start, now, phase.value))

    def close_all(self, now: float) -> None:
        for gpu in list(self._open):
            phase = self._open[gpu][0]
            self.close(gpu, now)
            self._open[gpu] = (phase, now)

    def seconds(self, gpus: list[str], phases: frozenset[Phase] | None = None) -> float:
        """Total seconds the given GPUs spent in ``phases`` (all phases if None), closed intervals."""
        total = 0.0
        for gpu in gpus:
            for phase, secs in self._totals.get(gpu, {}).items():
                if phases is None or phase in phases:
                    total += secs
        return total


def gpu_name(member: Member) -> str:
    return f"{member[0]}/{member[1]}"


@dataclass
class GpuRecord:
    member: Member
    kind: GpuKind
    granted_s: float
    released_s: float | None = None
    usable: bool = False
    deadline_s: float | None = None

    @property
    def name(self) -> str:
        return gpu_name(self.member)


@dataclass
class Cluster:
    """Alive GPUs and their billing windows. ``spot_capacity`` caps the spot GPUs held at once."""

    ondemand: int
    spot_capacity: int
    gpus_per_ondemand_node: int = 8
    gpus_per_spot_node: int = 1
    spot_host_gpus: int = 1
    gpus: dict[Member, GpuRecord] = field(default_factory=dict)
    _spot_nodes: dict[str, list[Member]] = field(default_factory=dict)
    _slots: dict[str, set[int]] = field(default_factory=dict)
    _released: list[GpuRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        for key in ("ondemand", "spot_capacity"):
            if getattr(self, key) < 0:
                raise ValueError(f"Cluster.{key} must be >= 0, got {getattr(self, key)}")
        for key in ("gpus_per_ondemand_node", "gpus_per_spot_node", "spot_host_gpus"):
            if getattr(self, key) < 1:
                raise ValueError(f"Cluster.{key} must be >= 1, got {getattr(self, key)}")
        for i in range(self.ondemand):
            member = (f"od{i // self.gpus_per_ondemand_node}", i % self.gpus_per_ondemand_node)
            self.gpus[member] = GpuRecord(member, GpuKind.ONDEMAND, 0.0, usable=True)

    def ondemand_members(self) -> list[Member]:
        return [m for m, g in self.gpus.items() if g.kind is GpuKind.ONDEMAND]

    def spot_held(self) -> int:
        return sum(len(ms) for ms in self._spot_nodes.values())

    def holds(self, node: str) -> bool:
        return node in self._spot_nodes

    def grant_spot_node(self, node: str, now: float) -> list[Member]:
        """A node was granted: hold it if there is room (returns its GPUs), else ignore it ([])."""
        assert node not in self._spot_nodes, f"spot node {node} granted twice"
        if self.spot_held() + self.gpus_per_spot_node > self.spot_capacity:
            return []
        members = self._place(node)
        for member in members:
            self.gpus[member] = GpuRecord(member, GpuKind.SPOT, now)
        self._spot_nodes[node] = members
        return members

    def _place(self, node: str) -> list[Member]:
        if self.gpus_per_spot_node > 1 or self.spot_host_gpus == 1:
            return [(f"spot:{node}", i) for i in range(self.gpus_per_spot_node)]
        hosts = -(-self.spot_capacity // self.spot_host_gpus)
        for h in range(hosts):
            self._slots.setdefault(f"spothost{h}", set())
        open_hosts = [h for h, used in self._slots.items() if len(used) < self.spot_host_gpus]
        host = max(open_hosts, key=lambda h: (len(self._slots[h]), -int(h[8:])))
        slot = min(set(range(self.spot_host_gpus)) - self._slots[host])
        self._slots[host].add(slot)
        return [(host, slot)]

    def has_live_peer(self, member: Member) -> bool:
        """Another usable GPU on the same host (a weight copy over NVLink is possible)."""
        return any(m[0] == member[0] and m != member and g.usable and g.released_s is None
                   for m, g in self.gpus.items())

    def spot_node_members(self, node: str) -> list[Member]:
        return list(self._spot_nodes.get(node, ()))

    def reclaim_spot_node(self, node: str, now: float) -> list[Member]:
        """The node is gone: stop billing its GPUs; returns them."""
        members = self._spot_nodes.pop(node)
        for member in members:
            record = self.gpus.pop(member)
            record.released_s, record.usable = now, False
            self._released.append(record)
            self._slots.get(member[0], set()).discard(member[1])
        return members

    def usable(self, kind: GpuKind) -> list[Member]:
        return sorted(m for m, g in self.gpus.items() if g.kind is kind and g.usable)

    def billed_seconds(self, kind: GpuKind, end_s: float) -> float:
        """GPU-seconds held of ``kind`` from the grant to the release (or ``end_s``)."""
        total = 0.0
        for g in self.records():
            if g.kind is kind:
                stop = end_s if g.released_s is None else min(g.released_s, end_s)
                total += max(0.0, stop - g.granted_s)
        return total

    def records(self) -> list[GpuRecord]:
        """Every GPU ever held: live ones and released ones (a slot may be reused by a later GPU)."""
        return list(self.gpus.values()) + self._released

    def names(self, kind: GpuKind) -> list[str]:
        return sorted({g.name for g in self.records() if g.kind is kind})
