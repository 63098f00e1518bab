"""Spot availability for the simulator: a trace replayed by the project's ``SpotMarket``.

The simulator never reads trace files itself; it takes the market's ``MarketEvent`` list (wall
seconds from the window start; NODE_UP / NOTICE / NODE_DOWN) and a price table. Nodes alive at the
window start arrive as NODE_UP at time 0; the simulator treats them as already booted and loaded
(the run starts at steady state). Prices: the simulated GPUs are H100-class whatever the trace's
instance type (the AWS traces are V100 instances; only their availability dynamics are used), so the
default is the H100 table, per zone when the trace folder ships ``zones.csv``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

from roll_spotlight.spot.market import EventKind, MarketConfig, MarketEvent, SpotMarket
from roll_spotlight.spot.prices import DEFAULT_PRICE_TABLES, PriceTable, load_gcp_zone_prices
from roll_spotlight.spot.traces import Trace, load_trace

TraceLike = Union[Trace, str, Path, None]


@dataclass(frozen=True)
class SpotFeed:
    """What the simulator needs from the spot market."""

    events: tuple[MarketEvent, ...]
    prices: PriceTable
    name: str
    provider: str
    notice_s: float
    window_s: float


def load(trace: TraceLike) -> Trace | None:
    if trace is None or isinstance(trace, Trace):
        return trace
    return load_trace(trace)


def h100_prices(trace: Trace | None) -> PriceTable:
    """H100 prices; per zone when the trace's folder carries ``zones.csv`` (GCP H100 probes)."""
    folder = None if trace is None or trace.source_path is None else trace.source_path
    if folder is not None and not folder.is_dir():
        folder = folder.parent
    if folder is not None and (folder / "zones.csv").is_file():
        return load_gcp_zone_prices(folder)
    return DEFAULT_PRICE_TABLES["H100"]


def spot_feed(trace: TraceLike, *, spot_nodes: int, start_s: float = 0.0, duration_s: float | None = None,
              skip_ramp: bool = True, zones: Sequence[str] | None = None, seed: int = 0,
              notice_s: float | None = None, prices: PriceTable | None = None) -> SpotFeed:
    """Replay ``trace`` (a Trace, a path, or None for no spot market) capped at ``spot_nodes`` nodes."""
    loaded = load(trace)
    if loaded is None or spot_nodes == 0:
        return SpotFeed((), prices or h100_prices(loaded), "none", "gcp", 30.0, float("inf"))
    config = MarketConfig(notice_s=notice_s, seed=seed, start_s=start_s, duration_s=duration_s,
                          skip_ramp=skip_ramp, cap_nodes=spot_nodes,
                          zones=tuple(zones) if zones else None)
    market = SpotMarket(loaded, config)
    return SpotFeed(market.events, prices or h100_prices(loaded), loaded.name, loaded.provider,
                    market.notice_s, market.duration_s)


def fake_feed(rows: Sequence[tuple[float, str, str]], *, notice_s: float = 30.0, zone: str = "z") -> SpotFeed:
    """A feed from ``(time_s, "up"|"down", node)`` rows, with NOTICEs ``notice_s`` before each down.

    For tests and what-if runs without a trace file.
    """
    kinds = {"up": EventKind.NODE_UP, "down": EventKind.NODE_DOWN}
    events = []
    up_at: dict[str, float] = {}
    for time_s, kind, node in rows:
        if kind not in kinds:
            raise ValueError(f"fake_feed: kind must be 'up' or 'down', got {kind!r}")
        if kind == "up":
            up_at[node] = time_s
        else:
            notice = max(time_s - notice_s, up_at.get(node, 0.0))
            events.append(MarketEvent(notice, EventKind.NOTICE, node, zone, notice))
        events.append(MarketEvent(time_s, kinds[kind], node, zone, time_s))
    order = {EventKind.NOTICE: 0, EventKind.NODE_DOWN: 1, EventKind.NODE_UP: 2}
    events.sort(key=lambda e: (e.time_s, order[e.kind]))
    return SpotFeed(tuple(events), DEFAULT_PRICE_TABLES["H100"], "fake", "gcp", notice_s, float("inf"))
