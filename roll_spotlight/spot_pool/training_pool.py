"""The spot side of a training run: the market, prices and pool of a run's ``spot:`` section.

In training (a run's ``spot:`` section, ``RunConfig.spot``), ``start_training_pool`` builds the
run's market (``training_market``: the trace, or the synthetic market, capped at ``max_workers``
nodes), its price table and a ``TrainingSpotPool``: the pool on a clock (wall seconds since the
initial fleet was ready) plus a ledger that also bills the on-demand GPUs, so a run reports
on-demand vs spot cost side by side. The Ray backend polls it while it waits for rollouts, which is
the only time spot workers hold leases (they pull rollout and exploration requests, and both are
waited for by that loop), so a notice reaches a busy worker within one poll; events that fall due
while the driver trains or validates are applied at the next poll (a late notice to an idle worker
is dropped and its node simply goes at NODE_DOWN, losing nothing).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from roll_spotlight.config.run import SpotConfig
    from roll_spotlight.dispatch.queue import QueueStats

from roll_spotlight.spot_pool.ray_nodes import RayNodeWatcher, RayWorkerLauncher, has_spot_resource
from roll_spotlight.spot.ledger import CostLedger, CostReport
from roll_spotlight.spot.market import MIN_NOTICE_S, NOTICE_S_BY_PROVIDER, MarketConfig, SpotMarket
from roll_spotlight.spot_pool.pool import ElasticSpotPool, EventSource, NodeState, SpotPoolConfig
from roll_spotlight.spot.market import MarketSchedule
from roll_spotlight.spot.prices import Price, PriceTable, default_prices, prices_for_trace
from roll_spotlight.spot.traces import Trace

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Training: the market, prices and pool of a run's ``spot:`` section

ONDEMAND_BILLING = "ondemand-gpus"  # the ledger entry of the trainer and on-demand rollout GPUs
BACKGROUND_POLL_S = 0.2  # how often a wall-clock training pool polls its market between driver polls
CONFIG_PRICE_SOURCE = "set in the run config ({key})"


def load_run_trace(spot: SpotConfig) -> Trace:
    """``spot.trace``, or the synthetic trace (Bamboo p3 statistics) seeded by ``spot.seed``."""
    from roll_spotlight.spot.synthetic import synthetic_trace
    from roll_spotlight.spot.traces import load_trace

    return load_trace(spot.trace) if spot.trace else synthetic_trace(seed=spot.seed)


def training_notice_s(spot: SpotConfig, provider: str) -> float:
    """The notice in wall seconds: as configured, else the provider's notice compressed like the
    trace, but at least ``MIN_NOTICE_S``."""
    if spot.notice_s is not None:
        return spot.notice_s
    return max(NOTICE_S_BY_PROVIDER[provider] / spot.compression, MIN_NOTICE_S)


def training_market(spot: SpotConfig, trace: Trace | None = None) -> SpotMarket:
    """The run's market: ``trace`` (default ``load_run_trace``) from ``start_s``, to its end,
    ``compression`` times faster, at most ``max_workers`` spot nodes alive (the market's cap:
    a node preempted frees its slot for the trace's next join); count traces preempt the nodes
    as ``count_model`` says."""
    trace = trace if trace is not None else load_run_trace(spot)
    return SpotMarket(trace, MarketConfig(
        notice_s=training_notice_s(spot, trace.provider), victims=spot.victims, count_model=spot.count_model,
        seed=spot.seed,
        compression=spot.compression, start_s=spot.start_s, cap_nodes=spot.max_workers, zones=spot.zones))


def training_prices(spot: SpotConfig, trace: Trace) -> PriceTable:
    """The trace's price table (``gpu_type``'s defaults when set), with the config's overrides."""
    return _with_config_prices(spot, default_prices(spot.gpu_type) if spot.gpu_type else prices_for_trace(trace))


