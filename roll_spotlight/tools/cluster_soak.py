"""`spotlight cluster-soak`: a spot trace driving real raylets on this machine, the run following them.

    trace --tile (soak)--> SpotMarket --ClusterTraceDriver--> LocalCluster: head + spot raylets
                                                                 |   notice -> agent -> DrainNode
    replay's runtime (queue, store, on-demand worker on the head) |
      + start_cluster_pool: RayNodeWatcher -> ElasticSpotPool -> spot workers pinned to each raylet
      --> replay's drive loop and its bit-for-bit check of every output

What `spotlight soak` does, on a cluster whose membership is real: the market no longer tells the
pool what happens; it starts a raylet per join (``ray start --address ... --block``), turns a
notice into the node's provider answer (its notice agent drains the node with the notice's
deadline) and kills the raylet's process group at the deadline, or without notice. The run's pool
is the one a training run with ``spot.source: cluster`` uses (``start_cluster_pool``): it sees
the raylets come, drain and go through Ray only.

The report is replay's (requests lost, duplicated, mismatched; preemptions and notices as the
pool saw them; regroups; ``time_lost_per_preemption_s``: median and max seconds of the regroups
after a loss) plus ``cluster``: what the harness did (joins, notices sent through the bridge,
kills after a notice and without one, raylets already gone at their kill) and ``deaths``, the
GCS's death reason of every spot node that registered (``AUTOSCALER_DRAIN_PREEMPTED``: drained by
its agent before it died), ``denoise_steps_lost_after_notice`` and
``..._without_notice`` (steps the workers of a node had run and not handed to the queue, read
just before its raylet is killed), ``leftover_processes`` after the head was shut down, and
``peak_rss_all_mb`` (this process and every process under it: head, raylets, agents, workers).

Time: as `spotlight soak` (``--speedup``); the notice is ``--notice-s`` wall seconds, by default
the provider's notice / speedup but at least ``MIN_CLUSTER_NOTICE_S``: the bridge's own latency
(a poll, a DrainNode, the driver's poll) and a denoising step plus a commit must fit in it.

Bad input (exit 2, one line naming the flag, before anything starts): more spot nodes than this
machine's memory holds (``--nodes``), an unknown provider, a bad trace.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import math
import sys
import time
from dataclasses import dataclass

from roll_spotlight.spot.market import COUNT_MODELS, NOTICE_S_BY_PROVIDER
from roll_spotlight.spot.notices import PROVIDERS
from roll_spotlight.spot.traces import Trace, load_trace

log = logging.getLogger(__name__)

MIN_CLUSTER_NOTICE_S = 4.0


@dataclass(frozen=True)
class ClusterSoakConfig:
    """One cluster soak; see the module docstring. ``provider`` None: the trace's."""

    trace: str | None = None
    minutes: float = 2.0
    speedup: float = 60.0
    nodes: int = 4
    gpus_per_node: int = 2
    sp_degree: int = 2
    provider: str | None = None
    count_model: str = "instances"
    start_s: float | str = 0.0
    notice_s: float | None = None
    no_notice: bool = False
    commit_every: int = 0
    num_steps: int = 6
    backlog: int = 2
    drain_timeout_s: float = 120.0
    seed: int = 0
    keep_logs: bool = False

    def __post_init__(self) -> None:
        for key, flag in (("minutes", "--minutes"), ("speedup", "--speedup"), ("drain_timeout_s", "--drain-timeout")):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{flag} must be a finite number > 0, got {value!r}")
        if self.provider is not None and self.provider not in PROVIDERS:
            raise ValueError(f"--provider {self.provider!r} is not one of {list(PROVIDERS)}")
        if self.count_model not in COUNT_MODELS:
            raise ValueError(f"--count-model {self.count_model!r} is not one of {list(COUNT_MODELS)}")
        if not (self.start_s == "auto" or (isinstance(self.start_s, (int, float)) and self.start_s >= 0)):
            raise ValueError(f"--start-s must be trace seconds >= 0 or 'auto', got {self.start_s!r}")
        if self.notice_s is not None and not (math.isfinite(self.notice_s) and self.notice_s > 0):
            raise ValueError(f"--notice-s must be a finite number > 0, got {self.notice_s!r}")

    def notice_wall_s(self, provider: str) -> float:
        if self.notice_s is not None:
            return self.notice_s
        return max(NOTICE_S_BY_PROVIDER.get(provider, 30.0) / self.speedup, MIN_CLUSTER_NOTICE_S)

    def soak_config(self):
        """The soak (and through it the replay) settings of this run."""
        from roll_spotlight.tools.soak import SoakConfig

        return SoakConfig(trace=self.trace, minutes=self.minutes, speedup=self.speedup, cap_nodes=self.nodes,
                          gpus_per_node=self.gpus_per_node, sp_degree=self.sp_degree, count_model=self.count_model,
                          notice_s=self.notice_s, no_notice=self.no_notice, commit_every=self.commit_every,
                          num_steps=self.num_steps,
                          backlog=self.backlog, drain_timeout_s=self.drain_timeout_s, seed=self.seed)


