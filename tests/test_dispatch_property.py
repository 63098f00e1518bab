"""Tier 1 property test: nothing is lost or completed twice, whatever the interleaving.

Several workers pull, complete (including with leases that were revoked behind their back),
commit, checkpoint, release, die, heartbeat and get preemption notices, while the clock moves and
leases expire. After a final honest worker drains the queue, every request is DONE exactly once,
and the accepted completions equal the submitted requests. Along the way, every lease that
resumes must carry exactly the last accepted commit/checkpoint of its request.
"""
from __future__ import annotations

from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from roll_spotlight.dispatch import (
    InFlightState,
    ManualClock,
    MicroBatch,
    QueueConfig,
    RequestKind,
    RequestQueue,
    RequestSpec,
    RequestState,
    Schedule,
)

WORKERS = ("a", "b", "c")
SCHEDULE = Schedule(num_steps=8, noise_level=0.7)
# Pulls, completions and ticks are the common case; they create the stale leases and resumptions
# the rarer ops then act on, so they are drawn more often.
OP_KINDS = (
    ["pull"] * 4 + ["complete"] * 4 + ["tick"] * 3 + ["batch"] * 2
    + ["submit", "replay", "commit", "checkpoint", "release", "lost", "heartbeat", "notice", "complete_many"]
    + ["sum"] * 3
)
# An op is (kind, worker, x, step); x is a count, an index, seconds, as the kind needs.
OPS = st.tuples(
    st.sampled_from(OP_KINDS), st.sampled_from(WORKERS), st.integers(0, 12),
    st.integers(0, SCHEDULE.num_steps - 1),
)


def make_spec(seed: int) -> RequestSpec:
    if seed % 3 == 1:  # a training micro-batch: reported in gradient sums (complete_all)
        return RequestSpec.train(MicroBatch(seed, (seed,), 0), SCHEDULE, 0, 0)
    kind = RequestKind.EXPLORE if seed % 3 == 0 else RequestKind.ROLLOUT
    return RequestSpec(seed % 4, f"p{seed % 4}", seed, SCHEDULE, 0, kind, iteration=0)


