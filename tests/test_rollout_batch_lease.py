"""Batched leases in the live rollout worker (`dispatch.pull_batch`).

A RolloutWorker actor leases up to the queue's ``pull_batch`` requests a call, runs them in order
and reports them with its next pull. These tests check that batching changes how often the worker
talks to the queue and nothing else: the outputs equal one-request pulls bit for bit, and a notice
in the middle of a batch completes what finished, commits the request in flight and hands back
the ones not started, so a second worker finishes everything with nothing lost or run twice.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from roll_spotlight.dispatch import QueueConfig, RequestKind, RequestSpec, Schedule  # noqa: E402
from roll_spotlight.dispatch.requests import Lease  # noqa: E402
from roll_spotlight.worker.faults import FaultPlan  # noqa: E402
from tests.runtime_helpers import denoise_lease, random_policy, save_random_policy, tiny_config  # noqa: E402

pytestmark = pytest.mark.ray
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import torch

    from roll_spotlight.worker.engine import RolloutEngine
    from roll_spotlight.runtime.ray_backend import RayClusterConfig, init_ray
    from roll_spotlight.weights import WeightStore

    torch.set_num_threads(1)
    init_ray(RayClusterConfig(num_cpus=2, ondemand_workers=2))
    cfg = tiny_config()
    path = str(save_random_policy(cfg, tmp_path_factory.mktemp("batch") / "policy.pt", seed=5))
    store = WeightStore.create(keep=1)
    store.publish(0, random_policy(cfg, seed=5).state_dict())
    yield {"path": path, "store": store, "reference": RolloutEngine(random_policy(cfg, seed=5))}
    ray.shutdown()


def _specs(steps: list[int]) -> list[RequestSpec]:
    prompts = ("two red circles", "a blue square", "three green triangles")
    return [RequestSpec(i, prompts[i % 3], 100 + i, Schedule(num_steps=n, noise_level=0.7),
                        0, RequestKind.ROLLOUT, 0) for i, n in enumerate(steps)]


def _queue(pull_batch: int):
    from roll_spotlight.dispatch.queue_actor import create_queue_actor

    return create_queue_actor(QueueConfig(lease_s=TIMEOUT_S, pull_batch=pull_batch))


def _worker(cluster, queue, name: str, **kwargs):
    from roll_spotlight.runtime.actors import ONDEMAND
    from roll_spotlight.worker.actor import RolloutWorker

    return RolloutWorker.options(resources={ONDEMAND: 1}).remote(name, cluster["path"], queue, cluster["store"],
                                                                   **kwargs)


def _drain(queue, total: int, workers) -> list:
    """Wait until ``total`` requests are done, stop ``workers``; their serve() counters."""
    serving = [w.serve.remote() for w in workers]
    deadline = time.monotonic() + TIMEOUT_S
    while len(ray.get(queue.done_ids.remote())) < total:
        assert time.monotonic() < deadline, "the queue was not drained in time"
        time.sleep(0.05)
    for w in workers:
        w.stop.remote()
    return ray.get(serving, timeout=TIMEOUT_S)


def _assert_equal(out, ref) -> None:
    assert np.array_equal(out.latents, ref.latents) and np.array_equal(out.log_probs, ref.log_probs)
    assert np.array_equal(out.image, ref.image) and out.resumed_from == ref.resumed_from


def test_a_batch_of_four_drains_the_queue_with_the_outputs_of_single_pulls(cluster):
    specs = _specs([4] * 8)
    runs = {}
    for batch in (1, 4):
        queue = _queue(batch)
        ray.get(queue.submit.remote(specs))
        worker = _worker(cluster, queue, f"w{batch}", heartbeat_s=600.0)  # no heartbeat in the count
        (counters,) = _drain(queue, len(specs), [worker])
        completions = ray.get(queue.take_results.remote())
        runs[batch] = (counters, ray.get(worker.queue_use.remote()), ray.get(queue.stats.remote()),
                       {c.request.request_id: c.output for c in completions})
        ray.kill(worker, no_restart=True)
        ray.kill(queue)
    for batch, (counters, _, stats, outputs) in runs.items():
        assert (counters["completed"], stats.completed, stats.leases_granted) == (8, 8, 8), batch
        assert (stats.duplicate_completions, stats.releases, stats.expirations) == (0, 0, 0), batch
        assert sorted(outputs) == list(range(8))
    for rid, out in runs[4][3].items():
        _assert_equal(out, runs[1][3][rid])
    # calls that leased something: batch 1, one per request (the first pull alone, the others with
    # the report of the previous request); batch 4, one per batch. The last report leased nothing.
    calls = {batch: use["calls"] - use["empty_pulls"] for batch, (_, use, _, _) in runs.items()}
    assert calls == {1: 8, 4: 2}, calls


def test_a_notice_mid_batch_completes_commits_and_releases_and_another_worker_finishes(cluster):
    # one batch of four: request 0 (4 steps) finishes, request 1 (8 steps) parks at step 5 and gets
    # the notice, requests 2 and 3 are not started. a hold at step 5 is never reached by 4 steps.
    specs = _specs([4, 8, 8, 8])
    queue = _queue(4)
    first = _worker(cluster, queue, "first", faults=FaultPlan(hold_at_step=5))
    serving = first.serve.remote()
    ray.get(queue.submit.remote(specs))
    assert ray.get(first.wait_held.remote(TIMEOUT_S)), "request 1 never reached step 5"
    assert ray.get(first.unsaved_steps.remote()) == 4 + 5, "the finished, unreported request counts as unsaved"
    first.notify_preemption.remote(5.0)
    counters = ray.get(serving, timeout=TIMEOUT_S)
    assert (counters["completed"], counters["committed"], counters["steps"]) == (1, 1, 9)
    stats = ray.get(queue.stats.remote())
    assert (stats.leases_granted, stats.completed, stats.commits, stats.releases) == (4, 1, 1, 2)
    assert ray.get(queue.counts.remote()) == (3, 0), "three pending again, none still leased"

    second = _worker(cluster, queue, "second")
    _drain(queue, len(specs), [second])
    completions = ray.get(queue.take_results.remote())
    stats = ray.get(queue.stats.remote())
    assert sorted(c.request.request_id for c in completions) == [0, 1, 2, 3], "each request completed once"
    assert (stats.completed, stats.leases_granted, stats.resumed_from_commit) == (4, 7, 1)
    assert (stats.duplicate_completions, stats.failed_attempts, stats.expirations) == (0, 0, 0)
    by_id = {c.request.request_id: c for c in completions}
    assert by_id[0].worker == "first" and {by_id[i].worker for i in (1, 2, 3)} == {"second"}
    assert by_id[1].output.resumed_from == 5
    for c in completions:  # the interrupted run equals an uninterrupted one, bit for bit
        ref = denoise_lease(cluster["reference"], Lease(0, c.request, "ref", float("inf"), None, 1)).output
        assert np.array_equal(c.output.latents, ref.latents) and np.array_equal(c.output.image, ref.image)
        assert np.array_equal(c.output.log_probs, ref.log_probs)
    for w in (first, second):
        ray.kill(w, no_restart=True)
    ray.kill(queue)


def test_dispatch_pull_batch_is_a_run_key_that_reaches_the_queue():
    from roll_spotlight.runtime.ray_backend import SPOT_MAX_ATTEMPTS, queue_config

    assert queue_config(tiny_config()) == QueueConfig()
    assert queue_config(tiny_config("dispatch.pull_batch=4")).pull_batch == 4
    spot = queue_config(tiny_config("dispatch.pull_batch=3", "spot.enabled=true"))
    assert (spot.pull_batch, spot.max_attempts) == (3, SPOT_MAX_ATTEMPTS)
    for bad in ("0", "true", "1.5"):
        with pytest.raises(ValueError, match="dispatch.pull_batch"):
            tiny_config(f"dispatch.pull_batch={bad}")


def test_an_sp_group_leader_leases_batches_for_its_group(cluster):
    """The leader's batch reaches every rank (lead()); the group's outputs match one worker's."""
    from roll_spotlight.elastic.rendezvous import RendezvousHost, group_memberships

    host = RendezvousHost("127.0.0.1")
    members = group_memberships(host.address, "g#1", 2, timeout_s=TIMEOUT_S)
    queue = _queue(2)
    group = [_worker(cluster, queue, f"g-{r}", sp=members[r], group_name="g-0") for r in range(2)]
    specs = _specs([4, 4, 4])
    ray.get(queue.submit.remote(specs))
    leader, follower = _drain(queue, len(specs), group)
    completions = ray.get(queue.take_results.remote())
    stats = ray.get(queue.stats.remote())
    assert (leader["completed"], follower["completed"], follower["steps"]) == (3, 0, leader["steps"])
    assert (stats.leases_granted, stats.completed, stats.duplicate_completions) == (3, 3, 0)
    use = ray.get(group[0].queue_use.remote())
    assert use["calls"] - use["empty_pulls"] == 2, "batches of 2 and 1, the last reported with an empty pull"
    for c in completions:  # SP 2 against one worker: equal to fp32 rounding (1e-5)
        ref = denoise_lease(cluster["reference"], Lease(0, c.request, "ref", float("inf"), None, 1)).output
        assert np.abs(c.output.latents - ref.latents).max() < 1e-5
    for w in group:
        ray.kill(w, no_restart=True)
    ray.kill(queue)
    host.close()