def check_machine(cfg: ClusterSoakConfig, available_mb: float | None = None) -> None:
    """Bad input found before anything starts: SP placement on the nodes, and the memory the
    spot nodes and the head need (``--nodes``)."""
    from roll_spotlight.runtime.sp_group import check_sp_degree, check_spot_placement
    from roll_spotlight.tools.local_cluster import available_memory_mb, check_capacity
    from roll_spotlight.tools.replay import TINY_MODEL

    check_sp_degree(TINY_MODEL, cfg.sp_degree, key="--sp-degree")
    check_spot_placement(cfg.gpus_per_node, cfg.sp_degree, cfg.nodes, degree_key="--sp-degree",
                         gpus_key="--gpus-per-node", nodes_key="--nodes")
    check_capacity(cfg.nodes, cfg.gpus_per_node, available_memory_mb() if available_mb is None else available_mb)


def run_cluster_soak(cfg: ClusterSoakConfig, trace: Trace | None = None, *, worker_kwargs=None) -> dict:
    """The whole cluster soak; returns the JSON report (see the module docstring).
    ``worker_kwargs(node_id)``: extra spot worker arguments (tests inject ``faults``: `runtime.faults.FaultPlan`)."""
    from roll_spotlight.spot.synthetic import synthetic_trace
    from roll_spotlight.tools import replay
    from roll_spotlight.tools.local_cluster import ClusterTraceDriver, LocalCluster, LocalClusterConfig
    from roll_spotlight.tools.soak import RssSampler, laps_needed, tile_trace

    if ray_is_initialized():
        raise RuntimeError("cluster-soak drives a cluster of its own: this process is already connected to Ray")
    if trace is None:
        trace = load_trace(cfg.trace) if cfg.trace else synthetic_trace()
    check_machine(cfg)
    soak = cfg.soak_config()
    start = window_start(cfg, trace)
    tiled = tile_trace(trace, laps_needed(soak, trace) + math.ceil(start / max(trace.end_s, 1e-9)))
    provider = cfg.provider or trace.provider
    notice_s = cfg.notice_wall_s(trace.provider)
    rcfg = dataclasses.replace(soak.replay_config(), notice_s=notice_s, start_s=start)
    market = replay.build_market(rcfg, tiled.trace)
    cluster_cfg = LocalClusterConfig(gpus_per_node=cfg.gpus_per_node, ondemand_gpus=2, provider=provider,
                                     notice_s=notice_s, keep_logs=cfg.keep_logs)
    with RssSampler(every_s=1.0) as rss, LocalCluster(cluster_cfg) as cluster:
        driver = ClusterTraceDriver(market, cluster, epoch0=time.time(), no_notice=cfg.no_notice)
        driver.tick(0.0)  # the window's initial fleet: its raylets start while the runtime comes up
        rcfg = dataclasses.replace(rcfg, address=cluster.address)
        report = replay.run_checked(rcfg, tiled.trace, market, drive=_ClusterDrive(cfg, cluster, driver, worker_kwargs))
    leftovers = cluster.leftovers()
    return report | {"soak_minutes": cfg.minutes, "trace": trace.name, "trace_laps": tiled.laps,
                     "nodes": cfg.nodes, "provider": provider, "leftover_processes": len(leftovers),
                     "peak_rss_all_mb": round(rss.peak_all_mb, 1),
                     "lost": report["requests_lost"], "duplicated": report["duplicate_completions"],
                     "mismatched": report["mismatched_outputs"]}


