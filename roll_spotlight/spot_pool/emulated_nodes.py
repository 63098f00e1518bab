"""The spot nodes of an emulated run (`worker.emulated`): raylets of a one-machine cluster that the
run's spot trace starts, drains through the notice bridge and kills at the emulation's time-scale,
and the check that this machine can hold the emulated GPUs at all.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

from roll_spotlight.cluster import local_cluster
from roll_spotlight.cluster.local_cluster import (HEAD_MB, ClusterTraceDriver, LocalCluster, LocalClusterConfig,
                                                  available_memory_mb)
from roll_spotlight.spot_pool.training_pool import training_market

# Memory (RSS) of an emulated worker actor: Ray's worker process with torch imported for the
# training stand-ins, no model (a Qwen-Image worker holds the model on its GPU, not here).
EMULATED_WORKER_MB = 300.0
# ... and of a ROLL worker process (ROLL, transformers and megatron imported): 488-503 MB measured
ROLL_WORKER_MB = 520.0


def emulated_gpus(cfg, ondemand_workers: int) -> tuple[int, int]:
    """(on-demand GPUs: the trainer and its rollout workers, spot nodes at the pool's peak)."""
    return 1 + ondemand_workers, cfg.spot.max_workers if cfg.spot.enabled else 0


def check_capacity(gpus: tuple[int, int], gpus_per_node: int, available_mb: float | None = None, *,
                   ondemand_mb: float = EMULATED_WORKER_MB, ondemand: str = "on-demand GPUs") -> None:
    """ValueError naming --emulate when this machine cannot hold the emulated GPUs: a worker
    process each (``ondemand_mb`` for the on-demand ones: a ROLL host's are larger), and a raylet
    per spot node (`cluster.local_cluster.check_capacity`)."""
    workers, nodes = gpus
    available = available_memory_mb() if available_mb is None else available_mb
    try:
        local_cluster.check_capacity(nodes, gpus_per_node, available, nodes_key="spot.max_workers",
                                     gpus_key="spot.gpus_per_node", worker_mb=EMULATED_WORKER_MB,
                                     head_mb=HEAD_MB + workers * ondemand_mb, head=f"{workers} {ondemand}")
    except ValueError as err:
        raise ValueError(f"--emulate: {err}") from None


class TraceRaylets:
    """The spot nodes of an emulated run: raylets of a one-machine cluster (`cluster.local_cluster`)
    that the run's spot trace starts, drains through the notice bridge and kills, at the
    emulation's time-scale; the run follows them as a real cluster (``spot.source: cluster``).

    A context manager: on entry the head is up; `add_fleet()` brings up the trace window's initial
    fleet and waits until it registered; `start()` sets the trace's clock going (once the run's
    workers are up); the exit stops the trace and ends every process of the cluster. The fleet is
    a step of its own because a host may place its on-demand workers on whichever node it picks
    (ROLL's CPU-only ``ResourceManager`` takes the node with the fewest CPUs: a spot node's 0)."""

    POLL_S = 0.1
    # wall seconds a raylet takes from `ray start` to registering on a 2-core machine (measured:
    # docs/cluster.md); a joining node's raylet starts this much ahead of its trace time, so the
    # run sees it join on time rather than this x the time-scale later
    RAYLET_START_S = 5.0

    def __init__(self, spot, ondemand_gpus: int, time_scale: float) -> None:
        self.market = training_market(replace(spot, compression=time_scale))
        self.spot, self.ondemand_gpus = spot, ondemand_gpus
        self.cluster = self.driver = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def __enter__(self) -> TraceRaylets:
        provider = self.market.trace.provider
        # raylets on a busy machine miss heartbeats: declare one dead after 9 s of silence, not 3
        config = LocalClusterConfig(gpus_per_node=self.spot.gpus_per_node, ondemand_gpus=self.ondemand_gpus,
                                    provider=provider, notice_s=self.market.notice_s, health_check_period_ms=3000)
        self.cluster = LocalCluster(config).__enter__()
        try:
            self.driver = ClusterTraceDriver(self.market, self.cluster, epoch0=time.time(), lead_s=self.RAYLET_START_S)
        except BaseException:
            self.cluster.close()
            raise
        return self

    @property
    def address(self) -> str:
        return self.cluster.address

    def add_fleet(self) -> None:
        """The window's initial fleet (trace time 0) joins; returns once its raylets registered."""
        self.driver.tick(0.0)
        self.cluster.wait_registered(list(self.cluster.nodes))

    def start(self) -> None:
        """The trace's clock starts now (its time 0 was the initial fleet's)."""
        self.driver.epoch0 = time.time()
        self._thread = threading.Thread(target=self._follow, name="trace-raylets", daemon=True)
        self._thread.start()

    def write_stats(self, run_dir: Path) -> None:
        """What the trace did to the raylets during the run, as ``spot_nodes.json`` in the run
        directory: joins, notices, and kills after a notice or without one. The run's own
        ``spot/preemptions`` counts a node when the GCS has declared it dead (health checks, 9 s of
        wall time after the kill), so a kill near a run's end shows here before it shows there."""
        (Path(run_dir) / "spot_nodes.json").write_text(json.dumps(asdict(self.driver.stats), indent=1))

    def _follow(self) -> None:
        while not self._stop.wait(self.POLL_S):
            try:
                self.driver.tick(time.time() - self.driver.epoch0)
            except Exception as err:  # re-raised by the exit: a trace that stopped is not a trace
                self.error = err
                return

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.cluster.close()
        if self.error is not None and exc[0] is None:
            raise RuntimeError("the spot trace stopped driving the raylets") from self.error
