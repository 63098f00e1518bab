"""Synthetic spot traces, for runs that name no trace file.

Model: a fleet of ``nodes`` spot nodes all join at t = 0. Preemption batches arrive as a Poisson
process with mean gap ``mtbp_s``; a batch reclaims a geometric (default) or 1 + Poisson number of
nodes with mean ``mean_batch``, chosen uniformly among the alive ones. Every reclaimed node is
replaced by a fresh one (new name, never reused) exactly ``replace_delay_s`` later. A batch that
finds fewer nodes alive than it drew is cut short (dropped when none is alive) and a warning is
logged: measured MTBP and batch size match the request only while the fleet rarely runs dry, which
holds for the defaults.

``DEFAULT_SYNTHETIC`` imitates the Bamboo AWS p3 trace (``bamboo-spot-traces/aws/p3-trace.csv``);
how each default is derived from it, and the check, are in docs/measurements.md ("The synthetic
spot trace").
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass, replace

import numpy as np

from roll_spotlight.checks import require_choice, require_each, require_int, require_number
from roll_spotlight.spot.traces import PROVIDERS, EventList, NodeEvent, Trace

logger = logging.getLogger(__name__)

BATCH_DISTRIBUTIONS = ("geometric", "poisson")


@dataclass(frozen=True)
class SyntheticTraceConfig:
    nodes: int = 32
    mtbp_s: float = 518.0
    mean_batch: float = 2.11
    span_s: float = 40_920.0
    provider: str = "aws"
    seed: int = 0
    replace_delay_s: float = 1_980.0
    batch_dist: str = "geometric"
    gpu_type: str = "V100"
    zone: str = "synthetic"

    def __post_init__(self) -> None:
        key = "SyntheticTraceConfig"
        require_int("SyntheticTraceConfig.nodes", self.nodes)
        require_each(self, key, ("mtbp_s", "span_s"), require_number)
        require_number("SyntheticTraceConfig.mean_batch", self.mean_batch, ">= 1")
        require_number("SyntheticTraceConfig.replace_delay_s", self.replace_delay_s, ">= 0")
        require_choice("SyntheticTraceConfig.provider", self.provider, PROVIDERS)
        require_choice("SyntheticTraceConfig.batch_dist", self.batch_dist, BATCH_DISTRIBUTIONS)


DEFAULT_SYNTHETIC = SyntheticTraceConfig()


def synthetic_trace(config: SyntheticTraceConfig = DEFAULT_SYNTHETIC, **overrides) -> Trace:
    """A deterministic (by ``seed``) event trace; keyword overrides replace fields of ``config``.

    ``synthetic_trace(nodes=8, mtbp_s=600, seed=1)`` is the usual call.
    """
    cfg = replace(config, **overrides)
    events = _FleetSim(cfg).simulate()
    return Trace(
        name=f"synthetic/{cfg.zone}-seed{cfg.seed}", kind="events", measures="running",
        provider=cfg.provider, zones={cfg.zone: EventList(tuple(events), 0.0, cfg.span_s)},
        gpu_type=cfg.gpu_type,
        notes=(f"synthetic: nodes={cfg.nodes} mtbp_s={cfg.mtbp_s} mean_batch={cfg.mean_batch} "
               f"replace_delay_s={cfg.replace_delay_s} batch_dist={cfg.batch_dist}",),
    )


class _FleetSim:
    """Poisson batches over a self-healing fleet; emits add/remove rows in time order."""

    def __init__(self, cfg: SyntheticTraceConfig) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.alive: list[str] = []
        self.refills: list[float] = []  # heap of replacement arrival times
        self.events: list[NodeEvent] = []
        self.next_id = 0
        self.batches = 0
        self.short_batches = 0  # cut short or dropped: fewer nodes alive than drawn

    def simulate(self) -> list[NodeEvent]:
        for _ in range(self.cfg.nodes):
            self._add(0.0)
        t = 0.0
        while True:
            t += float(self.rng.exponential(self.cfg.mtbp_s))
            if t >= self.cfg.span_s:
                break
            self._refill_until(t)
            self._preempt(t)
        self._refill_until(self.cfg.span_s)
        if self.short_batches:
            logger.warning("synthetic trace: %d of %d batches found too few nodes alive (nodes=%d, "
                           "replace_delay_s=%s); measured MTBP / batch size will fall short of the request",
                           self.short_batches, self.batches, self.cfg.nodes, self.cfg.replace_delay_s)
        return self.events

    def _add(self, t: float) -> None:
        node = f"n{self.next_id}"
        self.next_id += 1
        self.alive.append(node)
        self.events.append(NodeEvent(t, "add", node))

    def _refill_until(self, t: float) -> None:
        """Replacements due at or before ``t`` join; at ``t`` itself they join before the batch."""
        while self.refills and self.refills[0] <= t:
            self._add(heapq.heappop(self.refills))

    def _batch_size(self) -> int:
        mean = self.cfg.mean_batch
        if self.cfg.batch_dist == "geometric":
            return int(self.rng.geometric(1.0 / mean))
        return 1 + int(self.rng.poisson(mean - 1.0))

    def _preempt(self, t: float) -> None:
        drawn = self._batch_size()
        k = min(drawn, len(self.alive))
        self.batches += 1
        self.short_batches += k < drawn
        if k == 0:
            return
        picks = sorted(self.rng.choice(len(self.alive), size=k, replace=False).tolist())
        for i in reversed(picks):
            self.events.append(NodeEvent(t, "remove", self.alive.pop(i)))
            heapq.heappush(self.refills, t + self.cfg.replace_delay_s)
