"""`python -m benchmarks.replay`: the live Ray runtime under a spot trace's preemptions, every output checked.

    trace --SpotMarket(cap, window, speedup)--> ElasticSpotPool --start/notify/kill--> spot RolloutWorkers
                                                                                        + 1 on-demand worker
    driver: keep the queue stocked for --duration s --> drain --> recompute every output in process

What runs: a local Ray cluster (or ``--address``) with one on-demand ``RolloutWorker`` and up to
``--nodes`` (or ``--cap-nodes``) spot workers that an ``ElasticSpotPool`` starts, notifies and kills as the market
replays the trace, compressed ``--speedup`` times. A driver loop keeps a backlog of rollout
requests in the queue actor (a random-init tiny policy: correctness, not learning, is measured)
for ``--duration`` wall seconds, stops submitting and waits until every request is done (or
``--drain-timeout`` passes). Then each completed request is recomputed here, uninterrupted, with
``RolloutEngine`` on the same weights, alone, and its final latents and log-probs are compared with
``np.array_equal`` (with ``--max-batch`` > 1: within ``worker.engine.BATCHED_ATOL``, the image within
one level).

Counters of the JSON report (``kind: "measured"``):

- ``requests_lost``: submitted but not completed after the drain. ``duplicate_completions``:
  requests with more than one accepted completion (the queue's invariant says 0);
  ``late_completions_rejected``: completions the queue refused because the lease had been revoked
  (a worker killed while reporting). ``mismatched_outputs``: outputs that differ from the
  reference in any bit, or beyond the tolerance when batched (``mismatched_resumed_outputs``:
  those of them that were resumed).
- ``preemptions``: NODE_DOWN of a node that had a worker; ``notices``: notices delivered;
  ``resumed_from_commit``: leases granted from a committed or checkpointed state;
  ``outputs_resumed``: outputs whose final lease started past step 0.
- ``denoise_steps_lost``: steps that killed workers had run but not handed to the queue, read
  from each worker just before its kill (work redone after a kill without notice). A step that
  finishes or a checkpoint that lands between that read and the kill makes it off by one.

Count traces (the number of a group's instances alive over time) preempt the spot nodes as
``--count-model`` says (``SpotMarket``): ``instances`` (default: each spot node is one of the
group's alive instances, so a drop of k among n preempts each with probability k/n, seeded by
``--seed``) or ``capacity`` (only nodes above the count are preempted, by ``--victims``).
``--market-only`` replays the market alone, without Ray, and reports how many nodes it starts and
preempts in the submission window (``kind: "market"``).

Time: trace seconds are divided by ``--speedup``; the notice is wall time (a worker must finish
a real denoising step and a commit in it), by default the provider's notice / speedup but at
least ``MIN_NOTICE_S``. Spot nodes are capped at ``--nodes`` from the trace start (the
market's rule). ``--start-s auto`` starts the window ``AUTO_LEAD_S`` trace seconds before the
first preemption of the window of ``duration * speedup`` trace seconds that holds the most
preemptions. The clock starts once the on-demand worker and the window's initial spot fleet
have loaded the policy (nodes alive at the window start are in steady state, not cold-starting);
spot nodes that join later start cold, inside the replay. The cost ledger bills simulated (trace) seconds: each spot node from NODE_UP to
NODE_DOWN, the on-demand worker for the whole replay.

Local only: the policy file is written to a temporary directory every worker reads.

The options are `TraceRunConfig`, which soak and cluster-soak share;
`add_arguments` and `config_from_args` are their one command line.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from roll_spotlight.checks import require, require_choice, require_int, require_number
from roll_spotlight.config.ray_cluster import RayClusterConfig
from roll_spotlight.models.model_config import ModelConfig
from roll_spotlight.spot.market import (COUNT_MODELS, MIN_NOTICE_S, NOTICE_S_BY_PROVIDER, VICTIM_RULES, EventKind,
                                        MarketConfig, SpotMarket)
from roll_spotlight.spot.notices import PROVIDERS
from roll_spotlight.spot.traces import Trace, load_trace

log = logging.getLogger(__name__)

AUTO_LEAD_S = 600.0
# the replay's random-init policy: the test-sized architecture (4 heads, 64 image tokens)
TINY_MODEL = ModelConfig(image_size=16, num_layers=1, attention_head_dim=16, axes_dims_rope=(4, 6, 6),
                         joint_attention_dim=32)
ONDEMAND_WORKER = "ondemand-0"


# the fields whose flag is not "--" + the name with dashes
FLAGS = {"duration_s": "--duration", "drain_timeout_s": "--drain-timeout"}


def flag(name: str) -> str:
    """The command-line option of a `TraceRunConfig` field, as errors name it."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


