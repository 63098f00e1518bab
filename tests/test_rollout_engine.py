"""The batched rollout engine (worker.engine) and the worker loop around it: leases of one shape in
one forward per step, refills at step boundaries, a commit per row, and the determinism stated in
docs/design.md ("Determinism": bit for bit at max_batch 1, within engine.BATCHED_ATOL batched)."""

import numpy as np
import pytest
import torch

from roll_spotlight.dispatch import QueueConfig, RequestKind, RequestQueue, RequestSpec, Schedule
from roll_spotlight.dispatch.requests import Lease, Request
from roll_spotlight.worker.engine import BATCHED_ATOL, RolloutEngine, stack_outputs
from roll_spotlight.worker.loop import Signals, WorkerLoop, roll_out
from tests.runtime_helpers import denoise_lease, random_policy, tiny_config

SCHEDULE = Schedule(6, 0.7, "sde", 1, 4)
PROMPTS = ["two red circles", "a blue square", "three green triangles", "a circle"]


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    return random_policy(tiny_config(), seed=3)


def spec(i: int, schedule: Schedule = SCHEDULE, version: int = 0, kind=RequestKind.ROLLOUT) -> RequestSpec:
    return RequestSpec(i % len(PROMPTS), PROMPTS[i % len(PROMPTS)], 100 + i, schedule, version, kind, 0)


def lease(i: int, resume=None, **kw) -> Lease:
    return Lease(i, Request.from_spec(i, spec(i, **kw)), "w", float("inf"), resume, 1)


def same(a, b, atol: float = 0.0) -> bool:
    return bool(np.allclose(a.latents, b.latents, rtol=0, atol=atol)
                and np.allclose(a.log_probs, b.log_probs, rtol=0, atol=atol))


@pytest.fixture(scope="module")
def alone(policy):
    """Every request of the tests rolled out alone (max_batch 1)."""
    return roll_out(RolloutEngine(policy), [lease(i) for i in range(8)])


def test_max_batch_one_is_bit_for_bit_and_two_runs_agree(policy, alone):
    again = roll_out(RolloutEngine(policy), [lease(i) for i in range(8)])
    assert all(np.array_equal(a.latents, b.latents) and np.array_equal(a.image, b.image) for a, b in zip(alone, again))


@pytest.mark.parametrize("max_batch", [3, 8])
def test_a_batch_gives_every_request_its_own_rollout_within_tolerance(policy, alone, max_batch):
    batches = []
    hook = policy.transformer.register_forward_hook(lambda m, a, kw, out: batches.append(kw["hidden_states"].shape[0]),
                                                    with_kwargs=True)
    outputs = roll_out(RolloutEngine(policy, max_batch=max_batch), [lease(i) for i in range(8)])
    hook.remove()
    assert max(batches) == max_batch and len(batches) < 8 * SCHEDULE.num_steps
    assert [o.request_id for o in outputs] == list(range(8))
    for batched, solo in zip(outputs, alone):
        assert same(batched, solo, BATCHED_ATOL) and np.array_equal(batched.noised, solo.noised)


@pytest.mark.parametrize("max_batch", [1, 4])
def test_a_stop_commits_every_row_and_each_resumes_in_another_batch(policy, alone, max_batch):
    """A stop after step 2 commits all four rows, each its own in-flight state; resumed two by
    two beside fresh requests (step-level batching) each equals its uninterrupted rollout:
    bit for bit at max_batch 1, within the tolerance batched."""
    engine = RolloutEngine(policy, max_batch=max_batch)
    leases = [lease(i) for i in range(max_batch)]
    committed = engine.denoise_batch(leases, lambda report: None if min(report.running.values()) >= 2 else [])
    assert [c.state.step_index for _, c in committed] == [2] * max_batch
    assert [lease.request.request_id for lease, _ in committed] == list(range(max_batch))
    other = RolloutEngine(policy, max_batch=2)
    resumed = roll_out(other, [lease(i, resume=c.state) for i, (_, c) in enumerate(committed)])
    for i, out in enumerate(resumed):
        assert out.resumed_from == 2
        assert same(out, alone[i], BATCHED_ATOL if max_batch > 1 else 0.0)


def test_a_resumed_request_shares_a_forward_with_fresh_ones_and_frees_its_slot_first(policy, alone):
    part = denoise_lease(RolloutEngine(policy), lease(0), lambda: True)  # committed after step 1
    seen = []

    def at_boundary(report):
        seen.append(sorted(report.running.values()))
        return []

    RolloutEngine(policy, max_batch=2).denoise_batch([lease(0, resume=part.state), lease(1)], at_boundary)
    assert seen[0] == [1, 2] and seen[SCHEDULE.num_steps - 2] == [SCHEDULE.num_steps - 1]


