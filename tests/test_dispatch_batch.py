"""Tier 1: batch leases (``dispatch.pull_batch``): one pull leases several requests, each ends on
its own, and a lost worker's unfinished part of a batch is requeued. Pure queue and the actor's
body (``QueueServer``, no Ray cluster), journal included."""
from __future__ import annotations

import numpy as np
import pytest

from roll_spotlight.config.strict import ConfigError, from_dict
from roll_spotlight.dispatch import (
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

SCHEDULE = Schedule(num_steps=10, noise_level=0.7)


def specs(count: int, start: int = 0) -> list[RequestSpec]:
    return [RequestSpec(s % 3, f"p{s % 3}", s, SCHEDULE, 0, RequestKind.ROLLOUT, 0) for s in range(start, start + count)]


def make_queue(lease_s: float = 10.0, **config):
    clock = ManualClock()
    return RequestQueue(QueueConfig(lease_s=lease_s, **config), clock), clock


def state_for(lease, step: int, latent=None) -> InFlightState:
    request = lease.request
    return InFlightState(request.request_id, step, latent, request.seed, request.weight_version)


# ------------------------------------------------------------------------- config
@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_pull_batch_must_be_a_positive_integer_naming_the_key(bad):
    with pytest.raises(ValueError, match=r"dispatch\.pull_batch"):
        QueueConfig(pull_batch=bad)


def test_pull_batch_defaults_to_one_and_is_a_dispatch_key():
    assert QueueConfig().pull_batch == 1
    from roll_spotlight.config.run import DispatchConfig

    assert DispatchConfig(pull_batch=8).queue_config().pull_batch == 8
    with pytest.raises(ConfigError, match=r"dispatch\.pull_batch"):
        from_dict(DispatchConfig, {"pull_batch": 0}, key="dispatch")


# ------------------------------------------------------------------------- the pure queue
def test_a_batch_is_several_leases_of_one_worker_with_one_deadline():
    queue, clock = make_queue()
    queue.submit(specs(6))
    batch = queue.pull("w", 4)
    assert [lease.request.request_id for lease in batch] == [0, 1, 2, 3]
    assert len({lease.lease_id for lease in batch}) == 4
    assert {lease.deadline for lease in batch} == {clock.now + 10.0}
    assert [lease.lease_id for lease in queue.leases_of("w")] == [lease.lease_id for lease in batch]
    clock.advance(8.0)
    assert queue.heartbeat("w") == 4  # one heartbeat extends the whole batch
    clock.advance(8.0)
    assert queue.expire() == 0 and queue.leased_count() == 4


def test_partial_completion_then_loss_requeues_the_rest():
    queue, _ = make_queue()
    queue.submit(specs(5))
    batch = queue.pull("spot", 4)
    assert queue.complete_many([batch[0].result("img0"), batch[1].result("img1")]) == [True, True]
    assert queue.checkpoint("spot", state_for(batch[2], 6, latent=np.full(3, 6.0)))

    assert queue.worker_lost("spot") == 2  # only the unfinished part of the batch
    assert [queue.state_of(i) for i in range(5)] == [RequestState.DONE] * 2 + [RequestState.PENDING] * 3
    assert queue.complete_many([lease.result("late") for lease in batch]) == [False] * 4, "old leases are dead"

    again = queue.pull("ondemand", 3)
    # The checkpointed one first, then first in first out: 4 was queued before 3 came back.
    assert [lease.request.request_id for lease in again] == [2, 4, 3]
    assert again[0].resume.step_index == 6 and again[0].attempt == 2
    np.testing.assert_array_equal(again[0].resume.latent, np.full(3, 6.0))
    assert [(lease.resume, lease.attempt) for lease in again[1:]] == [(None, 1), (None, 2)]
    assert all(queue.complete_many([lease.result("ok") for lease in again]))
    stats = queue.stats()
    assert (stats.completed, stats.worker_losses, stats.duplicate_completions) == (5, 2, 4)
    assert [c.output for c in queue.take_results()] == ["img0", "img1", "ok", "ok", "ok"]


def test_commit_of_one_request_of_a_batch_keeps_the_others_leased():
    queue, _ = make_queue()
    queue.submit(specs(4))
    batch = queue.pull("spot", 3)
    latent = np.arange(4.0)
    assert queue.commit("spot", state_for(batch[1], 4, latent)) is True
    assert [lease.request.request_id for lease in queue.leases_of("spot")] == [0, 2]
    (resumed,) = queue.pull("ondemand")
    assert resumed.request.request_id == 1 and resumed.resume.latent is latent and resumed.attempt == 1
    # The rest of the batch is still the spot worker's to finish; release hands it back whole.
    assert queue.complete(batch[0].result("a")) is True
    assert queue.release("spot") == 1
    assert queue.state_of(2) is RequestState.PENDING
    rest = queue.pull("ondemand", 5)
    assert sorted(lease.request.request_id for lease in rest) == [2, 3]
    assert all(lease.attempt == 1 for lease in rest), "a release is not a failure"


def test_complete_and_pull_completes_then_leases_the_next_batch():
    queue, _ = make_queue()
    queue.submit(specs(7))
    first = queue.pull("w", 3)
    stale = first[0].result("dup")
    accepted, second = queue.complete_and_pull("w", [lease.result(i) for i, lease in enumerate(first)], 3)
    assert accepted == [True, True, True]
    assert [lease.request.request_id for lease in second] == [3, 4, 5]
    accepted, third = queue.complete_and_pull("w", [stale, second[0].result("x")], 3)
    assert accepted == [False, True] and [lease.request.request_id for lease in third] == [6]
    assert queue.leased_count() == 3 and queue.stats().duplicate_completions == 1


def test_complete_and_pull_under_a_notice_completes_but_leases_nothing():
    queue, clock = make_queue()
    queue.submit(specs(4))
    batch = queue.pull("spot", 2)
    queue.notify_preemption("spot", clock.now + 5.0)
    accepted, more = queue.complete_and_pull("spot", [lease.result("img") for lease in batch], 2)
    assert accepted == [True, True] and more == []
    assert queue.stats().refused_by_notice == 1
    _, fits = queue.complete_and_pull("spot", [], 2, est_duration_s=1.0)
    assert len(fits) == 2


def test_a_bad_batch_call_changes_nothing():
    queue, _ = make_queue()
    queue.submit(specs(3))
    batch = queue.pull("w", 2)
    before = queue.snapshot()
    with pytest.raises(ValueError, match="unknown request id 99"):
        queue.complete_many([batch[0].result("a"), RequestResult(99, 0, None)])
    with pytest.raises(ValueError, match="n must be"):
        queue.complete_and_pull("w", [batch[0].result("a")], 0)
    assert queue.snapshot() == before and queue.stats() == before.stats


def test_expiry_follows_heartbeats_and_earlier_deadlines():
    """The deadline heap finds exactly the overdue leases, whichever way heartbeats moved them."""
    queue, clock = make_queue(lease_s=10.0)
    queue.submit(specs(6))
    a = queue.pull("a", 2)  # deadline 10
    clock.advance(5.0)
    b = queue.pull("b", 2, max_lease_s=20.0)  # deadline 25
    c = queue.pull("c", 2, max_lease_s=2.0)  # deadline 7
    assert queue.heartbeat("a") == 2  # 10 -> 15
    assert queue.heartbeat("b", now=0.0) == 2  # an earlier clock reading: 25 -> 20
    clock.advance(3.0)  # t = 8
    assert queue.expire() == 2 and queue.leases_of("c") == []
    clock.advance(7.5)  # t = 15.5
    assert queue.expire() == 2 and queue.leases_of("a") == []
    assert queue.leased_count() == 2
    clock.advance(4.0)  # t = 19.5
    assert queue.expire() == 0
    clock.advance(1.0)
    assert queue.expire() == 2
    assert all(queue.state_of(lease.request.request_id) is RequestState.PENDING for lease in [*a, *b, *c])


def test_many_short_leases_keep_expiry_exact():
    """Thousands of leases granted and ended (the heap is rebuilt along the way): expiry still
    finds exactly the live ones and only them."""
    queue, clock = make_queue(lease_s=100.0)
    queue.submit(specs(3000))
    held = []
    for i in range(300):
        batch = queue.pull(f"w{i % 7}", 10)
        queue.complete_many([lease.result(None) for lease in batch[:7]])
        held += batch[7:]
        clock.advance(0.01)
    assert len(queue._deadlines.heap) < 4 * len(held) + 200, "dead items are pruned"
    clock.advance(100.0)
    assert queue.expire() == len(held) == 900
    assert queue.leased_count() == 0 and queue.pending_count() == 900


# ------------------------------------------------------------------------- the actor's body
def _server(**kwargs):
    pytest.importorskip("ray")
    from roll_spotlight.dispatch.queue_actor import QueueServer

    return QueueServer(**kwargs)


def test_server_pull_batch_uses_the_configured_size_and_plain_pull_is_unchanged():
    batched = _server(config=QueueConfig(pull_batch=3))
    batched.submit(specs(8))
    assert len(batched.pull("w")) == 1, "pull keeps its default of one"
    assert len(batched.pull_batch("w")) == 3
    assert len(batched.pull_batch("w", 2)) == 2
    accepted, leases = batched.complete_and_pull("w", [lease.result(None) for lease in batched.leases_of("w")])
    assert accepted == [True] * 6 and len(leases) == 2  # only 2 were left


def test_a_batching_workers_pull_leases_one_gradient_sums_micro_batches():
    """A worker that pulls for 16 rollout slots takes 16 rollouts but only ``pull_batch`` TRAIN
    micro-batches (the simulator's lease per GPU): 256 micro-batches over 14 workers then end in
    ceil(64 / 14) lease rounds, not two rounds of 16. An SP group's plain top-up pull is not capped."""
    from roll_spotlight.dispatch.requests import plan_micro_batches

    server = _server(config=QueueConfig(pull_batch=4))
    plan = plan_micro_batches(list(range(512)), [0, 1], 4)
    server.submit([RequestSpec.train(mb, SCHEDULE, 0, 1) for mb in plan] + specs(16))
    rollouts = server.pull_batch("a", 16)
    assert len(rollouts) == 16 and {x.request.kind for x in rollouts} == {RequestKind.ROLLOUT}
    accepted, train = server.complete_and_pull("a", [x.result(None) for x in rollouts], 16)
    assert all(accepted) and len(train) == 4 and {x.request.kind for x in train} == {RequestKind.TRAIN}
    assert len(server.pull_batch("b", 16, kinds=(RequestKind.TRAIN,))) == 4
    assert len(server.pull("c", 12, kinds=(RequestKind.TRAIN,))) == 12
    with pytest.raises(ValueError, match="max_train"):
        server.pull("d", 4, max_train=0)


def test_default_pull_batch_is_todays_pull_bit_for_bit():
    """With ``pull_batch`` 1, a worker using the batch API leaves the queue in exactly the state
    the single-request API does."""
    old, new = _server(), _server()
    for server in (old, new):
        server.submit(specs(5))
    for worker in ("a", "b", "a"):
        (lease,) = old.pull(worker)
        assert old.complete(lease.result(worker))
        (lease,) = new.pull_batch(worker)
        assert new.complete_many([lease.result(worker)]) == [True]
    _, (lease,) = new.complete_and_pull("b", [])
    (ref,) = old.pull("b")
    assert (lease.lease_id, lease.request) == (ref.lease_id, ref.request)
    assert new.stats() == old.stats()
    assert [r.request for r in new.snapshot().records] == [r.request for r in old.snapshot().records]
    assert [r.state for r in new.snapshot().records] == [r.state for r in old.snapshot().records]


@pytest.mark.parametrize("compact_every", [1, 3, 1000])
def test_journal_replays_batch_calls_exactly(tmp_path, compact_every):
    """The restarted server rebuilds a queue of batch leases exactly: live leases of a half-done
    batch survive, and the one method that requeues a lost worker's leases still finds them."""
    from roll_spotlight.dispatch.journal import JournalConfig

    journal = JournalConfig(str(tmp_path / "q"), compact_every=compact_every)
    first = _server(config=QueueConfig(pull_batch=4), journal=journal)
    first.submit(specs(12))
    a = first.pull_batch("a")
    b = first.pull_batch("b", 3)
    accepted, a2 = first.complete_and_pull("a", [lease.result(f"a{i}") for i, lease in enumerate(a)])
    assert accepted == [True] * 4 and len(a2) == 4
    assert first.complete_many([b[0].result("b0"), a[0].result("dup")]) == [True, False]
    first.checkpoint("b", state_for(b[1], 3, {"x": 1}))
    with open(tmp_path / "q.log", "ab") as fh:
        fh.write(b"\x80\x05\x95torn")

    second = _server(config=QueueConfig(pull_batch=4), journal=journal)
    assert second.snapshot() == first.snapshot() and second.stats() == first.stats()
    assert [x.lease_id for x in second.leases_of("a")] == [x.lease_id for x in a2]
    assert second.complete_many([a2[0].result("late but valid")]) == [True]
    assert second.worker_lost("b") == 2
    resumed, *rest = second.pull_batch("c", 3)
    assert resumed.request.request_id == b[1].request.request_id and resumed.resume.step_index == 3
    assert b[2].request.request_id in {lease.request.request_id for lease in rest}
    third = _server(config=QueueConfig(pull_batch=4), journal=journal)
    assert third.snapshot() == second.snapshot()


# ------------------------------------------------------------------------- the benchmark's loop
class _InProcessClient:
    """``QueueClient``'s methods, called on a ``QueueServer`` in this process (no Ray)."""

    def __init__(self, server, worker: str) -> None:
        self.server, self.worker = server, worker

    def pull(self, n: int = 1) -> list:
        return self.server.pull(self.worker, n)

    def pull_batch(self, n: int | None = None) -> list:
        return self.server.pull_batch(self.worker, n)

    def complete(self, lease, output) -> bool:
        return self.server.complete(lease.result(output))

    def complete_many(self, done) -> list[bool]:
        return self.server.complete_many([lease.result(output) for lease, output in done])

    def complete_and_pull(self, done, n: int | None = None):
        return self.server.complete_and_pull(self.worker, [lease.result(output) for lease, output in done], n)


@pytest.mark.parametrize(("batch", "timed"), [(1, 10), (4, 4), (16, 2)])
def test_benchmark_pull_loop_completes_its_quota_in_one_round_trip_a_batch(batch, timed):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "queue_throughput.py"
    spec = importlib.util.spec_from_file_location("queue_throughput_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    server = _server(config=QueueConfig(pull_batch=batch))
    server.submit(specs(25))
    trips = bench.pull_loop(_InProcessClient(server, "w"), 10, batch)
    # Batch 1: a pull and a complete per request, timed together; batch B: one call a batch
    # (ceil(10 / B) of them) and the first pull.
    assert len(trips) == timed
    stats = server.stats()
    assert (stats.completed, stats.leases_granted, stats.duplicate_completions) == (10, 10, 0)
    assert server.counts() == (15, 0)
