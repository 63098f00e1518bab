"""Tier 3: the queue as a Ray actor, pulled by worker actors in other processes."""
from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from roll_spotlight.dispatch import (  # noqa: E402
    InFlightState,
    QueueConfig,
    RequestKind,
    RequestSpec,
    Schedule,
)
from roll_spotlight.dispatch.queue_actor import QueueClient, create_queue_actor  # noqa: E402

pytestmark = pytest.mark.ray
SCHEDULE = Schedule(num_steps=10, noise_level=0.7)


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def specs(count: int, kind: RequestKind = RequestKind.ROLLOUT) -> list[RequestSpec]:
    return [RequestSpec(i % 4, f"p{i % 4}", i, SCHEDULE, 0, kind, iteration=0) for i in range(count)]


@ray.remote(num_cpus=0)
class LoopWorker:
    """Pull one, complete it, until the queue is empty; returns the request ids it completed."""

    def __init__(self, client: QueueClient) -> None:
        self.client = client

    def run(self) -> list[int]:
        done = []
        while leases := self.client.pull(1):
            (lease,) = leases
            assert self.client.complete(lease, (self.client.worker, lease.request.seed))
            done.append(lease.request.request_id)
        return done

    def pull_and_commit(self, step: int) -> int:
        (lease,) = self.client.pull(1)
        request = lease.request
        latent = np.arange(16, dtype=np.float32) * request.seed
        state = InFlightState(request.request_id, step, latent, request.seed, request.weight_version)
        assert self.client.checkpoint(state)
        return request.request_id


@ray.remote(num_cpus=0)
class BatchWorker:
    """Lease ``dispatch.pull_batch`` at a time, complete each batch with the next pull."""

    def __init__(self, client: QueueClient) -> None:
        self.client = client

    def run(self) -> list[int]:
        done, leases = [], self.client.pull_batch()
        while leases:
            verdicts, next_leases = self.client.complete_and_pull([(lease, lease.request.seed) for lease in leases])
            assert all(verdicts)
            done += [lease.request.request_id for lease in leases]
            leases = next_leases
        return done

    def pull_and_finish_one(self) -> list[int]:
        """Lease a batch, complete only its first request, return the batch's request ids."""
        leases = self.client.pull_batch()
        assert self.client.complete_many([(leases[0], "first")]) == [True]
        return [lease.request.request_id for lease in leases]


def test_batch_workers_complete_every_request_once(ray_cluster):
    queue = create_queue_actor(QueueConfig(lease_s=60.0, pull_batch=4))
    ids = ray.get(queue.submit.remote(specs(30)))
    workers = [BatchWorker.remote(QueueClient(queue, f"w{i}")) for i in range(3)]
    per_worker = ray.get([w.run.remote() for w in workers])

    assert sorted(rid for done in per_worker for rid in done) == ids
    stats = ray.get(queue.stats.remote())
    assert (stats.completed, stats.duplicate_completions, stats.leases_granted) == (30, 0, 30)
    assert ray.get(queue.counts.remote()) == (0, 0)


def test_a_lost_worker_mid_batch_has_the_rest_of_its_batch_requeued(ray_cluster):
    queue = create_queue_actor(QueueConfig(lease_s=60.0, pull_batch=3))
    ray.get(queue.submit.remote(specs(5)))
    doomed = BatchWorker.remote(QueueClient(queue, "spot-0"))
    batch = ray.get(doomed.pull_and_finish_one.remote())
    ray.kill(doomed)
    assert ray.get(queue.worker_lost.remote("spot-0")) == 2

    survivor = QueueClient(queue, "ondemand-0")
    leases = survivor.pull_batch(10)
    assert sorted(lease.request.request_id for lease in leases) == sorted(set(range(5)) - {batch[0]})
    assert survivor.complete_many([(lease, "img") for lease in leases]) == [True] * 4
    assert ray.get(queue.stats.remote()).completed == 5


def test_three_worker_actors_complete_every_request_once(ray_cluster):
    queue = create_queue_actor(QueueConfig(lease_s=60.0))
    ids = ray.get(queue.submit.remote(specs(30)))
    workers = [LoopWorker.remote(QueueClient(queue, f"w{i}")) for i in range(3)]
    per_worker = ray.get([w.run.remote() for w in workers])

    flat = sorted(rid for done in per_worker for rid in done)
    assert flat == ids  # disjoint and complete
    stats = ray.get(queue.stats.remote())
    assert (stats.completed, stats.duplicate_completions, stats.leases_granted) == (30, 0, 30)
    completions = ray.get(queue.take_results.remote())
    assert [c.output for c in completions] == [(c.worker, c.request.seed) for c in completions]
    assert ray.get(queue.counts.remote()) == (0, 0)


def test_killed_worker_is_resumed_from_its_checkpoint(ray_cluster):
    queue = create_queue_actor(QueueConfig(lease_s=60.0))
    ray.get(queue.submit.remote([specs(4)[3]]))  # one request, seed 3
    doomed = LoopWorker.remote(QueueClient(queue, "spot-0"))
    request_id = ray.get(doomed.pull_and_commit.remote(step=6))
    ray.kill(doomed)
    assert ray.get(queue.worker_lost.remote("spot-0")) == 1

    survivor = QueueClient(queue, "ondemand-0")
    (lease,) = survivor.pull(1)
    assert lease.request.request_id == request_id and lease.resume.step_index == 6
    np.testing.assert_array_equal(lease.resume.latent, np.arange(16, dtype=np.float32) * 3)
    assert survivor.complete(lease, "image") is True
    assert ray.get(queue.stats.remote()).resumed_from_commit == 1


def test_preemption_notice_through_the_actor(ray_cluster):
    queue = create_queue_actor()
    ray.get(queue.submit.remote(specs(2, RequestKind.EXPLORE)))
    ray.get(queue.notify_preemption.remote("spot-1", 30.0))
    spot = QueueClient(queue, "spot-1")
    assert spot.pull(1) == []
    assert spot.pull(1, est_duration_s=600.0) == []
    assert len(spot.pull(1, est_duration_s=1.0)) == 1
    assert QueueClient(queue, "ondemand").pull(1, kinds={RequestKind.ROLLOUT}) == []
