"""`python -m benchmarks.soak`: the live runtime under a spot trace for M wall minutes, repeating the trace.

    trace --tile_trace(laps)--> one long trace --replay machinery (benchmarks.replay)--> live Ray runtime
                                                       + a sampler of RSS (driver + Ray actors)

A soak is a long `python -m benchmarks.replay`: the same runtime (one on-demand RolloutWorker, spot workers
started, notified and killed by an ElasticSpotPool as the market replays the trace, compressed
``--speedup`` times), the same request backlog and the same bit-for-bit check of every output
against an uninterrupted recomputation. What it adds:

- **repetition**: when M minutes x speedup exceeds the trace, the trace is tiled (``tile_trace``).
  At each wrap the nodes still alive at the trace end are reclaimed (they do not exist at the
  next lap's start); ``wrap_removals`` counts those of the wraps the soak reached (before the
  market's cap on live nodes; the ones that hit a live worker are among ``preemptions``).
- **peak memory**: a thread samples RSS every ``sample_s`` of the driver plus every process whose
  title starts with ``ray::`` (the actors), summed; ``peak_rss_mb`` is the largest sum.
  ``peak_rss_all_mb`` adds Ray's own daemons (raylet, GCS) when this process started them.
- **multi-GPU spot nodes**: ``--gpus-per-node`` workers per node; with ``--sp-degree`` > 1 they
  are elastic SP members (`elastic.groups.ElasticGroups`): groups span nodes, a notice makes the
  survivors re-form, a newcomer node copies weights from a peer. The report counts ``regroups``
  (and those after a loss), groups broken without notice, regroup seconds per loss, and the
  newcomers' weight sources (replay's fields).

Count traces preempt the spot nodes as ``--count-model`` says (``instances``, the default: each
spot node is one of the group's alive instances; ``capacity``: only nodes above the count go); see
`python -m benchmarks.replay`. ``--market-only`` replays the tiled market alone, without Ray, and reports its
nodes started and preemptions in the submission window (``kind: "market"``).

The options are replay's (`TraceRunConfig`, with ``--minutes`` for ``--duration`` and the soak's
defaults, `DEFAULTS`); ``--start-s`` picks the window on one lap of the trace, which is then tiled
from there on. The JSON report is replay's report (``kind: "measured"``) plus the fields above. Exit
status: 0
when requests_lost, duplicate_completions and mismatched_outputs are all 0; 1 otherwise; 2 on bad
input (naming the option, file or line).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import sys
import threading
from dataclasses import dataclass

import numpy as np

from benchmarks.replay import TraceRunConfig
from roll_spotlight.spot.traces import CountSeries, EventList, NodeEvent, Trace

log = logging.getLogger(__name__)

DEFAULTS = TraceRunConfig(speedup=120.0, duration_s=60.0, nodes=3, num_steps=6, drain_timeout_s=120.0)


# ---------------------------------------------------------------------------------------------
# Repeating a trace


@dataclass(frozen=True)
class Tiled:
    """The tiled trace; ``wraps``: (trace second of a wrap, nodes reclaimed there), all zones."""

    trace: Trace
    laps: int
    period_s: float
    wraps: tuple[tuple[float, int], ...] = ()

    @property
    def wrap_removals(self) -> int:
        return sum(n for _, n in self.wraps)

    def removals_until(self, trace_s: float) -> int:
        """Nodes reclaimed by wraps at or before ``trace_s`` (the part of the soak that ran)."""
        return sum(n for t, n in self.wraps if t <= trace_s)


def tile_trace(trace: Trace, laps: int) -> Tiled:
    """``laps`` copies of ``trace`` back to back, lap k shifted by k x ``trace.end_s``. Event
    traces: node names get a ``~k`` suffix and nodes alive at a lap's end are removed at the
    wrap. Count traces: the series are concatenated (a sample landing on a wrap is dropped)."""
    if laps < 1:
        raise ValueError(f"laps must be >= 1, got {laps}")
    period = float(trace.end_s)
    if laps == 1:
        return Tiled(trace, 1, period)
    tile = _tile_events if trace.kind == "events" else _tile_counts
    zones, per_wrap = {}, [0] * (laps - 1)
    for name, zone in trace.zones.items():
        zones[name], wrapped = tile(zone, laps, period)
        per_wrap = [a + b for a, b in zip(per_wrap, wrapped)]
    tiled = dataclasses.replace(trace, name=f"{trace.name} x{laps}", zones=zones)
    return Tiled(tiled, laps, period, tuple(((k + 1) * period, n) for k, n in enumerate(per_wrap)))


def _tile_events(zone: EventList, laps: int, period: float) -> tuple[EventList, list[int]]:
    rows, removals = [], []
    for k in range(laps):
        alive: list[str] = []
        for ev in zone.events:
            node = f"{ev.node}~{k}"
            rows.append(NodeEvent(ev.time_s + k * period, ev.op, node))
            if ev.op == "add":
                alive.append(node)
            else:
                alive.remove(node)
        if k < laps - 1:
            rows.extend(NodeEvent((k + 1) * period, "remove", node) for node in alive)
            removals.append(len(alive))
    rows.sort(key=lambda r: (r.time_s, r.op != "remove"))
    return EventList(tuple(rows), zone.start_s, zone.end_s + (laps - 1) * period), removals


def _tile_counts(zone: CountSeries, laps: int, period: float) -> tuple[CountSeries, list[int]]:
    times, counts, gaps, removals = [], [], [], []
    for k in range(laps):
        t = zone.times_s + k * period
        keep = t < (k + 1) * period + zone.start_s  # a sample on the next lap's origin belongs to it
        if times:
            removals.append(max(0, int(counts[-1][-1] - zone.counts[0])))
        times.append(t[keep])
        counts.append(zone.counts[keep])
        gaps.extend((a + k * period, b + k * period) for a, b in zone.gaps)
    series = CountSeries(np.concatenate(times), np.concatenate(counts), zone.end_s + (laps - 1) * period, tuple(gaps))
    return series, removals


# ---------------------------------------------------------------------------------------------
# Memory


class RssSampler:
    """Samples, every ``every_s`` in a daemon thread, the RSS of this process plus every
    descendant titled ``ray::*`` (actors), and separately of all descendants."""

    def __init__(self, every_s: float) -> None:
        import psutil

        self.every_s, self._me = every_s, psutil.Process()
        self.peak_actors_mb = self.peak_all_mb = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self) -> None:
        import psutil

        mine = self._me.memory_info().rss
        actors = everything = 0
        for proc in self._me.children(recursive=True):
            try:
                rss, title = proc.memory_info().rss, " ".join(proc.cmdline()[:1])
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # a worker that died between listing and reading: not ours to count
            everything += rss
            actors += rss if title.startswith("ray::") else 0
        self.peak_actors_mb = max(self.peak_actors_mb, (mine + actors) / 2**20)
        self.peak_all_mb = max(self.peak_all_mb, (mine + everything) / 2**20)
        self.samples += 1


# ---------------------------------------------------------------------------------------------
# The soak


def laps_needed(cfg: TraceRunConfig, trace: Trace) -> int:
    """Laps so the trace covers the submission window plus the drain."""
    needed = (cfg.duration_s + cfg.drain_timeout_s) * cfg.speedup
    return max(1, math.ceil(needed / max(trace.end_s, 1e-9)))


def tiled_market(cfg: TraceRunConfig, trace: Trace):
    """The soak's market: the window start chosen on one lap (``--start-s``; "auto": replay's
    busiest window), the trace tiled to cover it plus the run and its drain. Returns the tiling,
    ``cfg`` with the start in trace seconds, and the market."""
    from benchmarks import replay

    start = replay.window_start(cfg, trace)
    tiled = tile_trace(trace, laps_needed(cfg, trace) + math.ceil(start / max(trace.end_s, 1e-9)))
    cfg = dataclasses.replace(cfg, start_s=start)
    return tiled, cfg, replay.build_market(cfg, tiled.trace)


def soak_fields(cfg: TraceRunConfig, trace: Trace, tiled: Tiled, replayed_s: float) -> dict:
    """What a soak's report adds to replay's about the trace it repeated (``replayed_s`` trace
    seconds of it from the window start)."""
    wraps = tiled.removals_until(cfg.start_s + replayed_s) - tiled.removals_until(cfg.start_s)
    return {"soak_minutes": cfg.duration_s / 60.0, "trace": trace.name, "trace_laps": tiled.laps,
            "trace_period_s": tiled.period_s, "wrap_removals": wraps}


def run_soak(cfg: TraceRunConfig, trace: Trace | None = None) -> dict:
    """The whole soak (``trace``: already loaded from ``cfg.trace``); returns the JSON report."""
    from benchmarks import replay

    trace = trace if trace is not None else replay.load_or_synthetic(cfg)
    tiled, cfg, market = tiled_market(cfg, trace)
    with RssSampler(cfg.sample_s) as rss:
        report = replay.run_checked(cfg, tiled.trace, market)
    replayed_s = (report["run_wall_s"] + report["drain_wall_s"]) * cfg.speedup
    return report | soak_fields(cfg, trace, tiled, replayed_s) | {
        "trace_seconds_replayed": replayed_s, "requests": report["requests_submitted"],
        "lost": report["requests_lost"], "duplicated": report["duplicate_completions"],
        "mismatched": report["mismatched_outputs"], "peak_rss_mb": round(rss.peak_actors_mb, 1),
        "peak_rss_all_mb": round(rss.peak_all_mb, 1), "rss_samples": rss.samples,
    }


def run_market_only(cfg: TraceRunConfig, trace: Trace | None = None) -> dict:
    """The soak's tiled market alone (no Ray): replay's ``market_report`` plus the tiling."""
    from benchmarks import replay

    trace = trace if trace is not None else replay.load_or_synthetic(cfg)
    tiled, cfg, market = tiled_market(cfg, trace)
    return replay.market_report(cfg, tiled.trace, market) | soak_fields(cfg, trace, tiled,
                                                                         cfg.duration_s * cfg.speedup)


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    from benchmarks.replay import add_arguments

    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p, DEFAULTS, minutes=True)
    p.add_argument("--market-only", action="store_true",
                   help="replay the tiled market alone (no Ray) and report its nodes and preemptions")
    return p


def config_from_args(args: argparse.Namespace) -> TraceRunConfig:
    from benchmarks import replay

    return replay.config_from_args(args, DEFAULTS)


def main(argv: list[str] | None = None) -> int:
    """Run one soak and print its report; 1 if a correctness counter is not 0, 2 on bad input."""
    from benchmarks.replay import load_or_synthetic, print_report

    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
        trace = load_or_synthetic(cfg)  # bad traces fail before Ray starts
        report = run_market_only(cfg, trace) if args.market_only else run_soak(cfg, trace)
    except (ValueError, FileNotFoundError) as err:
        print(f"python -m benchmarks.soak: {err}", file=sys.stderr)
        return 2
    return print_report(report, "soak", as_json=args.json, checked=not args.market_only)


if __name__ == "__main__":
    sys.exit(main())