def _with_config_prices(spot: SpotConfig, table: PriceTable) -> PriceTable:
    """``table`` with ``spot.ondemand_usd_per_gpu_hour`` / ``spot_usd_per_gpu_hour`` replacing its
    prices of that kind (every zone)."""
    prices = dict(table.prices)
    for kind, key in (("ondemand", "ondemand_usd_per_gpu_hour"), ("spot", "spot_usd_per_gpu_hour")):
        value = getattr(spot, key)
        if value is not None:
            prices = {pool: price for pool, price in prices.items() if pool.partition("/")[0] != kind}
            prices[kind] = Price(value, CONFIG_PRICE_SOURCE.format(key=f"spot.{key}"))
    return PriceTable(table.gpu_type, prices)


class TrainingSpotPool:
    """The spot side of one training run: the pool polled on ``clock``, and the run's ledger.

    Both pools bill on the pool clock times the pool's ``bill_scale`` (the market's compression,
    so GPU-seconds are trace seconds): the ``ondemand_gpus`` (trainer and on-demand rollout
    workers) from clock 0 to ``close``; each spot node from its NODE_UP to its NODE_DOWN (or
    ``close``). ``record`` counts the completions the backend collects: how many ran on spot
    workers, how many were resumed from a committed step, and repeated request ids (the queue
    promises none).
    """

    def __init__(self, pool: ElasticSpotPool, ledger: CostLedger, clock: Callable[[], float],
                 ondemand_gpus: int, *, background_poll_s: float | None = None) -> None:
        assert ondemand_gpus >= 1, "the trainer alone is one on-demand GPU"
        self.pool, self.ledger, self.clock = pool, ledger, clock
        self.ondemand_gpus = ondemand_gpus
        self._seen: set[int] = set()
        self.completed_on_spot = self.outputs_resumed = self.duplicate_completions = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self.poller_error: BaseException | None = None
        ledger.start(ONDEMAND_BILLING, "ondemand", 0.0, gpus=ondemand_gpus)
        if background_poll_s is not None:
            self._start_poller(background_poll_s)

    def _start_poller(self, interval_s: float) -> None:
        """The market runs on the wall clock whatever the driver is doing (validating, waiting for
        the trainer), so a daemon thread polls it too; otherwise a notice that falls due while the
        driver is busy arrives late and its node dies without committing."""
        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.poll()
                except Exception as err:  # re-raised to the driver by its next poll() or close()
                    self.poller_error = err
                    log.exception("the spot pool's background poll failed; it no longer follows the spot nodes")
                    return

        self._poller = threading.Thread(target=loop, name="spot-pool-poller", daemon=True)
        self._poller.start()

    @property
    def bill_scale(self) -> float:
        return self.pool.config.bill_scale

    def poll(self) -> None:
        self.raise_if_failed()
        with self._lock:
            if not self._stop.is_set():
                self.pool.poll(self.clock())

    def raise_if_failed(self) -> None:
        """The background poller's failure, raised in the caller (a pool that silently stopped
        following its nodes would go on billing and reporting as if it did)."""
        if self.poller_error is not None:
            raise RuntimeError("the spot pool's background poll failed") from self.poller_error

    def record(self, completion) -> None:
        """Count one collected completion (a ``dispatch.requests.Completion``)."""
        with self._lock:
            self._record(completion)

    def _record(self, completion) -> None:
        request_id = completion.request.request_id
        if request_id in self._seen:
            self.duplicate_completions += 1
            return
        self._seen.add(request_id)
        self.completed_on_spot += self.pool.owns(completion.worker)
        self.outputs_resumed += completion.output.resumed_from > 0

    def is_spot(self, worker: str) -> bool:
        """Is ``worker``, a name in the queue, one of this pool's workers or elastic SP groups
        (alive or gone)?"""
        with self._lock:
            return self.pool.owns(worker) or any(worker in r.formed for r in self._regroups())

    def _regroups(self) -> list:
        return getattr(self.pool.launcher, "regroups", [])

    def _pullers(self) -> list[str]:
        """The names the spot workers pull under now: each solo worker's, or each SP group's."""
        groups = getattr(self.pool.launcher, "groups", None)
        return sorted(groups.names.values() if groups is not None else self.pool.launcher.workers)

    def place(self, queue, share: float) -> int:
        """Queue training (`spot.training_phase`): the first `share` of the live spot workers (SP
        groups count as one), by name, pull exploration before training micro-batches, the others
        the default order (training first). Returns how many explore first. Workers and groups
        that form later train first."""
        import ray

        from roll_spotlight.dispatch.requests import RequestKind

        with self._lock:
            names = self._pullers()
        k = round(share * len(names))
        explore_first = (RequestKind.ROLLOUT, RequestKind.EXPLORE, RequestKind.TRAIN)
        ray.get([queue.set_order.remote(names[:k], explore_first), queue.set_order.remote(names[k:], None)])
        return k

    def unsaved_steps(self, node_id: str) -> int:
        """Denoising steps the workers on Ray node ``node_id`` have run and not yet handed to the
        queue (what a kill now would throw away); 0 for a node without live workers of the pool."""
        with self._lock:
            node = self.pool.nodes.get(node_id)
            if node is None or node.state is NodeState.GONE:
                return 0
            return self.pool.launcher.unsaved_steps(node.worker)

    def cost(self) -> CostReport:
        return self.ledger.report(self.clock() * self.bill_scale)

    def metrics(self, queue: QueueStats) -> dict[str, float]:
        """Flat counters and costs so far, for a run's metrics row (TensorBoard-friendly keys)."""
        with self._lock:
            return self._metrics(queue)

    def _metrics(self, queue: QueueStats) -> dict[str, float]:
        stats = self.pool.stats
        counters = {
            "spot/workers_serving": self.pool.serving, "spot/nodes_started": stats.nodes_up,
            "spot/preemptions": stats.preemptions, "spot/notices": stats.notices,
            "spot/notices_late": stats.notices_late, "spot/actor_deaths": stats.actor_deaths,
            "spot/leases_requeued": stats.leases_requeued, "spot/steps_lost": stats.steps_lost,
            "spot/commits": queue.commits, "spot/checkpoints": queue.checkpoints,
            "spot/resumed_from_commit": queue.resumed_from_commit, "spot/outputs_resumed": self.outputs_resumed,
            "spot/completed_on_spot": self.completed_on_spot, "spot/requests_failed": queue.failed,
            "spot/duplicate_completions": self.duplicate_completions,
            "spot/late_completions_rejected": queue.duplicate_completions,
        }
        return counters | regroup_metrics(self._regroups()) \
            | cost_metrics(self.cost(), self.bill_scale)

    def close(self) -> CostReport:
        """Stop every spot worker and all billing; returns the run's final cost."""
        with self._lock:
            self._stop.set()
        if self._poller is not None:
            self._poller.join()
        now = self.clock()
        self.pool.close(now)
        if ONDEMAND_BILLING in self.ledger.open_nodes:
            self.ledger.stop(ONDEMAND_BILLING, now * self.bill_scale)
        self.raise_if_failed()
        return self.ledger.report()


