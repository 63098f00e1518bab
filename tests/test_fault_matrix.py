"""The fault matrix: one test per row, each with a deterministic injection and a
comparison with a failure-free run (as torchft's ``fail_at``).

Rows and where they are injected:

| row                                              | level                                   |
| preemption with notice                           | coordinator run, in-process workers     |
| kill without notice                              | coordinator run, lease expiry           |
| two preemptions inside one notice window         | coordinator run                         |
| preemption during a regroup                      | tests/test_sp_rollout.py (live workers, |
|                                                  | SP 4 -> 2 -> 4, bit-identical output)   |
| preemption of the only holder of a weight version| newcomers fall back to the weight store |
|                                                  | (transfer.choose_source; bench regroup's|
|                                                  | cold path)                              |
| reward worker crash                              | RewardActor on Ray (restart + retry)    |
| trainer crash                                    | coordinator run, resume from checkpoint |
| queue actor crash                                | QueueActor on Ray with a journal        |
| all spot capacity gone for a while               | coordinator run + exploration round     |
| NaN or infinite rewards                          | coordinator run, SafeReward             |
| corrupted or truncated checkpoint                | coordinator resume falls back           |
| notice, kill, two notices with batched workers   | one iteration's rollouts, max_batch 4,  |
|                                                  | within worker.engine.BATCHED_ATOL       |

The coordinator rows run the real loop (queue, rollout engine, trainer) over `FaultyBackend`: the
in-process backend with its rollouts served by named workers that pull from one queue on a manual
clock; faults are keyed by (request id, lease number). Their final weights (torch.equal) and
metrics (==, timings excluded) must equal those of the failure-free run.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.runtime_helpers import denoise_lease, random_policy, tiny_config

SPOT = ("spot-0", "spot-1")
ONDEMAND = "ondemand-0"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ------------------------------------------------------------------------------------------------
# The in-process fault harness


class Killed(Exception):
    """The worker's process is gone (no commit, no word to the queue)."""


@dataclass(frozen=True)
class Fault:
    kind: str  # "notice": stop after `step` and commit; "kill": die after `step`
    step: int


@dataclass
class _Worker:
    name: str
    executor: object
    alive: bool = True


class FaultyBackend:
    """LocalBackend whose rollouts go through named workers pulling from one queue.

    One tick: every live worker pulls up to `max_batch` leases, then denoises them together to
    their end or a fault of one of them. A notice commits every row and the worker leaves; a kill
    leaves the leases to expire (nobody tells the queue). `spot_gone` lists the rollout calls
    (1-based) during which no spot worker exists.
    """

    def __init__(self, cfg, policy, faults: dict[tuple[int, int], Fault] | None = None,
                 commit_every: int = 0, spot_gone: frozenset[int] = frozenset(), max_batch: int = 1):
        from roll_spotlight.dispatch.queue import ManualClock, QueueConfig, RequestQueue
        from roll_spotlight.runtime.local import LocalBackend

        self.local = LocalBackend(cfg, policy)
        self.clock = ManualClock()
        self.queue = RequestQueue(QueueConfig(lease_s=5.0, max_attempts=10), clock=self.clock)
        self.faults, self.commit_every, self.spot_gone = dict(faults or {}), commit_every, spot_gone
        self.max_batch = max_batch
        self.calls, self.leases_seen, self.completed_by = 0, {}, {}

    def __getattr__(self, name):  # everything but rollouts is the in-process backend's
        return getattr(self.local, name)

    @property
    def weight_version(self) -> int:
        return self.local.weight_version

    def _workers(self) -> list[_Worker]:
        from roll_spotlight.worker.engine import RolloutEngine

        policy = self.local.core.policy
        names = ([] if self.calls in self.spot_gone else list(SPOT)) + [ONDEMAND]
        return [_Worker(n, RolloutEngine(policy, commit_every=self.commit_every, max_batch=self.max_batch))
                for n in names]

    def rollouts_scored(self, specs) -> tuple[list, object]:
        outputs = self.rollouts(specs)
        return outputs, self.local.score(np.stack([o.image for o in outputs]), [s.prompt for s in specs])

    def rollouts(self, specs) -> list:
        self.calls += 1
        ids = self.queue.submit(specs)
        workers = self._workers()
        while self.queue.pending_count() or self.queue.leased_count():
            held = [(w, leases) for w in workers if w.alive if (leases := self.queue.pull(w.name, self.max_batch))]
            for worker, leases in held:
                self._run(worker, leases)
            self.clock.advance(1.0 if held else 10.0)  # idle: let dead workers' leases expire
            self.queue.expire()
        done = {c.request.request_id: c for c in self.queue.take_results()}
        self.completed_by.update({i: done[i].worker for i in ids})
        self.queue.forget_finished()
        return [done[i].output for i in ids]

    def _run(self, worker: _Worker, leases: list) -> None:
        faults = {}
        for lease in leases:
            rid = lease.request.request_id
            self.leases_seen[rid] = self.leases_seen.get(rid, 0) + 1
            faults[rid] = self.faults.get((rid, self.leases_seen[rid]))

        def at_boundary(report):
            for lease, finished in report.finished:
                assert self.queue.complete(lease.result(finished.output))
            due = [f for rid, step in report.running.items() if (f := faults[rid]) is not None and step == f.step]
            if any(f.kind == "kill" for f in due):
                raise Killed(worker.name)
            if due:
                self.queue.notify_preemption(worker.name, self.clock() + 2.0)
                return None
            return []

        try:
            committed = worker.executor.denoise_batch(leases, at_boundary,
                                                      lambda s: self.queue.checkpoint(worker.name, s))
        except Killed:
            worker.alive = False
            return
        for _, outcome in committed:
            assert self.queue.commit(worker.name, outcome.state)
        worker.alive = not committed  # noticed: the node leaves once the states are handed back


