"""`spotlight soak`: the live runtime under a spot trace for M wall minutes, repeating the trace.

    trace --tile_trace(laps)--> one long trace --replay machinery (tools.replay)--> live Ray runtime
                                                       + a sampler of RSS (driver + Ray actors)

A soak is a long `spotlight replay`: the same runtime (one on-demand RolloutWorker, spot workers
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
`spotlight replay`. ``--market-only`` replays the tiled market alone, without Ray, and reports its
nodes started and preemptions in the submission window (``kind: "market"``).

The JSON report is replay's report (``kind: "measured"``) plus the fields above. Exit status: 0
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

from roll_spotlight.spot.market import COUNT_MODELS
from roll_spotlight.spot.traces import CountSeries, EventList, NodeEvent, Trace, load_trace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SoakConfig:
    """One soak; see the module docstring. Times are wall seconds unless named ``trace``."""

    trace: str | None = None
    minutes: float = 1.0
    speedup: float = 120.0
    cap_nodes: int = 3
    gpus_per_node: int = 1
    sp_degree: int = 1
    count_model: str = "instances"
    no_notice: bool = False
    notice_s: float | None = None
    commit_every: int = 0
    num_steps: int = 6
    backlog: int = 2
    drain_timeout_s: float = 120.0
    seed: int = 0
    sample_s: float = 0.5
    address: str | None = None

    def __post_init__(self) -> None:
        for key in ("minutes", "speedup", "drain_timeout_s", "sample_s"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"soak.{key} must be a finite number > 0, got {value!r}")
        for key, low in (("cap_nodes", 1), ("commit_every", 0), ("num_steps", 1), ("backlog", 1)):
            if getattr(self, key) < low:
                raise ValueError(f"soak.{key} must be >= {low}, got {getattr(self, key)!r}")
        if self.count_model not in COUNT_MODELS:
            raise ValueError(f"soak.count_model must be one of {list(COUNT_MODELS)}, got {self.count_model!r}")

    def replay_config(self, drain_timeout_s: float | None = None):
        """The replay machinery's config for this soak (start at the tiled trace's origin)."""
        from roll_spotlight.tools.replay import ReplayConfig

        return ReplayConfig(speedup=self.speedup, duration_s=self.minutes * 60.0, start_s=0.0,
                            cap_nodes=self.cap_nodes, gpus_per_node=self.gpus_per_node, sp_degree=self.sp_degree,
                            count_model=self.count_model, no_notice=self.no_notice,
                            notice_s=self.notice_s,
                            commit_every=self.commit_every, num_steps=self.num_steps, backlog=self.backlog,
                            drain_timeout_s=drain_timeout_s or self.drain_timeout_s, seed=self.seed,
                            address=self.address)


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


def laps_needed(cfg: SoakConfig, trace: Trace) -> int:
    """Laps so the trace covers the submission window plus the drain."""
    needed = (cfg.minutes * 60.0 + cfg.drain_timeout_s) * cfg.speedup
    return max(1, math.ceil(needed / max(trace.end_s, 1e-9)))


def run_soak(cfg: SoakConfig, trace: Trace | None = None) -> dict:
    """The whole soak (``trace``: already loaded from ``cfg.trace``); returns the JSON report."""
    from roll_spotlight.spot.synthetic import synthetic_trace

    if trace is None:
        trace = load_trace(cfg.trace) if cfg.trace else synthetic_trace()
    tiled = tile_trace(trace, laps_needed(cfg, trace))
    with RssSampler(cfg.sample_s) as rss:
        report = _replay(cfg, tiled.trace)
    replayed_s = (report["run_wall_s"] + report["drain_wall_s"]) * cfg.speedup
    return report | {
        "soak_minutes": cfg.minutes, "trace": trace.name, "trace_laps": tiled.laps,
        "trace_period_s": tiled.period_s, "trace_seconds_replayed": replayed_s,
        "wrap_removals": tiled.removals_until(replayed_s),
        "requests": report["requests_submitted"], "lost": report["requests_lost"],
        "duplicated": report["duplicate_completions"], "mismatched": report["mismatched_outputs"],
        "peak_rss_mb": round(rss.peak_actors_mb, 1), "peak_rss_all_mb": round(rss.peak_all_mb, 1),
        "rss_samples": rss.samples,
    }


def run_market_only(cfg: SoakConfig, trace: Trace | None = None) -> dict:
    """The soak's tiled market alone (no Ray): replay's ``market_report`` plus the tiling."""
    from roll_spotlight.spot.synthetic import synthetic_trace
    from roll_spotlight.tools import replay

    if trace is None:
        trace = load_trace(cfg.trace) if cfg.trace else synthetic_trace()
    tiled = tile_trace(trace, laps_needed(cfg, trace))
    rcfg = cfg.replay_config()
    report = replay.market_report(rcfg, tiled.trace, replay.build_market(rcfg, tiled.trace))
    return report | {"soak_minutes": cfg.minutes, "trace": trace.name, "trace_laps": tiled.laps,
                     "trace_period_s": tiled.period_s,
                     "wrap_removals": tiled.removals_until(cfg.minutes * 60.0 * cfg.speedup)}


def _replay(cfg: SoakConfig, trace: Trace) -> dict:
    """Replay's live run and check over an already built trace (replay.run_replay loads its own)."""
    from roll_spotlight.tools import replay

    rcfg = cfg.replay_config()
    return replay.run_checked(rcfg, trace, replay.build_market(rcfg, trace))


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    d = SoakConfig()
    p = argparse.ArgumentParser(prog="spotlight soak", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--trace", default=None, help="trace file or folder; omitted: the synthetic p3-like trace")
    p.add_argument("--minutes", type=float, default=d.minutes, help="wall minutes of request submission")
    p.add_argument("--speedup", type=float, default=d.speedup, help="trace seconds per wall second")
    p.add_argument("--cap-nodes", type=int, default=d.cap_nodes, help="most spot nodes alive at once")
    p.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node, help="rollout workers (GPUs) per spot node")
    p.add_argument("--sp-degree", type=int, default=d.sp_degree,
                   help="SP degree of the spot workers' elastic groups (1: solo workers)")
    p.add_argument("--count-model", default=d.count_model, choices=COUNT_MODELS,
                   help="count traces: each spot node is one of the group's instances, or the count is a capacity")
    p.add_argument("--no-notice", action="store_true", help="kill at NODE_DOWN without any notice")
    p.add_argument("--notice-s", type=float, default=None, help="notice in wall seconds (default: replay's)")
    p.add_argument("--commit-every", type=int, default=d.commit_every, help="checkpoint every K steps (0: never)")
    p.add_argument("--num-steps", type=int, default=d.num_steps, help="denoising steps per request")
    p.add_argument("--backlog", type=int, default=d.backlog, help="pending requests kept per serving worker")
    p.add_argument("--drain-timeout", type=float, default=d.drain_timeout_s, help="wall seconds to wait for the drain")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--address", default=None, help="join this Ray cluster instead of starting one")
    p.add_argument("--market-only", action="store_true",
                   help="replay the tiled market alone (no Ray) and report its nodes and preemptions")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line (default: indented)")
    return p


def config_from_args(args: argparse.Namespace) -> SoakConfig:
    return SoakConfig(trace=args.trace, minutes=args.minutes, speedup=args.speedup, cap_nodes=args.cap_nodes,
                      gpus_per_node=args.gpus_per_node, sp_degree=args.sp_degree,
                      count_model=args.count_model, no_notice=args.no_notice, notice_s=args.notice_s, commit_every=args.commit_every,
                      num_steps=args.num_steps, backlog=args.backlog, drain_timeout_s=args.drain_timeout,
                      seed=args.seed, address=args.address)


def main(argv: list[str] | None = None) -> int:
    """Run one soak and print its report; 1 if a correctness counter is not 0, 2 on bad input."""
    from roll_spotlight.tools.replay import print_report

    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
        trace = load_trace(cfg.trace) if cfg.trace is not None else None  # bad traces fail before Ray starts
        report = run_market_only(cfg, trace) if args.market_only else run_soak(cfg, trace)
    except (ValueError, FileNotFoundError) as err:
        print(f"spotlight soak: {err}", file=sys.stderr)
        return 2
    return print_report(report, "soak", as_json=args.json, checked=not args.market_only)


if __name__ == "__main__":
    sys.exit(main())