def regroup_metrics(reports) -> dict[str, float]:
    """Elastic SP counters from the launcher's `RegroupReport`s: regroups after a loss and after
    arrivals, newcomers' weight copies by source, groups broken without notice, and the time lost
    per preemption (a loss's regroup, from the decision to the new groups serving: what the
    members of the groups it broke stand idle; the committed step in hand is not lost)."""
    lost = loss_regroup_seconds(reports)
    out = {"spot/regroups": float(len(reports)), "spot/regroups_after_loss": float(len(lost)),
           "spot/groups_broken": float(sum(len(r.broken) for r in reports)),
           "spot/regroup_s_per_loss": float(sum(lost) / len(lost)) if lost else 0.0,
           "spot/regroup_s_max": float(max((r.seconds for r in reports), default=0.0))}
    for report in reports:
        for source in report.sources.values():
            key = f"spot/newcomer_weights_{source.value}"
            out[key] = out.get(key, 0.0) + 1.0
    return out


def loss_regroup_seconds(reports) -> list[float]:
    """Seconds of each regroup after a loss: the time a preemption costs the members of the
    groups it broke (from the decision to the new groups serving)."""
    return [float(r.seconds) for r in reports if r.lost]


def cost_metrics(report: CostReport, bill_scale: float) -> dict[str, float]:
    """``cost/gpu_s/<pool>`` (billed seconds), ``cost/usd/<pool>``, the totals, and what the same
    GPU-hours would have cost on demand."""
    out: dict[str, float] = {"cost/bill_scale": bill_scale}
    for pool in report.pools:
        out[f"cost/gpu_s/{pool.pool}"] = pool.gpu_hours * 3600.0
        out[f"cost/usd/{pool.pool}"] = pool.usd
    return out | {"cost/usd": report.total_usd, "cost/all_ondemand_usd": report.ondemand_usd,
                  "cost/savings_usd": report.savings_usd, "cost/savings_fraction": report.savings_fraction}


