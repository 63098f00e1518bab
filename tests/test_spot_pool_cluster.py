"""Tier 3: ``spot.source: cluster`` on a live Ray cluster. The local head node declares
``spot_gpu``, so the training pool starts one worker pinned to it; a request parks at step 3; a
preemption drain of the node (with its deadline) reaches the worker as the notice, and the worker
commits its in-flight state to the queue. Runs on a cluster of its own (it drains the head node)."""
from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from roll_spotlight.dispatch import QueueConfig, RequestKind, RequestSpec, Schedule  # noqa: E402
from roll_spotlight.config.run import SpotConfig  # noqa: E402
from roll_spotlight.worker.faults import FaultPlan  # noqa: E402
from tests.runtime_helpers import random_policy, save_random_policy, tiny_config  # noqa: E402

pytestmark = pytest.mark.ray
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def spot_head_node():
    if ray.is_initialized():
        pytest.skip("needs a Ray cluster of its own (the test drains the head node)")
    from roll_spotlight.loopback import set_loopback_env

    set_loopback_env()
    ray.init(num_cpus=1, resources={"spot_gpu": 1}, include_dashboard=False, log_to_driver=False)
    yield ray.nodes()[0]["NodeID"]
    ray.shutdown()


def test_cluster_source_needs_gpu_type_and_no_trace():
    from roll_spotlight.config.strict import ConfigError

    with pytest.raises((ConfigError, ValueError), match="spot.gpu_type"):
        SpotConfig(enabled=True, source="cluster")
    with pytest.raises((ConfigError, ValueError), match="spot.trace"):
        SpotConfig(enabled=True, source="cluster", gpu_type="H100", trace="t.csv")
    with pytest.raises((ConfigError, ValueError), match="spot.source"):
        SpotConfig(enabled=True, source="replay")


def test_cluster_pool_follows_the_spot_node_and_its_drain_is_the_notice(spot_head_node, tmp_path):
    from ray.core.generated import autoscaler_pb2

    from roll_spotlight.dispatch.queue_actor import create_queue_actor
    from roll_spotlight.spot_pool.training_pool import start_training_pool
    from roll_spotlight.weights import WeightStore

    cfg = tiny_config()
    path = str(save_random_policy(cfg, tmp_path / "policy.pt", seed=5))
    store = WeightStore.create(keep=1)
    store.publish(0, random_policy(cfg, seed=5).published_state())
    queue = create_queue_actor(QueueConfig(lease_s=TIMEOUT_S))
    spot = SpotConfig(enabled=True, source="cluster", gpu_type="H100", spot_usd_per_gpu_hour=2.0)
    training = start_training_pool(spot, path, queue, store, ondemand_gpus=1,
                                   worker_kwargs=lambda node: {"faults": FaultPlan(hold_at_step=3)})
    name = f"spot-{spot_head_node}"
    assert training.pool.serving == 1 and list(training.pool.launcher.workers) == [name]
    spec = RequestSpec(0, "two red circles", 99, Schedule(num_steps=6, noise_level=0.7), 0, RequestKind.ROLLOUT, 0)
    ray.get(queue.submit.remote([spec]))
    worker = training.pool.launcher.workers[name]
    assert ray.get(worker.wait_held.remote(TIMEOUT_S)), "the worker never reached step 3"

    gcs = ray._raylet.GcsClient(address=ray.get_runtime_context().gcs_address)
    reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
    accepted, why = gcs.drain_node(spot_head_node, reason, "spot reclaim", int((time.time() + 30.0) * 1000))
    assert accepted, why
    deadline = time.monotonic() + TIMEOUT_S  # the pool's background poller relays the notice
    while ray.get(queue.stats.remote()).commits == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = ray.get(queue.stats.remote())
    assert (stats.commits, stats.completed) == (1, 0), "the drain never reached the worker as a notice"
    assert training.pool.stats.notices == 1
    snapshot = ray.get(queue.snapshot.remote())
    (record,) = snapshot.records
    assert record.resume is not None and record.resume.step_index == 3  # another worker resumes from here
    report = training.close()
    spot_pools = [p for p in report.pools if p.pool.startswith("spot")]
    assert spot_pools and all(p.usd >= 0 for p in spot_pools)
