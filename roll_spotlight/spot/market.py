"""SpotMarket: a trace replayed as node-level events (NODE_UP, NOTICE, NODE_DOWN) on a wall clock.

Node lifecycle (one node id, never reused)::

    (absent) --NODE_UP--> ALIVE --NOTICE--> NOTIFIED --NODE_DOWN--> GONE

A node that outlives the replay window never gets NOTICE/NODE_DOWN; its NOTICE may still fall in
the window when its reclamation lies just after it. Simultaneous events of one kind are listed in
the nodes' join order.

How a trace becomes node lifetimes (trace seconds), zone by zone, in one chronological replay:

- **Event traces** name their nodes: ``add`` -> NODE_UP, ``remove`` -> NODE_DOWN of that node.
  Ids are ``<zone>/<trace node name>`` (``p3/node17``).
- **Count traces** give N_z(t), the number of the zone's instances alive; new nodes are named
  ``<zone>/n<k>``, k counting from 0 per zone. ``MarketConfig.count_model`` says how our nodes
  relate to those instances:

  - ``"instances"`` (default): each of our nodes is one of the zone's alive instances. A drop from
    n to n - k reclaims k of the n instances, drawn uniformly without replacement, so each of our
    m alive nodes in the zone is preempted with probability k/n (jointly hypergeometric: never
    more than k of ours, and exactly k when we hold all n). A rise of j lets up to j new nodes
    join (replacements for nodes we lost, or the first fleet), within ``cap_nodes``. The draw
    comes from an RNG seeded by ``(seed, crc32(zone))``; ``victims`` does not apply. This is how
    a pool of M nodes inside a group of n > M instances sees the group's preemptions.
  - ``"capacity"``: N_z is read as a capacity. The replay keeps ``alive_z <= N_z(t)``: when N_z
    drops below the alive count, the surplus nodes are preempted; when N_z rises above it, new
    nodes join. Victims of a drop follow ``MarketConfig.victims``: ``"newest_first"`` (default:
    the most recently joined nodes go first, i.e. LIFO, which mirrors providers reclaiming the
    last-granted capacity and keeps long-lived nodes stable) or ``"seeded_random"`` (uniform among
    the zone's alive nodes, from the zone's RNG above, so the pick in one zone does not depend on
    the other zones). This is the README's rule "preempt whatever runs above the new capacity";
    with ``cap_nodes`` M it hides every drop while N_z stays above M.
- **cap_nodes = M** scales to a smaller cluster: the total alive set over all zones is capped at
  M; a join that would exceed M is ignored (an event-trace node ignored at its ``add`` stays
  ignored, so its ``remove`` is ignored too). Adds happen only at trace joins/rises: a slot freed
  by a preemption is not back-filled until the trace adds a node again. Event traces name their
  nodes, so ``count_model`` does not apply to them.
- At one instant departures are processed before arrivals, so the alive set never exceeds M.

Window and clock: the replay window starts at ``t0 = ramp_end + start_s`` (``ramp_end`` = 0, or
with ``skip_ramp`` the first time the total alive count reaches its maximum over the trace: 25 min
into the Bamboo p3 trace, where the fleet reaches 32) and lasts ``duration_s`` trace seconds
(default: to the end of the trace): ``[t0, t0 + duration_s)``, closed at the trace end so the last
rows of an event trace count. On count traces ``skip_ramp`` jumps to the first capacity peak, which
may lie far into the trace. Nodes alive at ``t0`` get NODE_UP at wall time 0. Wall time =
(trace time - t0) / compression. With ``cap_nodes`` the cap is applied from the trace start, before
the window is cut.

Notice: NOTICE comes ``notice_s`` **wall** seconds before NODE_DOWN (not compressed: it is the
deadline the workers must meet in real time), clamped so it never precedes the node's NODE_UP
(nor wall time 0). Defaults per provider: AWS 120 s, GCP 30 s, Azure 30 s.

Everything is deterministic: the same trace and config give the same event list.
"""

from __future__ import annotations

import bisect
import enum
import math
import zlib
from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np

from roll_spotlight.checks import require, require_choice, require_int, require_number
from roll_spotlight.spot.traces import CountSeries, EventList, Trace

# AWS: EC2 docs, 'Spot Instance interruption notices' (2 min); GCP: Compute Engine API docs
# (scheduling.skipGuestOsShutdown: 30 s from ACPI soft-off to hard-off); Azure: 'Scheduled Events' (>= 30 s)
NOTICE_S_BY_PROVIDER = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
# The least notice a compressed replay gives a worker, in wall seconds: a denoising step plus a
# commit must fit in it on a loaded host.
MIN_NOTICE_S = 2.0
VICTIM_RULES = ("newest_first", "seeded_random")
COUNT_MODELS = ("instances", "capacity")


