"""The distributed backend: the coordinator's phases on Ray actors.

    driver (coordinator) --submit--> QueueActor <--pull/complete/commit-- RolloutWorker x N
          |                                                                   |  fetch version v
          +--train/score-----> TrainerActor --publish v+1--> WeightStore <----+
          +--score---------->  RewardActor

Nothing is pushed to workers: they pull. The trainer publishes every version to the weight store,
which keeps the latest two (exploration on stale weights needs version t while t+1 trains).

With the run's ``spot:`` section enabled, spot rollout workers join the same queue as a market says
(``spot_pool.training_pool.start_training_pool``): the wait loop of ``rollouts`` polls the pool, a worker
told of a preemption commits its in-flight request and another worker resumes it, and a killed
worker's leases go back to the queue. Rollouts are pure functions of (weights, prompt, seed,
schedule) and are collected in request-id order, so the training curve is the one without spot.
Each iteration's metrics gain the pool's counters and the run's cost ledger (``spot/*``, ``cost/*``).

Crash recovery: given the run directory, the queue actor journals its calls to
``<run_dir>/queue.{state,log}`` (``dispatch.journal``) and Ray restarts it from there if its
process dies. The journal serves one driver's life; a resumed run starts a fresh one (the
checkpoint, not the old queue, says what to redo). Reward batches carry a ``batch_id``
(:class:`RewardBatchIds`), so a retried ``score`` call is answered from the reward actor's memory
instead of being scored and counted twice.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import ray

from roll_spotlight.config.ray_cluster import RayClusterConfig
from roll_spotlight.config.strict import to_dict
from roll_spotlight.driver_node import on_driver_node
from roll_spotlight.loopback import set_loopback_env
from roll_spotlight.runtime.actors import ONDEMAND, SPOT, RewardActor, TrainerActor
from roll_spotlight.worker.actor import RolloutWorker
from roll_spotlight.worker.emulated import Emulation
from roll_spotlight.worker.policy_source import worker_gpus
from roll_spotlight.runtime.update_report import UpdateReport, update_report
from roll_spotlight.config.run import RunConfig
from roll_spotlight.timeline import Timeline

log = logging.getLogger(__name__)
SPOT_MAX_ATTEMPTS = 1_000_000  # kills are the market's doing, not the request's: never give up on one


QUEUE_JOURNAL = "queue"  # <run_dir>/queue.state and <run_dir>/queue.log


def queue_config(cfg: RunConfig):
    """The run's queue: the ``dispatch`` section's keys, and with spot on no request is given up
    for its kills (``SPOT_MAX_ATTEMPTS``)."""
    attempts = {"max_attempts": SPOT_MAX_ATTEMPTS} if cfg.spot.enabled else {}
    return dataclasses.replace(cfg.dispatch.queue_config(), **attempts)


def fresh_queue_journal(run_dir: str | Path) -> Path:
    """The queue journal's base path in ``run_dir``, with a previous driver's journal removed.

    Why remove it: the journal rebuilds the queue after a crash of the queue actor *within* a
    driver's life. After a driver crash, ``--resume`` redoes the interrupted iteration from the
    checkpoint; the old queue's requests (other ids, weight versions the new store lacks, leases of
    workers that no longer exist) must not come back.
    """
    base = Path(run_dir) / QUEUE_JOURNAL
    stale = [base.with_name(base.name + suffix) for suffix in (".state", ".log", ".state.tmp")]
    for path in (p for p in stale if p.exists()):
        log.info("removing the previous driver's queue journal file %s", path)
        path.unlink()
    return base


class RewardBatchIds:
    """Ids of reward batches: ``(iteration, phase, n)``.

    ``iteration`` and ``phase`` (``rollout`` or ``explore``) are those of the requests collected
    last; ``n`` counts the batches of that (iteration, phase), since exploration scores several
    batches per iteration. Ids are unique within a driver's life (the reward actor's cache of
    results lives no longer) and are the same for the same run, so a retried call with its id is
    recognised as a repeat.
    """

    def __init__(self) -> None:
        self.label: tuple[int, str] = (0, "none")
        self._counts: Counter[tuple[int, str]] = Counter()

    def collected(self, specs: Sequence) -> None:
        if specs:
            self.label = (int(specs[0].iteration), specs[0].kind.value)

    def next(self) -> tuple[int, str, int]:
        n = self._counts[self.label]
        self._counts[self.label] += 1
        return self.label + (n,)


def init_ray(cluster: RayClusterConfig) -> None:
    """Join `address`, or start a local Ray bound to 127.0.0.1 with the simulated-GPU resources."""
    set_loopback_env()
    if ray.is_initialized():
        return
    if cluster.address:
        ray.init(address=cluster.address, log_to_driver=False)
        return
    spot = max(cluster.spot_workers + cluster.spot_pool_slots, 1)
    resources = {ONDEMAND: float(cluster.ondemand_workers + 1), SPOT: float(spot)}
    ray.init(num_cpus=cluster.num_cpus, resources=resources, include_dashboard=False, log_to_driver=False)


class RayBackend:
    """``run_dir``: where the queue actor keeps its crash-recovery journal (None: no journal, a
    dead queue ends the run). ``spot_market``, ``spot_clock`` and ``spot_worker_kwargs`` replace
    the spot pool's market, clock and per-node worker arguments (tests: a made-up market, a fake
    clock, failure injection)."""

    def __init__(self, cfg: RunConfig, policy_path: str | Path, cluster: RayClusterConfig | None = None, *,
                 run_dir: str | Path | None = None, spot_market=None, spot_clock: Callable[[], float] | None = None,
                 spot_worker_kwargs: Callable[[str], Mapping[str, object]] | None = None):
        from roll_spotlight.dispatch.queue_actor import create_queue_actor
        from roll_spotlight.weights import WeightStore

        self.cluster = cluster or RayClusterConfig()
        self.max_batch = cfg.sampling.max_batch
        if cfg.spot.enabled:  # room for a replacement to start while its predecessor is being killed
            slots = 2 * cfg.spot.max_workers * cfg.spot.gpus_per_node  # one worker per spot GPU
            self.cluster = dataclasses.replace(self.cluster, spot_pool_slots=slots)
        if self.cluster.elastic.sp_degree > 1:
            from roll_spotlight.worker.sp_group import check_sp_degree, check_spot_placement

            check_sp_degree(cfg.model, self.cluster.elastic.sp_degree)
            if cfg.spot.enabled:
                check_spot_placement(cfg.spot.gpus_per_node, self.cluster.elastic.sp_degree, cfg.spot.max_workers)
        self._owns_ray = not ray.is_initialized()  # then close() disconnects: whoever joins Ray leaves it
        init_ray(self.cluster)
        if cfg.spot.enabled and cfg.spot.source == "market" and ray.cluster_resources().get(SPOT, 0.0) < 1:
            raise ValueError(f"spot.enabled needs the Ray resource {SPOT!r}, which this cluster lacks")
        # a policy source (worker.policy_source): the tiny base's path, or a model section each actor loads;
        # or emulated GPUs (worker.emulated), whose trainer is colocated with an on-demand worker
        path = policy_path if isinstance(policy_path, (Mapping, Emulation)) else str(policy_path)
        data, gpus = to_dict(cfg), worker_gpus(path)
        self._path = path
        self.emulation = path if isinstance(path, Emulation) else None
        self._validation = None  # (pairs, sampling) when the workers validate (`evaluate`)
        if self.emulation is None and cfg.train.ema_decay == 0:
            from roll_spotlight.training.prompt_pools import validation_set

            self._validation = (validation_set(cfg.task), cfg.sampling)
        self.store = WeightStore.create(keep=2)
        self.trainer = TrainerActor.options(resources={ONDEMAND: 1}, num_gpus=gpus).remote(
            data, path, self.store, self.cluster.trainer_threads_for(cfg.exploration.mode))
        self.rewards = [RewardActor.options(**on_driver_node()).remote(data, emulation=self.emulation)
                        for _ in range(cfg.reward.world_size)]
        self.reward = self.rewards[0]
        self.reward_cfg = cfg.reward
        self.batch_ids = RewardBatchIds()
        self.weight_version = ray.get(self.trainer.weight_version.remote())
        # the journal creates run_dir: only once the trainer is up, so an earlier failure leaves none
        journal = fresh_queue_journal(run_dir) if run_dir is not None else None
        self.queue = create_queue_actor(queue_config(cfg), journal=journal)
        self.inbox = None
        if cfg.queue_trains():  # the update's micro-batches go through the queue (runtime.queue_training)
            from roll_spotlight.runtime.queue_training import create_inbox

            self.inbox = create_inbox(self.queue)
            ray.get(self.trainer.use_queue_training.remote(self.queue, self.inbox))
        self.workers = {}
        self.serving = {}
        self._rendezvous = None
        self._placement_groups = []
        self._spot_inbox = self.inbox if cfg.spot_trains() else None  # spot workers train, or only explore
        self._add_workers("ondemand", ONDEMAND, self.cluster.ondemand_workers)
        self._add_workers("spot", SPOT, self.cluster.spot_workers)
        self._wait_started()
        self._phases = Timeline("driver")
        self._market_at_train = (0, 0)
        self.spot = None
        if cfg.spot.enabled:
            self.spot = self._start_spot(cfg, spot_market, spot_clock, spot_worker_kwargs)

    def _wait_started(self, timeout_s: float = 300.0) -> None:
        """Return once every worker and reward actor is up, as the spot pool waits for its fleet:
        iteration 1 starts on a loaded cluster, as the simulator's (not times the time-scale)."""
        refs = [w.weight_version.remote() for w in self.workers.values()] + [r.stats.remote() for r in self.rewards]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            log.warning("%d of %d workers and reward actors were not up after %.0f s; the run starts anyway",
                        len(refs) - len(ready), len(refs), timeout_s)

    def _start_spot(self, cfg: RunConfig, market, clock, worker_kwargs):
        from roll_spotlight.spot_pool.training_pool import spot_elastic, start_training_pool

        source, shape, bill_scale = self._path, None, 1.0
        if self.emulation is not None:  # spot workers on spot nodes; the run's GPU-seconds are modelled ones
            source = self.emulation.as_role("spot", cfg.spot.gpus_per_node)
            shape, bill_scale = self.emulation.sp_shape(), self.emulation.time_scale
        sp = self.cluster.elastic
        elastic = spot_elastic(cfg.model, sp.sp_degree, sp.group_timeout_s, source, shape=shape,
                               min_degree=sp.min_sp_degree)
        return start_training_pool(cfg.spot, source, self.queue, self.store, threads=self.cluster.threads_per_actor,
                                   ondemand_gpus=self._ondemand_gpus(), market=market, clock=clock,
                                   worker_kwargs=worker_kwargs, elastic=elastic, inbox=self._spot_inbox,
                                   bill_scale=bill_scale, max_batch=cfg.sampling.max_batch)

    def _ondemand_gpus(self) -> int:
        """The on-demand GPUs billed: each rollout worker's, and the trainer's unless emulated GPUs
        colocate it with a worker (every on-demand GPU rolls out and trains)."""
        return self.cluster.ondemand_workers + (0 if self.emulation is not None else 1)

    def _add_workers(self, prefix: str, resource: str, count: int) -> None:
        """``count`` workers named ``prefix-i``; with ``sp_degree`` > 1, in SP groups of that many,
        each group on one node (a STRICT_PACK placement group) and known to the queue by the
        name of its first member."""
        degree = self.cluster.elastic.sp_degree
        if degree == 1:
            for i in range(count):
                self.add_worker(f"{prefix}-{i}", resource)
            return
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from roll_spotlight.elastic.rendezvous import group_memberships

        gpus = worker_gpus(self._path)
        bundle = {resource: 1.0, **({"GPU": float(gpus)} if gpus else {})}
        for first in range(0, count, degree):
            pg = placement_group([bundle] * degree, strategy="STRICT_PACK")
            ray.get(pg.ready())
            self._placement_groups.append(pg)
            leader = f"{prefix}-{first}"
            members = group_memberships(self._rendezvous_address(), leader, degree, self.cluster.elastic.group_timeout_s)
            for rank, membership in enumerate(members):
                strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank)
                self.add_worker(f"{prefix}-{first + rank}", resource, sp=membership, group_name=leader,
                                _options={"scheduling_strategy": strategy})

    def _rendezvous_address(self):
        """Where SP groups meet: a file store on a local cluster, a TCP store on this host otherwise."""
        if self._rendezvous is None:
            from roll_spotlight.worker.sp_group import open_rendezvous

            self._rendezvous = open_rendezvous(all_local=not self.cluster.address)
        return self._rendezvous.address

    def add_worker(self, name: str, resource: str, _options: Mapping | None = None, **kwargs):
        # in a placement group the actor still asks for its unit and GPU, out of its bundle (so Ray
        # sets CUDA_VISIBLE_DEVICES for it)
        options = {"resources": {resource: 1}, "num_gpus": worker_gpus(self._path), "name": None, **(_options or {})}
        worker = RolloutWorker.options(**options).remote(
            name, self._policy_path(), self.queue, self.store, threads=self.cluster.threads_per_actor,
            max_batch=self.max_batch, inbox=self.inbox if resource == ONDEMAND else self._spot_inbox, **kwargs)
        self.workers[name] = worker
        self.serving[name] = worker.serve.remote()
        return worker

    def _policy_path(self):
        return self._path

    def explore(self, specs) -> list:
        """Explore requests carry the stale version; the weight store still holds it."""
        return self.rollouts(specs)

    def rollouts(self, specs) -> list:
        return [c.output for c in self._collect(specs)]

    def rollouts_scored(self, specs) -> tuple[list, object]:
        """Rollouts and their rewards. With `reward.overlap` the reward actors score each batch of
        `reward.batch_size` images as soon as it completes, while the rest still roll out."""
        from roll_spotlight.runtime.collect import StreamingScorer

        if not self.reward_cfg.overlap:
            outputs = self.rollouts(specs)
            return outputs, self.score(np.stack([o.image for o in outputs]), [s.prompt for s in specs])
        self.batch_ids.collected(specs)
        scorer = StreamingScorer(self.rewards, self.batch_ids, self.reward_cfg.batch_size)
        completions = self._collect(specs, lambda c: scorer.add(c.request.request_id, c.request.prompt, c.output.image))
        with self._phases.phase("wait_rewards"):
            scored = scorer.result([c.request.request_id for c in completions])
        return [c.output for c in completions], scored

    def _collect(self, specs, on_completion=None) -> list:
        from roll_spotlight.runtime.collect import collect

        t0 = time.time()
        self.batch_ids.collected(specs)
        spot = self.spot

        def completed(completion) -> None:
            if spot is not None:
                spot.record(completion)
            if on_completion is not None:
                on_completion(completion)

        completions = collect(self.queue, specs, poll_s=self.cluster.poll_s, on_completion=completed,
                              tick=spot.poll if spot is not None else lambda: None)
        self._phases.add("wait_rollouts", t0)
        return completions

    def score(self, images: np.ndarray, prompts: list[str]):
        """One batch, split over the reward actors (`reward.world_size`) and gathered in order."""
        from roll_spotlight.runtime.collect import StreamingScorer

        n = len(prompts)
        scorer = StreamingScorer(self.rewards, self.batch_ids, max(1, -(-n // len(self.rewards))))
        for i in range(n):
            scorer.add(i, prompts[i], images[i])
        return scorer.result(range(n))

    def start_train(self, outputs, prompts, group_ids, rewards, baselines=None):
        """`baselines`: per-sample advantage baselines (`exploration.baseline: pool`), or None."""
        self._market_at_train = self._market_counts()
        return self.trainer.train.remote(outputs, prompts, group_ids, rewards, baselines)

    def _market_counts(self) -> tuple[int, int]:
        """(notices, preemptions) of the spot pool so far; (0, 0) without spot."""
        stats = None if self.spot is None else self.spot.pool.stats
        return (0, 0) if stats is None else (stats.notices, stats.preemptions)

    def place_spot(self, share: float) -> int:
        return 0 if self.spot is None else self.spot.place(self.queue, share)

    def training(self, handle) -> bool:
        ready, _ = ray.wait([handle], timeout=0)
        return not ready

    def finish_train(self, handle) -> UpdateReport:
        result = ray.get(handle)
        self.weight_version = ray.get(self.trainer.weight_version.remote())
        extra = {}
        if self.spot is not None:
            self.spot.poll()
            extra = self.spot.metrics(ray.get(self.queue.stats.remote()))
            (n0, p0), (n1, p1) = self._market_at_train, self._market_counts()
            extra |= {"spot/notices_in_training": float(n1 - n0), "spot/preemptions_in_training": float(p1 - p0)}
        is_spot = self.spot.is_spot if self.spot is not None else lambda worker: False
        return update_report(result, is_spot, extra)

    def train(self, outputs, prompts, group_ids, rewards, baselines=None) -> UpdateReport:
        return self.finish_train(self.start_train(outputs, prompts, group_ids, rewards, baselines))

    def evaluate(self):
        """Validation. Its pairs go through the queue as ODE rollouts of the published weights, so
        every rollout worker denoises them, spot ones too (a notice commits them like any other
        rollout), and the trainer scores the images; with a weight average (`train.ema_decay`) or
        on emulated GPUs the trainer validates alone."""
        if self._validation is None:
            return ray.get(self.trainer.evaluate.remote())
        from roll_spotlight.training.evaluate import validation_specs

        with self._phases.phase("validate"):
            specs = validation_specs(*self._validation, self.weight_version)
            images = np.stack([c.output.image for c in self._collect(specs)])
            return ray.get(self.trainer.score_validation.remote(images))

    def save_checkpoint(self, path: Path) -> None:
        ray.get(self.trainer.save.remote(str(path)))

    def load_checkpoint(self, path: Path) -> None:
        ray.get(self.trainer.load.remote(str(path)))
        self.weight_version = ray.get(self.trainer.weight_version.remote())

    def timeline(self) -> list[dict]:
        events = list(self._phases.events) + ray.get(self.trainer.timeline.remote())
        events += [e for timeline in ray.get([r.timeline.remote() for r in self.rewards]) for e in timeline]
        for worker in self.workers.values():
            events += ray.get(worker.timeline.remote())
        if self.spot is not None:
            events += self._spot_timelines()
        return sorted(events, key=lambda e: e["start"])

    def _spot_timelines(self) -> list[dict]:
        """Every spot worker's phases: those gone (read just before a kill, with a mark of how
        each ended) and the live ones."""
        from ray.exceptions import RayActorError

        launcher = self.spot.pool.launcher
        events = [e for timeline in launcher.timelines.values() for e in timeline]
        for name, worker in list(launcher.workers.items()):
            try:
                events += ray.get(worker.timeline.remote())
            except RayActorError:
                log.info("spot worker %s died before its timeline was read", name)
        return events

    def close(self) -> None:
        if self.spot is not None:
            cost = self.spot.close()
            log.info("spot pool closed: %s; cost %.4f USD vs %.4f USD all on demand (billed seconds x %g)",
                     self.spot.pool.stats, cost.total_usd, cost.ondemand_usd, self.spot.bill_scale)
        for worker in self.workers.values():
            worker.stop.remote()
        ray.get(list(self.serving.values()))
        for pg in self._placement_groups:
            ray.util.remove_placement_group(pg)
        if self._rendezvous is not None:
            self._rendezvous.close()
        if self._owns_ray:
            ray.shutdown()
