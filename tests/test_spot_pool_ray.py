"""Tier 3: the elastic spot pool driving real RolloutWorker actors. Worker a is parked at step s
(deterministic injection), then preempted by the market, with or without notice; worker b, which
joins later, resumes the request; the output must equal an uninterrupted in-process run bit for bit."""
from __future__ import annotations

import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from roll_spotlight.dispatch import QueueConfig, RequestKind, RequestSpec, Schedule  # noqa: E402
from roll_spotlight.dispatch.requests import Lease  # noqa: E402
from roll_spotlight.worker.faults import FaultPlan  # noqa: E402
from roll_spotlight.spot_pool.ray_nodes import RayWorkerLauncher  # noqa: E402
from roll_spotlight.spot_pool.pool import ElasticSpotPool, SpotPoolConfig# noqa: E402
from roll_spotlight.spot.market import MarketSchedule
from roll_spotlight.spot import EventList, MarketConfig, NodeEvent, SpotMarket, Trace  # noqa: E402
from tests.runtime_helpers import denoise_lease, random_policy, save_random_policy, tiny_config  # noqa: E402

pytestmark = pytest.mark.ray
SCHEDULE = Schedule(num_steps=8, noise_level=0.7)
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import torch

    from roll_spotlight.worker.engine import RolloutEngine
    from roll_spotlight.runtime.ray_backend import RayClusterConfig, init_ray
    from roll_spotlight.weights import WeightStore

    torch.set_num_threads(1)
    init_ray(RayClusterConfig(num_cpus=2, ondemand_workers=1, spot_workers=4))
    cfg = tiny_config()
    path = str(save_random_policy(cfg, tmp_path_factory.mktemp("spot") / "policy.pt", seed=5))
    store = WeightStore.create(keep=1)
    store.publish(0, random_policy(cfg, seed=5).state_dict())
    yield {"path": path, "store": store, "reference": RolloutEngine(random_policy(cfg, seed=5))}
    ray.shutdown()


def two_node_market(notice_s: float) -> SpotMarket:
    """Node a: up at 0, reclaimed at 100 s; node b joins at 50 s and stays (compression 1)."""
    rows = (NodeEvent(0.0, "add", "a"), NodeEvent(50.0, "add", "b"), NodeEvent(100.0, "remove", "a"))
    trace = Trace(name="two-nodes", kind="events", measures="running", provider="aws",
                  zones={"z": EventList(rows, 0.0, 200.0)}, gpu_type="V100")
    return SpotMarket(trace, MarketConfig(notice_s=notice_s))


def start_pool(cluster, *, hold_at: int, commit_every: int, no_notice: bool):
    from roll_spotlight.dispatch.queue_actor import create_queue_actor

    queue = create_queue_actor(QueueConfig(lease_s=TIMEOUT_S))
    launcher = RayWorkerLauncher(cluster["path"], queue, cluster["store"], commit_every=commit_every,
                                 worker_kwargs=lambda node: {"faults": FaultPlan(hold_at_step=hold_at)} if node == "z/a" else {})
    pool = ElasticSpotPool(MarketSchedule(two_node_market(notice_s=10.0)), launcher,
                           config=SpotPoolConfig(no_notice=no_notice))
    pool.poll(0.0)  # starts worker a
    assert launcher.wait_ready(TIMEOUT_S)
    spec = RequestSpec(0, "three blue squares", 777, SCHEDULE, 0, RequestKind.ROLLOUT, 0)
    ray.get(queue.submit.remote([spec]))
    assert ray.get(launcher.workers["spot-z/a"].wait_held.remote(TIMEOUT_S)), "worker a never reached its step"
    return queue, launcher, pool


def wait_for_completion(queue, pool, now: float):
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        pool.poll(now)  # watches for actor deaths; no market event is due
        if done := ray.get(queue.take_results.remote()):
            return done
        time.sleep(0.05)
    raise AssertionError(f"no completion within {TIMEOUT_S} s")


def assert_equals_uninterrupted(cluster, completion) -> None:
    ref = denoise_lease(cluster["reference"], Lease(0, completion.request, "ref", float("inf"), None, 1)).output
    out = completion.output
    assert np.array_equal(out.latents, ref.latents) and np.array_equal(out.log_probs, ref.log_probs)
    assert np.array_equal(out.image, ref.image)


def test_notice_at_step_3_commits_and_the_next_node_resumes_bit_identically(cluster):
    queue, launcher, pool = start_pool(cluster, hold_at=3, commit_every=0, no_notice=False)
    pool.poll(95.0)  # b joins (50 s); a's notice (90 s) with 5 s left
    assert launcher.wait_stopped("spot-z/a", TIMEOUT_S) == {"completed": 0, "committed": 1, "steps": 3,
                                                             "weight_fetches": 1, "groups_joined": 0,
                                                             "peer_weight_copies": 0, "micro_batches": 0,
                                                             "micro_batches_refused": 0,
                                                             "micro_batches_released": 0}
    (completion,) = wait_for_completion(queue, pool, 95.0)
    pool.poll(100.0)  # a's NODE_DOWN: it had handed everything over
    assert completion.worker == "spot-z/b" and completion.output.resumed_from == 3
    assert_equals_uninterrupted(cluster, completion)
    stats = ray.get(queue.stats.remote())
    assert (stats.commits, stats.resumed_from_commit, stats.duplicate_completions) == (1, 1, 0)
    assert (pool.stats.notices, pool.stats.preempted_after_notice, pool.stats.steps_lost) == (1, 1, 0)
    assert pool.stats.leases_requeued == 0
    pool.close(100.0)