class EventKind(enum.Enum):
    NODE_UP = "node_up"
    NOTICE = "notice"
    NODE_DOWN = "node_down"


@dataclass(frozen=True)
class MarketConfig:
    notice_s: float | None = None  # None: the provider's notice (NOTICE_S_BY_PROVIDER)
    victims: str = "newest_first"  # count traces with count_model="capacity" only
    count_model: str = "instances"  # count traces: our nodes are instances of the group, or capacity
    seed: int = 0
    compression: float = 1.0
    start_s: float = 0.0
    duration_s: float | None = None
    skip_ramp: bool = False
    cap_nodes: int | None = None
    zones: tuple[str, ...] | None = None  # None: every zone of the trace

    def __post_init__(self) -> None:
        require_number("MarketConfig.notice_s", self.notice_s, ">= 0", optional=True)
        require_choice("MarketConfig.victims", self.victims, VICTIM_RULES)
        require_choice("MarketConfig.count_model", self.count_model, COUNT_MODELS)
        require_number("MarketConfig.compression", self.compression)
        require_number("MarketConfig.start_s", self.start_s, ">= 0")
        require_number("MarketConfig.duration_s", self.duration_s, optional=True)
        require_int("MarketConfig.cap_nodes", self.cap_nodes, optional=True)
        require(self.zones is None or len(self.zones) > 0, "MarketConfig.zones", self.zones,
                "selects nothing; use None for every zone")


@dataclass(frozen=True)
class MarketEvent:
    time_s: float  # wall seconds since the window start
    kind: EventKind
    node_id: str
    zone: str
    trace_time_s: float  # when it happens in the trace (for NOTICE: derived from the wall time)


@dataclass(frozen=True)
class NodeLife:
    """A node's stay in trace seconds; ``down_s`` None = never reclaimed within the trace."""

    node_id: str
    zone: str
    up_s: float
    down_s: float | None


# Ordering of events at one instant: departures (NOTICE then NODE_DOWN) before arrivals, and a
# NOTICE clamped onto its node's NODE_UP after that NODE_UP. Keys: (wall time, rank, join order).
_RANK = {EventKind.NOTICE: 0, EventKind.NODE_DOWN: 1, EventKind.NODE_UP: 2}
_RANK_CLAMPED_NOTICE = 3