def wall_clock() -> Callable[[], float]:
    """Seconds since this call (the monotonic clock)."""
    t0 = time.monotonic()
    return lambda: time.monotonic() - t0


def elastic_groups_config(model_cfg, degree: int, *, timeout_s: float, cuda: bool, name: str = "spot",
                          min_degree: int = 1, shape: tuple[int, int] | None = None):
    """The `ElasticGroupsConfig` of a run's spot workers: Ulysses' shape from the model (``shape``:
    given, for emulated GPUs that load none)."""
    from roll_spotlight.elastic.groups import ElasticGroupsConfig
    from roll_spotlight.worker.sp_group import sp_shape

    heads, tokens = shape or sp_shape(model_cfg)
    return ElasticGroupsConfig(num_heads=heads, preferred_degree=degree, num_tokens=tokens, timeout_s=timeout_s,
                               cuda=cuda, name=name, min_degree=min_degree)


def spot_elastic(model_cfg, degree: int, timeout_s: float, policy_path, min_degree: int = 1,
                 shape: tuple[int, int] | None = None):
    """The `ElasticGroupsConfig` of a run's spot workers (None at SP degree 1: solo workers)."""
    if degree == 1:
        return None
    from roll_spotlight.worker.policy_source import worker_gpus

    return elastic_groups_config(model_cfg, degree, timeout_s=timeout_s, cuda=worker_gpus(policy_path) > 0,
                                 min_degree=min_degree, shape=shape)