@dataclass(frozen=True)
class TraceRunConfig:
    """A run of the live runtime under a spot trace (`python -m benchmarks.replay`, `soak`, `cluster-soak`).

    The market replays `trace` (None: the synthetic one) from `start_s` trace seconds (or "auto":
    the busiest window) `speedup` times faster than real time, on at most `nodes` spot nodes of
    `gpus_per_node` workers in elastic SP groups of `sp_degree`; count traces preempt them as
    `count_model` and `victims` say. A notice comes `notice_s` wall seconds ahead (None: the
    provider's notice / speedup, with a floor each tool sets), or never with `no_notice`;
    `commit_every` > 0 also checkpoints every k steps; workers denoise up to `max_batch` requests
    together. A driver keeps `backlog` x `max_batch` requests of
    `num_steps` denoising steps pending per serving worker for `duration_s` wall seconds, then
    waits up to `drain_timeout_s`; leases last `lease_s`; the driver polls every `poll_s`.
    `address` joins a running Ray cluster. Soak: `sample_s` is its memory sampling period.
    Cluster-soak: `provider` is the notice bridge's (None: the trace's), `keep_logs` keeps every
    raylet's log.
    """

    trace: str | None = None
    speedup: float = 30.0
    duration_s: float = 120.0
    start_s: float | str = 0.0
    zones: tuple[str, ...] | None = None
    victims: str = "newest_first"
    count_model: str = "instances"
    nodes: int = 4
    gpus_per_node: int = 1
    sp_degree: int = 1
    provider: str | None = None
    no_notice: bool = False
    notice_s: float | None = None
    commit_every: int = 0
    max_batch: int = 1
    num_steps: int = 12
    noise_level: float = 0.7
    backlog: int = 2
    drain_timeout_s: float = 180.0
    lease_s: float = 60.0
    poll_s: float = 0.02
    seed: int = 0
    address: str | None = None
    sample_s: float = 0.5
    keep_logs: bool = False

    def __post_init__(self) -> None:
        for name in ("speedup", "duration_s", "drain_timeout_s", "lease_s", "poll_s", "noise_level", "sample_s"):
            require_number(flag(name), getattr(self, name))
        require_number("--notice-s", self.notice_s, optional=True)
        require(self.start_s == "auto" or (isinstance(self.start_s, (int, float)) and self.start_s >= 0),
                "--start-s", self.start_s, "must be trace seconds >= 0 or 'auto'")
        for name in ("nodes", "gpus_per_node", "sp_degree", "num_steps", "backlog", "max_batch"):
            require_int(flag(name), getattr(self, name))
        require_int("--commit-every", self.commit_every, ">= 0", why="(0: only on notice)")
        require_choice("--victims", self.victims, VICTIM_RULES)
        require_choice("--count-model", self.count_model, COUNT_MODELS)
        require_choice("--provider", self.provider, PROVIDERS, optional=True)
        require(self.zones is None or len(self.zones) > 0, "--zones", self.zones, "must name a zone (omit: all)")

    def ray_cluster(self) -> RayClusterConfig:
        """The Ray cluster a tool starts (or joins at `address`): one on-demand worker and
        `spot_gpu` units for twice the fleet's GPUs."""
        return RayClusterConfig(address=self.address, num_cpus=2, ondemand_workers=1,
                                spot_workers=2 * self.nodes * self.gpus_per_node)