class SpotMarket:
    """Replays a trace as an ordered, immutable list of ``MarketEvent`` (see the module docstring)."""

    def __init__(self, trace: Trace, config: MarketConfig | None = None) -> None:
        self.config = config or MarketConfig()
        self.trace = trace.select_zones(tuple(self.config.zones or trace.zone_names))
        self.notice_s = (self.config.notice_s if self.config.notice_s is not None
                         else NOTICE_S_BY_PROVIDER[trace.provider])
        self.lives: tuple[NodeLife, ...] = tuple(_replay(self.trace, self.config))
        self.window_start_s = self._window_start()
        self.window_end_s = self._window_end()
        self.events: tuple[MarketEvent, ...] = tuple(self._build_events())
        self._times = [ev.time_s for ev in self.events]

    # -- queries -------------------------------------------------------------------------------

    @property
    def duration_s(self) -> float:
        """Wall length of the replay window."""
        return self._wall(self.window_end_s)

    def __iter__(self) -> Iterator[MarketEvent]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def events_between(self, t0: float, t1: float) -> tuple[MarketEvent, ...]:
        """Events with ``t0 <= time_s < t1`` (wall seconds), in order."""
        lo = bisect.bisect_left(self._times, t0)
        hi = bisect.bisect_left(self._times, t1)
        return self.events[lo:hi]

    def alive_at(self, t: float) -> frozenset[str]:
        """Node ids alive at wall time ``t``, after every event with ``time_s <= t``."""
        alive: dict[str, None] = {}
        for ev in self.events[: bisect.bisect_right(self._times, t)]:
            if ev.kind is EventKind.NODE_UP:
                alive[ev.node_id] = None
            elif ev.kind is EventKind.NODE_DOWN:
                del alive[ev.node_id]
        return frozenset(alive)

    # -- construction --------------------------------------------------------------------------

    def _wall(self, trace_t: float) -> float:
        return (trace_t - self.window_start_s) / self.config.compression

    def _window_start(self) -> float:
        ramp_end = _ramp_end(self.lives) if self.config.skip_ramp else 0.0
        return ramp_end + self.config.start_s

    def _window_end(self) -> float:
        end = self.trace.end_s
        if self.config.duration_s is not None:
            end = min(end, self.window_start_s + self.config.duration_s)
        if end <= self.window_start_s:
            raise ValueError(f"start_s={self.config.start_s!r} (window start {self.window_start_s:.0f} s) "
                             f"is not before the trace end {self.trace.end_s:.0f} s")
        return end

    def _before_end(self, wall_t: float) -> bool:
        """The window is half-open, except that a window reaching the trace end keeps its last instant
        (the final rows of an event trace are real preemptions)."""
        end_w = self._wall(self.window_end_s)
        return wall_t < end_w or (wall_t == end_w and self.window_end_s == self.trace.end_s)

    def _build_events(self) -> list[MarketEvent]:
        keyed: list[tuple[tuple, MarketEvent]] = []
        for seq, life in enumerate(self.lives):
            keyed.extend(self._life_events(seq, life))
        keyed.sort(key=lambda pair: pair[0])
        return [ev for _, ev in keyed]

    def _life_events(self, seq: int, life: NodeLife) -> list[tuple[tuple, MarketEvent]]:
        t0, down = self.window_start_s, life.down_s
        if not self._before_end(self._wall(life.up_s)) or (down is not None and down <= t0):
            return []
        up_w = self._wall(max(life.up_s, t0))
        out = [((up_w, _RANK[EventKind.NODE_UP], seq),
                MarketEvent(up_w, EventKind.NODE_UP, life.node_id, life.zone, max(life.up_s, t0)))]
        if down is None:
            return out
        down_w = self._wall(down)
        notice_w = max(down_w - self.notice_s, up_w)
        if self._before_end(notice_w):
            rank = _RANK_CLAMPED_NOTICE if notice_w == up_w else _RANK[EventKind.NOTICE]
            trace_t = t0 + notice_w * self.config.compression
            notice = MarketEvent(notice_w, EventKind.NOTICE, life.node_id, life.zone, trace_t)
            out.append(((notice_w, rank, seq), notice))
        if self._before_end(down_w):
            out.append(((down_w, _RANK[EventKind.NODE_DOWN], seq),
                        MarketEvent(down_w, EventKind.NODE_DOWN, life.node_id, life.zone, down)))
        return out


# ---------------------------------------------------------------------------------------------
# Replay: trace -> node lifetimes (trace seconds)

# A raw trace operation: (time, order, zone, op, arg). order 0 = departures first at one instant.
_Op = tuple[float, int, str, str, object]


def _trace_ops(trace: Trace) -> list[_Op]:
    ops: list[_Op] = []
    for zone, data in trace.zones.items():
        ops.extend(_event_ops(zone, data) if isinstance(data, EventList) else _count_ops(zone, data))
    ops.sort(key=lambda op: (op[0], op[1]))  # stable: ties keep zone order, then row order
    return ops


def _event_ops(zone: str, data: EventList) -> list[_Op]:
    return [(ev.time_s, 0 if ev.op == "remove" else 1, zone, ev.op, ev.node) for ev in data.events]


def _count_ops(zone: str, data: CountSeries) -> list[_Op]:
    ops: list[_Op] = []
    previous = 0
    for t, n in zip(data.times_s.tolist(), data.counts.tolist()):
        if n != previous:
            ops.append((t, 0 if n < previous else 1, zone, "level", n))
        previous = n
    return ops


