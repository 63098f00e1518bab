"""Persistent SP workers on a local Ray cluster: losses, newcomers and notices mid-rollout.

One module-scoped story runs on five worker actors on fake node "a" (a pool of four and a newcomer
that starts with other random weights); the tests check its pieces. Failures are injected
deterministically from the controller's step hook (kill two members right after step 2 was
dispatched; a preemption notice at step 3), and every final latent is compared with a
failure-free run. The collective (gloo/NCCL broadcast) transfer and the remote-peer choice are
covered without Ray in test_elastic_transfer.py, which keeps this file to five actors.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from roll_spotlight.elastic.controller import ControllerConfig, ElasticController, WorkerState  # noqa: E402
from roll_spotlight.elastic.model_spec import QwenModelSpec  # noqa: E402
from roll_spotlight.elastic.rollout import RolloutRequest, denoise, start_state  # noqa: E402
from roll_spotlight.elastic.transfer import TransferPlan, TransferSource  # noqa: E402
from roll_spotlight.elastic.workers import WorkerConfig, spawn_worker  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.dist, pytest.mark.slow]

SPEC = QwenModelSpec()  # 4 heads, Qwen-like shapes, 1.3 M parameters


def _request() -> RolloutRequest:
    rng = np.random.default_rng(0)
    mask = np.array([1] * 6 + [0] * 2)
    embeds = rng.standard_normal((8, SPEC.joint_attention_dim)).astype(np.float32)
    return RolloutRequest("r0", seed=123, prompt_embeds=embeds, prompt_mask=mask, grid=(8, 8),
                          channels=SPEC.in_channels, num_steps=6)


def _kill_at(step: int, controller: ElasticController, victims: slice):
    def hook(at: int, group) -> None:
        if at == step and group.degree == 4:
            for member in group.members[victims]:
                ray.kill(controller.handles[member])
    return hook


@pytest.fixture(scope="module")
def story():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", object_store_memory=160 << 20)
    try:
        yield _run_story()
    finally:
        ray.shutdown()


def _run_story() -> dict:
    request = _request()
    pool = [spawn_worker(WorkerConfig(gpu=g, model=SPEC, node="a")) for g in range(4)]
    newcomer = spawn_worker(WorkerConfig(gpu=4, model=dataclasses.replace(SPEC, init_seed=1), node="a"))
    controller = ElasticController(ControllerConfig(num_heads=4, preferred_degree=4))
    controller.add_workers(pool)
    out: dict = {"request": request, "controller": controller}
    out["uninterrupted"] = controller.run_rollout(request)
    out["killed"] = controller.run_rollout(request, step_hook=_kill_at(2, controller, slice(2, 4)))
    out["checksums_before"] = ray.get([newcomer.checksum.remote(), pool[0].checksum.remote()])
    out["standby"] = controller.standby([newcomer])  # known (and store-connected) before it is needed
    out["standby_state"] = controller.states[("a", 4)]
    out["admit"] = controller.admit([newcomer])
    out["checksum_after"] = ray.get(newcomer.checksum.remote())
    out["plan_after_admit"] = controller.plan
    # A notice for ("a", 1) at step 3: the newcomer replaces it for steps 4 and 5.
    notice = lambda at, group: controller.notify_preemption([("a", 1)]) if at == 3 else None  # noqa: E731
    out["noticed"] = controller.run_rollout(request, step_hook=notice)
    out["plan_after_notice"] = controller.plan
    # The newcomer's weights are views of a:0's published object. Kill a:0 (its owner), churn the
    # object store so freed memory would be reused, and the newcomer must still hold those weights.
    ray.kill(pool[0])
    controller.remove([("a", 0)])
    controller.regroup()
    for i in range(6):  # 64 MB each in a 160 MB store: freed memory is handed out again
        ref = ray.put(np.full(16 << 20, i, dtype=np.float32))
        del ref
    out["checksum_after_owner_died"] = ray.get(newcomer.checksum.remote())
    out["alone"] = controller.run_rollout(request)
    out["reference"] = denoise(SPEC.build(), request, start_state(request), request.num_steps)
    return out


def _max_diff(a, b) -> float:
    return float(np.abs(a.state.latent - b.state.latent).max())


def test_uninterrupted_degree_four_equals_single_process(story) -> None:
    run = story["uninterrupted"]
    assert run.degrees == [4] * 6 and not run.lost
    diff = float(np.abs(run.state.latent - story["reference"].latent).max())
    print(f"degree-4 rollout vs SP=1: max abs diff {diff:.3e}")
    assert diff < 1e-5


def test_losing_two_of_four_continues_at_degree_two_with_the_same_latent(story) -> None:
    run = story["killed"]
    assert run.degrees == [4, 4, 2, 2, 2, 2], "step 2 is redone by the survivors at degree 2"
    assert sorted(run.lost) == [("a", 2), ("a", 3)]
    assert len(run.regroups) == 1 and run.regroups[0].moves == 0
    assert run.state.step == 6
    diff = _max_diff(run, story["uninterrupted"])
    print(f"killed-at-step-2 rollout vs uninterrupted: max abs diff {diff:.3e}")
    assert diff < 1e-6


def test_newcomer_copies_weights_from_a_same_node_peer(story) -> None:
    assert story["standby"] == [("a", 4)] and story["standby_state"] is WorkerState.STANDBY
    assert story["controller"].states[("a", 4)] is WorkerState.ACTIVE
    assert story["admit"] == {("a", 4): TransferPlan(TransferSource.SAME_NODE_PEER, "a:0")}
    before, peer = story["checksums_before"]
    assert before != peer, "the newcomer starts with other weights"
    assert story["checksum_after"] == peer
    assert story["checksum_after_owner_died"] == peer, "shared weights outlive the peer that published them"
    groups = {g.members for g in story["plan_after_admit"].groups}
    assert groups == {(("a", 0), ("a", 1)), (("a", 4),)}, "3 GPUs with 4 heads: degrees 2 + 1, survivors kept"


def test_preemption_notice_drains_at_the_boundary_and_the_newcomer_takes_over(story) -> None:
    run = story["noticed"]
    assert run.lost == [("a", 1)]
    assert run.degrees == [2] * 6, "the noticed worker finishes its in-flight step, then (a0, a4) go on"
    assert [g.members for g in story["plan_after_notice"].groups] == [(("a", 0), ("a", 4))]
    assert run.regroups[0].moves == 1
    diff = _max_diff(run, story["uninterrupted"])
    print(f"rollout finished on the newcomer's copied weights vs uninterrupted: max abs diff {diff:.3e}")
    assert diff < 1e-6


def test_newcomer_on_shared_weights_runs_alone_after_the_publishing_peer_died(story) -> None:
    run = story["alone"]
    assert run.degrees == [1] * 6 and not run.lost
    diff = _max_diff(run, story["uninterrupted"])
    print(f"degree-1 rollout on weights shared from a dead peer vs uninterrupted: max abs diff {diff:.3e}")
    assert diff < 1e-5
