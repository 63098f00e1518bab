"""Tier 3: a real Ray preemption drain reaches RayNodeWatcher as NOTICE with its deadline.

Drains the local head node (new actors can no longer be placed there), so it runs on a cluster of
its own. It pins the private Ray API the watcher reads (``get_draining_nodes``): if a Ray upgrade
moves it, this test says so."""
from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from roll_spotlight.spot_pool.ray_nodes import RayNodeWatcher  # noqa: E402
from roll_spotlight.spot import EventKind  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def spot_head_node():
    if ray.is_initialized():
        pytest.skip("needs a Ray cluster of its own (the test drains the head node)")
    ray.init(num_cpus=1, resources={"spot_gpu": 1}, include_dashboard=False, log_to_driver=False)
    yield ray.nodes()[0]["NodeID"]
    ray.shutdown()


@ray.remote(num_cpus=0, resources={"spot_gpu": 1})
class Busy:
    """Keeps the node from being idle, so a drain waits for its deadline instead of ending it."""

    def ping(self) -> int:
        return 1


def test_a_preemption_drain_becomes_a_notice_with_the_drain_deadline(spot_head_node):
    from ray.core.generated import autoscaler_pb2

    busy = Busy.remote()
    ray.get(busy.ping.remote())
    watcher = RayNodeWatcher()
    assert [(e.kind, e.node_id) for e in watcher.due(0.0)] == [(EventKind.NODE_UP, spot_head_node)]
    gcs = ray._raylet.GcsClient(address=ray.get_runtime_context().gcs_address)
    reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
    accepted, why = gcs.drain_node(spot_head_node, reason, "spot reclaim", int((time.time() + 30.0) * 1000))
    assert accepted, why
    events = []
    for _ in range(50):  # the GCS records the drain asynchronously
        if events := watcher.due(1.0):
            break
        time.sleep(0.1)
    assert [(e.kind, e.node_id) for e in events] == [(EventKind.NOTICE, spot_head_node)]
    assert watcher.deadline(spot_head_node) == pytest.approx(31.0, abs=2.0)
    assert ray.get(busy.ping.remote()) == 1  # running actors keep running until the node goes
