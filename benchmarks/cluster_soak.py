"""`python -m benchmarks.cluster_soak`: a spot trace driving real raylets on this machine, the run following them.

    trace --tile (soak)--> SpotMarket --ClusterTraceDriver--> LocalCluster: head + spot raylets
                                                                 |   notice -> agent -> DrainNode
    replay's runtime (queue, store, on-demand worker on the head) |
      + start_cluster_pool: RayNodeWatcher -> ElasticSpotPool -> spot workers pinned to each raylet
      --> replay's drive loop and its bit-for-bit check of every output

What `python -m benchmarks.soak` does, on a cluster whose membership is real: the market no longer tells the
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

Time: as `python -m benchmarks.soak` (``--speedup``); the notice is ``--notice-s`` wall seconds, by default
the provider's notice / speedup but at least ``MIN_CLUSTER_NOTICE_S``: the bridge's own latency
(a poll, a DrainNode, the driver's poll) and a denoising step plus a commit must fit in it.

The options are soak's (`TraceRunConfig`) with this run's defaults (`DEFAULTS`), less
``--address`` (the harness starts its own cluster), plus ``--provider`` and ``--keep-logs``.

Bad input (exit 2, one line naming the flag, before anything starts): more spot nodes than this
machine's memory holds (``--nodes``), an unknown provider, a bad trace.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
import time

from benchmarks.replay import TraceRunConfig
from roll_spotlight.spot.notices import PROVIDERS
from roll_spotlight.spot.traces import Trace

log = logging.getLogger(__name__)

MIN_CLUSTER_NOTICE_S = 4.0
DEFAULTS = TraceRunConfig(speedup=60.0, duration_s=120.0, nodes=4, gpus_per_node=2, sp_degree=2, num_steps=6,
                          drain_timeout_s=120.0, sample_s=1.0)


def check_machine(cfg: TraceRunConfig, available_mb: float | None = None) -> None:
    """Bad input found before anything starts: SP placement on the nodes, and the memory the
    spot nodes and the head need (``--nodes``)."""
    from roll_spotlight.cluster.local_cluster import available_memory_mb, check_capacity
    from benchmarks.replay import check_placement

    check_placement(cfg)
    check_capacity(cfg.nodes, cfg.gpus_per_node, available_memory_mb() if available_mb is None else available_mb)


def run_cluster_soak(cfg: TraceRunConfig, trace: Trace | None = None, *, worker_kwargs=None) -> dict:
    """The whole cluster soak; returns the JSON report (see the module docstring).
    ``worker_kwargs(node_id)``: extra spot worker arguments (tests inject ``faults``: `worker.faults.FaultPlan`)."""
    from roll_spotlight.cluster.local_cluster import ClusterTraceDriver, LocalCluster, LocalClusterConfig
    from benchmarks import replay
    from benchmarks.soak import RssSampler, tiled_market

    if ray_is_initialized():
        raise RuntimeError("cluster-soak drives a cluster of its own: this process is already connected to Ray")
    trace = trace if trace is not None else replay.load_or_synthetic(cfg)
    check_machine(cfg)
    cfg = dataclasses.replace(cfg, notice_s=replay.notice_wall_s(cfg, trace.provider, MIN_CLUSTER_NOTICE_S))
    tiled, cfg, market = tiled_market(cfg, trace)
    provider = cfg.provider or trace.provider
    cluster_cfg = LocalClusterConfig(gpus_per_node=cfg.gpus_per_node, ondemand_gpus=2, provider=provider,
                                     notice_s=cfg.notice_s, keep_logs=cfg.keep_logs)
    with RssSampler(every_s=cfg.sample_s) as rss, LocalCluster(cluster_cfg) as cluster:
        driver = ClusterTraceDriver(market, cluster, epoch0=time.time(), no_notice=cfg.no_notice)
        driver.tick(0.0)  # the window's initial fleet: its raylets start while the runtime comes up
        cfg = dataclasses.replace(cfg, address=cluster.address)
        report = replay.run_checked(cfg, tiled.trace, market, drive=_ClusterDrive(cluster, driver, worker_kwargs))
    leftovers = cluster.leftovers()
    return report | {"soak_minutes": cfg.duration_s / 60.0, "trace": trace.name, "trace_laps": tiled.laps,
                     "nodes": cfg.nodes, "provider": provider, "leftover_processes": len(leftovers),
                     "peak_rss_all_mb": round(rss.peak_all_mb, 1),
                     "lost": report["requests_lost"], "duplicated": report["duplicate_completions"],
                     "mismatched": report["mismatched_outputs"]}


def ray_is_initialized() -> bool:
    import ray

    return ray.is_initialized()


class _ClusterDrive:
    """``replay.run_checked``'s drive on the local cluster: once the initial fleet's raylets are
    up, the run's cluster pool on them, then replay's loop with ``driver`` moving the raylets."""

    def __init__(self, cluster, driver, worker_kwargs=None) -> None:
        self.cluster, self.driver, self.worker_kwargs = cluster, driver, worker_kwargs
        self.steps_lost = {True: 0, False: 0}  # noticed? -> steps the killed workers had not handed in
        self.training = None
        driver.before_kill = self._before_kill

    def __call__(self, cfg: TraceRunConfig, rt, market, stream):
        from roll_spotlight.config.run import SpotConfig
        from roll_spotlight.spot_pool.training_pool import spot_elastic, start_cluster_pool
        from roll_spotlight.spot.prices import prices_for_trace
        from benchmarks.replay import TINY_MODEL, drive_live

        driver = self.driver
        # a node noticed at once may leave as soon as it registers (a drained idle raylet exits)
        self.cluster.wait_registered([name for name in self.cluster.nodes if name not in driver.noticed])
        spot = SpotConfig(enabled=True, source="cluster", gpu_type=prices_for_trace(market.trace).gpu_type,
                          max_workers=cfg.nodes, gpus_per_node=cfg.gpus_per_node, commit_every=cfg.commit_every)
        elastic = spot_elastic(TINY_MODEL, cfg.sp_degree, cfg.lease_s, rt.policy_path)
        self.training = start_cluster_pool(spot, rt.policy_path, rt.queue, rt.store, ondemand_gpus=1,
                                           worker_kwargs=self.worker_kwargs, ready_timeout_s=180.0, elastic=elastic,
                                           max_batch=cfg.max_batch)
        rt.wait_ready()
        started = []

        def poll(now: float) -> None:
            if not started:  # market time 0 is the drive clock's 0; deadlines go out in epoch seconds
                driver.epoch0 = time.time() - now
                started.append(now)
            self.training.raise_if_failed()  # the pool follows the nodes in its own thread
            driver.tick(now)

        try:
            live = drive_live(cfg, rt, self.training.pool, stream, poll=poll, close=lambda now: self.training.close())
        except BaseException:
            self.training.close()
            raise
        live.extra = {"cluster": dataclasses.asdict(driver.stats) | {"deaths": death_reasons(self.cluster)},
                      "notice_wall_s": cfg.notice_s,
                      "denoise_steps_lost_after_notice": self.steps_lost[True],
                      "denoise_steps_lost_without_notice": self.steps_lost[False]}
        return live, self.training.ledger

    def _before_kill(self, name: str, noticed: bool) -> None:
        node_id = self.cluster.node_ids().get(name) if self.training is not None else None
        if node_id is not None:
            self.steps_lost[noticed] += self.training.unsaved_steps(node_id)


# ---------------------------------------------------------------------------------------------
# Command line


def death_reasons(cluster) -> dict[str, int]:
    """How the spot nodes of ``cluster`` that registered and died went, by the GCS's death reason
    (AUTOSCALER_DRAIN_PREEMPTED: drained for a preemption first, i.e. the bridge got there)."""
    from ray.core.generated.common_pb2 import NodeDeathInfo

    reasons: dict[str, int] = {}
    for info in cluster.node_infos().values():
        if info.state != 0 and info.node_name.startswith("spot-"):
            reason = NodeDeathInfo.Reason.Name(info.death_info.reason)
            reasons[reason] = reasons.get(reason, 0) + 1
    return reasons


def build_parser() -> argparse.ArgumentParser:
    from benchmarks.replay import add_arguments

    p = argparse.ArgumentParser(prog="python -m benchmarks.cluster_soak", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p, DEFAULTS, minutes=True, join=False, notice_floor_s=MIN_CLUSTER_NOTICE_S)
    p.add_argument("--provider", default=None, help=f"notice bridge provider, one of {PROVIDERS}; default: the trace's")
    p.add_argument("--keep-logs", action="store_true", help="keep every raylet's and agent's log (the path is logged)")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the harness and the pool do")
    return p


def config_from_args(args: argparse.Namespace) -> TraceRunConfig:
    from benchmarks import replay

    return replay.config_from_args(args, DEFAULTS)


def main(argv: list[str] | None = None) -> int:
    """Run one cluster soak and print its report; 1 if a correctness counter is not 0 or a
    process is left behind, 2 on bad input."""
    from roll_spotlight.loopback import set_loopback_env
    from benchmarks.replay import load_or_synthetic, print_report

    set_loopback_env()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = config_from_args(args)
        trace = load_or_synthetic(cfg)  # bad traces fail before Ray starts
        check_machine(cfg)
        with contextlib.redirect_stdout(sys.stderr):  # Ray prints each killed raylet's last log lines
            report = run_cluster_soak(cfg, trace)
    except (ValueError, FileNotFoundError) as err:
        print(f"python -m benchmarks.cluster_soak: {err}", file=sys.stderr)
        return 2
    code = print_report(report, "cluster-soak", as_json=args.json, checked=True)
    return 1 if report["leftover_processes"] else code


if __name__ == "__main__":
    sys.exit(main())