def check_placement(cfg: TraceRunConfig) -> None:
    """The SP groups fit the replay's model and the spot nodes (errors name the flags)."""
    from roll_spotlight.worker.sp_group import check_sp_degree, check_spot_placement

    check_sp_degree(TINY_MODEL, cfg.sp_degree, key="--sp-degree")
    check_spot_placement(cfg.gpus_per_node, cfg.sp_degree, cfg.nodes, degree_key="--sp-degree",
                         gpus_key="--gpus-per-node", nodes_key="--nodes")


# ---------------------------------------------------------------------------------------------
# The market window


def notice_wall_s(cfg: TraceRunConfig, provider: str, floor_s: float = MIN_NOTICE_S) -> float:
    """The notice in wall seconds: as given, else the provider's notice (30 s when it gives none
    ahead of time, as k8s's grace period) compressed like the trace, but at least ``floor_s`` (a
    step plus a commit must fit on a loaded host)."""
    if cfg.notice_s is not None:
        return cfg.notice_s
    return max(NOTICE_S_BY_PROVIDER.get(provider, 30.0) / cfg.speedup, floor_s)


def busiest_window(trace: Trace, window_s: float, *, cap_nodes: int | None = None,
                   zones: tuple[str, ...] | None = None, victims: str = "newest_first",
                   count_model: str = "instances", seed: int = 0, lead_s: float = AUTO_LEAD_S) -> float:
    """A window start (trace seconds) whose ``window_s`` holds the most preemptions of the capped
    fleet, ``lead_s`` before the first of them (ties: the earliest); 0 when nothing is preempted.
    ``seed`` is the market's: the seeded rules pick the same victims as the replayed market."""
    full = SpotMarket(trace, MarketConfig(notice_s=0.0, victims=victims, count_model=count_model, seed=seed,
                                          cap_nodes=cap_nodes, zones=zones))
    downs = np.array(sorted(ev.time_s for ev in full.events if ev.kind is EventKind.NODE_DOWN))
    best_count, best_start = 0, 0.0
    for down in downs:
        start = max(0.0, float(down) - lead_s)
        count = int(np.searchsorted(downs, start + window_s, side="left") - np.searchsorted(downs, start))
        if count > best_count:
            best_count, best_start = count, start
    return best_start


def window_start(cfg: TraceRunConfig, trace: Trace) -> float:
    """``--start-s`` in trace seconds; "auto": the busiest window of the run's length."""
    if cfg.start_s != "auto":
        return float(cfg.start_s)
    return busiest_window(trace, cfg.duration_s * cfg.speedup, cap_nodes=cfg.nodes, zones=cfg.zones,
                          victims=cfg.victims, count_model=cfg.count_model, seed=cfg.seed)


def build_market(cfg: TraceRunConfig, trace: Trace) -> SpotMarket:
    start = window_start(cfg, trace)
    notice = 0.0 if cfg.no_notice else notice_wall_s(cfg, trace.provider)
    span = (cfg.duration_s + cfg.drain_timeout_s) * cfg.speedup  # events keep coming while draining
    return SpotMarket(trace, MarketConfig(notice_s=notice, victims=cfg.victims, count_model=cfg.count_model,
                                          seed=cfg.seed, compression=cfg.speedup, start_s=start, duration_s=span,
                                          cap_nodes=cfg.nodes, zones=cfg.zones))


def report_head(kind: str, cfg: TraceRunConfig, trace: Trace, market: SpotMarket) -> dict:
    """The first fields of a replay's report: its kind, the trace and the replayed market window."""
    window = {"start_s": market.window_start_s, "end_s": market.window_end_s, "zones": list(market.trace.zone_names),
              "cap_nodes": cfg.nodes, "victims": cfg.victims, "count_model": cfg.count_model}
    return {"kind": kind, "trace": trace.name, "trace_window": window, "speedup": cfg.speedup,
            "simulated_minutes": cfg.duration_s * cfg.speedup / 60.0}


def market_report(cfg: TraceRunConfig, trace: Trace, market: SpotMarket) -> dict:
    """What the market alone does in the submission window (wall ``[0, duration_s)``), no Ray:
    nodes started, notices and preemptions (NODE_DOWN events), as a ``kind: "market"`` report."""
    kinds = Counter(ev.kind for ev in market.events_between(0.0, cfg.duration_s))
    return report_head("market", cfg, trace, market) | {
        "seed": cfg.seed,
        "spot_nodes_initial": len(market.alive_at(0.0)),
        "spot_nodes_started": kinds[EventKind.NODE_UP],
        "notices": kinds[EventKind.NOTICE],
        "preemptions": kinds[EventKind.NODE_DOWN],
    }