def test_rollout_log_probs_equal_the_trainers_recompute_within_tolerance(policy):
    """Rolled out in one batch of 8, recomputed by the training path in micro-batches of 3."""
    from roll_spotlight.flow_grpo import recompute_log_probs

    outputs = roll_out(RolloutEngine(policy, max_batch=8), [lease(i) for i in range(8)])
    traj = stack_outputs(outputs, RolloutEngine(policy).sigmas(SCHEDULE.num_steps), 0.7, "sde")
    for rows in ([0, 1, 2], [7, 3]):
        sub = traj.select(rows)
        cond = policy.encode_prompts([PROMPTS[i % len(PROMPTS)] for i in rows])
        for k in range(*SCHEDULE.window):
            out = recompute_log_probs(lambda x, s: policy.velocity(x, s, cond), sub, k, noise_level=0.7)
            torch.testing.assert_close(out.log_prob.detach(), sub.log_probs[:, k], rtol=0, atol=BATCHED_ATOL)


def test_leases_of_different_shapes_are_refused_before_anything_runs(policy):
    calls = []
    hook = policy.transformer.register_forward_hook(lambda *a: calls.append(1))
    engine = RolloutEngine(policy, max_batch=4)
    for other, field in ((lease(1, version=2), "weight_version=2"), (lease(1, schedule=Schedule(8, 0.7)),
                                                                     "schedule.num_steps=8")):
        with pytest.raises(ValueError, match=f"different shapes.*{field}"):
            engine.denoise_batch([lease(0), other], lambda report: [])
        with pytest.raises(ValueError, match=field):
            roll_out(engine, [lease(0), lease(2), other])
    hook.remove()
    assert calls == []
    for bad in (0, 2.5, "4", True):
        with pytest.raises(ValueError, match="sampling.max_batch"):
            RolloutEngine(policy, max_batch=bad)


# ---- the worker loop: a batch of 8 leased, noticed mid-batch


class QueueClient:
    """`dispatch.queue_actor.QueueClient` over an in-process `RequestQueue`."""

    def __init__(self, queue: RequestQueue, worker: str) -> None:
        self.queue, self.worker = queue, worker

    def __getattr__(self, name):
        method = getattr(self.queue, name)
        return lambda *args, **kw: method(self.worker, *args, **kw)

    def pull_batch(self, n=None, kinds=None):
        return self.queue.pull(self.worker, n or 1, kinds=kinds)

    def complete_many(self, done):
        return self.queue.complete_many([lease.result(output) for lease, output in done])

    def complete_and_pull(self, done, n=None, kinds=None):
        return self.queue.complete_and_pull(self.worker, [lease.result(o) for lease, o in done], n or 1, kinds=kinds)

    def notify_preemption(self, seconds_left: float) -> None:
        self.queue.notify_preemption(self.worker, 0.0)  # gone at once: the queue leases it nothing more


def test_a_notice_mid_batch_commits_all_eight_rows_and_another_worker_finishes_them(policy, alone):
    queue = RequestQueue(QueueConfig(lease_s=600.0))
    queue.submit([spec(i) for i in range(8)])
    signals = Signals()

    def notice_at_step_3(kind: str, reached: int) -> None:
        if kind == "step" and reached == 3:
            loop.notice(60.0)

    compute = _Compute(policy, 8)
    loop = WorkerLoop(QueueClient(queue, "spot"), compute, signals=signals, on_progress=notice_at_step_3)
    counters = loop.serve()
    assert (counters["committed"], counters["completed"], counters["steps"]) == (8, 0, 24)
    assert compute.batches == [8] and loop.unsaved_steps() == 0
    finisher = WorkerLoop(QueueClient(queue, "ondemand"), _Compute(policy, 3))
    assert finisher.serve(idle=lambda: True)["completed"] == 8
    done = {c.request.request_id: c.output for c in queue.take_results()}
    assert sorted(done) == list(range(8)) and queue.stats().duplicate_completions == 0
    for i, out in done.items():
        assert out.resumed_from == 3 and same(out, alone[i], BATCHED_ATOL)


def test_free_slots_refill_from_the_queue_at_step_boundaries(policy, alone):
    queue = RequestQueue(QueueConfig(lease_s=600.0))
    queue.submit([spec(i) for i in range(8)])
    compute = _Compute(policy, 3)
    counters = WorkerLoop(QueueClient(queue, "w"), compute).serve(idle=lambda: True)
    assert counters["completed"] == 8 and compute.batches == [3]  # one batch: 3 leased, 5 refilled
    done = {c.request.request_id: c.output for c in queue.take_results()}
    assert all(same(done[i], alone[i], BATCHED_ATOL) for i in range(8))


class _Compute:
    """A `ModelCompute`'s rollout side on one policy, counting the batches it was handed."""

    def __init__(self, policy, max_batch: int) -> None:
        self.engine, self.version, self.batches = RolloutEngine(policy, max_batch=max_batch), 0, []

    @property
    def max_batch(self) -> int:
        return self.engine.max_batch

    def denoise_batch(self, leases, at_boundary, on_checkpoint=None, *, decode=True):
        self.batches.append(len(leases))
        return self.engine.denoise_batch(leases, at_boundary, on_checkpoint, decode=decode)