class _Replay:
    """Chronological replay with the victim rule and the cluster cap; collects NodeLife records."""

    def __init__(self, zones: tuple[str, ...], config: MarketConfig) -> None:
        self.cap = config.cap_nodes if config.cap_nodes is not None else math.inf
        self.victims = config.victims
        self.count_model = config.count_model
        self.level = {z: 0 for z in zones}  # the count trace's last N_z
        self.rngs = {z: np.random.default_rng([config.seed, zlib.crc32(z.encode())]) for z in zones}
        self.alive: dict[str, list[str]] = {z: [] for z in zones}  # arrival order
        self.next_id = {z: 0 for z in zones}
        self.up: dict[str, tuple[float, int]] = {}  # node id -> (join time, join sequence)
        self.lives: dict[int, NodeLife] = {}  # join sequence -> life
        self.total = 0
        self.joins = 0

    def apply(self, op: _Op) -> None:
        t, _, zone, kind, arg = op
        if kind == "add":
            self._join(t, zone, f"{zone}/{arg}")
        elif kind == "remove":
            self._leave(t, zone, f"{zone}/{arg}")
        elif kind == "level":
            self._set_level(t, zone, int(arg))
        else:
            raise AssertionError(f"unknown trace op {kind!r}")

    def _join(self, t: float, zone: str, node_id: str) -> None:
        if self.total >= self.cap:
            return  # ignored by the cap; its later remove finds it absent and is ignored too
        self.alive[zone].append(node_id)
        self.up[node_id] = (t, self.joins)
        self.joins += 1
        self.total += 1

    def _leave(self, t: float, zone: str, node_id: str) -> None:
        if node_id not in self.up:
            return
        self.alive[zone].remove(node_id)
        self.total -= 1
        up, seq = self.up.pop(node_id)
        if t > up:
            self.lives[seq] = NodeLife(node_id, zone, up, t)
        # else: joined and left at one instant, never visible to a consumer

    def _set_level(self, t: float, zone: str, level: int) -> None:
        if self.count_model == "instances":
            self._set_instances(t, zone, level)
        else:
            self._set_capacity(t, zone, level)
        self.level[zone] = level

    def _set_instances(self, t: float, zone: str, level: int) -> None:
        """N_z goes from n to ``level``: a drop reclaims k of the n instances uniformly, our alive
        nodes being m of them (slots 0..m-1); a rise lets as many nodes join, within the cap."""
        alive, n = self.alive[zone], self.level[zone]
        if level < n and alive:
            hit = self.rngs[zone].choice(n, size=n - level, replace=False)
            ours = sorted(int(i) for i in hit.tolist() if i < len(alive))
            for node_id in [alive[i] for i in ours]:
                self._leave(t, zone, node_id)
        for _ in range(max(level - n, 0)):
            if self.total >= self.cap:
                break
            self._join(t, zone, f"{zone}/n{self.next_id[zone]}")
            self.next_id[zone] += 1

    def _set_capacity(self, t: float, zone: str, level: int) -> None:
        alive = self.alive[zone]
        for node_id in self._pick_victims(zone, len(alive) - level):
            self._leave(t, zone, node_id)
        while len(alive) < level and self.total < self.cap:
            self._join(t, zone, f"{zone}/n{self.next_id[zone]}")
            self.next_id[zone] += 1

    def _pick_victims(self, zone: str, k: int) -> list[str]:
        alive = self.alive[zone]
        if k <= 0:
            return []
        if self.victims == "newest_first":
            return alive[-k:][::-1]
        picks = self.rngs[zone].choice(len(alive), size=k, replace=False)
        return [alive[i] for i in sorted(picks.tolist())]

    def finish(self) -> list[NodeLife]:
        """All lives in join order; nodes still up at the end have ``down_s`` None."""
        lives = dict(self.lives)
        for zone, nodes in self.alive.items():
            for node_id in nodes:
                up, seq = self.up[node_id]
                lives[seq] = NodeLife(node_id, zone, up, None)
        return [lives[seq] for seq in sorted(lives)]


def _replay(trace: Trace, config: MarketConfig) -> list[NodeLife]:
    replay = _Replay(trace.zone_names, config)
    for op in _trace_ops(trace):
        replay.apply(op)
    return replay.finish()


def _ramp_end(lives: tuple[NodeLife, ...]) -> float:
    """First trace time at which the total alive count reaches its maximum."""
    deltas: dict[float, int] = {}
    for life in lives:
        deltas[life.up_s] = deltas.get(life.up_s, 0) + 1
        if life.down_s is not None:
            deltas[life.down_s] = deltas.get(life.down_s, 0) - 1
    times = sorted(deltas)
    counts = np.cumsum([deltas[t] for t in times])
    return float(times[int(np.argmax(counts))]) if times else 0.0


class MarketSchedule:
    """A ``SpotMarket`` as an event source, on its wall clock (seconds since the window start).
    ``lead_s``: every NODE_UP after the start comes that much early (nodes that take ``lead_s`` to
    come up join when the trace says); deadlines stay the trace's."""

    def __init__(self, market: SpotMarket, lead_s: float = 0.0) -> None:
        self.market = market
        self._next = 0
        early = [replace(e, time_s=max(0.0, e.time_s - lead_s)) if e.kind is EventKind.NODE_UP and e.time_s > 0
                 else e for e in market.events]
        self._events = sorted(early, key=lambda e: e.time_s)  # stable: ties keep the market's order
        scale, t0 = market.config.compression, market.window_start_s
        self._deadlines = {life.node_id: (life.down_s - t0) / scale
                           for life in market.lives if life.down_s is not None}

    def due(self, now: float) -> list[MarketEvent]:
        start = self._next
        while self._next < len(self._events) and self._events[self._next].time_s <= now:
            self._next += 1
        return self._events[start:self._next]

    def deadline(self, node_id: str) -> float | None:
        return self._deadlines.get(node_id)