# ---------------------------------------------------------------------------------------------
# Requests


class RequestStream:
    """An endless, deterministic stream of rollout requests (prompt i mod pool, seed from i)."""

    def __init__(self, prompts: tuple[str, ...], num_steps: int, noise_level: float, seed: int) -> None:
        from roll_spotlight.dispatch.requests import Schedule

        self.prompts, self.seed = prompts, seed
        self.schedule = Schedule(num_steps, noise_level, "sde")
        self.issued = 0

    def take(self, n: int) -> list:
        from roll_spotlight.dispatch.requests import RequestKind, RequestSpec

        specs = []
        for i in range(self.issued, self.issued + n):
            pid = i % len(self.prompts)
            specs.append(RequestSpec(prompt_id=pid, prompt=self.prompts[pid], seed=self.seed * 1_000_003 + i,
                                     schedule=self.schedule, weight_version=0, kind=RequestKind.ROLLOUT,
                                     iteration=0))
        self.issued += n
        return specs


# ---------------------------------------------------------------------------------------------
# The live run


@dataclass
class _Results:
    completions: dict[int, object] = field(default_factory=dict)  # request id -> Completion
    duplicates: int = 0
    by_worker_kind: Counter = field(default_factory=Counter)
    max_poll_gap_s: float = 0.0  # the longest the driver went without applying market events

    def add(self, completions) -> None:
        for c in completions:
            if c.request.request_id in self.completions:
                self.duplicates += 1
                continue
            self.completions[c.request.request_id] = c
            self.by_worker_kind["ondemand" if c.worker == ONDEMAND_WORKER else "spot"] += 1


class _Runtime:
    """Ray, the queue and weight-store actors, the policy file and the on-demand worker."""

    def __init__(self, cfg: TraceRunConfig, policy_dir: Path) -> None:
        import ray

        from roll_spotlight.dispatch.queue import QueueConfig
        from roll_spotlight.dispatch.queue_actor import create_queue_actor
        from roll_spotlight.runtime.actors import ONDEMAND
        from roll_spotlight.worker.actor import RolloutWorker
        from roll_spotlight.runtime.ray_backend import init_ray
        from roll_spotlight.weights import WeightStore

        self.started_ray = not ray.is_initialized()
        init_ray(cfg.ray_cluster())
        self.policy_path = str(policy_dir / "policy.pt")
        policy = _save_tiny_policy(self.policy_path, cfg.seed)
        self.queue = create_queue_actor(QueueConfig(lease_s=cfg.lease_s, max_attempts=1_000_000))
        self.store = WeightStore.create(keep=1)
        self.store.publish(0, policy.state_dict())
        self.ondemand = RolloutWorker.options(resources={ONDEMAND: 1}).remote(
            ONDEMAND_WORKER, self.policy_path, self.queue, self.store, threads=1, commit_every=cfg.commit_every,
            max_batch=cfg.max_batch)
        self.ondemand_serving = self.ondemand.serve.remote()

    def wait_ready(self) -> None:
        """Block until the on-demand worker has loaded its policy (the replay clock starts then)."""
        import ray

        ray.get(self.ondemand.stats.remote())

    def stop_ondemand(self, timeout_s: float) -> None:
        import ray

        self.ondemand.stop.remote()
        ray.wait([self.ondemand_serving], timeout=timeout_s)
        ray.kill(self.ondemand, no_restart=True)

    def close(self) -> None:
        import ray

        if self.started_ray:
            ray.shutdown()


def _save_tiny_policy(path: str, seed: int):
    """A random-init tiny policy (the test-sized architecture), saved where workers load it."""
    import torch

    from roll_spotlight.models import build_policy, save_policy
    from roll_spotlight.config.run import TaskConfig
    from roll_spotlight.training.prompt_pools import task_vocab

    torch.manual_seed(seed)
    policy = build_policy(TINY_MODEL, vocab=task_vocab(TaskConfig()))
    save_policy(policy, path)
    return policy


