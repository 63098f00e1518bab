"""The simulated system: one baseline running Flow-GRPO iterations on one cluster and spot feed.

The policies are the runtime's own, imported: ``RequestQueue`` (dispatch), ``plan_groups``
(elastic SP), ``BanditPlanner`` and ``select_max_variance`` (exploration). What is simulated is
only time: a worker denoises up to ``max_batch`` requests together, each step ``CostModel.step_s``;
training ``CostModel.train_s`` (or, with spot training, micro-batches through the queue); restarts
and joins cost what the cost model says. Explored rewards are synthetic (``SyntheticRewards``).

One iteration (docs/design.md section 3)::

    ROLLOUT (+rewards) -> TRAIN -> weight sync -> next iteration
       \-> colocated reward: ROLLOUT -> REWARD on the rollout GPUs -> TRAIN
                            \\-> spot GPUs explore prompts of t+1 (spotlight)
                            \\-> spot and on-demand GPUs pull TRAIN micro-batches (spotlight_train)

SP worker lifecycle (a worker = one SP group incarnation, id never reused)::

    created --ready_at--> idle <--> running --complete--> idle
                            |          |--notice, cannot finish by the deadline--> commit -> idle
                            |          |--regroup (warm)--> commit at a step boundary -> gone
                            +----------+--node reclaimed--> lease requeued (worker_lost) -> gone

Invariants: every request of an iteration completes exactly once (the queue guarantees it); time
only moves forward; with no spot market the run is a deterministic function of the cost model.
"""
from __future__ import annotations

import enum
import heapq
import logging
import math
from dataclasses import dataclass, field

import numpy as np

from roll_spotlight.dispatch.queue import QueueConfig, RequestQueue
from roll_spotlight.dispatch.requests import InFlightState, Lease, RequestKind, RequestSpec, Schedule
from roll_spotlight.elastic.group_plan import Plan, SPGroup, plan_groups
from roll_spotlight.exploration.bandit import BanditPlanner, PlannerConfig, Pull, seed_stream
from roll_spotlight.exploration.select import select_max_variance
from roll_spotlight.sim.baselines import BaselineSpec, Exploration, Recovery, Training
from roll_spotlight.sim.gpu_inventory import BUSY_PHASES, Cluster, GpuKind, GpuPhases, Member, Phase, gpu_name
from roll_spotlight.sim.costmodel import CostModel
from roll_spotlight.sim.events import PRIORITY_MARKET, EventHandle, EventLoop
from roll_spotlight.sim.synthetic_rewards import SyntheticRewards
from roll_spotlight.sim.spotfeed import SpotFeed
from roll_spotlight.sim.update_model import QueueTrainer, TrainRun
from roll_spotlight.spot.ledger import CostLedger
from roll_spotlight.spot.market import EventKind, MarketEvent

logger = logging.getLogger(__name__)

# Requests are never given up in simulation: a preempted lease always returns to the queue.
_QUEUE_CONFIG = QueueConfig(lease_s=1e12, max_attempts=1_000_000)