def test_kill_without_notice_resumes_from_the_last_checkpoint_and_loses_at_most_commit_every(cluster):
    queue, launcher, pool = start_pool(cluster, hold_at=5, commit_every=2, no_notice=True)
    pool.poll(100.0)  # b joins; a's notice is dropped; a is killed at step 5 (checkpointed at 4)
    assert (pool.stats.preemptions, pool.stats.notices, pool.stats.leases_requeued) == (1, 0, 1)
    assert pool.stats.steps_lost == 1 <= 2
    (completion,) = wait_for_completion(queue, pool, 100.0)
    assert completion.worker == "spot-z/b" and completion.output.resumed_from == 4
    assert_equals_uninterrupted(cluster, completion)
    stats = ray.get(queue.stats.remote())
    assert (stats.checkpoints, stats.worker_losses, stats.resumed_from_commit) == (3, 1, 1)  # a: 2, 4; b: 6
    pool.close(100.0)


def test_real_model_spot_workers_load_their_model_and_resume_bit_identically(cluster, tmp_path):
    """A Qwen-Image-class policy source (a model section, loaded by each worker from its own disk):
    worker a gets a notice at step 3, worker b resumes; the weight version carries the transformer
    only, and the result equals an uninterrupted in-process run."""
    import torch

    from roll_spotlight.config.strict import to_dict
    from roll_spotlight.dispatch.queue_actor import create_queue_actor
    from roll_spotlight.models import ModelConfig, build_policy
    from roll_spotlight.worker.engine import RolloutEngine
    from roll_spotlight.weights import WeightStore
    from tests.qwen_helpers import save_tiny_qwen

    model = ModelConfig(preset="qwen_image", path=str(save_tiny_qwen(tmp_path / "qwen")), image_size=32)
    trained = build_policy(model)
    with torch.no_grad():
        for p in trained.transformer.parameters():
            p.add_(0.01)  # the version differs from what is on disk: workers must take it from the store
    store = WeightStore.create(keep=1)
    store.publish(0, trained.published_state())
    queue = create_queue_actor(QueueConfig(lease_s=TIMEOUT_S))
    launcher = RayWorkerLauncher(to_dict(model), queue, store,
                                 worker_kwargs=lambda node: {"faults": FaultPlan(hold_at_step=3)} if node == "z/a" else {})
    pool = ElasticSpotPool(MarketSchedule(two_node_market(notice_s=10.0)), launcher, config=SpotPoolConfig())
    pool.poll(0.0)
    assert launcher.wait_ready(TIMEOUT_S)
    spec = RequestSpec(0, 'a sign that says "spot"', 321, SCHEDULE, 0, RequestKind.ROLLOUT, 0)
    ray.get(queue.submit.remote([spec]))
    assert ray.get(launcher.workers["spot-z/a"].wait_held.remote(TIMEOUT_S)), "worker a never reached its step"
    pool.poll(95.0)
    assert launcher.wait_stopped("spot-z/a", TIMEOUT_S)["committed"] == 1
    (completion,) = wait_for_completion(queue, pool, 95.0)
    assert completion.worker == "spot-z/b" and completion.output.resumed_from == 3
    ref = denoise_lease(RolloutEngine(trained), Lease(0, completion.request, "ref", float("inf"), None, 1)).output
    assert np.array_equal(completion.output.latents, ref.latents)
    assert np.array_equal(completion.output.log_probs, ref.log_probs)
    pool.close(100.0)


def test_workers_pinned_to_a_node_that_went_before_they_were_placed_count_as_dead(cluster):
    """On a real cluster a spot node can go between the pool starting its workers (pinned to it)
    and Ray placing them: their calls raise ActorUnschedulableError. The launcher's probes read
    nothing from them and its death check reports the node, instead of failing the pool."""
    from roll_spotlight.dispatch.queue_actor import create_queue_actor

    queue = create_queue_actor(QueueConfig(lease_s=TIMEOUT_S))
    launcher = RayWorkerLauncher(cluster["path"], queue, cluster["store"], node_affinity=True)
    gone = "ab" * 28  # a node id no raylet has
    launcher.start("spot-gone", gone)
    deadline = time.monotonic() + TIMEOUT_S
    died = []
    while not died and time.monotonic() < deadline:
        died = launcher.dead()
        time.sleep(0.05)
    assert died == ["spot-gone"]
    assert launcher.kill("spot-gone") == 0 and launcher.timelines["spot-gone"][-1]["phase"] == "preempted"