def _run_loop(cfg: TraceRunConfig, rt: _Runtime, pool, poll, stream: RequestStream, results: _Results,
              clock, until_s: float, submit: bool) -> None:
    """Call ``poll(now)`` (apply due market events), collect results and (while ``submit``) keep
    the backlog stocked for ``pool``'s serving workers, until ``until_s``, or, when not
    submitting, until every submitted request is done."""
    import ray

    from roll_spotlight.runtime.collect import pump

    last = clock()

    def tick() -> None:
        nonlocal last
        now = clock()
        results.max_poll_gap_s = max(results.max_poll_gap_s, now - last)
        last = now
        poll(now)
        if submit:
            pending, _ = ray.get(rt.queue.counts.remote())
            target = cfg.backlog * cfg.max_batch * (1 + pool.serving)
            if pending < target:
                ray.get(rt.queue.submit.remote(stream.take(target - pending)))

    def done() -> bool:
        return clock() >= until_s or (not submit and len(results.completions) >= stream.issued)

    pump(rt.queue, done=done, on_completions=results.add, tick=tick, poll_s=cfg.poll_s)


def check_outputs(policy_path: str, completions: list, batched: bool = False) -> tuple[int, int]:
    """Recompute each completed request uninterrupted in this process, alone; returns (mismatched,
    mismatched among resumed outputs). Bit for bit: final latents, log-probs and image; outputs of
    ``batched`` workers within `worker.engine.BATCHED_ATOL`, the image within one level."""
    from roll_spotlight.dispatch.requests import Lease
    from roll_spotlight.worker.policy_source import load_policy
    from roll_spotlight.worker.engine import RolloutEngine
    from roll_spotlight.worker.loop import roll_out

    from roll_spotlight.worker.engine import BATCHED_ATOL

    atol, levels = (BATCHED_ATOL, 1) if batched else (0.0, 0)
    engine = RolloutEngine(load_policy(policy_path))
    mismatched = mismatched_resumed = 0
    for c in completions:
        reference = roll_out(engine, [Lease(0, c.request, "reference", math.inf, None, 1)])[0]
        same = (np.allclose(reference.latents, c.output.latents, rtol=0, atol=atol)
                and np.allclose(reference.log_probs, c.output.log_probs, rtol=0, atol=atol)
                and np.abs(reference.image.astype(int) - c.output.image).max() <= levels)
        mismatched += not same
        mismatched_resumed += (not same) and c.output.resumed_from > 0
    return mismatched, mismatched_resumed


def load_or_synthetic(cfg: TraceRunConfig) -> Trace:
    """``--trace``, or the synthetic trace when none is given."""
    from roll_spotlight.spot.synthetic import synthetic_trace

    return load_trace(cfg.trace) if cfg.trace else synthetic_trace()


def run_replay(cfg: TraceRunConfig) -> dict:
    """The whole replay; returns the JSON report (see the module docstring)."""
    trace = load_or_synthetic(cfg)
    return run_checked(cfg, trace, build_market(cfg, trace))


def run_checked(cfg: TraceRunConfig, trace: Trace, market: SpotMarket, drive=None) -> dict:
    """Start the runtime, ``drive(cfg, rt, market, stream) -> (_Live, CostLedger)`` it (default:
    ``_replay_live``, the market's pool on this cluster), recompute every output uninterrupted and
    return the report. The one home of the run-and-check that replay, soak and cluster-soak share."""
    from roll_spotlight.config.run import TaskConfig
    from roll_spotlight.training.prompt_pools import train_pool

    t_start = time.monotonic()
    _one_torch_thread()
    stream = RequestStream(train_pool(TaskConfig(train_prompts=256)).texts, cfg.num_steps, cfg.noise_level, cfg.seed)
    with tempfile.TemporaryDirectory(prefix="spotlight-replay-") as tmp:  # mkdtemp: mode 0700
        rt = _Runtime(cfg, Path(tmp))
        try:
            live, ledger = (drive or _replay_live)(cfg, rt, market, stream)
            t_ref = time.monotonic()
            completions = [live.results.completions[i] for i in sorted(live.results.completions)]
            mismatches = check_outputs(rt.policy_path, completions, batched=cfg.max_batch > 1)
            reference_s = time.monotonic() - t_ref
        finally:
            rt.close()
    timing = {"run_wall_s": live.drain_at, "drain_wall_s": live.end_at - live.drain_at,
              "reference_wall_s": reference_s, "wall_s": time.monotonic() - t_start}
    return _report(cfg, trace, market, stream, live, ledger, mismatches, timing)