def ray_is_initialized() -> bool:
    import ray

    return ray.is_initialized()


def window_start(cfg: ClusterSoakConfig, trace: Trace) -> float:
    """``--start-s`` in trace seconds; "auto": replay's busiest window of the soak's length (the
    one with the most preemptions of the capped fleet, on one lap of the trace)."""
    from roll_spotlight.tools.replay import busiest_window

    if cfg.start_s != "auto":
        return float(cfg.start_s)
    return busiest_window(trace, cfg.minutes * 60.0 * cfg.speedup, cap_nodes=cfg.nodes,
                          count_model=cfg.count_model, seed=cfg.seed)


class _ClusterDrive:
    """``replay.run_checked``'s drive on the local cluster: once the initial fleet's raylets are
    up, the run's cluster pool on them, then replay's loop with ``driver`` moving the raylets."""

    def __init__(self, cfg: ClusterSoakConfig, cluster, driver, worker_kwargs=None) -> None:
        self.cfg, self.cluster, self.driver, self.worker_kwargs = cfg, cluster, driver, worker_kwargs
        self.steps_lost = {True: 0, False: 0}  # noticed? -> steps the killed workers had not handed in
        self.training = None
        driver.before_kill = self._before_kill

    def __call__(self, rcfg, rt, market, stream):
        from roll_spotlight.config.run import SpotConfig
        from roll_spotlight.runtime.spot_pool import spot_elastic, start_cluster_pool
        from roll_spotlight.spot.prices import prices_for_trace
        from roll_spotlight.tools.replay import TINY_MODEL, drive_live

        driver = self.driver
        # a node noticed at once may leave as soon as it registers (a drained idle raylet exits)
        self.cluster.wait_registered([name for name in self.cluster.nodes if name not in driver.noticed])
        spot = SpotConfig(enabled=True, source="cluster", gpu_type=prices_for_trace(market.trace).gpu_type,
                          max_workers=self.cfg.nodes, gpus_per_node=self.cfg.gpus_per_node,
                          commit_every=self.cfg.commit_every)
        elastic = spot_elastic(TINY_MODEL, self.cfg.sp_degree, rcfg.lease_s, rt.policy_path)
        self.training = start_cluster_pool(spot, rt.policy_path, rt.queue, rt.store, ondemand_gpus=1,
                                           worker_kwargs=self.worker_kwargs, ready_timeout_s=180.0, elastic=elastic)
        rt.wait_ready()
        started = []

        def poll(now: float) -> None:
            if not started:  # market time 0 is the drive clock's 0; deadlines go out in epoch seconds
                driver.epoch0 = time.time() - now
                started.append(now)
            self.training.raise_if_failed()  # the pool follows the nodes in its own thread
            driver.tick(now)

        try:
            live = drive_live(rcfg, rt, self.training.pool, stream, poll=poll, close=lambda now: self.training.close())
        except BaseException:
            self.training.close()
            raise
        live.extra = {"cluster": dataclasses.asdict(driver.stats) | {"deaths": self.cluster.death_reasons()},
                      "notice_wall_s": rcfg.notice_s,
                      "denoise_steps_lost_after_notice": self.steps_lost[True],
                      "denoise_steps_lost_without_notice": self.steps_lost[False]}
        return live, self.training.ledger

    def _before_kill(self, name: str, noticed: bool) -> None:
        node_id = self.cluster.node_ids().get(name) if self.training is not None else None
        if node_id is not None:
            self.steps_lost[noticed] += self.training.unsaved_steps(node_id)


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    d = ClusterSoakConfig()
    p = argparse.ArgumentParser(prog="spotlight cluster-soak", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--trace", default=None, help="trace file or folder; omitted: the synthetic p3-like trace")
    p.add_argument("--nodes", type=int, default=d.nodes, help="most spot raylets alive at once")
    p.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node, help="rollout workers (GPUs) per spot node")
    p.add_argument("--sp-degree", type=int, default=d.sp_degree, help="SP degree of the spot workers' elastic groups")
    p.add_argument("--minutes", type=float, default=d.minutes, help="wall minutes of request submission")
    p.add_argument("--speedup", type=float, default=d.speedup, help="trace seconds per wall second")
    p.add_argument("--start-s", default="0", help="window start in trace seconds, or 'auto' (the busiest window)")
    p.add_argument("--provider", default=None, help=f"notice bridge provider, one of {PROVIDERS}; default: the trace's")
    p.add_argument("--count-model", default=d.count_model, help=f"count traces: one of {COUNT_MODELS}")
    p.add_argument("--notice-s", type=float, default=None,
                   help=f"notice in wall seconds (default: provider notice / speedup, at least {MIN_CLUSTER_NOTICE_S})")
    p.add_argument("--no-notice", action="store_true", help="drop every notice: each preemption is a plain SIGKILL")
    p.add_argument("--commit-every", type=int, default=d.commit_every, help="checkpoint every K steps (0: never)")
    p.add_argument("--num-steps", type=int, default=d.num_steps, help="denoising steps per request")
    p.add_argument("--backlog", type=int, default=d.backlog, help="pending requests kept per serving worker")
    p.add_argument("--drain-timeout", type=float, default=d.drain_timeout_s, help="wall seconds to wait for the drain")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--keep-logs", action="store_true", help="keep every raylet's and agent's log (the path is logged)")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the harness and the pool do")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line (default: indented)")
    return p


