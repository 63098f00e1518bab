"""SP rollout groups in the iteration loop (worker.sp_group): several rollout workers denoise one
image with Ulysses SP, serve the queue as one worker, and commit together on any member's notice.

Tier 1 runs the group's ranks as threads of this process (gloo over a file store); tier 3 runs
them as RolloutWorker actors behind the Ray backend and its queue. Outputs are compared with the
single-worker run to 1e-5 (fp32): bit-identical on CPU, but GPU kernels may reorder sums by shape.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from roll_spotlight.dispatch import RequestKind, RequestSpec, Schedule
from roll_spotlight.dispatch.requests import Lease, Request
from roll_spotlight.elastic.comm import any_true, broadcast_object, make_process_group
from roll_spotlight.elastic.rendezvous import RendezvousHost, SPMembership, group_memberships
from roll_spotlight.elastic.ulysses import is_ulysses_applied
from roll_spotlight.worker.engine import Committed, Finished, RolloutEngine
from roll_spotlight.worker.faults import FaultPlan
from roll_spotlight.worker.sp_group import SPRolloutGroup, check_sp_degree
from tests.runtime_helpers import denoise_lease, random_policy, save_random_policy, tiny_config

pytestmark = pytest.mark.dist
SCHEDULE = Schedule(num_steps=6, noise_level=0.7)
TOL = 1e-5


def _spec(seed: int = 777) -> RequestSpec:
    return RequestSpec(0, "three blue squares", seed, SCHEDULE, 0, RequestKind.ROLLOUT, 0)


def _lease(spec: RequestSpec, resume=None) -> Lease:
    return Lease(0, Request.from_spec(0, spec), "test", float("inf"), resume, 1)


def _in_threads(size: int, fn):
    """Run ``fn(rank)`` on ``size`` threads; their results in rank order (an exception re-raised)."""
    results, errors = [None] * size, []

    def main(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            errors.append(err)

    threads = [threading.Thread(target=main, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results


def _assert_close(out, ref) -> None:
    assert np.abs(out.latents - ref.latents).max() < TOL
    assert np.abs(out.log_probs - ref.log_probs).max() < TOL
    assert np.abs(out.image.astype(int) - ref.image.astype(int)).max() <= 1  # uint8 rounding at most
    assert (out.seed, out.resumed_from) == (ref.seed, ref.resumed_from)


@pytest.fixture(scope="module")
def cfg():
    torch.set_num_threads(1)
    return tiny_config()


@pytest.fixture(scope="module")
def reference(cfg):
    return denoise_lease(RolloutEngine(random_policy(cfg, seed=5)), _lease(_spec())).output


def test_group_decisions_are_the_same_on_every_rank(tmp_path):
    host = RendezvousHost("127.0.0.1")

    def rank_main(rank: int):
        group = make_process_group(host.address.connect(30), "decide", rank, 3, backend="gloo", timeout_s=30,
                                   loopback=True)
        shared = broadcast_object({"lease": rank, "data": np.arange(4)} if rank == 0 else "ignored", 0, group)
        return shared["lease"], shared["data"].tolist(), any_true(rank == 2, group), any_true(False, group)

    assert _in_threads(3, rank_main) == [(0, [0, 1, 2, 3], True, False)] * 3
    host.close()


@pytest.mark.parametrize("degree", [2, 4])
def test_a_group_rollout_equals_the_single_worker_rollout(cfg, reference, degree):
    host = RendezvousHost("127.0.0.1")
    members = group_memberships(host.address, f"sp{degree}", degree, timeout_s=60)

    policies = [random_policy(cfg, seed=5) for _ in range(degree)]  # the global torch RNG: not in threads

    def rank_main(rank: int):
        policy = policies[rank]
        group = SPRolloutGroup(policy, members[rank])
        executor = RolloutEngine(policy)
        outcome = denoise_lease(executor, _lease(_spec()), lambda: group.any(False), decode=group.leader)
        group.close()
        return outcome

    outcomes = _in_threads(degree, rank_main)
    assert all(isinstance(o, Finished) for o in outcomes)
    assert all(o.output is None for o in outcomes[1:]), "only the leader decodes and returns the result"
    _assert_close(outcomes[0].output, reference)
    host.close()


def test_a_notice_on_one_rank_commits_the_group_at_the_same_step_and_a_single_worker_resumes(cfg, reference):
    host = RendezvousHost("127.0.0.1")
    members = group_memberships(host.address, "notice", 2, timeout_s=60)

    policies = [random_policy(cfg, seed=5) for _ in range(2)]  # the global torch RNG: not in threads

    def rank_main(rank: int):
        policy = policies[rank]
        group = SPRolloutGroup(policy, members[rank])
        steps = iter(range(1, 100))
        notice = lambda: rank == 1 and next(steps) == 3  # noqa: E731 - rank 1's notice after step 3
        outcome = denoise_lease(RolloutEngine(policy), _lease(_spec()), lambda: group.any(notice()), decode=group.leader)
        group.close()
        return outcome

    outcomes = _in_threads(2, rank_main)
    assert all(isinstance(o, Committed) and o.steps_run == 3 and o.state.step_index == 3 for o in outcomes)
    resumed = denoise_lease(RolloutEngine(random_policy(cfg, seed=5)), _lease(_spec(), resume=outcomes[0].state)).output
    assert resumed.resumed_from == 3
    assert np.abs(resumed.latents - reference.latents).max() < TOL
    assert np.abs(resumed.log_probs - reference.log_probs).max() < TOL
    host.close()


def test_a_group_denoises_a_batch_and_a_notice_commits_every_row_at_one_step(cfg):
    """max_batch 4 in a group of 2: each request ends within BATCHED_ATOL of its rollout alone; a
    notice on rank 1 after step 3 commits all four rows on both ranks at step 3, and a single
    worker resumes them, two by two, to the same outputs."""
    from roll_spotlight.worker.engine import BATCHED_ATOL
    from roll_spotlight.worker.loop import roll_out

    leases = [Lease(i, Request.from_spec(i, _spec(700 + i)), "test", float("inf"), None, 1) for i in range(4)]
    alone = roll_out(RolloutEngine(random_policy(cfg, seed=5)), leases)
    host = RendezvousHost("127.0.0.1")
    policies = [random_policy(cfg, seed=5) for _ in range(2)]  # the global torch RNG: not in threads

    def run(tag: str, notice_at: int | None):
        members = group_memberships(host.address, tag, 2, timeout_s=60)

        def rank_main(rank: int):
            group, finished = SPRolloutGroup(policies[rank], members[rank]), []

            def at_boundary(report):
                finished.extend(outcome for _, outcome in report.finished)
                step = max(report.running.values(), default=None)
                return None if group.any(rank == 1 and step == notice_at) else []

            committed = RolloutEngine(policies[rank], max_batch=4).denoise_batch(leases, at_boundary,
                                                                                decode=group.leader)
            group.close()
            return finished, committed

        return _in_threads(2, rank_main)

    (done, none), (follower_done, _) = run("batch", None)
    assert none == [] and len(done) == 4 and all(o.output is None for o in follower_done)
    for out in sorted((o.output for o in done), key=lambda o: o.request_id):
        ref = alone[out.request_id]
        assert np.abs(out.latents - ref.latents).max() < BATCHED_ATOL
        assert np.abs(out.log_probs - ref.log_probs).max() < BATCHED_ATOL
    ranks = run("notice", 3)
    for finished, committed in ranks:
        assert finished == [] and [(c.state.step_index, c.steps_run) for _, c in committed] == [(3, 3)] * 4
    states = [c.state for _, c in ranks[0][1]]
    resumed = roll_out(RolloutEngine(random_policy(cfg, seed=5), max_batch=2),
                       [Lease(i, lease.request, "test", float("inf"), states[i], 1) for i, lease in enumerate(leases)])
    for out, ref in zip(resumed, alone):
        assert out.resumed_from == 3 and np.abs(out.latents - ref.latents).max() < BATCHED_ATOL
    host.close()


def test_a_qwen_image_class_policy_from_a_directory_rolls_out_in_an_sp_group(tmp_path):
    """The real-model path (VAE, text encoder, transformer loaded from a diffusers directory; a
    tiny random config of the same classes, 2 heads): an SP group of 2 equals one worker."""
    from roll_spotlight.models import ModelConfig, build_policy
    from tests.qwen_helpers import save_tiny_qwen

    model = ModelConfig(preset="qwen_image", path=str(save_tiny_qwen(tmp_path / "qwen")), image_size=32)
    spec = RequestSpec(0, 'a sign that says "spot"', 321, SCHEDULE, 0, RequestKind.ROLLOUT, 0)
    reference = denoise_lease(RolloutEngine(build_policy(model)), _lease(spec)).output
    policies = [build_policy(model) for _ in range(2)]
    host = RendezvousHost("127.0.0.1")
    members = group_memberships(host.address, "qwen", 2, timeout_s=60)

    def rank_main(rank: int):
        group = SPRolloutGroup(policies[rank], members[rank])
        outcome = denoise_lease(RolloutEngine(policies[rank]), _lease(spec), lambda: group.any(False), decode=group.leader)
        group.close()
        return outcome

    leader, follower = _in_threads(2, rank_main)
    assert follower.output is None
    _assert_close(leader.output, reference)
    host.close()


def test_a_degree_that_does_not_split_the_model_is_refused_at_start_up_naming_the_key(cfg):
    check_sp_degree(cfg.model, 4)
    with pytest.raises(ValueError, match=r"elastic\.sp_degree=3 must divide model\.num_attention_heads=4"):
        check_sp_degree(cfg.model, 3)
    with pytest.raises(ValueError, match=r"SPMembership.rank must be in \[0, size=2\), got 2"):
        SPMembership(RendezvousHost("127.0.0.1").address, "x", 2, 2)


# ------------------------------------------------------------------------------------------
# tier 3: RolloutWorker actors


@pytest.fixture(scope="module")
def ray_cluster(cfg, tmp_path_factory):
    ray = pytest.importorskip("ray")
    from roll_spotlight.runtime.ray_backend import RayClusterConfig, init_ray

    init_ray(RayClusterConfig(num_cpus=2, ondemand_workers=4, spot_workers=6))
    path = save_random_policy(cfg, tmp_path_factory.mktemp("sp") / "policy.pt", seed=5)
    yield ray, path
    ray.shutdown()


@pytest.mark.ray
def test_ray_backend_sp_groups_serve_the_queue_as_one_worker_each(cfg, ray_cluster, tmp_path):
    from roll_spotlight.config.elastic import ElasticConfig
    from roll_spotlight.runtime.ray_backend import RayBackend, RayClusterConfig

    ray, path = ray_cluster
    backend = RayBackend(cfg, path, RayClusterConfig(ondemand_workers=4, elastic=ElasticConfig(sp_degree=2)))
    try:
        specs = [_spec(seed=777 + i) for i in range(4)]
        outputs = backend.rollouts(specs)
        for worker in backend.workers.values():
            worker.stop.remote()
        stats = dict(zip(backend.serving, ray.get(list(backend.serving.values()))))  # counters once serve() ended
    finally:
        backend.close()
    single = RolloutEngine(random_policy(cfg, seed=5))
    for spec, out in zip(specs, outputs):
        _assert_close(out, denoise_lease(single, _lease(spec)).output)
    leaders, followers = ("ondemand-0", "ondemand-2"), ("ondemand-1", "ondemand-3")
    assert sum(stats[n]["completed"] for n in leaders) == 4
    assert all(stats[n]["completed"] == 0 and stats[n]["sp_size"] == 2 for n in followers)
    assert [stats[f]["steps"] for f in followers] == [stats[n]["steps"] for n in leaders], \
        "every follower ran each of its leader's steps"


def _store_and_queue(cfg, lease_s: float = 60.0):
    """The weight store with version 0 (the reference weights) and a queue actor."""
    from roll_spotlight.dispatch import QueueConfig
    from roll_spotlight.dispatch.queue_actor import create_queue_actor
    from roll_spotlight.weights import WeightStore

    store = WeightStore.create(keep=1)
    store.publish(0, random_policy(cfg, seed=5).state_dict())
    return store, create_queue_actor(QueueConfig(lease_s=lease_s))


def _group_actors(path, queue, store, host, name: str, size: int, hold_rank: int) -> list:
    """``size`` RolloutWorker actors ``name-r`` forming one group known to the queue as ``name-0``;
    rank ``hold_rank`` parks after step 3."""
    from roll_spotlight.runtime.actors import ONDEMAND
    from roll_spotlight.worker.actor import RolloutWorker

    members = group_memberships(host.address, f"{name}#1", size, timeout_s=60)
    return [RolloutWorker.options(resources={ONDEMAND: 1}).remote(
        f"{name}-{r}", str(path), queue, store, sp=members[r], group_name=f"{name}-0",
        faults=FaultPlan(hold_at_step=3) if r == hold_rank else None) for r in range(size)]


def _group_noticed_at_step_3(ray, path, queue, store, host, name: str, size: int, hold_rank: int):
    """A group of ``size`` actors serves one request; rank ``hold_rank`` gets a notice at step 3.
    Returns the actors and every member's counters once ``serve()`` ended."""
    actors = _group_actors(path, queue, store, host, name, size, hold_rank)
    serving = [w.serve.remote() for w in actors]
    ray.get(queue.submit.remote([_spec()]))
    assert ray.get(actors[hold_rank].wait_held.remote(60)), f"rank {hold_rank} never reached step 3"
    actors[hold_rank].notify_preemption.remote(5.0)
    return actors, ray.get(serving, timeout=60)