def run_market_only(cfg: TraceRunConfig) -> dict:
    """The replay's market alone (``market_report``): no Ray, no workers, no outputs to check."""
    trace = load_or_synthetic(cfg)
    return market_report(cfg, trace, build_market(cfg, trace))


def _one_torch_thread() -> None:
    import torch

    torch.set_num_threads(1)  # oversubscribed cores make torch 20-40x slower (see runtime.actors)


@dataclass
class _Live:
    pool: object
    results: _Results
    queue_stats: object
    failed: list
    drain_at: float
    end_at: float
    extra: dict = field(default_factory=dict)  # a driver's own report fields (cluster-soak)


def _replay_live(cfg: TraceRunConfig, rt: _Runtime, market: SpotMarket, stream: RequestStream):
    """The market's pool on this cluster: initial fleet up, then ``drive_live``; the ledger bills
    trace seconds (the on-demand worker from clock 0 to the end)."""
    from roll_spotlight.spot_pool.ray_nodes import RayWorkerLauncher
    from roll_spotlight.spot_pool.training_pool import spot_elastic
    from roll_spotlight.spot.ledger import CostLedger
    from roll_spotlight.spot_pool.pool import ElasticSpotPool, SpotPoolConfig
    from roll_spotlight.spot.market import MarketSchedule
    from roll_spotlight.spot.prices import prices_for_trace

    ledger = CostLedger(prices_for_trace(market.trace))
    elastic = spot_elastic(TINY_MODEL, cfg.sp_degree, cfg.lease_s, rt.policy_path)
    launcher = RayWorkerLauncher(rt.policy_path, rt.queue, rt.store, commit_every=cfg.commit_every,
                                 max_batch=cfg.max_batch, gpus_per_node=cfg.gpus_per_node, elastic=elastic)
    pool = ElasticSpotPool(MarketSchedule(market), launcher, ledger,
                           SpotPoolConfig(no_notice=cfg.no_notice, bill_scale=cfg.speedup,
                                          gpus_per_node=cfg.gpus_per_node))
    pool.poll(0.0)  # the window's initial fleet: up before the clock starts (steady state)
    rt.wait_ready()
    launcher.wait_ready(timeout_s=120.0)
    live = drive_live(cfg, rt, pool, stream, poll=pool.poll, close=pool.close)
    ledger.start(ONDEMAND_WORKER, "ondemand", 0.0)
    ledger.stop(ONDEMAND_WORKER, live.end_at * cfg.speedup)
    return live, ledger


def drive_live(cfg: TraceRunConfig, rt: _Runtime, pool, stream: RequestStream, *, poll, close) -> _Live:
    """The clock starts now: submit for ``duration``, drain, ``close(now)`` the spot side, stop
    the on-demand worker, collect what is left. ``poll(now)`` runs on every turn of the loop."""
    import ray

    t0 = time.monotonic()
    clock = lambda: time.monotonic() - t0  # noqa: E731
    results = _Results()
    _run_loop(cfg, rt, pool, poll, stream, results, clock, cfg.duration_s, submit=True)
    drain_at = clock()
    _run_loop(cfg, rt, pool, poll, stream, results, clock, cfg.duration_s + cfg.drain_timeout_s, submit=False)
    end_at = clock()
    close(end_at)
    rt.stop_ondemand(timeout_s=60.0)
    results.add(ray.get(rt.queue.take_results.remote()))
    stats, failed = ray.get([rt.queue.stats.remote(), rt.queue.failed.remote()])
    return _Live(pool, results, stats, failed, drain_at, end_at)


