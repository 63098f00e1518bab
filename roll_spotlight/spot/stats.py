"""Summary statistics of a trace, with the definitions of the shipped traces README.

- Event traces: a **preemption event** is a batch, i.e. all ``remove`` rows sharing one timestamp;
  **instances lost** = number of ``remove`` rows.
- Count traces: a **preemption event** is a drop (a sample lower than the one before; a gap holds
  the previous value, so the sample after a gap is compared with the one before it);
  **instances lost** = the sum of all decreases.
- **MTBP** (mean time between preemptions) of a zone = its span / its events. Pooled over zones it
  is total zone-seconds / total events; ``mtbp_min_s``/``mtbp_max_s`` give the per-zone range.
- **mean alive** = time-weighted mean of the alive/available count over the zone's span.

For capacity traces (``measures="capacity"``) the "preemptions" are drops in obtainable capacity,
not observed reclamations; the numbers are reported under the same names, as the README does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from roll_spotlight.spot.traces import (CountSeries, EventList, Trace, is_redundant_long_probe, load_trace,
                                        sniff_format)


@dataclass(frozen=True)
class ZoneStats:
    zone: str
    span_s: float
    capacity: int
    mean_alive: float
    preemption_events: int
    instances_lost: int
    mtbp_s: float
    distinct_nodes: int | None = None  # event traces only


@dataclass(frozen=True)
class TraceStats:
    name: str
    kind: str
    measures: str
    provider: str
    zones: tuple[ZoneStats, ...]
    preemption_events: int
    instances_lost: int
    zone_hours: float
    mtbp_s: float
    mtbp_min_s: float
    mtbp_max_s: float

    @property
    def batches(self) -> int:
        """Same as ``preemption_events``: the README's "batches" (event traces) or "drops" (counts)."""
        return self.preemption_events

    @property
    def capacity(self) -> int:
        return sum(z.capacity for z in self.zones)

    @property
    def mean_alive_range(self) -> tuple[float, float]:
        means = [z.mean_alive for z in self.zones]
        return min(means), max(means)

    def to_dict(self) -> dict:
        """JSON-ready: infinite MTBPs (no preemption at all) become None."""
        return _finite(asdict(self) | {"capacity": self.capacity})


def _finite(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _mtbp(span_s: float, events: int) -> float:
    return span_s / events if events else math.inf


def _event_zone_stats(zone: str, data: EventList) -> ZoneStats:
    removes = [ev for ev in data.events if ev.op == "remove"]
    batches = len({ev.time_s for ev in removes})
    alive = data.alive_series()
    return ZoneStats(zone, data.span_s, alive.capacity, alive.time_mean(), batches, len(removes),
                     _mtbp(data.span_s, batches),
                     distinct_nodes=sum(1 for ev in data.events if ev.op == "add"))


def _count_zone_stats(zone: str, data: CountSeries) -> ZoneStats:
    steps = np.diff(data.counts)
    drops = int((steps < 0).sum())
    lost = int(-steps[steps < 0].sum())
    return ZoneStats(zone, data.span_s, data.capacity, data.time_mean(), drops, lost,
                     _mtbp(data.span_s, drops))


def zone_stats(zone: str, data: EventList | CountSeries) -> ZoneStats:
    return _event_zone_stats(zone, data) if isinstance(data, EventList) else _count_zone_stats(zone, data)


def trace_stats(trace: Trace) -> TraceStats:
    """Per-zone and pooled preemption statistics (definitions in the module docstring)."""
    zones = tuple(zone_stats(name, data) for name, data in trace.zones.items())
    events = sum(z.preemption_events for z in zones)
    zone_seconds = sum(z.span_s for z in zones)
    per_zone = [z.mtbp_s for z in zones]
    return TraceStats(
        name=trace.name, kind=trace.kind, measures=trace.measures, provider=trace.provider,
        zones=zones, preemption_events=events, instances_lost=sum(z.instances_lost for z in zones),
        zone_hours=zone_seconds / 3600.0, mtbp_s=_mtbp(zone_seconds, events),
        mtbp_min_s=min(per_zone), mtbp_max_s=max(per_zone),
    )


def discover_traces(root: Path | str) -> list[Path]:
    """Every loadable trace under ``root``: event/probe CSV files and folders of count-JSON files.

    A ``*_long.csv`` probe file is skipped when its ``*_wide.csv`` twin exists (same data).
    """
    root = Path(root)
    found: list[Path] = []
    for folder in sorted([root, *(p for p in root.rglob("*") if p.is_dir())]):
        formats = {p: sniff_format(p) for p in sorted(folder.iterdir())
                   if p.is_file() and p.suffix in (".csv", ".json")}
        if any(f == "count_json" for f in formats.values()):
            found.append(folder)
        found.extend(p for p, f in formats.items() if f in ("events", "probe") and not is_redundant_long_probe(p))
    return found


def summarize_shipped_traces(root: Path | str) -> list[dict]:
    """One row per trace under ``root`` (for docs and the CLI): what it measures and its statistics."""
    root = Path(root)
    rows = []
    for path in discover_traces(root):
        trace = load_trace(path)
        stats = trace_stats(trace)
        lo, hi = stats.mean_alive_range
        rows.append({
            "trace": path.relative_to(root).as_posix(), "kind": trace.kind, "measures": trace.measures,
            "provider": trace.provider, "gpu_type": trace.gpu_type, "zones": len(trace.zones),
            "span_h_min": min(z.span_s for z in stats.zones) / 3600.0, "span_h_max": trace.span_s / 3600.0,
            "capacity_per_zone": max(trace.capacity.values()), "mean_alive_min": lo, "mean_alive_max": hi,
            "preemption_events": stats.preemption_events, "instances_lost": stats.instances_lost,
            "mtbp_min": _finite(stats.mtbp_s / 60.0), "mtbp_min_range": _finite([stats.mtbp_min_s / 60.0,
                                                                                 stats.mtbp_max_s / 60.0]),
        })
    return rows