def _wait_for_completion(ray, queue, tick=lambda: None, timeout_s: float = 60.0):
    """The queue's one completion, polled until ``timeout_s`` (``tick`` runs between polls)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done := ray.get(queue.take_results.remote()):
            (completion,) = done
            return completion
        tick()
        time.sleep(0.02)
    raise AssertionError(f"no completion within {timeout_s} s")


@pytest.mark.ray
def test_a_notice_to_a_follower_actor_commits_the_lease_and_another_worker_resumes_it(cfg, ray_cluster, reference):
    from roll_spotlight.runtime.actors import ONDEMAND
    from roll_spotlight.worker.actor import RolloutWorker

    ray, path = ray_cluster
    store, queue = _store_and_queue(cfg)
    host = RendezvousHost("127.0.0.1")
    group, (leader_stats, follower_stats) = _group_noticed_at_step_3(ray, path, queue, store, host, "g", 2,
                                                                     hold_rank=1)
    assert (leader_stats["committed"], leader_stats["completed"], leader_stats["steps"]) == (1, 0, 3)
    assert (follower_stats["committed"], follower_stats["steps"]) == (0, 3)
    solo = RolloutWorker.options(resources={ONDEMAND: 1}).remote("solo", str(path), queue, store)
    solo_serving = solo.serve.remote()
    completion = _wait_for_completion(ray, queue)
    solo.stop.remote()
    ray.get(solo_serving, timeout=60)
    assert completion.worker == "solo" and completion.output.resumed_from == 3
    assert np.abs(completion.output.latents - reference.latents).max() < TOL
    stats = ray.get(queue.stats.remote())
    assert (stats.commits, stats.resumed_from_commit) == (1, 1)
    for worker in [*group, solo]:
        ray.kill(worker, no_restart=True)  # their ondemand_gpu units go back to the module's cluster
    host.close()


def _spot_pool(cfg, path, queue, store, rows, *, degree: int, hold: dict[str, int], no_notice: bool = False,
               min_degree: int = 1, inbox=None, hold_kind: str = "hold_at_step", timeout_s: float = 60.0):
    """An elastic spot pool of 2-GPU nodes (`rows`: the trace) whose workers form SP groups of up
    to ``degree``; ``hold`` parks a node's workers after that step (node id -> step; ``hold_kind``
    "hold_at_micro_batch": after that many training rounds, `worker.faults`); ``inbox``: queue
    training."""
    from roll_spotlight.spot_pool.training_pool import elastic_groups_config
    from roll_spotlight.spot_pool.ray_nodes import RayWorkerLauncher
    from roll_spotlight.spot import EventList, MarketConfig, SpotMarket, Trace
    from roll_spotlight.spot_pool.pool import ElasticSpotPool, SpotPoolConfig
    from roll_spotlight.spot.market import MarketSchedule

    trace = Trace(name="nodes", kind="events", measures="running", provider="aws",
                  zones={"z": EventList(tuple(rows), 0.0, 200.0)}, gpu_type="V100")
    elastic = elastic_groups_config(cfg.model, degree, timeout_s=timeout_s, cuda=False, min_degree=min_degree)
    launcher = RayWorkerLauncher(path if isinstance(path, dict) else str(path), queue, store, gpus_per_node=2,
                                 elastic=elastic, inbox=inbox,
                                 worker_kwargs=lambda node: {"faults": FaultPlan(**{hold_kind: hold[node]})}
                                 if node in hold else {})
    market = SpotMarket(trace, MarketConfig(notice_s=10.0))
    config = SpotPoolConfig(gpus_per_node=2, no_notice=no_notice)
    return launcher, ElasticSpotPool(MarketSchedule(market), launcher, config=config)


def _degrees(launcher) -> list[int]:
    return sorted(g.degree for g in launcher.groups.plan.groups)


def _held(ray, launcher, node: str) -> None:
    for worker in launcher.nodes[f"spot-{node}"]:
        assert ray.get(launcher.workers[worker].wait_held.remote(60)), f"{worker} never parked"


@pytest.mark.ray
def test_spot_nodes_form_groups_and_a_notice_regroups_the_survivors_4_2_4(cfg, ray_cluster, reference):
    """SP 4 over two 2-GPU nodes; node b's notice mid-rollout (step 3) makes the group commit and
    node a's survivors re-form SP 2 and resume; node c's arrival re-forms SP 4 (a's group commits
    at step 4), which finishes the lease: the output equals the uninterrupted single-worker run
    bit for bit (CPU)."""
    from roll_spotlight.elastic.transfer import TransferSource
    from roll_spotlight.spot_pool.training_pool import regroup_metrics
    from roll_spotlight.spot import NodeEvent

    ray, path = ray_cluster
    store, queue = _store_and_queue(cfg)
    rows = (NodeEvent(0.0, "add", "a"), NodeEvent(0.0, "add", "b"), NodeEvent(95.0, "add", "c"),
            NodeEvent(100.0, "remove", "b"))
    launcher, pool = _spot_pool(cfg, path, queue, store, rows, degree=4, hold={"z/a": 4, "z/b": 3})
    pool.poll(0.0)
    assert launcher.wait_ready(180) and _degrees(launcher) == [4], "one group of 4 across nodes a and b"
    ray.get(queue.submit.remote([_spec()]))
    _held(ray, launcher, "z/b")
    pool.poll(95.0)  # b's notice (due at 90): SP 4 commits at step 3, a re-forms SP 2; c starts
    assert _degrees(launcher) == [2] and pool.stats.notices == 1
    _held(ray, launcher, "z/a")  # the SP 2 group ran step 4 of the lease
    assert launcher.wait_ready(180) and _degrees(launcher) == [4], "c's arrival re-formed a group of 4"
    completion = _wait_for_completion(ray, queue, tick=lambda: pool.poll(95.0))
    pool.poll(100.0)  # b goes down after its notice: nothing lost, nothing requeued
    assert completion.output.resumed_from == 4
    assert np.array_equal(completion.output.latents, reference.latents)
    assert np.array_equal(completion.output.log_probs, reference.log_probs)
    stats = ray.get(queue.stats.remote())
    assert (stats.commits, stats.resumed_from_commit) == (2, 2)
    assert (pool.stats.preemptions, pool.stats.steps_lost, pool.stats.leases_requeued) == (1, 0, 0)
    lost = [r for r in launcher.regroups if r.lost]
    assert [len(r.lost) for r in lost] == [2]
    c_sources = [s for r in launcher.regroups for m, s in r.sources.items() if m[0] == "z/c"]
    assert c_sources == [TransferSource.REMOTE_PEER, TransferSource.SAME_NODE_PEER], \
        "c's first worker copies from a peer on another node, its second from the first"
    metrics = regroup_metrics(launcher.regroups)
    assert (metrics["spot/regroups_after_loss"], metrics["spot/newcomer_weights_same_node_peer"]) == (1, 3)
    assert 0 < metrics["spot/regroup_s_per_loss"] <= metrics["spot/regroup_s_max"]
    pool.close(100.0)


@pytest.mark.ray
def test_survivors_below_the_minimum_degree_wait_for_a_newcomer_and_resume_together(cfg, ray_cluster, reference):
    """elastic min degree 4: after b's notice a's two workers cannot run alone, so they wait (no
    group) and the committed lease waits in the queue; c's arrival forms a group of 4 with them
    that resumes it, bit for bit."""
    from roll_spotlight.spot import NodeEvent

    ray, path = ray_cluster
    store, queue = _store_and_queue(cfg)
    rows = (NodeEvent(0.0, "add", "a"), NodeEvent(0.0, "add", "b"), NodeEvent(95.0, "add", "c"),
            NodeEvent(100.0, "remove", "b"))
    launcher, pool = _spot_pool(cfg, path, queue, store, rows, degree=4, hold={"z/b": 3}, min_degree=4)
    pool.poll(0.0)
    assert launcher.wait_ready(180) and _degrees(launcher) == [4]
    ray.get(queue.submit.remote([_spec()]))
    _held(ray, launcher, "z/b")
    pool.poll(95.0)  # b's notice: the group commits at step 3; a cannot form a group alone
    assert launcher.groups.plan.groups == () and launcher.groups.plan.idle == (("z/a", 0), ("z/a", 1))
    assert ray.get(queue.counts.remote()) == (1, 0), "the committed lease waits for a group"
    assert launcher.wait_ready(180) and _degrees(launcher) == [4], "c and a merged into a group of 4"
    completion = _wait_for_completion(ray, queue, tick=lambda: pool.poll(95.0))
    pool.poll(100.0)
    assert completion.output.resumed_from == 3
    assert np.array_equal(completion.output.latents, reference.latents)
    pool.close(100.0)


@pytest.mark.ray
def test_a_kill_without_notice_breaks_the_group_and_its_lease_goes_back_to_the_queue(cfg, ray_cluster):
    from roll_spotlight.spot import NodeEvent

    ray, path = ray_cluster
    # the lease outlives the survivors' wait for their dead peers (the group's timeout), so it is
    # still the broken group's when the regroup hands it back
    store, queue = _store_and_queue(cfg, lease_s=600.0)
    rows = (NodeEvent(0.0, "add", "a"), NodeEvent(0.0, "add", "b"), NodeEvent(100.0, "remove", "b"))
    launcher, pool = _spot_pool(cfg, path, queue, store, rows, degree=4, hold={"z/a": 3}, no_notice=True,
                                timeout_s=20.0)
    pool.poll(0.0)
    assert launcher.wait_ready(180) and _degrees(launcher) == [4]
    ray.get(queue.submit.remote([_spec()]))
    _held(ray, launcher, "z/a")
    pool.poll(100.0)  # b is killed with no notice: the group breaks, a re-forms SP 2
    # Handed back exactly once: requeued by the kill, or committed by a's members when they leave
    # the broken group first (ray.kill is asynchronous, so either may come first).
    commits = ray.get(queue.stats.remote()).commits
    assert pool.stats.preemptions == 1 and pool.stats.leases_requeued + commits == 1
    assert _degrees(launcher) == [2] and launcher.regroups[-1].broken
    assert ray.get(queue.counts.remote())[0] == 1, "the lease is pending again"
    pool.close(100.0)


@pytest.mark.slow
def test_sp_rollout_benchmark_reports_sharded_tokens_and_equal_outputs():
    import json
    import subprocess
    import sys

    from tests.runtime_helpers import REPO

    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "sp_rollout.py"), "--json", "--degrees", "1", "2",
                          "--image-size", "16", "--steps", "2", "--requests", "1", "--repeats", "1"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    result = json.loads(out)
    assert result["image_tokens"] == 64
    assert [result["degrees"][d]["image_tokens_per_rank"] for d in ("1", "2")] == [[64], [32]]
    assert result["degrees"]["2"]["max_abs_diff_latents"] < TOL and result["degrees"]["2"]["rollout_median_s"] > 0


@pytest.mark.ray
def test_survivors_of_a_notice_re_form_a_smaller_group_in_place_and_resume_the_committed_lease(
        cfg, ray_cluster, reference):
    """A group of 4 workers: member 3 gets a notice at step 3, the group commits; two survivors
    form a degree-2 group under a fresh prefix (same processes, weights kept: no second fetch) and
    finish the lease from step 3 with the same result as an uninterrupted rollout."""
    ray, path = ray_cluster
    store, queue = _store_and_queue(cfg)
    host = RendezvousHost("127.0.0.1")
    workers, counters = _group_noticed_at_step_3(ray, path, queue, store, host, "w", 4, hold_rank=3)
    assert [c["committed"] for c in counters] == [1, 0, 0, 0] and all(c["steps"] == 3 for c in counters)
    second = group_memberships(host.address, "w#2", 2, timeout_s=60)  # a fresh prefix: no stale keys
    # a re-formed group is a new queue identity: the notice recorded for "w-0" keeps refusing it leases
    serving = [workers[r].serve.remote(sp=second[r], group_name="w-0#2") for r in range(2)]
    completion = _wait_for_completion(ray, queue)
    for w in workers[:2]:
        w.stop.remote()
    counters = ray.get(serving, timeout=60)
    assert completion.worker == "w-0#2" and completion.output.resumed_from == 3
    assert np.abs(completion.output.latents - reference.latents).max() < TOL
    assert np.abs(completion.output.log_probs - reference.log_probs).max() < TOL
    assert [c["sp_size"] for c in counters] == [2, 2]
    assert [c["weight_fetches"] for c in counters] == [1, 1], "the survivors kept their weights"
    assert [c["steps"] for c in counters] == [3 + SCHEDULE.num_steps - 3] * 2
    for w in workers:
        ray.kill(w, no_restart=True)
    host.close()


@pytest.mark.ray
def test_an_elastic_group_losing_a_node_mid_rollout_goes_4_2_4_and_ends_bit_identical(cfg, ray_cluster, reference):
    """elastic.groups on the live workers: a group of 4 on two 2-GPU nodes; node n1 gets a notice
    at step 2 (the group commits), the two survivors re-form at degree 2 in place and resume the
    lease; at step 4 two newcomers on node n2 take the weights from peers and the group merges
    back to 4, which finishes the rollout. The output equals the single-worker run bit for bit."""
    from roll_spotlight.elastic.groups import ElasticGroups, ElasticGroupsConfig
    from roll_spotlight.elastic.transfer import TransferSource
    from roll_spotlight.runtime.actors import ONDEMAND, SPOT
    from roll_spotlight.worker.actor import RolloutWorker

    ray, path = ray_cluster
    store, queue = _store_and_queue(cfg)
    host = RendezvousHost("127.0.0.1")
    holds = {("n1", 1): 2, ("n0", 1): 4}  # parked after these steps, until a notice or a leave
    members = [("n0", 0), ("n0", 1), ("n1", 0), ("n1", 1)]
    first = {m: RolloutWorker.options(resources={ONDEMAND: 1}).remote(
        f"{m[0]}-{m[1]}", str(path), queue, store, faults=FaultPlan(hold_at_step=holds.get(m))) for m in members}
    groups = ElasticGroups(ElasticGroupsConfig(num_heads=4, preferred_degree=4, name="t424"), host, queue)
    groups.add(first)
    assert groups.regroup().formed == ("gen0/t424/sp0",)
    ray.get(queue.submit.remote([_spec()]))
    assert ray.get(first[("n1", 1)].wait_held.remote(60)), "the group of 4 never reached step 2"
    lost = [("n1", 0), ("n1", 1)]
    groups.notice(lost, 5.0)  # node n1 is preempted: the group commits after step 2
    shrink = groups.regroup(lost=lost)
    assert [g.members for g in groups.plan.groups] == [(("n0", 0), ("n0", 1))] and shrink.broken == ()
    for member in lost:
        ray.kill(first[member], no_restart=True)
    assert ray.get(first[("n0", 1)].wait_held.remote(60)), "the degree-2 group never reached step 4"
    newcomers = {("n2", g): RolloutWorker.options(resources={SPOT: 1}).remote(
        f"n2-{g}", str(path), queue, store) for g in range(2)}
    grow = groups.regroup(newcomers=newcomers)  # the degree-2 group commits at step 4, then 4 form
    assert dict(grow.sources) == {("n2", 0): TransferSource.REMOTE_PEER, ("n2", 1): TransferSource.SAME_NODE_PEER}
    completion = _wait_for_completion(ray, queue)
    counters = groups.stop()
    assert completion.worker == grow.formed[0] and completion.output.resumed_from == 4
    assert np.array_equal(completion.output.latents, reference.latents)
    assert np.array_equal(completion.output.log_probs, reference.log_probs)
    joins = [e["size"] for e in ray.get(first[("n0", 0)].timeline.remote()) if e["phase"] == "sp_join"]
    assert joins == [4, 2, 4]
    assert [counters[m]["weight_fetches"] for m in members[:2]] == [1, 1], "survivors kept their weights"
    assert [(counters[m]["weight_fetches"], counters[m]["peer_weight_copies"]) for m in newcomers] == [(0, 1)] * 2
    assert ray.get(queue.stats.remote()).commits == 2
    for worker in [first[m] for m in members[:2]] + list(newcomers.values()):
        ray.kill(worker, no_restart=True)
    host.close()


# ------------------------------------------------------------------------------------------
# training micro-batches: an SP group's ranks train data-parallel (runtime.queue_training)


def _train_leases(work, holder: str = "g") -> list[Lease]:
    """One lease per micro-batch of ``work``, in plan order."""
    return [Lease(i, Request.from_spec(i, RequestSpec.train(mb, work.schedule, work.weight_version, work.iteration)),
                  holder, float("inf"), None, 1) for i, mb in enumerate(work.micro_batches)]


@pytest.mark.parametrize("notice_after_round", [None, 1])
def test_a_group_trains_its_leases_data_parallel_and_the_leader_holds_the_group_sum(notice_after_round):
    """Two ranks split five micro-batches in rounds (0|1, 2|3, 4|-) and the leader ends with one
    sum equal to the one-trainer sum of the same micro-batches within the tolerance of
    tests/test_queue_training.py; a notice to rank 1 after round 1 ends both ranks' sums there,
    and the leader's sum covers exactly that round's two micro-batches."""
    import copy

    from roll_spotlight.worker.compute import group_sum, trained_parameters
    from roll_spotlight.training.grpo import GRPOLoss, trainable_parameters
    from roll_spotlight.training.micro_batches import compute_sum
    from tests.test_queue_training import ATOL, RTOL, lora_config, named_trained, trainer_and_work

    cfg = lora_config()
    trainer, work = trainer_and_work(cfg)
    leases = _train_leases(work)[:5]
    assert len(leases) == 5
    policies = [copy.deepcopy(trainer.policy) for _ in range(2)]
    host = RendezvousHost("127.0.0.1")
    members = group_memberships(host.address, f"train{notice_after_round}", 2, timeout_s=60)

    def rank_main(rank: int):
        policy = policies[rank]
        group = SPRolloutGroup(policy, members[rank])
        params = trained_parameters(policy, trainable_parameters(policy, cfg.train.trainable))
        rounds = iter(range(1, 100))
        notice = lambda: rank == 1 and notice_after_round is not None and next(rounds) == notice_after_round  # noqa: E731
        micro_batches = [lease.request.micro_batch for lease in leases]
        out = group_sum(GRPOLoss(policy, cfg.train), params, work, micro_batches, group, "g-0", notice)
        group.close()
        return out

    (finished, total), (follower_finished, nothing) = _in_threads(2, rank_main)
    expected = 5 if notice_after_round is None else 2
    assert finished == follower_finished == expected and nothing is None
    indices = tuple(lease.request.micro_batch.index for lease in leases[:expected])
    assert total.worker == "g-0" and total.indices == indices
    one = compute_sum(trainer.loss, named_trained(trainer), work, [work.micro_batches[i] for i in indices], "one")
    assert set(total.grads) == set(one.grads) and len(one.grads) > 0
    for name, grad in one.grads.items():
        np.testing.assert_allclose(total.grads[name], grad, rtol=RTOL, atol=ATOL)
    assert total.totals["loss"] == pytest.approx(one.totals["loss"], rel=RTOL, abs=ATOL)
    assert all(not is_ulysses_applied(p.transformer) for p in policies), "the group left its policies unsharded"
    host.close()


@pytest.mark.ray
@pytest.mark.slow
def test_a_group_of_workers_trains_an_update_across_a_notice_like_one_trainer(ray_cluster, tmp_path):
    """A group of two RolloutWorker actors pulls TRAIN leases (dispatch.pull_batch=2, topped up to
    two per rank): rank 1 parks after round 1 and gets a notice, so the leader reports that
    round's two micro-batches as one sum and hands the other two back; a solo worker computes
    everything else. The update equals the one-trainer update within the tolerance."""
    from roll_spotlight.dispatch import QueueConfig
    from roll_spotlight.dispatch.queue_actor import create_queue_actor
    from roll_spotlight.models import save_policy
    from roll_spotlight.runtime.actors import ONDEMAND, SPOT
    from roll_spotlight.worker.actor import RolloutWorker
    from roll_spotlight.worker.compute import ModelCompute
    from roll_spotlight.worker.policy_source import policy_setup, policy_source, prepare_policy
    from roll_spotlight.runtime.queue_training import QueueTraining, create_inbox
    from roll_spotlight.training.grpo import FlowGRPOTrainer
    from roll_spotlight.weights import WeightStore
    from tests.test_queue_training import ATOL, RTOL, _reference_step, lora_config, trainer_and_work

    ray, _ = ray_cluster
    cfg = lora_config()
    _, work = trainer_and_work(cfg)
    expected, _ = _reference_step(cfg, work)
    policy = prepare_policy(random_policy(cfg), policy_setup(cfg))
    save_policy(random_policy(cfg), tmp_path / "base.pt")
    source = policy_source(cfg.model, str(tmp_path / "base.pt"), policy_setup(cfg))
    queue = create_queue_actor(QueueConfig(pull_batch=2, lease_s=600.0))
    inbox = create_inbox(queue)
    store = WeightStore.create()
    store.publish(0, policy.published_state())
    host = RendezvousHost("127.0.0.1")
    members = group_memberships(host.address, "gt#1", 2, timeout_s=60)
    group = [RolloutWorker.options(resources={SPOT: 1}).remote(
        f"g-{r}", source, queue, store, sp=members[r], group_name="g-0", inbox=inbox,
        faults=FaultPlan(hold_at_micro_batch=1) if r == 1 else None) for r in range(2)]
    serving = [w.serve.remote() for w in group]
    trainer = FlowGRPOTrainer(policy, cfg.train)
    updates = QueueTraining(queue, inbox, ModelCompute(policy, version=0), pulls=False)
    result = {}
    update = threading.Thread(target=lambda: result.update(done=trainer.step(work.batch, updates.update(0, work.schedule))))
    update.start()
    assert ray.get(group[1].wait_held.remote(120.0)), "the group never finished its first round"
    group[1].notify_preemption.remote(30.0)
    leader, follower = ray.get(serving, timeout=120)
    solo = RolloutWorker.options(resources={ONDEMAND: 1}).remote("solo", source, queue, store, inbox=inbox)
    solo_serving = solo.serve.remote()
    update.join(timeout=300)
    assert not update.is_alive(), "the update never finished"
    solo.stop.remote()
    ray.get(solo_serving, timeout=60)

    m = len(work.micro_batches)
    assert (leader["micro_batches"], leader["micro_batches_released"]) == (2, 2)
    assert follower["micro_batches"] == 0, "the leader reports for the group"
    follower_train = [e for e in ray.get(group[1].timeline.remote()) if e["phase"] == "train"]
    assert [e["micro_batches"] for e in follower_train] == [2], "rank 1 took part in the group's round"
    assert {w: n for w, (n, _) in result["done"].contributions.by_worker.items()} == {"g-0": 2, "solo": m - 2}
    for name, tensor in policy.published_state().items():
        torch.testing.assert_close(tensor, expected[name], rtol=RTOL, atol=ATOL)
    for worker in [*group, solo]:
        ray.kill(worker, no_restart=True)
    host.close()


@pytest.mark.ray
@pytest.mark.slow
def test_a_member_killed_without_notice_mid_sum_breaks_the_group_and_nothing_is_lost(ray_cluster, tmp_path):
    """SP 4 over two 2-GPU spot nodes trains an update (dispatch.pull_batch=2: eight leases, two
    rounds); node a's workers park after round 1 and node b is killed without notice: the group
    breaks, its eight leases go back to the queue and its partial sums die with it; a's survivors
    re-form SP 2 and train every micro-batch. The update equals the one-trainer update."""
    from roll_spotlight.dispatch import QueueConfig
    from roll_spotlight.dispatch.queue_actor import create_queue_actor
    from roll_spotlight.models import save_policy
    from roll_spotlight.worker.compute import ModelCompute
    from roll_spotlight.worker.policy_source import policy_setup, policy_source, prepare_policy
    from roll_spotlight.runtime.queue_training import QueueTraining, create_inbox
    from roll_spotlight.spot import NodeEvent
    from roll_spotlight.training.grpo import FlowGRPOTrainer
    from roll_spotlight.weights import WeightStore
    from tests.test_queue_training import ATOL, RTOL, _reference_step, lora_config, trainer_and_work

    ray, _ = ray_cluster
    cfg = lora_config()
    _, work = trainer_and_work(cfg)
    expected, _ = _reference_step(cfg, work)
    policy = prepare_policy(random_policy(cfg), policy_setup(cfg))
    save_policy(random_policy(cfg), tmp_path / "base.pt")
    source = policy_source(cfg.model, str(tmp_path / "base.pt"), policy_setup(cfg))
    queue = create_queue_actor(QueueConfig(pull_batch=2, lease_s=600.0))
    inbox = create_inbox(queue)
    store = WeightStore.create()
    store.publish(0, policy.published_state())
    rows = (NodeEvent(0.0, "add", "a"), NodeEvent(0.0, "add", "b"), NodeEvent(100.0, "remove", "b"))
    launcher, pool = _spot_pool(cfg, source, queue, store, rows, degree=4, hold={"z/a": 1}, no_notice=True,
                                inbox=inbox, hold_kind="hold_at_micro_batch")
    pool.poll(0.0)
    assert launcher.wait_ready(180) and _degrees(launcher) == [4]
    trainer = FlowGRPOTrainer(policy, cfg.train)
    updates = QueueTraining(queue, inbox, ModelCompute(policy, version=0), pulls=False)
    result = {}
    update = threading.Thread(target=lambda: result.update(done=trainer.step(work.batch, updates.update(0, work.schedule))))
    update.start()
    _held(ray, launcher, "z/a")  # the group of 4 finished round 1 of its eight leases
    pool.poll(100.0)  # b is killed with no notice: the group breaks, a re-forms SP 2
    assert pool.stats.leases_requeued == 8 and launcher.regroups[-1].broken
    assert _degrees(launcher) == [2]
    update.join(timeout=300)
    assert not update.is_alive(), "the update never finished"
    survivors = launcher.regroups[-1].formed
    by_worker = {w: n for w, (n, _) in result["done"].contributions.by_worker.items()}
    assert set(by_worker) == set(survivors)
    assert sum(by_worker.values()) == len(work.micro_batches)
    assert ray.get(inbox.stats.remote()).get("reports_refused", 0) == 0
    for name, tensor in policy.published_state().items():
        torch.testing.assert_close(tensor, expected[name], rtol=RTOL, atol=ATOL)
    pool.close(100.0)