def _report(cfg, trace, market, stream, live: _Live, ledger, mismatches, timing) -> dict:
    from roll_spotlight.spot_pool.training_pool import regroup_metrics

    results, pool, queue_stats = live.results, live.pool, live.queue_stats
    completions = results.completions.values()
    regroups = {k.removeprefix("spot/"): v for k, v in regroup_metrics(pool.launcher.regroups).items()}
    regroups["time_lost_per_preemption_s"] = time_lost_per_preemption(pool.launcher.regroups)
    return report_head("measured", cfg, trace, market) | {
        **timing,
        "notice_wall_s": None if cfg.no_notice else notice_wall_s(cfg, trace.provider),
        "no_notice": cfg.no_notice,
        "commit_every": cfg.commit_every,
        "max_batch": cfg.max_batch,
        "num_steps": cfg.num_steps,
        "requests_submitted": stream.issued,
        "requests_completed": len(results.completions),
        "requests_lost": stream.issued - len(results.completions),
        "requests_failed": len(live.failed),
        "duplicate_completions": results.duplicates,
        "late_completions_rejected": queue_stats.duplicate_completions,
        "completed_on_spot": results.by_worker_kind["spot"],
        "completed_on_ondemand": results.by_worker_kind["ondemand"],
        "spot_nodes_started": pool.stats.nodes_up,
        "preemptions": pool.stats.preemptions,
        "notices": pool.stats.notices,
        "notices_ignored": pool.stats.notices_ignored,
        "notices_late": pool.stats.notices_late,
        "preempted_after_notice": pool.stats.preempted_after_notice,
        "actor_deaths": pool.stats.actor_deaths,
        "leases_requeued": pool.stats.leases_requeued,
        "resumed_from_commit": queue_stats.resumed_from_commit,
        "outputs_resumed": sum(c.output.resumed_from > 0 for c in completions),
        "commits": queue_stats.commits,
        "checkpoints": queue_stats.checkpoints,
        "lease_expirations": queue_stats.expirations,
        "denoise_steps_lost": pool.stats.steps_lost,
        "gpus_per_node": cfg.gpus_per_node,
        "sp_degree": cfg.sp_degree,
        **regroups,
        "max_poll_gap_s": results.max_poll_gap_s,
        "mismatched_outputs": mismatches[0],
        "mismatched_resumed_outputs": mismatches[1],
        "cost": ledger.report().to_dict(),
        **live.extra,
    }


# ---------------------------------------------------------------------------------------------
# Command line


def time_lost_per_preemption(reports) -> dict[str, float | int | None]:
    """Median and max of ``loss_regroup_seconds`` (None without a regroup after a loss)."""
    from roll_spotlight.spot_pool.training_pool import loss_regroup_seconds

    lost = sorted(loss_regroup_seconds(reports))
    if not lost:
        return {"count": 0, "median": None, "max": None}
    mid = len(lost) // 2
    median = lost[mid] if len(lost) % 2 else (lost[mid - 1] + lost[mid]) / 2
    return {"count": len(lost), "median": median, "max": lost[-1]}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p, TraceRunConfig())
    p.add_argument("--market-only", action="store_true",
                   help="replay the market alone (no Ray) and report its nodes and preemptions")
    return p