@dataclass(frozen=True)
class SimConfig:
    """Shape of one simulated run. ``spot`` is the most spot GPUs held at once.

    ``gpus_per_spot_node`` GPUs come with each trace instance; with one GPU per instance,
    ``spot_host_gpus`` > 1 places instances as GPU slots of shared hosts (see ``cluster``), the
    setting under which SP groups stay on one host and newcomers copy weights over NVLink.

    ``reward_colocated``: the reward model shares the rollout GPUs (verl-omni's sync reward), so an
    iteration's rollouts are scored after the last one, on ``reward_workers`` slots, while the
    on-demand GPUs are in phase REWARD; by default reward servers score each image as it completes.

    ``max_batch``: requests a worker denoises together (None: the recipes'); ``serial_rollout``: one at
    a time, CFG branches one after the other (the engine before batching; verl-omni's published runs).
    """

    resolution: int
    ondemand: int
    spot: int
    iterations: int
    seed: int = 0
    gpus_per_ondemand_node: int = 8
    gpus_per_spot_node: int = 1
    spot_host_gpus: int = 8
    seeds_per_pull: int = 4
    record_timeline: bool = False
    max_sim_s: float = 90 * 24 * 3600.0
    reward_colocated: bool = False
    max_batch: int | None = None
    serial_rollout: bool = False

    def __post_init__(self) -> None:
        if self.resolution % 16:
            raise ValueError(f"SimConfig.resolution must be a multiple of 16, got {self.resolution}")
        if self.ondemand < 1:
            raise ValueError(f"SimConfig.ondemand must be >= 1 (training runs on on-demand GPUs), "
                             f"got {self.ondemand}")
        if self.spot < 0 or self.iterations < 1:
            raise ValueError(f"SimConfig: spot must be >= 0 and iterations >= 1, got spot={self.spot}, "
                             f"iterations={self.iterations}")
        if self.spot % self.gpus_per_spot_node:
            raise ValueError(f"SimConfig.spot={self.spot} must be a multiple of gpus_per_spot_node="
                             f"{self.gpus_per_spot_node}")
        if self.max_batch is not None and (type(self.max_batch) is not int or self.max_batch < 1
                                           or self.serial_rollout and self.max_batch != 1):
            raise ValueError(f"SimConfig.max_batch must be None or an integer >= 1 (1 with serial_rollout), "
                             f"got {self.max_batch!r}")

    def batch_of(self, cost: CostModel, degree: int | None = None) -> int:
        """Requests an SP group of ``degree`` GPUs denoises together: fewer on a smaller group (memory)."""
        if self.serial_rollout:
            return 1
        batch = self.max_batch if self.max_batch is not None else cost.max_batch(self.resolution)
        preferred = cost.preferred_sp(self.resolution)
        return batch if degree is None or degree >= preferred else max(1, batch * degree // preferred)


class IterPhase(enum.Enum):
    ROLLOUT = "rollout"
    TRAIN = "train"


@dataclass
class BatchRun:
    """Requests one worker denoises together from ``start``, a step of all rows in ``step_s``; row i
    starts at step ``first_steps[i]`` (resumed) and all report when the last finishes (no refill)."""

    leases: list[Lease]
    start: float
    step_s: float
    first_steps: list[int]

    @property
    def steps(self) -> int:
        return max(l.request.schedule.num_steps - f for l, f in zip(self.leases, self.first_steps))

    def boundary(self, steps_done: int) -> float:
        return self.start + steps_done * self.step_s


@dataclass
class SimWorker:
    """One SP group incarnation pulling from the queue."""

    wid: str
    group: SPGroup
    kind: GpuKind
    cross_node: bool
    ready_at: float
    run: BatchRun | None = None
    done_event: EventHandle | None = None
    commit_event: EventHandle | None = None
    dissolving: bool = False
    train: TrainRun | None = None       # a lease batch of TRAIN micro-batches (spot training)

    @property
    def members(self) -> tuple[Member, ...]:
        return self.group.members

    @property
    def busy(self) -> bool:
        return self.run is not None or self.train is not None


@dataclass
class BaselineResult:
    """Simulated outcome of one baseline; every number here is simulated, not measured.

    - ``time_per_iteration_s``: run length / iterations (an iteration ends after the weight sync).
    - ``*_idle_fraction``: 1 - (seconds in rollout, exploration or training) / billed GPU-seconds;
      booting, restarting, regrouping, receiving weights and waiting all count as idle.
    - ``cost_per_iteration_usd``: billed GPU-hours x the feed's prices (spot per zone) / iterations.
    - ``preemptions``: NODE_DOWN of held nodes; ``regroups``: SP groups formed after the start;
      ``cold_restarts``: broken groups restarted cold; ``commits``: in-flight states committed.
    - ``lost_gpu_s``: GPU-seconds of work thrown away: rollouts since the last commit, training
      micro-batches since the last accepted gradient report.
    - ``mean_train_phase_s``: mean seconds from the start of training to the new weights (before
      the weight sync); ``train``: spot training's micro-batch counts, None for FSDP training.
    - ``phases_per_iteration``: ``wall_s``, an iteration's wall clock split into rollout (start to
      the last rollout), reward (to the last score), train (to the new weights) and sync (to the
      next iteration), summing to ``time_per_iteration_s``; ``ondemand_gpu_s`` and ``spot_gpu_s``,
      GPU-seconds per iteration in each ``cluster.Phase`` (``phase_seconds`` / iterations).
    - ``mean_group_reward_std``: mean over iterations and prompts of the trained group's reward
      spread, from the *synthetic* reward model (a sanity signal for the planner, not quality).
    """

    name: str
    iterations: int
    iteration_times_s: list[float]
    time_per_iteration_s: float
    sim_end_s: float
    cost_per_iteration_usd: float
    ondemand_usd: float
    spot_usd: float
    ondemand_gpu_hours: float
    spot_gpu_hours: float
    ondemand_idle_fraction: float
    spot_idle_fraction: float | None
    spot_lost_work_fraction: float | None
    preemptions: int
    notices: int
    regroups: int
    cold_restarts: int
    commits: int
    lost_gpu_s: float
    explored_seeds_per_iteration: float
    mean_group_reward_std: float
    mean_train_phase_s: float = 0.0
    train: dict[str, float] | None = None
    phase_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    phases_per_iteration: dict[str, dict[str, float]] = field(default_factory=dict)
    timeline: list[tuple[str, float, float, str]] | None = None


class ClusterSimulation:
    """Composition root of one simulated run; ``simulate()`` returns a :class:`BaselineResult`."""

    def __init__(self, spec: BaselineSpec, config: SimConfig, cost: CostModel, feed: SpotFeed) -> None:
        self.spec, self.config, self.cost, self.feed = spec, config, cost, feed
        self.loop = EventLoop()
        self.queue = RequestQueue(_QUEUE_CONFIG, clock=lambda: self.loop.now)
        self.cluster = Cluster(config.ondemand, config.spot if spec.uses_spot else 0,
                               config.gpus_per_ondemand_node, config.gpus_per_spot_node,
                               config.spot_host_gpus)
        self.timeline = GpuPhases(record=config.record_timeline)
        self.ledger = CostLedger(feed.prices)
        self.rewards = SyntheticRewards(config.seed)
        self.workers: dict[str, SimWorker] = {}
        self.spot_plan: Plan | None = None
        self._next_wid = 0
        self._restarting: dict[Member, float] = {}
        self._deadline: dict[Member, float] = {}
        self._reward_slots = [0.0] * int(cost.reward_workers)
        self._join_token: dict[str, float] = {}
        self._counters = dict(preemptions=0, notices=0, regroups=0, cold_restarts=0, commits=0)
        self._lost_gpu_s = 0.0
        self._iteration = 0
        self._version = 0
        self._phase = IterPhase.ROLLOUT
        self._next_prompt = 0
        self._iteration_starts: list[float] = []
        self._outstanding = 0
        self._planner: BanditPlanner | None = None
        self._planned_batch: tuple[list[int], dict[int, list[int]]] | None = None
        self._explored_total = 0
        self._group_rewards: dict[int, list[float]] = {}
        self._group_stds: list[float] = []
        self._done = False
        self._end_s = 0.0
        self._spot_weights_at = 0.0
        self._down_at = {e.node_id: e.time_s for e in feed.events if e.kind is EventKind.NODE_DOWN}
        self._train_started_at = 0.0
        self._train_phases: list[float] = []
        self._marks: list[dict[str, float]] = []        # per iteration: when each wall phase ended
        self._rollouts_left = 0
        self._unscored: list[tuple[RequestSpec, float]] = []
        self.trainer = QueueTrainer(self) if spec.training is Training.QUEUE else None

    # ================================================================ run (table of contents)
    def simulate(self) -> BaselineResult:
        self._start_ondemand()
        if self.spec.uses_spot:
            self._schedule_market()
        self.loop.schedule(0.0, self._begin_iteration)
        self.loop.run_until(self.config.max_sim_s, stop=lambda: self._done)
        if not self._done:
            raise RuntimeError(f"{self.spec.name}: {len(self._iteration_starts)} of "
                               f"{self.config.iterations} iterations done by t={self.loop.now:.0f} s")
        return self._result()

    # ================================================================ setup
    def _start_ondemand(self) -> None:
        members = self.cluster.ondemand_members()
        live: dict[str, list[int]] = {}
        for node, gpu in members:
            live.setdefault(node, []).append(gpu)
        for node, gpus in live.items():
            self.ledger.start(node, "ondemand", 0.0, gpus=len(gpus))
        plan = self._plan(live, None)
        for group in plan.groups:
            self._new_worker(group, GpuKind.ONDEMAND, 0.0)
        for member in members:
            self.timeline.set(gpu_name(member), Phase.IDLE, 0.0)

    def _schedule_market(self) -> None:
        """Nodes up at time 0 form the initial cluster (booted, loaded, grouped); the rest replay."""
        handlers = {EventKind.NODE_UP: self._on_node_up, EventKind.NOTICE: self._on_notice,
                    EventKind.NODE_DOWN: self._on_node_down}
        initial = [e for e in self.feed.events if e.kind is EventKind.NODE_UP and e.time_s == 0.0]
        for event in initial:
            for member in self._grant(event):
                self.cluster.gpus[member].usable = True
                self._set_phase([member], Phase.IDLE)
        self._replan()
        for event in self.feed.events:
            if event.kind is not EventKind.NODE_UP or event.time_s > 0.0:
                self.loop.schedule(event.time_s, handlers[event.kind], event, priority=PRIORITY_MARKET)

    def _plan(self, live: dict[str, list[int]], previous: Plan | None) -> Plan:
        res = self.config.resolution
        return plan_groups(live, num_heads=int(self.cost.num_heads),
                           preferred_degree=self.cost.preferred_sp(res), previous=previous,
                           num_tokens=self.cost.image_tokens(res))

    # ================================================================ iterations
    def _begin_iteration(self) -> None:
        self._iteration_starts.append(self.loop.now)
        self._marks.append({"start": self.loop.now})
        self._set_phase(self.cluster.ondemand_members(), Phase.IDLE)
        if self.spec.exploration is Exploration.CRITICAL:
            self._begin_rollout(*self._critical_batch())
        else:
            self._begin_rollout(*self._next_batch())

    def _next_batch(self) -> tuple[list[int], dict[int, list[int]]]:
        """Prompts and seeds of this iteration: the planner's selection if exploration ran."""
        if self._planned_batch is not None:
            batch, self._planned_batch = self._planned_batch, None
            return batch
        prompts = self._new_prompts(int(self.cost.prompts_per_iteration))
        return prompts, {p: self._fresh_seeds(p, int(self.cost.group_size)) for p in prompts}

    def _new_prompts(self, n: int) -> list[int]:
        prompts = list(range(self._next_prompt, self._next_prompt + n))
        self._next_prompt += n
        return prompts

    def _fresh_seeds(self, prompt: int, n: int) -> list[int]:
        stream = seed_stream(self.config.seed, prompt)
        return [next(stream) for _ in range(n)]

    def _critical_batch(self) -> tuple[list[int], dict[int, list[int]]]:
        """Exploration on the critical path: roll out group_size + explore_seeds_critical candidates
        per prompt with the current weights; training uses the max-variance group_size of them."""
        prompts = self._new_prompts(int(self.cost.prompts_per_iteration))
        per_prompt = int(self.cost.group_size + self.cost.explore_seeds_critical)
        self._explored_total += per_prompt * len(prompts)
        return prompts, {p: self._fresh_seeds(p, per_prompt) for p in prompts}

    def _begin_rollout(self, prompts: list[int], seeds: dict[int, list[int]]) -> None:
        specs = [self._spec(p, s, RequestKind.ROLLOUT) for p in prompts for s in seeds[p]]
        self._phase, self._outstanding = IterPhase.ROLLOUT, len(specs)
        self._rollouts_left = len(specs)
        self._group_rewards = {p: [] for p in prompts}
        self.queue.submit(specs)
        self._wake_all()

    def _spec(self, prompt: int, seed: int, kind: RequestKind) -> RequestSpec:
        return RequestSpec(prompt_id=prompt, prompt=f"prompt-{prompt}", seed=int(seed),
                           schedule=self._schedule(kind), weight_version=self._version, kind=kind,
                           iteration=self._iteration)

    def _schedule(self, kind: RequestKind) -> Schedule:
        steps = int(self.cost.sampling_steps if kind is RequestKind.ROLLOUT else self.cost.explore_steps)
        window = min(int(self.cost.trained_steps), steps)
        return Schedule(num_steps=steps, noise_level=float(self.cost.noise_level), window_end=window)

    def _begin_train(self) -> None:
        self._record_group_stds()
        self._phase = IterPhase.TRAIN
        self._train_started_at = self._marks[-1]["reward"] = self.loop.now
        images = sum(len(r) for r in self._trained_groups())
        if self.trainer is not None:
            self.trainer.begin(images)
            self._wake_all()
            return
        train_s = self.cost.train_s(images, self.config.resolution, self.config.ondemand)
        for member in self.cluster.ondemand_members():
            self.timeline.set(gpu_name(member), Phase.TRAIN, self.loop.now)
        self.loop.after(train_s, self._end_train)
        if self.spec.exploration is Exploration.OFF_PATH:
            self._start_off_path_exploration(train_s)

    def _trained_groups(self) -> list[list[float]]:
        """The rewards trained on per prompt: the max-variance group_size when more were rolled out."""
        k = int(self.cost.group_size)
        return [[r[i] for i in select_max_variance(r, k)] if len(r) > k else r
                for r in self._group_rewards.values() if r]

    def _record_group_stds(self) -> None:
        stds = [float(np.std(r)) for r in self._trained_groups()]
        self._group_stds.append(float(np.mean(stds)) if stds else 0.0)

    def _train_done(self) -> None:
        """Every micro-batch is in an accepted sum: the trainer clips and steps."""
        self._set_phase(self.cluster.ondemand_members(), Phase.TRAIN)
        self.loop.after(self.cost.optimizer_step_s, self._end_train)

    def _end_train(self) -> None:
        now = self.loop.now
        self._train_phases.append(now - self._train_started_at)
        self._marks[-1]["train"] = now
        if self.spec.exploration is Exploration.OFF_PATH:
            self._stop_off_path_exploration()
        self._version += 1
        sync_end = self._marks[-1]["sync"] = now + self.cost.local_weight_sync_s
        for w in self._workers_of(GpuKind.ONDEMAND):
            w.ready_at = max(w.ready_at, sync_end)
        for member in self.cluster.ondemand_members():
            self.timeline.set(gpu_name(member), Phase.SYNC, now)
        self._publish_to_spot(now + self.cost.publish_s())
        self._iteration += 1
        if self._iteration >= self.config.iterations:
            self._finish(sync_end)
            return
        self.loop.schedule(sync_end, self._begin_iteration)

    def _publish_to_spot(self, ready: float) -> None:
        self._spot_weights_at = ready
        for w in self._workers_of(GpuKind.SPOT):
            w.ready_at = max(w.ready_at, ready)
            for member in w.members:
                self.timeline.set(gpu_name(member), Phase.SYNC, self.loop.now)
            self.loop.schedule(w.ready_at, self._on_worker_ready, w.wid)

    def _finish(self, end_s: float) -> None:
        self._iteration_starts.append(end_s)
        self._end_s = end_s
        self.loop.schedule(end_s, self._stop)

    def _stop(self) -> None:
        self._done = True

    # ================================================================ off-path exploration
    def _start_off_path_exploration(self, train_s: float) -> None:
        workers = self._ready_spot_workers()
        prompts = self._new_prompts(int(self.cost.prompts_per_iteration))
        reserve = self._new_prompts(int(self.cost.prompts_per_iteration))
        degree = self.cost.preferred_sp(self.config.resolution)
        batch = self.config.batch_of(self.cost, degree)   # a seed's price: one image of a full batch
        per_seed_s = self.cost.rollout_s(self.config.resolution, degree, int(self.cost.explore_steps), batch=batch,
                                         serial=self.config.serial_rollout) / batch
        config = PlannerConfig(group_size=int(self.cost.group_size), seeds_per_pull=self.config.seeds_per_pull,
                               predicted_train_s=train_s, spot_workers=len(workers), per_seed_s=per_seed_s,
                               base_seed=self.config.seed)
        self._planner = BanditPlanner(config, prompts, reserve, start_s=self.loop.now)
        self.queue.set_source(_PlannerSource(self))
        self._wake_all()

    def _ready_spot_workers(self) -> list[SimWorker]:
        return [w for w in self._workers_of(GpuKind.SPOT) if not w.dissolving and w.ready_at <= self.loop.now]

    def _update_budget(self) -> None:
        if self._planner is not None and self._phase is IterPhase.TRAIN:
            self._planner.update_budget(workers=len(self._ready_spot_workers()), now_s=self.loop.now)

    def _stop_off_path_exploration(self) -> None:
        self.queue.set_source(None)
        self.queue.cancel(RequestKind.EXPLORE)
        for w in self._workers_of(GpuKind.SPOT):
            if w.run is not None and w.run.leases[0].request.kind is RequestKind.EXPLORE:
                self._abort_run(w)
        planner, self._planner = self._planner, None
        assert planner is not None
        self._explored_total += planner.summary().explored_seeds
        selection = planner.selection(int(self.cost.group_size))
        self._planned_batch = ([int(p) for p in planner.batch], {int(p): s for p, s in selection.items()})

    def _abort_run(self, w: SimWorker) -> None:
        """Exploration stopped: drop the in-flight explore run (its time is spent, not lost work)."""
        self._cancel_events(w)
        self.queue.release(w.wid)
        w.run = None
        self._set_phase(w.members, Phase.IDLE)
        if w.dissolving:
            self._retire(w)

    # ================================================================ workers
    def _new_worker(self, group: SPGroup, kind: GpuKind, ready_at: float) -> SimWorker:
        cross_node = len(group.nodes) > 1
        wid = f"{'od' if kind is GpuKind.ONDEMAND else 'sp'}{self._next_wid:05d}"
        self._next_wid += 1
        worker = SimWorker(wid, group, kind, cross_node, ready_at)
        self.workers[wid] = worker
        deadlines = [self._deadline[m] for m in group.members if m in self._deadline]
        if deadlines and self.spec.commit_on_notice:
            self.queue.notify_preemption(wid, min(deadlines))
        self.loop.schedule(max(ready_at, self.loop.now), self._on_worker_ready, wid)
        return worker

    def _workers_of(self, kind: GpuKind) -> list[SimWorker]:
        return [w for _, w in sorted(self.workers.items()) if w.kind is kind]

    def _on_worker_ready(self, wid: str) -> None:
        w = self.workers.get(wid)
        if w is None or w.dissolving or self.loop.now < w.ready_at:
            return
        if not w.busy:
            self._set_phase(w.members, Phase.IDLE)
        self._update_budget()
        self._try_pull(w)

    def _wake_all(self) -> None:
        for _, w in sorted(self.workers.items()):
            self._try_pull(w)

    def _allowed_kinds(self, w: SimWorker) -> set[RequestKind]:
        if self._phase is IterPhase.TRAIN and self.trainer is not None:
            return {RequestKind.TRAIN}
        if w.kind is GpuKind.ONDEMAND:
            return {RequestKind.ROLLOUT} if self._phase is IterPhase.ROLLOUT else set()
        if self._phase is IterPhase.ROLLOUT and self.spec.spot_rollout:
            return {RequestKind.ROLLOUT}
        if self._phase is IterPhase.TRAIN and self.spec.exploration is Exploration.OFF_PATH:
            return {RequestKind.EXPLORE}
        return set()

    def _try_pull(self, w: SimWorker) -> None:
        if w.busy or w.dissolving or self.loop.now < w.ready_at:
            return
        kinds = self._allowed_kinds(w)
        if not kinds:
            return
        if RequestKind.TRAIN in kinds:
            self.trainer.pull(w)
            return
        batch = self.config.batch_of(self.cost, w.group.degree)
        est = self._step_s(w, batch) * max(self.cost.sampling_steps, self.cost.explore_steps)
        leases = self.queue.pull(w.wid, batch, now=self.loop.now, est_duration_s=est, kinds=kinds)
        if leases:
            self._start_run(w, leases)

    def _step_s(self, w: SimWorker, batch: int) -> float:
        return self.cost.step_s(self.config.resolution, w.group.degree, w.cross_node, batch,
                                serial=self.config.serial_rollout)

    def _start_run(self, w: SimWorker, leases: list[Lease]) -> None:
        first = [lease.resume.step_index if lease.resume is not None else 0 for lease in leases]
        w.run = BatchRun(leases, self.loop.now, self._step_s(w, len(leases)), first)
        w.done_event = self.loop.after(w.run.steps * w.run.step_s, self._on_run_done, w.wid, w.run)
        rollout = leases[0].request.kind is RequestKind.ROLLOUT
        self._set_phase(w.members, Phase.ROLLOUT if rollout else Phase.EXPLORE)

    def _on_run_done(self, wid: str, run: BatchRun) -> None:
        w = self.workers.get(wid)
        if w is None or w.run is not run:
            return
        duration = self.loop.now - run.start
        if w.commit_event is not None:
            w.commit_event.cancel()
        w.run, w.done_event, w.commit_event = None, None, None
        for lease in run.leases:
            if self.queue.complete(lease.result(None), now=self.loop.now):
                self._score(lease, duration)
        self._after_run(w)

    def _after_run(self, w: SimWorker) -> None:
        if w.dissolving:
            self._retire(w)
            return
        self._set_phase(w.members, Phase.IDLE)
        self._try_pull(w)

    def _cancel_events(self, w: SimWorker) -> None:
        for handle in (w.done_event, w.commit_event):
            if handle is not None:
                handle.cancel()
        w.done_event = w.commit_event = None

    # ================================================================ rewards
    def _score(self, lease: Lease, duration_s: float) -> None:
        """A finished image goes to the reward; a colocated reward waits for the last rollout."""
        request = lease.request
        if request.kind is RequestKind.ROLLOUT:
            self._rollouts_left -= 1
            if self._rollouts_left == 0:
                self._marks[-1]["rollout"] = self.loop.now
            if self.config.reward_colocated:
                self._unscored.append((request, duration_s))
                if self._rollouts_left == 0:   # after this event: the worker's own bookkeeping runs first
                    self.loop.schedule(self.loop.now, self._score_colocated)
                return
        self._queue_reward(request, duration_s)

    def _score_colocated(self) -> None:
        """Every rollout is done: the rollout GPUs run the reward model over the iteration's images."""
        self._set_phase(self.cluster.ondemand_members(), Phase.REWARD)
        unscored, self._unscored = self._unscored, []
        for request, duration_s in unscored:
            self._queue_reward(request, duration_s)

    def _queue_reward(self, request: RequestSpec, duration_s: float) -> None:
        """FIFO over ``reward_workers`` slots."""
        start = max(self.loop.now, heapq.heappop(self._reward_slots))
        end = start + self.cost.reward_s()
        heapq.heappush(self._reward_slots, end)
        self.loop.schedule(end, self._on_scored, request, duration_s, self._iteration)

    def _on_scored(self, request, duration_s: float, iteration: int) -> None:
        reward = self.rewards.reward(request.prompt_id, request.seed, request.weight_version)
        if request.kind is RequestKind.ROLLOUT:
            self._group_rewards[request.prompt_id].append(reward)
            self._count_down()
        elif self._planner is not None and iteration == self._iteration:
            self._planner.observe(request.prompt_id, request.seed, reward, duration_s)

    def _count_down(self) -> None:
        self._outstanding -= 1
        if self._outstanding == 0:
            if self.config.reward_colocated:
                self._set_phase(self.cluster.ondemand_members(), Phase.IDLE)
            self._begin_train()

    # ================================================================ spot market
    def _grant(self, event: MarketEvent) -> list[Member]:
        """Hold the node if there is room and start billing it; [] when the cluster is full."""
        members = self.cluster.grant_spot_node(event.node_id, self.loop.now)
        if not members:
            logger.debug("spot node %s ignored: cluster full", event.node_id)
            return []
        self.ledger.start(event.node_id, f"spot/{event.zone}", self.loop.now, gpus=len(members))
        return members

    def _on_node_up(self, event: MarketEvent) -> None:
        members = self._grant(event)
        if not members:
            return
        node, now = event.node_id, self.loop.now
        self._join_token[node] = now
        self._set_phase(members, Phase.JOIN)
        self.loop.after(self._join_s(members[0]), self._on_node_joined, node, now)

    def _join_s(self, member: Member) -> float:
        if self.spec.recovery is Recovery.WARM:
            return self.cost.warm_join_s(peer_on_node=self.cluster.has_live_peer(member))
        return self.cost.cold_join_s()

    def _on_node_joined(self, node: str, token: float) -> None:
        if not self.cluster.holds(node) or self._join_token.get(node) != token:
            return
        for member in self.cluster.spot_node_members(node):
            self.cluster.gpus[member].usable = True
            self._set_phase([member], Phase.IDLE)
        self._replan()

    def _on_notice(self, event: MarketEvent) -> None:
        node = event.node_id
        if not self.cluster.holds(node):
            return
        self._counters["notices"] += 1
        deadline = self._down_time(event)
        members = set(self.cluster.spot_node_members(node))
        for member in members:
            self._deadline[member] = deadline
        if not self.spec.commit_on_notice:
            return
        for w in [w for w in self.workers.values() if members & set(w.members)]:
            self.queue.notify_preemption(w.wid, deadline)
            if w.train is not None:
                self.trainer.stop_for_notice(w, deadline)
            else:
                self._plan_commit_before(w, deadline)

    def _worker_deadline(self, w: SimWorker) -> float | None:
        """The earliest notice deadline among the worker's GPUs (None: no notice)."""
        deadlines = [self._deadline[m] for m in w.members if m in self._deadline]
        return min(deadlines) if deadlines else None

    def _down_time(self, notice: MarketEvent) -> float:
        return self._down_at.get(notice.node_id, notice.time_s + self.feed.notice_s)

    def _plan_commit_before(self, w: SimWorker, deadline: float) -> None:
        """Work as many whole steps as fit before the deadline, then commit every row's state."""
        if w.run is None or w.done_event is None or w.done_event.time <= deadline:
            return
        run = w.run
        # the last step boundary strictly before the deadline (at the deadline the node is gone)
        steps_by_deadline = math.ceil((deadline - run.start) / run.step_s - 1e-9) - 1
        at = max(self.loop.now, run.boundary(steps_by_deadline))
        self._schedule_commit(w, at, math.floor((at - run.start) / run.step_s + 1e-9))

    def _schedule_commit(self, w: SimWorker, at: float, steps_done: int) -> None:
        assert w.run is not None
        if w.commit_event is not None and w.commit_event.time <= at:
            return
        if w.commit_event is not None:
            w.commit_event.cancel()
        w.commit_event = self.loop.schedule(at, self._on_commit, w.wid, w.run, steps_done)

    def _on_commit(self, wid: str, run: BatchRun, steps_done: int) -> None:
        """Every row of the batch is committed at its own step (a row already finished completes)."""
        w = self.workers.get(wid)
        if w is None or w.run is not run:
            return
        self._lost_gpu_s += (self.loop.now - run.boundary(steps_done)) * w.group.degree
        for lease, first in zip(run.leases, run.first_steps):
            request = lease.request
            step_index = min(first + steps_done, request.schedule.num_steps)
            if step_index == request.schedule.num_steps:
                if self.queue.complete(lease.result(None), now=self.loop.now):
                    self._score(lease, self.loop.now - run.start)
                continue
            state = InFlightState(request.request_id, step_index, None, request.seed, request.weight_version)
            committed = self.queue.commit(wid, state)
            assert committed, f"commit of request {request.request_id} by {wid} refused"
            self._counters["commits"] += 1
        if w.done_event is not None:
            w.done_event.cancel()
        w.run, w.done_event, w.commit_event = None, None, None
        self._after_run(w)
        self._wake_all()

    def _on_node_down(self, event: MarketEvent) -> None:
        node = event.node_id
        if not self.cluster.holds(node):
            return
        self._counters["preemptions"] += 1
        members = set(self.cluster.reclaim_spot_node(node, self.loop.now))
        self.ledger.stop(node, self.loop.now)
        for member in members:
            self.timeline.close(gpu_name(member), self.loop.now)
            self._deadline.pop(member, None)
            self._restarting.pop(member, None)
        for w in [w for w in self.workers.values() if members & set(w.members)]:
            self._break_worker(w, members)
        self._replan()
        self._wake_all()

    def _break_worker(self, w: SimWorker, dead: set[Member]) -> None:
        """A member died: requeue the lease (from the last commit) and recover the survivors."""
        if w.train is not None:
            self.trainer.lose(w)
        if w.run is not None:
            self._lost_gpu_s += (self.loop.now - w.run.start) * w.group.degree
            self._cancel_events(w)
            self.queue.worker_lost(w.wid)
            w.run = None
        survivors = [m for m in w.members if m not in dead]
        del self.workers[w.wid]
        if self.spec.recovery is Recovery.COLD and survivors and not w.dissolving:
            self._cold_restart(survivors)

    def _cold_restart(self, members: list[Member]) -> None:
        self._counters["cold_restarts"] += 1
        end = self.loop.now + self.cost.cold_restart_s()
        self._restarting.update({m: end for m in members})
        self._set_phase(members, Phase.RESTART)
        self.loop.schedule(end, self._on_restarted, tuple(members), end)

    def _on_restarted(self, members: tuple[Member, ...], end: float) -> None:
        alive = [m for m in members if self._restarting.get(m) == end]
        for member in alive:
            del self._restarting[member]
        self._set_phase(alive, Phase.IDLE)
        self._replan()
        self._wake_all()

    # ================================================================ SP regrouping
    def _replan(self) -> None:
        if self.spec.recovery is Recovery.WARM:
            self._replan_warm()
        else:
            self._replan_cold()
        self._update_budget()

    def _live_map(self, members: list[Member]) -> dict[str, list[int]]:
        live: dict[str, list[int]] = {}
        for node, gpu in members:
            live.setdefault(node, []).append(gpu)
        return live

    def _replan_warm(self) -> None:
        """Spotlight: re-plan every usable spot GPU with the fewest moves; a changed group that is
        running commits at its next step boundary; new groups form after a warm regroup."""
        live = self.cluster.usable(GpuKind.SPOT)
        if not live:
            self.spot_plan = None
            return
        plan = self._plan(self._live_map(live), self.spot_plan)
        current = {w.members: w for w in self._workers_of(GpuKind.SPOT) if not w.dissolving}
        wanted = {g.members for g in plan.groups}
        if plan is self.spot_plan and set(current) == wanted:
            return
        self.spot_plan = plan
        free_at = {m: self.loop.now for m in live}
        for w in self._workers_of(GpuKind.SPOT):
            if w.dissolving:
                for member in w.members:
                    free_at[member] = max(free_at.get(member, self.loop.now), self._busy_until(w))
        for members, w in current.items():
            if members not in wanted:
                self._dissolve(w, free_at)
        for group in plan.groups:
            if group.members not in current:
                self._form_group(group, free_at, self.cost.warm_regroup_s)

    def _replan_cold(self) -> None:
        """Naive: running groups are left alone; free GPUs form new groups of the configured degree
        only (NCCL init), and GPUs that do not make a full group wait for more to arrive."""
        owned = {m for w in self.workers.values() for m in w.members}
        free = [m for m in self.cluster.usable(GpuKind.SPOT) if m not in owned and m not in self._restarting]
        if not free:
            return
        plan = self._plan(self._live_map(free), None)
        degree = self.cost.preferred_sp(self.config.resolution)
        free_at = {m: self.loop.now for m in free}
        for group in plan.groups:
            if group.degree == degree:
                self._form_group(group, free_at, self.cost.nccl_init_s)

    def _form_group(self, group: SPGroup, free_at: dict[Member, float], setup_s: float) -> None:
        """A new SP group: ready when its members are free, set up (for degree > 1) and hold the
        newest weights. Groups of the initial cluster (t = 0) start formed."""
        if self.loop.now > 0:
            self._counters["regroups"] += 1
        setup = setup_s if group.degree > 1 and self.loop.now > 0 else 0.0
        ready = max(max(free_at[m] for m in group.members) + setup, self._spot_weights_at)
        self._new_worker(group, GpuKind.SPOT, ready)
        if ready > self.loop.now:
            self._set_phase([m for m in group.members if free_at[m] <= self.loop.now], Phase.REGROUP)

    def _dissolve(self, w: SimWorker, free_at: dict[Member, float]) -> None:
        """Leave the group: immediately when idle, else at the next step boundary (commit), or
        after the training micro-batch in hand and its report."""
        w.dissolving = True
        if w.train is not None:
            free = self.trainer.stop_for_dissolve(w)
            for member in w.members:
                free_at[member] = max(free_at.get(member, self.loop.now), free)
            return
        if w.run is None:
            self._retire(w)
            return
        steps_done = math.ceil((self.loop.now - w.run.start) / w.run.step_s - 1e-9)
        at = w.run.boundary(steps_done)
        if w.done_event is not None and w.done_event.time <= at:
            at = w.done_event.time
        else:
            self._schedule_commit(w, at, steps_done)
        for member in w.members:
            free_at[member] = max(free_at.get(member, self.loop.now), at)

    def _busy_until(self, w: SimWorker) -> float:
        if w.train is not None:
            return self.trainer.busy_until(w)
        events = [h.time for h in (w.commit_event, w.done_event) if h is not None and h.pending]
        return min(events) if events else self.loop.now

    def _retire(self, w: SimWorker) -> None:
        self.workers.pop(w.wid, None)
        self._cancel_events(w)

    # ================================================================ bookkeeping
    def _set_phase(self, members, phase: Phase) -> None:
        for member in members:
            if member in self.cluster.gpus and self.cluster.gpus[member].released_s is None:
                self.timeline.set(gpu_name(member), phase, self.loop.now)

    def _result(self) -> BaselineResult:
        end = self._end_s
        self.timeline.close_all(end)
        od_names, spot_names = self.cluster.names(GpuKind.ONDEMAND), self.cluster.names(GpuKind.SPOT)
        od_billed = self.cluster.billed_seconds(GpuKind.ONDEMAND, end)
        spot_billed = self.cluster.billed_seconds(GpuKind.SPOT, end)
        report = self.ledger.report(now=end)
        od_usd = sum(p.usd for p in report.pools if p.pool.startswith("ondemand"))
        spot_usd = sum(p.usd for p in report.pools if p.pool.startswith("spot"))
        starts = self._iteration_starts
        times = [b - a for a, b in zip(starts, starts[1:])]
        n = self.config.iterations
        gpu_s = self._phase_seconds(od_names, spot_names)
        return BaselineResult(
            name=self.spec.name, iterations=n, iteration_times_s=times,
            time_per_iteration_s=end / n, sim_end_s=end,
            cost_per_iteration_usd=(od_usd + spot_usd) / n, ondemand_usd=od_usd, spot_usd=spot_usd,
            ondemand_gpu_hours=od_billed / 3600, spot_gpu_hours=spot_billed / 3600,
            ondemand_idle_fraction=_idle(self.timeline.seconds(od_names, BUSY_PHASES), od_billed),
            spot_idle_fraction=_idle(self.timeline.seconds(spot_names, BUSY_PHASES), spot_billed)
            if spot_billed > 0 else None,
            spot_lost_work_fraction=self._lost_gpu_s / spot_billed if spot_billed > 0 else None,
            preemptions=self._counters["preemptions"], notices=self._counters["notices"],
            regroups=self._counters["regroups"], cold_restarts=self._counters["cold_restarts"],
            commits=self._counters["commits"], lost_gpu_s=self._lost_gpu_s,
            explored_seeds_per_iteration=self._explored_total / n,
            mean_group_reward_std=float(np.mean(self._group_stds)) if self._group_stds else 0.0,
            mean_train_phase_s=float(np.mean(self._train_phases)) if self._train_phases else 0.0,
            train=self.trainer.summary(n) if self.trainer is not None else None,
            phase_seconds=gpu_s, phases_per_iteration=self._phases_per_iteration(gpu_s),
            timeline=[(i.gpu, i.start_s, i.end_s, i.phase) for i in self.timeline.intervals]
            if self.config.record_timeline else None,
        )

    def _phase_seconds(self, od_names: list[str], spot_names: list[str]) -> dict[str, dict[str, float]]:
        return {kind: {p.value: self.timeline.seconds(names, frozenset({p})) for p in Phase}
                for kind, names in (("ondemand", od_names), ("spot", spot_names))}

    def _phases_per_iteration(self, gpu_s: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        n = self.config.iterations
        return {"wall_s": _wall_phases(self._marks),
                **{f"{kind}_gpu_s": {p: s / n for p, s in phases.items()} for kind, phases in gpu_s.items()}}


_WALL_PHASES = ("rollout", "reward", "train", "sync")   # each ends at the mark of its name


def _wall_phases(marks: list[dict[str, float]]) -> dict[str, float]:
    """Mean wall seconds per iteration of each phase, from the marks of the finished iterations."""
    done = [m for m in marks if "sync" in m]
    out = dict.fromkeys(_WALL_PHASES, 0.0)
    for m in done:
        start = m["start"]
        for name in _WALL_PHASES:
            out[name] += (m[name] - start) / len(done)
            start = m[name]
    return out


def _idle(busy_s: float, billed_s: float) -> float:
    return 1.0 - busy_s / billed_s if billed_s > 0 else 0.0


class _PlannerSource:
    """``RequestSource`` over the exploration planner: one ``Pull`` -> one EXPLORE request per seed."""

    def __init__(self, sim: ClusterSimulation) -> None:
        self.sim = sim

    def next_requests(self, worker: str, n: int) -> list[RequestSpec]:
        planner = self.sim._planner
        specs: list[RequestSpec] = []
        while planner is not None and len(specs) < n:
            pull: Pull | None = planner.next_pull(self.sim.loop.now)
            if pull is None:
                break
            specs += [self.sim._spec(int(pull.prompt_id), seed, RequestKind.EXPLORE) for seed in pull.seeds]
        return specs