def start_training_pool(spot: SpotConfig, policy_path, queue, store, *, ondemand_gpus: int, threads: int = 1,
                        market: SpotMarket | None = None, clock: Callable[[], float] | None = None,
                        worker_kwargs: Callable[[str], Mapping[str, object]] | None = None,
                        ready_timeout_s: float = 120.0, elastic=None, inbox=None,
                        bill_scale: float = 1.0, max_batch: int = 1) -> TrainingSpotPool:
    """Start the run's spot pool on Ray: the market's initial fleet is started and loaded before
    the clock starts (nodes alive at the window start are in steady state, not cold-starting).
    ``market``, ``clock`` and ``worker_kwargs`` are for tests (a made-up market, a fake clock,
    failure injection); by default the market comes from ``spot`` and the clock is the wall.
    With ``spot.source: cluster`` the pool follows the Ray cluster's own spot nodes instead (see
    ``start_cluster_pool``). Each node runs ``spot.gpus_per_node`` workers; ``elastic`` (an
    `ElasticGroupsConfig`, for SP degree > 1) makes them elastic SP members (``RayWorkerLauncher``);
    ``inbox`` (queue training) lets them compute micro-batches of updates too. ``bill_scale``:
    GPU-seconds per wall second on a cluster (emulated GPUs: the time-scale); a market's bills at
    its compression. ``max_batch``: requests a worker denoises together (``sampling.max_batch``)."""
    if spot.source == "cluster" and market is None:
        return start_cluster_pool(spot, policy_path, queue, store, ondemand_gpus=ondemand_gpus, threads=threads,
                                  worker_kwargs=worker_kwargs, ready_timeout_s=ready_timeout_s, elastic=elastic,
                                  inbox=inbox, bill_scale=bill_scale, max_batch=max_batch)
    market = market if market is not None else training_market(spot)
    ledger = CostLedger(training_prices(spot, market.trace))
    launcher = RayWorkerLauncher(policy_path, queue, store, threads=threads, commit_every=spot.commit_every,
                                 max_batch=max_batch, worker_kwargs=worker_kwargs, gpus_per_node=spot.gpus_per_node,
                                 elastic=elastic, inbox=inbox)
    pool = ElasticSpotPool(MarketSchedule(market), launcher, ledger,
                           SpotPoolConfig(bill_scale=market.config.compression, gpus_per_node=spot.gpus_per_node,
                                          no_notice=not spot.commit_on_notice))
    pool.poll(0.0)
    if not launcher.wait_ready(ready_timeout_s):
        log.warning("spot workers of the initial fleet were not ready after %.0f s; training goes on", ready_timeout_s)
    log.info("spot pool: market %s, %d events over %.0f wall s, notice %.1f s, %d initial worker(s)",
             market.trace.name, len(market), market.duration_s, market.notice_s, pool.serving)
    # a test's fake clock advances per poll, so only the wall clock gets the background poller
    return TrainingSpotPool(pool, ledger, clock or wall_clock(), ondemand_gpus,
                            background_poll_s=None if clock is not None else BACKGROUND_POLL_S)


def cluster_prices(spot: SpotConfig) -> PriceTable:
    """Prices of a live cluster's GPUs: ``gpu_type``'s defaults with the config's overrides."""
    return _with_config_prices(spot, default_prices(spot.gpu_type))


def start_cluster_pool(spot: SpotConfig, policy_path, queue, store, *, ondemand_gpus: int, threads: int = 1,
                       source: EventSource | None = None,
                       worker_kwargs: Callable[[str], Mapping[str, object]] | None = None,
                       ready_timeout_s: float = 120.0, elastic=None, inbox=None,
                       bill_scale: float = 1.0, max_batch: int = 1) -> TrainingSpotPool:
    """The spot pool of a real cluster: ``RayNodeWatcher`` turns the Ray nodes that carry the
    ``spot_gpu`` resource (what deploy/kuberay declares on spot nodes, and what the workers ask
    for) into events; each such node gets one worker pinned to it (node affinity); a preemption
    drain with its deadline is the notice. Billing is in wall seconds at ``cluster_prices``.
    ``source`` replaces the watcher (tests)."""
    ledger = CostLedger(cluster_prices(spot))
    launcher = RayWorkerLauncher(policy_path, queue, store, threads=threads, commit_every=spot.commit_every,
                                 max_batch=max_batch, node_affinity=True, worker_kwargs=worker_kwargs,
                                 gpus_per_node=spot.gpus_per_node, elastic=elastic, inbox=inbox)
    pool = ElasticSpotPool(source or RayNodeWatcher(is_spot=has_spot_resource), launcher, ledger,
                           SpotPoolConfig(bill_scale=bill_scale, gpus_per_node=spot.gpus_per_node,
                                          no_notice=not spot.commit_on_notice))
    pool.poll(0.0)
    if not launcher.wait_ready(ready_timeout_s):
        log.warning("spot workers on the cluster's spot nodes were not ready after %.0f s; training goes on",
                    ready_timeout_s)
    log.info("spot pool: following the Ray cluster's spot nodes, %d worker(s) now", pool.serving)
    return TrainingSpotPool(pool, ledger, wall_clock(), ondemand_gpus, background_poll_s=BACKGROUND_POLL_S)