def add_arguments(p: argparse.ArgumentParser, d: TraceRunConfig, *, minutes: bool = False, join: bool = True,
                  notice_floor_s: float = MIN_NOTICE_S) -> None:
    """The options of replay, soak and cluster-soak (`TraceRunConfig`, defaults ``d``): the run's
    length in wall seconds (``--duration``) or, with ``minutes``, ``--minutes``; with ``join``,
    ``--address``; ``notice_floor_s`` is the tool's least default notice (`notice_wall_s`). Each
    option's ``dest`` is its field (`config_from_args`)."""
    p.add_argument("--trace", default=None, help="trace file or folder; omitted: the synthetic p3-like trace")
    if minutes:
        p.add_argument("--minutes", type=float, default=d.duration_s / 60.0, help="wall minutes of request submission")
    else:
        p.add_argument("--duration", dest="duration_s", type=float, default=d.duration_s, metavar="SECONDS",
                       help="wall seconds of request submission")
    p.add_argument("--speedup", type=float, default=d.speedup, help="trace seconds per wall second")
    p.add_argument("--start-s", default=str(d.start_s), help="window start in trace seconds, or 'auto' (the busiest)")
    p.add_argument("--zones", default=None, help="comma-separated zones of the trace to use; omitted: all")
    p.add_argument("--victims", default=d.victims, help=f"count-trace victim rule with --count-model capacity: "
                   f"one of {VICTIM_RULES}")
    p.add_argument("--count-model", default=d.count_model, help=f"count traces: each spot node is one of the "
                   f"group's instances, or the count is a capacity: one of {COUNT_MODELS}")
    p.add_argument("--nodes", "--cap-nodes", dest="nodes", type=int, default=d.nodes,
                   help="most spot nodes alive at once")
    p.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node, help="rollout workers (GPUs) per spot node")
    p.add_argument("--sp-degree", type=int, default=d.sp_degree,
                   help="SP degree of the spot workers' elastic groups (1: solo workers)")
    p.add_argument("--no-notice", action="store_true", help="kill at NODE_DOWN without any notice")
    p.add_argument("--notice-s", type=float, default=None,
                   help=f"notice in wall seconds; omitted: provider notice / speedup, at least {notice_floor_s}")
    p.add_argument("--commit-every", type=int, default=d.commit_every, help="checkpoint every K steps (0: never)")
    p.add_argument("--num-steps", type=int, default=d.num_steps, help="denoising steps per request")
    p.add_argument("--max-batch", type=int, default=d.max_batch,
                   help="requests a worker denoises together (sampling.max_batch); outputs then checked within "
                        "worker.engine.BATCHED_ATOL of batch 1")
    p.add_argument("--backlog", type=int, default=d.backlog,
                   help="pending batches (of --max-batch requests) kept per serving worker")
    p.add_argument("--drain-timeout", dest="drain_timeout_s", type=float, default=d.drain_timeout_s,
                   metavar="SECONDS", help="wall seconds to wait for the drain")
    p.add_argument("--seed", type=int, default=d.seed)
    if join:
        p.add_argument("--address", default=None, help="join this Ray cluster instead of starting one")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line (default: indented)")


def config_from_args(args: argparse.Namespace, defaults: TraceRunConfig = TraceRunConfig()) -> TraceRunConfig:
    """The validated `TraceRunConfig` of `add_arguments`' options (fields without one keep
    ``defaults``'), its SP groups checked against the model and the nodes."""
    given = vars(args)
    values = {f.name: given[f.name] for f in dataclasses.fields(TraceRunConfig) if f.name in given}
    if "minutes" in given:
        require_number("--minutes", args.minutes)
        values["duration_s"] = args.minutes * 60.0
    if args.start_s != "auto":
        values["start_s"] = _float_arg("--start-s", args.start_s)
    values["zones"] = tuple(z.strip() for z in args.zones.split(",") if z.strip()) if args.zones else None
    cfg = dataclasses.replace(defaults, **values)
    check_placement(cfg)
    return cfg


def _float_arg(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number of trace seconds or 'auto', got {text!r}") from None


def failed_checks(report: dict) -> list[str]:
    """Correctness counters that must be 0 in every replay (loss of steps without notice is not one)."""
    return [key for key in ("requests_lost", "duplicate_completions", "mismatched_outputs") if report[key]]


def main(argv: list[str] | None = None) -> int:
    """Run one replay and print its report; 1 if a correctness counter is not 0, 2 on bad input."""
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
        report = run_market_only(cfg) if args.market_only else run_replay(cfg)
    except (ValueError, FileNotFoundError) as err:
        print(f"python -m benchmarks.replay: {err}", file=sys.stderr)
        return 2
    return print_report(report, "replay", as_json=args.json, checked=not args.market_only)


def print_report(report: dict, name: str, *, as_json: bool, checked: bool) -> int:
    """Print a replay or soak report; 1 if a checked run failed a correctness counter, else 0."""
    print(json.dumps(report) if as_json else json.dumps(report, indent=2))
    bad = failed_checks(report) if checked else []
    if bad:
        log.error("%s failed its checks: %s", name, ", ".join(f"{k}={report[k]}" for k in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