def _coordinator(cfg, backend, run_dir):
    from roll_spotlight.runtime.coordinator import Coordinator

    return Coordinator(cfg, backend, run_dir, progress=False)


def _fingerprint(backend, run_dir: Path) -> dict:
    from roll_spotlight.training.metrics import read_metrics

    rows = [{k: v for k, v in r.items() if not k.endswith("_s")} for r in read_metrics(run_dir)]
    core = backend.local.core if isinstance(backend, FaultyBackend) else backend.core
    weights = {k: v.clone() for k, v in core.policy.state_dict().items()}
    return {"metrics": rows, "weights": weights}


def _assert_same(run: dict, reference: dict) -> None:
    import torch

    assert run["metrics"] == reference["metrics"]
    assert run["weights"].keys() == reference["weights"].keys()
    for key, value in reference["weights"].items():
        assert torch.equal(run["weights"][key], value), key


def _cfg(*extra: str):
    return tiny_config("eval_steps=0", *extra)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The failure-free run: the same harness with no faults, and the plain in-process backend."""
    from roll_spotlight.runtime.local import LocalBackend

    cfg, root = _cfg(), tmp_path_factory.mktemp("reference")
    plain = LocalBackend(cfg, random_policy(cfg))
    _coordinator(cfg, plain, root / "plain").train()
    harness = FaultyBackend(cfg, random_policy(cfg))
    _coordinator(cfg, harness, root / "harness").train()
    out = _fingerprint(harness, root / "harness")
    _assert_same(_fingerprint(plain, root / "plain"), out)  # the harness itself changes nothing
    return out | {"completed_by": harness.completed_by}


def _faulty_run(tmp_path, cfg=None, **kwargs) -> tuple[FaultyBackend, dict]:
    cfg = cfg or _cfg()
    backend = FaultyBackend(cfg, random_policy(cfg), **kwargs)
    _coordinator(cfg, backend, tmp_path / "run").train()
    return backend, _fingerprint(backend, tmp_path / "run")


# ------------------------------------------------------------------------------------------------
# Rows on the coordinator loop


def test_row_preemption_with_notice(tmp_path, reference):
    backend, run = _faulty_run(tmp_path, faults={(0, 1): Fault("notice", 2)})
    stats = backend.queue.stats()
    assert stats.commits == 1 and stats.resumed_from_commit == 1
    assert backend.completed_by[0] != reference["completed_by"][0], "another worker finished request 0"
    assert stats.duplicate_completions == 0 and stats.completed == stats.submitted
    _assert_same(run, reference)


def test_row_kill_without_notice(tmp_path, reference):
    # The worker holding request 1 dies after step 3 with a checkpoint every step (the last one
    # after step 2); nobody tells the queue, so the lease expires and the next worker resumes.
    backend, run = _faulty_run(tmp_path, faults={(1, 1): Fault("kill", 3)}, commit_every=1)
    stats = backend.queue.stats()
    assert stats.expirations == 1 and stats.commits == 0 and stats.resumed_from_commit == 1
    assert stats.duplicate_completions == 0 and stats.completed == stats.submitted
    _assert_same(run, reference)


def test_row_two_preemptions_inside_one_notice_window(tmp_path, reference):
    # Both spot workers hold a lease in the same tick and are noticed in it (one 2 s window).
    backend, run = _faulty_run(tmp_path, faults={(0, 1): Fault("notice", 1), (1, 1): Fault("notice", 2)})
    stats = backend.queue.stats()
    assert stats.commits == 2 and stats.resumed_from_commit == 2
    assert backend.completed_by[0] == backend.completed_by[1] == ONDEMAND
    assert stats.completed == stats.submitted and stats.duplicate_completions == 0
    _assert_same(run, reference)


def test_row_all_spot_capacity_gone_for_a_while(tmp_path, reference):
    backend, run = _faulty_run(tmp_path, spot_gone=frozenset({1}))
    first = range(len(backend.completed_by) // 2)
    assert all(backend.completed_by[i] == ONDEMAND for i in first), "on-demand carried iteration 1 alone"
    assert any(w in SPOT for w in backend.completed_by.values()), "spot capacity came back for iteration 2"
    _assert_same(run, reference)


BATCHED_FAULTS = {
    "notice mid-batch": {(1, 1): Fault("notice", 3)},
    "kill mid-batch": {(2, 1): Fault("kill", 2)},
    "two notices in one window": {(0, 1): Fault("notice", 1), (5, 1): Fault("notice", 2)},
}


@pytest.mark.parametrize("faults", BATCHED_FAULTS.values(), ids=BATCHED_FAULTS.keys())
def test_rows_batched_lose_nothing_and_every_output_is_its_solo_rollout_within_tolerance(faults):
    """The rows above with workers denoising up to 4 requests together (sampling.max_batch: 4):
    a notice commits every row of the batch, a kill loses them to lease expiry, and every request
    completes once, within worker.engine.BATCHED_ATOL of its batch-1 rollout (bits move: docs 5b)."""
    from roll_spotlight.dispatch.requests import Lease, Request
    from roll_spotlight.runtime.coordinator import iteration_specs
    from roll_spotlight.training.prompt_pools import train_pool
    from roll_spotlight.worker.engine import BATCHED_ATOL, RolloutEngine
    from roll_spotlight.worker.loop import roll_out

    cfg = _cfg("train.group_size=4", "sampling.max_batch=4")
    backend = FaultyBackend(cfg, random_policy(cfg), faults=faults, max_batch=4)
    specs = iteration_specs(cfg, train_pool(cfg.task), 1, 0)
    outputs = backend.rollouts(specs)
    stats = backend.queue.stats()
    assert stats.completed == stats.submitted == len(specs) == 8 and stats.duplicate_completions == 0
    noticed = sum(f.kind == "notice" for f in faults.values())
    assert stats.commits == 4 * noticed and stats.expirations == 4 * (len(faults) - noticed)
    alone = roll_out(RolloutEngine(random_policy(cfg)), [Lease(i, Request.from_spec(i, s), "ref", math.inf, None, 1)
                                                         for i, s in enumerate(specs)])
    assert sum(o.resumed_from > 0 for o in outputs) == 4 * noticed
    for out, ref in zip(outputs, alone):
        assert np.allclose(out.latents, ref.latents, rtol=0, atol=BATCHED_ATOL)
        assert np.allclose(out.log_probs, ref.log_probs, rtol=0, atol=BATCHED_ATOL)


def test_row_all_spot_capacity_gone_exploration_budget_goes_to_zero(tmp_path):
    from roll_spotlight.exploration.budget import ExplorationBudget
    from roll_spotlight.runtime.local import LocalBackend
    from roll_spotlight.training.metrics import read_metrics

    budget = ExplorationBudget(predicted_train_s=10.0, workers=2)
    budget.update(workers=0, now_s=1.0)
    assert budget.remaining_s(spent_s=0.0, in_flight_s=0.0) == 0.0

    class NoSpot(LocalBackend):
        def training(self, handle) -> bool:  # no spot worker left to explore while training runs
            return False

    cfg = _cfg("exploration.mode=stale", "exploration.seeds_per_prompt=6", "max_steps=3")
    backend = NoSpot(cfg, random_policy(cfg))
    _coordinator(cfg, backend, tmp_path / "run").train()
    rows = read_metrics(tmp_path / "run")[1:]
    assert [r["explored_seeds"] for r in rows] == [0, 0, 0]
    assert [r["weight_version"] for r in rows] == [1, 2, 3], "training carried on"
    assert all(math.isfinite(r["reward_mean"]) for r in rows)


def _inject(reward_fn, bad: dict[int, float]):
    """A reward whose samples `bad` (index -> value) are replaced, inside SafeReward."""
    from roll_spotlight.rewards import RewardOutput, SafeReward

    class Replaced:
        def __call__(self, images, prompts):
            out = reward_fn.inner(images, prompts)
            rewards = out.rewards.copy()
            for i, value in bad.items():
                if i < len(rewards):
                    rewards[i] = value
            return RewardOutput(rewards, out.info)

    return SafeReward(Replaced(), fallback=reward_fn.fallback)


def test_row_nan_or_infinite_rewards(tmp_path):
    """NaN/inf samples get the fallback; the run equals one whose reward returned the fallback."""
    from roll_spotlight.runtime.local import LocalBackend

    cfg = _cfg()
    runs = {}
    for name, bad in (("nonfinite", {1: math.nan, 4: math.inf, 5: -math.inf}), ("fallback", {1: 0.0, 4: 0.0, 5: 0.0})):
        backend = LocalBackend(cfg, random_policy(cfg))
        backend.core.reward_fn = _inject(backend.core.reward_fn, bad)
        _coordinator(cfg, backend, tmp_path / name).train()
        runs[name] = (_fingerprint(backend, tmp_path / name), backend.core.reward_fn)
    assert runs["nonfinite"][1].nonfinite > 0 and runs["fallback"][1].nonfinite == 0
    for row in runs["nonfinite"][0]["metrics"]:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
    _assert_same(runs["nonfinite"][0], runs["fallback"][0])


@pytest.fixture(scope="module")
def reference3(tmp_path_factory) -> dict:
    """Failure-free 3-iteration run with a checkpoint every iteration."""
    from roll_spotlight.runtime.local import LocalBackend

    cfg, root = _cfg("max_steps=3", "save_steps=1"), tmp_path_factory.mktemp("reference3")
    backend = LocalBackend(cfg, random_policy(cfg))
    _coordinator(cfg, backend, root).train()
    return _fingerprint(backend, root)


def test_row_trainer_crash_resumes_from_last_checkpoint(tmp_path, reference3):
    from roll_spotlight.runtime.local import LocalBackend

    cfg = _cfg("max_steps=3", "save_steps=1")

    class CrashingTrainer(LocalBackend):
        def start_train(self, outputs, prompts, group_ids, rewards):
            if self.core.weight_version == 2:  # iteration 3, after its rollouts and rewards
                raise RuntimeError("injected trainer crash")
            return super().start_train(outputs, prompts, group_ids, rewards)

    with pytest.raises(RuntimeError, match="injected trainer crash"):
        _coordinator(cfg, CrashingTrainer(cfg, random_policy(cfg)), tmp_path).train()
    backend = LocalBackend(cfg, random_policy(cfg, seed=7))  # other weights: the checkpoint must win
    coordinator = _coordinator(cfg, backend, tmp_path)
    assert coordinator.resume_latest().name == "iter-000002"
    coordinator.train()
    _assert_same(_fingerprint(backend, tmp_path), reference3)


@pytest.mark.parametrize("damage", ["truncate", "flip", "meta"])
def test_row_corrupted_or_truncated_checkpoint(tmp_path, reference3, damage, caplog):
    from roll_spotlight.runtime.coordinator import CheckpointError
    from roll_spotlight.runtime.local import LocalBackend

    cut = _cfg("max_steps=2", "save_steps=1")
    _coordinator(cut, LocalBackend(cut, random_policy(cut)), tmp_path).train()
    newest = tmp_path / "checkpoints" / "iter-000002"
    damaged = newest / ("meta.json" if damage == "meta" else "backend.pt")
    data = damaged.read_bytes()
    damaged.write_bytes({"truncate": data[: len(data) // 2], "flip": data[:-9] + bytes([data[-9] ^ 1]) + data[-8:],
                         "meta": data[:-3]}[damage])
    cfg = _cfg("max_steps=3", "save_steps=1")
    with pytest.raises(CheckpointError, match=str(damaged)):
        _coordinator(cfg, LocalBackend(cfg, random_policy(cfg)), tmp_path).resume(newest)
    backend = LocalBackend(cfg, random_policy(cfg))
    coordinator = _coordinator(cfg, backend, tmp_path)
    with caplog.at_level("WARNING"):
        assert coordinator.resume_latest().name == "iter-000001", "the previous checkpoint is used"
    assert str(damaged) in caplog.text
    coordinator.train()
    _assert_same(_fingerprint(backend, tmp_path), reference3)


# ------------------------------------------------------------------------------------------------
# Rows on Ray actors (reward worker, queue actor)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from roll_spotlight.runtime.ray_backend import RayClusterConfig, init_ray

    init_ray(RayClusterConfig(num_cpus=2))  # the runtime's own start (loopback environment)
    yield ray
    ray.shutdown()


@pytest.mark.ray
def test_local_ray_advertises_loopback_only(ray_cluster):
    """docs/security.md: the runtime's local Ray advertises and connects to 127.0.0.1 (its
    servers still listen on every interface; the doc says so and what to do about it)."""
    ray = ray_cluster
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, size=(n, 16, 16, 3), dtype=np.uint8)


@pytest.mark.ray
def test_row_reward_worker_crash_is_restarted_and_retried_once(ray_cluster):
    from roll_spotlight.config.strict import to_dict
    from roll_spotlight.runtime.actors import RewardActor
    from roll_spotlight.rewards.configured import configured_reward

    ray, cfg = ray_cluster, _cfg()
    prompts = ["a red circle", "two blue squares", "a green square"]
    direct = configured_reward(cfg.reward)
    actor = RewardActor.remote(to_dict(cfg), crash_at_batch=2)
    outs = [ray.get(actor.score.remote(_images(3, seed), prompts, batch_id=seed)) for seed in range(3)]
    for seed, out in enumerate(outs):
        assert np.array_equal(out.rewards, direct(_images(3, seed), prompts).rewards)
    again = ray.get(actor.score.remote(_images(3, 2), prompts, batch_id=2))  # a repeated batch id
    stats = ray.get(actor.stats.remote())
    assert stats["restarted"], "the crash really killed the first process"
    assert stats == {"batches": 2, "samples": 6, "repeats": 1, "restarted": True}, \
        "the retried batch and the one after it, each once; the repeat is served, not rescored"
    assert np.array_equal(again.rewards, outs[2].rewards)
    ray.kill(actor, no_restart=True)


def _restarted(ray, queue, attempts: int = 600) -> bool:
    """Wait for the restarted queue actor (ray.kill returns before the process is gone; calls
    sent meanwhile may still reach the old process, whose ping says 0 records replayed)."""
    import time

    for _ in range(attempts):
        if ray.get(queue.ping.remote(), timeout=60) > 0:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.ray
def test_row_queue_actor_crash_recovers_from_its_journal(ray_cluster, tmp_path):
    """Two 'workers' (the driver, running real rollouts) hold leases when the queue actor dies;
    the restarted actor replays its journal, the old leases still complete, nothing is lost or
    duplicated and every output equals its failure-free rollout."""
    import torch

    from roll_spotlight.dispatch.queue_actor import create_queue_actor
    from roll_spotlight.dispatch.requests import Lease
    from roll_spotlight.worker.engine import RolloutEngine
    from roll_spotlight.runtime.coordinator import iteration_specs
    from roll_spotlight.training.prompt_pools import train_pool

    ray, cfg = ray_cluster, _cfg()
    torch.manual_seed(0)
    specs = iteration_specs(cfg, train_pool(cfg.task), 1, weight_version=0)
    executor = RolloutEngine(random_policy(cfg))
    queue = create_queue_actor(journal=tmp_path / "queue")
    ids = ray.get(queue.submit.remote(specs))
    a, b = ray.get(queue.pull.remote("a", 1)), ray.get(queue.pull.remote("b", 2))
    stop_after_2 = iter([False, True])
    partial = denoise_lease(executor, a[0], lambda: next(stop_after_2))
    assert ray.get(queue.checkpoint.remote("a", partial.state))
    assert ray.get(queue.complete.remote(b[0].result(denoise_lease(executor, b[0]).output)))
    before = ray.get(queue.snapshot.remote())

    ray.kill(queue, no_restart=False)  # the queue's process dies; Ray restarts it
    assert _restarted(ray, queue), "the restarted actor replayed its journal"
    assert ray.get(queue.snapshot.remote()) == before
    resumed = dataclasses.replace(a[0], resume=partial.state)
    assert ray.get(queue.complete.remote(a[0].result(denoise_lease(executor, resumed).output))), "old lease still valid"
    assert ray.get(queue.complete.remote(b[1].result(denoise_lease(executor, b[1]).output)))
    while leases := ray.get(queue.pull.remote("c", 1)):
        assert ray.get(queue.complete.remote(leases[0].result(denoise_lease(executor, leases[0]).output)))
    results = ray.get(queue.take_results.remote())
    stats = ray.get(queue.stats.remote())
    assert [c.request.request_id for c in results] == ids
    assert stats.completed == len(ids) and stats.duplicate_completions == 0
    for c in results:
        ref = denoise_lease(executor, Lease(0, c.request, "ref", math.inf, None, 1)).output
        assert np.array_equal(ref.latents, c.output.latents) and np.array_equal(ref.log_probs, c.output.log_probs)
    ray.kill(queue, no_restart=True)


@pytest.mark.parametrize("compact_every", [1, 4, 1000])
def test_queue_journal_rebuilds_the_queue_exactly(tmp_path, compact_every):
    """Tier 1 for the queue row: a second server on the same journal has the same requests,
    leases, counters and results as the first, with any compaction period and a torn last record."""
    from roll_spotlight.dispatch.journal import JournalConfig
    from roll_spotlight.dispatch.queue_actor import QueueServer
    from roll_spotlight.dispatch.requests import InFlightState, RequestKind, RequestSpec, Schedule

    journal = JournalConfig(str(tmp_path / "q"), compact_every=compact_every)
    first = QueueServer(journal=journal)
    specs = [RequestSpec(0, "p", seed, Schedule(4, 0.7), 0, RequestKind.ROLLOUT, 1) for seed in range(5)]
    first.submit(specs)
    a, b = first.pull("a", 2), first.pull("b", 1)
    first.checkpoint("a", InFlightState(a[0].request.request_id, 2, {"x": 1}, a[0].request.seed, 0))
    first.complete(a[1].result("out"))
    first.complete(a[1].result("again"))  # a duplicate: rejected, counted
    first.take_results()
    first.commit("b", InFlightState(b[0].request.request_id, 1, {"x": 2}, b[0].request.seed, 0))
    first.notify_preemption("b", 5.0)
    assert first.pull("b", 1) == []  # refused by the notice
    with open(tmp_path / "q.log", "ab") as fh:
        fh.write(b"\x80\x05\x95torn")  # the process died mid-append
    second = QueueServer(journal=journal)
    assert second.snapshot() == first.snapshot() and second.stats() == first.stats()
    assert [(x.lease_id, x.request) for x in second.leases_of("a")] == [(x.lease_id, x.request) for x in first.leases_of("a")]
    assert second.complete(a[0].result("late but valid")), "the live lease survived the restart"
    third = QueueServer(journal=journal)  # records appended after the torn tail are not lost
    assert third.snapshot() == second.snapshot()