class Harness:
    """The workers' (possibly stale) view of their leases, and a model of the committed steps."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.queue = RequestQueue(QueueConfig(lease_s=10.0, max_attempts=10**9), self.clock)
        self.held: dict[str, list] = {w: [] for w in (*WORKERS, "drain")}
        self.sent: list = []
        self.accepted: dict[int, object] = {}
        self.rejected = 0
        self.last_step: dict[int, int] = {}
        self.submitted = 0
        self.refused_sums = 0

    def submit(self, count: int) -> None:
        self.queue.submit([make_spec(self.submitted + i) for i in range(count)])
        self.submitted += count

    def pull(self, name: str, n: int, **kwargs) -> None:
        self.took(name, self.queue.pull(name, n, **kwargs))

    def took(self, name: str, leases: list) -> None:
        for lease in leases:
            resumed_at = None if lease.resume is None else lease.resume.step_index
            if resumed_at is not None:
                event("resumed")
            assert resumed_at == self.last_step.get(lease.request.request_id)
            self.held[name].append(lease)

    def complete(self, name: str, i: int) -> None:
        if self.held[name]:
            lease = self.held[name].pop(i % len(self.held[name]))
            if not self.send(lease.result((lease.request.request_id, lease.lease_id))):
                event("stale lease completion rejected")

    def send(self, result) -> bool:
        return self.judged(result, self.queue.complete(result))

    def judged(self, result, ok: bool) -> bool:
        self.sent.append(result)
        if ok:
            assert result.request_id not in self.accepted, "completed twice"
            self.accepted[result.request_id] = result.output
        else:
            self.rejected += 1
        return ok

    def batch(self, name: str, x: int, *, pull: bool) -> None:
        """Complete the first few held leases in one call (``complete_many``), or complete them
        and lease the next batch in the same call (``complete_and_pull``)."""
        done, self.held[name] = self.held[name][: x % 4], self.held[name][x % 4:]
        results = [lease.result((lease.request.request_id, lease.lease_id)) for lease in done]
        if pull:
            verdicts, leases = self.queue.complete_and_pull(name, results, 1 + x % 3)
        else:
            verdicts, leases = self.queue.complete_many(results), []
        assert len(verdicts) == len(results)
        for result, ok in zip(results, verdicts):
            self.judged(result, ok)
        self.took(name, leases)

    def sum(self, name: str, x: int) -> None:
        """Report a gradient sum over some held TRAIN leases: all accepted, or none (and then the
        sum's leases still held go back to PENDING: none of them stays with this worker; a newer
        lease of the same request, pulled after the old one expired, is not in the sum and stays)."""
        train = [lease for lease in self.held[name] if lease.request.kind is RequestKind.TRAIN][: 1 + x % 3]
        if not train:
            return
        self.held[name] = [lease for lease in self.held[name] if lease not in train]
        results = [lease.result((lease.request.request_id, lease.lease_id)) for lease in train]
        if self.queue.complete_all(name, results):
            event("gradient sum accepted")
            for result in results:
                assert result.request_id not in self.accepted, "completed twice"
                self.accepted[result.request_id] = result.output
        else:
            event("gradient sum refused")
            self.refused_sums += 1
            mine = {(lease.request.request_id, lease.lease_id) for lease in self.queue.leases_of(name)}
            assert not mine & {(r.request_id, r.lease_id) for r in results}

    def tick(self, seconds: int) -> None:
        """Advance the clock; expiry must return exactly the leases a full scan finds overdue."""
        self.clock.advance(seconds)
        overdue = [lease for w in self.queue.lease_holders() for lease in self.queue.leases_of(w)
                   if lease.deadline < self.clock.now]
        assert self.queue.expire() == len(overdue)
        assert all(self.queue.state_of(lease.request.request_id) is not RequestState.LEASED for lease in overdue)

    def commit(self, name: str, i: int, at: int, *, keep_lease: bool) -> None:
        if not self.held[name]:
            return
        lease = self.held[name][i % len(self.held[name])]
        state = InFlightState(lease.request.request_id, at, f"latent@{at}", lease.request.seed, 0)
        method = self.queue.checkpoint if keep_lease else self.queue.commit
        if method(name, state):
            self.last_step[lease.request.request_id] = at
        else:
            event("stale commit rejected")
        if not keep_lease:
            self.held[name].remove(lease)

    def apply(self, op: tuple) -> None:
        kind, name, x, at = op
        if kind == "submit":
            self.submit(1 + x % 3)
        elif kind == "pull":
            self.pull(name, 1 + x % 3)
        elif kind == "complete":
            self.complete(name, x)
        elif kind == "replay":
            if self.sent:
                assert not self.send(self.sent[x % len(self.sent)])
        elif kind in ("commit", "checkpoint"):
            self.commit(name, x, at, keep_lease=kind == "checkpoint")
        elif kind == "release":
            self.queue.release(name)
            self.held[name].clear()
        elif kind == "lost":
            # Declared lost but still running (a partition): its view goes stale, not empty.
            self.queue.worker_lost(name)
        elif kind == "heartbeat":
            self.queue.heartbeat(name)
        elif kind == "tick":
            self.tick(x)
        elif kind in ("batch", "complete_many"):
            self.batch(name, x, pull=kind == "batch")
        elif kind == "sum":
            self.sum(name, x)
        elif kind == "notice":
            self.queue.notify_preemption(name, self.clock.now + 2 * x)
        else:
            raise AssertionError(f"unknown op {kind}")

    def check_invariants(self) -> None:
        q = self.queue
        assert q.pending_count() + q.leased_count() + len(q.done_ids()) == self.submitted
        leased = [lease.request.request_id for w in self.held for lease in q.leases_of(w)]
        assert len(leased) == len(set(leased)) == q.leased_count()
        assert all(q.state_of(rid) is RequestState.LEASED for rid in leased)

    def drain(self) -> None:
        for name in WORKERS:
            self.queue.clear_preemption(name)
        self.clock.advance(1000.0)
        self.queue.expire()
        for _ in range(self.submitted):
            self.pull("drain", 4)
            while self.held["drain"]:
                self.complete("drain", 0)
        assert self.queue.pending_count() == self.queue.leased_count() == 0


@settings(max_examples=150, deadline=None)
@given(initial=st.integers(1, 8), ops=st.lists(OPS, min_size=10, max_size=80))
@example(initial=2, ops=[("pull", "a", 0, 0)] * 7 + [("tick", "a", 11, 0), ("pull", "a", 0, 0), ("sum", "a", 0, 0)])
def test_any_interleaving_completes_every_request_exactly_once(initial, ops):
    h = Harness()
    h.submit(initial)
    for op in ops:
        h.apply(op)
        h.check_invariants()
    h.drain()

    stats = h.queue.stats()
    assert h.queue.done_ids() == set(range(h.submitted))
    assert len(h.accepted) == stats.completed == stats.submitted == h.submitted
    assert stats.duplicate_completions == h.rejected and stats.refused_reports == h.refused_sums
    for completion in h.queue.take_results():  # gradient sums keep no output in the queue
        rid = completion.request.request_id
        assert completion.output == h.accepted[rid] == (rid, completion.lease_id)


def test_a_refused_sum_over_an_expired_lease_leaves_the_newer_lease_of_the_same_request():
    """Found by the property test: a worker's lease expires, it pulls the same request again, then
    reports a sum over the old lease. The sum is refused; the new lease stays and completes once."""
    h = Harness()
    h.submit(2)                                   # request 1 is a training micro-batch
    h.pull("a", 2)
    old = next(lease for lease in h.held["a"] if lease.request.request_id == 1)
    h.tick(11)                                    # past lease_s: both leases expire
    h.pull("a", 2)
    new = next(lease for lease in h.queue.leases_of("a") if lease.request.request_id == 1)
    assert new.lease_id != old.lease_id
    assert not h.queue.complete_all("a", [old.result((1, old.lease_id))])
    assert [lease.lease_id for lease in h.queue.leases_of("a") if lease.request.request_id == 1] == [new.lease_id]
    assert h.queue.complete_all("a", [new.result((1, new.lease_id))])
    assert h.queue.stats().refused_reports == 1
