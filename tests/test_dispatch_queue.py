"""Tier 1: every transition of the dispatch queue, on a fake clock."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from roll_spotlight.dispatch import (
    TRANSITIONS,
    InFlightState,
    ManualClock,
    QueueConfig,
    RequestKind,
    RequestQueue,
    RequestResult,
    RequestSpec,
    RequestState,
    Schedule,
)

ROLLOUT, EXPLORE = RequestKind.ROLLOUT, RequestKind.EXPLORE
SCHEDULE = Schedule(num_steps=10, noise_level=0.7, window_start=0, window_end=3)


def spec(seed: int = 0, *, kind=ROLLOUT, iteration: int = 0, priority: int = 0, version: int = 0):
    return RequestSpec(
        prompt_id=seed % 3, prompt=f"prompt {seed % 3}", seed=seed, schedule=SCHEDULE,
        weight_version=version, kind=kind, iteration=iteration, priority=priority,
    )


def make_queue(lease_s: float = 10.0, max_attempts: int = 3):
    clock = ManualClock()
    return RequestQueue(QueueConfig(lease_s=lease_s, max_attempts=max_attempts), clock), clock


def state_for(lease, step: int, latent=None) -> InFlightState:
    request = lease.request
    return InFlightState(request.request_id, step, latent, request.seed, request.weight_version)


# ------------------------------------------------------------------------- config and types
@pytest.mark.parametrize(
    ("kwargs", "key"),
    [({"lease_s": 0}, "lease_s"), ({"lease_s": float("inf")}, "lease_s"),
     ({"max_attempts": 0}, "max_attempts"), ({"max_attempts": 2.5}, "max_attempts")],
)
def test_config_rejects_bad_values_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        QueueConfig(**kwargs)


def test_schedule_validates_window():
    with pytest.raises(ValueError, match="window"):
        Schedule(num_steps=4, noise_level=0.5, window_start=3, window_end=2)
    with pytest.raises(ValueError, match="kind"):
        Schedule(num_steps=4, noise_level=0.5, kind="euler")
    assert hash(SCHEDULE) == hash(Schedule(10, 0.7, "sde", 0, 3))


def test_transition_table_has_no_exit_from_final_states():
    for final in (RequestState.DONE, RequestState.FAILED, RequestState.CANCELLED):
        assert TRANSITIONS[final] == frozenset()
    assert RequestState.DONE not in TRANSITIONS[RequestState.PENDING]


# ------------------------------------------------------------------------- pull / complete
def test_submit_assigns_increasing_ids_and_pull_leases_fifo():
    queue, clock = make_queue()
    ids = queue.submit([spec(s) for s in range(4)])
    assert ids == [0, 1, 2, 3]
    leases = queue.pull("w0", 3)
    assert [lease.request.request_id for lease in leases] == [0, 1, 2]
    assert all(lease.deadline == clock.now + 10.0 and lease.resume is None for lease in leases)
    assert len({lease.lease_id for lease in leases}) == 3
    assert (queue.pending_count(), queue.leased_count()) == (1, 3)
    assert queue.state_of(0) is RequestState.LEASED
    assert queue.pull("w1", 5)[0].request.request_id == 3
    assert queue.pull("w1") == []


def test_complete_once_then_duplicates_are_ignored():
    queue, _ = make_queue()
    queue.submit([spec(1)])
    (lease,) = queue.pull("w0")
    assert queue.complete(lease.result("image")) is True
    assert queue.complete(lease.result("again")) is False
    assert queue.state_of(0) is RequestState.DONE and queue.done_ids() == {0}
    (completion,) = queue.results([0])
    assert (completion.output, completion.worker, completion.lease_id) == ("image", "w0", lease.lease_id)
    stats = queue.stats()
    assert (stats.completed, stats.duplicate_completions) == (1, 1)


def test_completion_of_a_revoked_lease_is_a_duplicate():
    queue, _ = make_queue()
    queue.submit([spec(1)])
    (old,) = queue.pull("slow")
    queue.release("slow")
    (new,) = queue.pull("fast")
    assert queue.complete(old.result("stale")) is False
    assert queue.state_of(0) is RequestState.LEASED
    assert queue.complete(new.result("fresh")) is True
    assert queue.results([0])[0].output == "fresh"
    assert queue.stats().duplicate_completions == 1


def test_complete_of_never_issued_id_is_an_error():
    queue, _ = make_queue()
    with pytest.raises(ValueError, match="unknown request id 7"):
        queue.complete(RequestResult(7, 0, None))


def test_pull_validates_arguments():
    queue, _ = make_queue()
    with pytest.raises(ValueError, match="n must be"):
        queue.pull("w", 0)
    with pytest.raises(ValueError, match="max_lease_s"):
        queue.pull("w", 1, max_lease_s=0)
    with pytest.raises(ValueError, match="kinds"):
        queue.pull("w", 1, kinds={"rollout"})


def test_take_results_pops_once_and_results_names_missing_ids():
    queue, _ = make_queue()
    queue.submit([spec(0), spec(1)])
    for lease in queue.pull("w", 2):
        queue.complete(lease.result(lease.request.seed * 10))
    assert [c.output for c in queue.take_results()] == [0, 10]
    assert queue.take_results() == []
    assert queue.done_ids() == {0, 1}
    with pytest.raises(KeyError, match=r"\[0\]"):
        queue.results([0])


# ------------------------------------------------------------------------- heartbeat and expiry
def test_heartbeat_extends_only_that_workers_leases():
    queue, clock = make_queue(lease_s=10.0)
    queue.submit([spec(0), spec(1)])
    (a,) = queue.pull("a")
    (b,) = queue.pull("b", max_lease_s=4.0)
    clock.advance(8.0)
    assert queue.heartbeat("a") == 1
    assert queue.heartbeat("nobody") == 0
    assert queue.expire() == 1  # b's 4 s lease
    assert queue.state_of(b.request.request_id) is RequestState.PENDING
    clock.advance(9.0)  # a was extended to 18 s
    assert queue.expire() == 0
    assert queue.leases_of("a")[0].deadline == 18.0
    clock.advance(1.5)
    assert queue.expire() == 1
    assert queue.stats().expirations == 2


def test_expire_without_commit_restarts_from_scratch():
    queue, clock = make_queue()
    queue.submit([spec(5)])
    queue.pull("w0")
    clock.advance(10.5)
    assert queue.expire() == 1
    (lease,) = queue.pull("w1")
    assert lease.resume is None and lease.attempt == 2


def test_expire_keeps_last_checkpoint_so_a_silent_kill_resumes():
    queue, clock = make_queue()
    queue.submit([spec(5)])
    (lease,) = queue.pull("w0")
    assert queue.checkpoint("w0", state_for(lease, 3, latent=np.ones(4)))
    assert queue.checkpoint("w0", state_for(lease, 6, latent=np.full(4, 6.0)))
    clock.advance(11.0)
    queue.expire()
    (resumed,) = queue.pull("w1")
    assert resumed.resume.step_index == 6
    np.testing.assert_array_equal(resumed.resume.latent, np.full(4, 6.0))
    # A state committed by an earlier lease survives a later lease that dies silently.
    clock.advance(11.0)
    queue.expire()
    assert queue.pull("w2")[0].resume.step_index == 6
    assert queue.stats().resumed_from_commit == 2


# ------------------------------------------------------------------------- commit and resume
def test_commit_puts_request_at_front_with_its_state():
    queue, _ = make_queue()
    queue.submit([spec(s) for s in range(3)])
    (first,) = queue.pull("spot")
    latent = np.arange(8.0)
    assert queue.commit("spot", state_for(first, 4, latent)) is True
    assert queue.state_of(first.request.request_id) is RequestState.PENDING
    assert queue.leases_of("spot") == []
    (resumed,) = queue.pull("ondemand")
    assert resumed.request.request_id == first.request.request_id
    assert resumed.resume.step_index == 4 and resumed.resume.latent is latent
    assert resumed.attempt == 1  # a commit is not a failure
    stats = queue.stats()
    assert (stats.commits, stats.resumed_from_commit) == (1, 1)


def test_commit_by_a_non_holder_is_refused():
    queue, _ = make_queue()
    queue.submit([spec(0)])
    (lease,) = queue.pull("a")
    assert queue.commit("b", state_for(lease, 2)) is False
    assert queue.checkpoint("b", state_for(lease, 2)) is False
    assert queue.stats().stale_commits == 2
    assert queue.state_of(0) is RequestState.LEASED


def test_commit_of_another_trajectory_is_rejected():
    queue, _ = make_queue()
    queue.submit([spec(0)])
    (lease,) = queue.pull("a")
    with pytest.raises(ValueError, match="seed"):
        queue.commit("a", InFlightState(0, 2, None, seed=99, weight_version=0))
    with pytest.raises(ValueError, match="step_index"):
        queue.commit("a", state_for(lease, 10))


# ------------------------------------------------------------------------- release / worker loss
def test_release_and_worker_lost_requeue_all_leases_of_the_worker():
    queue, _ = make_queue()
    queue.submit([spec(s) for s in range(4)])
    queue.pull("a", 2)
    queue.pull("b", 2)
    assert queue.release("a") == 2
    assert queue.worker_lost("b") == 2
    assert (queue.pending_count(), queue.leased_count()) == (4, 0)
    leases = queue.pull("c", 4)
    assert [lease.attempt for lease in leases] == [1, 1, 2, 2]  # only the loss counts as failure
    stats = queue.stats()
    assert (stats.releases, stats.worker_losses, stats.failed_attempts) == (2, 2, 2)
    assert queue.release("a") == 0


def test_worker_lost_clears_its_preemption_notice():
    queue, _ = make_queue()
    queue.submit([spec(0)])
    queue.notify_preemption("a", deadline=5.0)
    assert queue.pull("a") == []
    queue.worker_lost("a")
    assert len(queue.pull("a")) == 1  # a new worker under the same name


# ------------------------------------------------------------------------- max attempts and fail
def test_max_attempts_marks_failed_and_reports():
    queue, clock = make_queue(lease_s=1.0, max_attempts=2)
    queue.submit([spec(0), spec(1)])
    (lease,) = queue.pull("a")
    assert queue.fail(lease.request.request_id, lease.lease_id, "CUDA OOM") is True
    assert queue.fail(lease.request.request_id, lease.lease_id, "again") is False
    queue.pull("b", 2)
    clock.advance(2.0)
    queue.expire()
    (failed,) = queue.failed()
    assert failed.request.request_id == 0 and failed.attempts == 2
    assert failed.last_error == "lease expired"
    assert queue.state_of(0) is RequestState.FAILED
    assert queue.state_of(1) is RequestState.PENDING
    assert queue.stats().failed == 1
    assert [lease.request.request_id for lease in queue.pull("c", 5)] == [1]


# ------------------------------------------------------------------------- cancel
def test_cancel_drops_pending_explore_of_one_iteration():
    queue, _ = make_queue()
    queue.submit([spec(0, kind=EXPLORE, iteration=1), spec(1, kind=EXPLORE, iteration=2)])
    queue.submit([spec(2, kind=ROLLOUT, iteration=1)])
    assert queue.cancel(EXPLORE, iteration=1) == 1
    assert queue.state_of(0) is RequestState.CANCELLED
    assert [lease.request.request_id for lease in queue.pull("w", 5)] == [2, 1]


def test_cancelled_leased_request_may_complete_but_is_not_requeued():
    queue, _ = make_queue()
    queue.submit([spec(0, kind=EXPLORE), spec(1, kind=EXPLORE)])
    a, b = queue.pull("w", 2)
    assert queue.cancel(EXPLORE) == 0
    assert queue.complete(a.result("reward")) is True
    assert queue.commit("w", state_for(b, 2)) is True
    assert queue.state_of(1) is RequestState.CANCELLED
    assert queue.pending_count() == 0 and queue.stats().cancelled == 1


# ------------------------------------------------------------------------- preemption notices
def test_notice_refuses_new_work_unless_it_fits_before_the_deadline():
    queue, clock = make_queue()
    queue.submit([spec(s) for s in range(3)])
    clock.advance(100.0)
    queue.notify_preemption("spot", deadline=130.0)
    assert queue.pull("spot") == []
    assert queue.pull("spot", est_duration_s=31.0) == []
    assert len(queue.pull("spot", est_duration_s=29.0)) == 1
    assert len(queue.pull("ondemand")) == 1  # other workers are unaffected
    queue.clear_preemption("spot")
    assert len(queue.pull("spot")) == 1
    assert queue.stats().refused_by_notice == 2


# ------------------------------------------------------------------------- ordering
def test_rollouts_before_explores_and_kind_filter():
    queue, _ = make_queue()
    queue.submit([spec(0, kind=EXPLORE), spec(1, kind=EXPLORE, priority=5)])
    queue.submit([spec(2, kind=ROLLOUT), spec(3, kind=ROLLOUT, priority=1)])
    assert [lease.request.request_id for lease in queue.pull("ondemand", 5, kinds={ROLLOUT})] == [3, 2]
    assert queue.pending_count(ROLLOUT) == 0 and queue.pending_count(EXPLORE) == 2
    assert queue.pull("ondemand", 1, kinds={ROLLOUT}) == []
    assert [lease.request.request_id for lease in queue.pull("spot", 5)] == [1, 0]


def test_pull_order_within_kind_is_committed_then_priority_then_fifo():
    queue, _ = make_queue()
    queue.submit([spec(0), spec(1), spec(2, priority=3)])
    (top,) = queue.pull("a")
    assert top.request.request_id == 2
    queue.commit("a", state_for(top, 1))
    queue.submit([spec(3, priority=9)])
    order = [lease.request.request_id for lease in queue.pull("b", 4)]
    assert order == [2, 3, 0, 1]


# ------------------------------------------------------------------------- lazy source
class CountingSource:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def next_requests(self, worker: str, n: int) -> list[RequestSpec]:
        self.calls.append((worker, n))
        return [spec(100 + len(self.calls) * 10 + i, kind=EXPLORE) for i in range(n)]


def test_source_is_asked_only_when_nothing_is_pending():
    source = CountingSource()
    queue = RequestQueue(QueueConfig(), ManualClock(), source=source)
    queue.submit([spec(0)])
    assert [lease.request.seed for lease in queue.pull("w", 1)] == [0]
    assert source.calls == []
    leases = queue.pull("w", 2)
    assert source.calls == [("w", 2)]
    assert [lease.request.kind for lease in leases] == [EXPLORE, EXPLORE]
    assert queue.pull("ondemand", 1, kinds={ROLLOUT}) == []  # generated, left for spot workers
    assert queue.pending_count(EXPLORE) == 1 and len(source.calls) == 2
    assert queue.stats().from_source == 3


# ------------------------------------------------------------------------- snapshot / restore
def test_snapshot_restore_round_trip():
    queue, clock = make_queue()
    queue.submit([spec(s) for s in range(5)] + [spec(9, kind=EXPLORE)])
    a, b, c = queue.pull("w", 3)
    queue.complete(a.result({"reward": 0.5}))
    queue.commit("w", state_for(b, 7, latent=np.full(3, 7.0)))
    queue.cancel(EXPLORE)
    snap = pickle.loads(pickle.dumps(queue.snapshot()))

    restored = RequestQueue(queue.config, clock)
    restored.restore(snap)
    assert restored.stats() == queue.stats()
    assert restored.done_ids() == {0}
    assert restored.results([0])[0].output == {"reward": 0.5}
    assert restored.state_of(5) is RequestState.CANCELLED
    assert restored.leased_count() == 0 and restored.pending_count() == 4  # c came back
    leases = restored.pull("x", 4)
    assert [lease.request.request_id for lease in leases] == [1, 2, 3, 4]
    assert leases[0].resume.step_index == 7
    assert min(lease.lease_id for lease in leases) > c.lease_id
    assert restored.complete(c.result("pre-snapshot lease")) is False
    assert restored.submit([spec(6)]) == [6]


def test_forget_finished_keeps_late_completions_harmless():
    queue, _ = make_queue()
    queue.submit([spec(0), spec(1)])
    a, b = queue.pull("w", 2)
    queue.complete(a.result(1))
    queue.take_results()
    assert queue.forget_finished() == 1
    assert queue.complete(a.result(1)) is False
    assert queue.complete(b.result(2)) is True
    assert queue.done_ids() == {1}


# ------------------------------------------------------------------------- training micro-batches
def train_specs(count: int, version: int = 0):
    from roll_spotlight.dispatch import MicroBatch

    return [RequestSpec.train(MicroBatch(i, (2 * i, 2 * i + 1), 1), SCHEDULE, version, 1) for i in range(count)]


def test_a_train_request_carries_a_micro_batch_and_no_other_kind_does():
    from roll_spotlight.dispatch import MicroBatch

    with pytest.raises(ValueError, match="micro_batch"):
        RequestSpec(0, "p", 0, SCHEDULE, 0, RequestKind.TRAIN, 0)
    with pytest.raises(ValueError, match="micro_batch"):
        RequestSpec(0, "p", 0, SCHEDULE, 0, ROLLOUT, 0, micro_batch=MicroBatch(0, (0,), 0))
    with pytest.raises(ValueError, match="rows"):
        MicroBatch(0, (), 0)


def test_training_work_is_pulled_after_rollouts_and_before_exploration_unless_reordered():
    q, _ = make_queue()
    q.submit([spec(1, kind=EXPLORE)] + train_specs(2) + [spec(2)])
    assert [lease.request.kind for lease in q.pull("w", 3)] == [ROLLOUT]  # a batch never mixes in TRAIN
    assert [lease.request.kind for lease in q.pull("w", 3)] == [RequestKind.TRAIN] * 2
    assert [lease.request.kind for lease in q.pull("w", 3)] == [EXPLORE]
    q.submit([spec(3, kind=EXPLORE)] + train_specs(1))
    q.set_order(["explorer"], (ROLLOUT, EXPLORE, RequestKind.TRAIN))
    assert q.pull("explorer", 1)[0].request.kind is EXPLORE
    assert q.pull("other", 1)[0].request.kind is RequestKind.TRAIN
    q.submit([spec(4, kind=EXPLORE)] + train_specs(1))
    q.set_order(["explorer"], None)  # back to the default order
    assert q.pull("explorer", 1)[0].request.kind is RequestKind.TRAIN
    with pytest.raises(ValueError, match="every RequestKind"):
        q.set_order(["w"], (ROLLOUT, EXPLORE))


def test_complete_all_accepts_a_sum_whose_leases_are_all_current():
    q, _ = make_queue()
    q.submit(train_specs(3))
    leases = q.pull("spot-0", 3)
    assert q.complete_all("spot-0", [lease.result(None) for lease in leases[:2]])
    assert [q.state_of(lease.request.request_id) for lease in leases] == [
        RequestState.DONE, RequestState.DONE, RequestState.LEASED]
    assert q.stats().refused_reports == 0


def test_complete_all_refuses_a_sum_with_a_revoked_lease_and_hands_the_rest_back():
    q, clock = make_queue(lease_s=5.0)
    q.submit(train_specs(2))
    first = q.pull("spot-0", 1)[0]
    clock.advance(3.0)
    second = q.pull("spot-0", 1)[0]
    clock.advance(3.0)  # the first lease expired and is re-leased elsewhere; the second is current
    assert q.expire() == 1
    again = q.pull("od-0", 1)[0]
    assert again.request.request_id == first.request.request_id
    assert not q.complete_all("spot-0", [first.result(None), second.result(None)])
    assert q.stats().refused_reports == 1
    assert q.state_of(second.request.request_id) is RequestState.PENDING  # its work is in the refused sum
    assert q.state_of(first.request.request_id) is RequestState.LEASED  # still od-0's
    assert q.complete_all("od-0", [again.result(None)])
    assert not q.complete_all("od-0", [again.result(None)])  # a repeated report is refused too
    assert q.stats().completed == 1


def test_complete_all_refuses_another_workers_lease_and_repeated_ids():
    q, _ = make_queue()
    q.submit(train_specs(2))
    mine, theirs = q.pull("a", 1)[0], q.pull("b", 1)[0]
    assert not q.complete_all("a", [mine.result(None), theirs.result(None)])
    assert q.state_of(theirs.request.request_id) is RequestState.LEASED  # b's lease is untouched
    mine = q.pull("a", 1)[0]
    assert not q.complete_all("a", [mine.result(None), mine.result(None)])
    assert q.state_of(mine.request.request_id) is RequestState.PENDING
    with pytest.raises(ValueError, match="unknown request id"):
        q.complete_all("a", [RequestResult(99, 0, None)])