def config_from_args(args: argparse.Namespace) -> ClusterSoakConfig:
    from roll_spotlight.tools.replay import _float_arg

    start = args.start_s if args.start_s == "auto" else _float_arg("--start-s", args.start_s)
    return ClusterSoakConfig(trace=args.trace, minutes=args.minutes, speedup=args.speedup, nodes=args.nodes,
                             start_s=start,
                             gpus_per_node=args.gpus_per_node, sp_degree=args.sp_degree, provider=args.provider,
                             count_model=args.count_model, notice_s=args.notice_s, no_notice=args.no_notice,
                             commit_every=args.commit_every,
                             num_steps=args.num_steps, backlog=args.backlog, drain_timeout_s=args.drain_timeout,
                             seed=args.seed, keep_logs=args.keep_logs)


def main(argv: list[str] | None = None) -> int:
    """Run one cluster soak and print its report; 1 if a correctness counter is not 0 or a
    process is left behind, 2 on bad input."""
    from roll_spotlight.loopback import set_loopback_env
    from roll_spotlight.tools.replay import print_report

    set_loopback_env()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = config_from_args(args)
        trace = load_trace(cfg.trace) if cfg.trace is not None else None  # bad traces fail before Ray starts
        check_machine(cfg)
        with contextlib.redirect_stdout(sys.stderr):  # Ray prints each killed raylet's last log lines
            report = run_cluster_soak(cfg, trace)
    except (ValueError, FileNotFoundError) as err:
        print(f"spotlight cluster-soak: {err}", file=sys.stderr)
        return 2
    code = print_report(report, "cluster-soak", as_json=args.json, checked=True)
    return 1 if report["leftover_processes"] else code


if __name__ == "__main__":
    sys.exit(main())
