"""Tier 1: the elastic spot pool against a fake launcher, the market schedule, the Ray node watcher's
diffing (fake node lists), and preempt/resume of real rollouts through the pure queue."""
from __future__ import annotations

import math

import numpy as np
import pytest

from roll_spotlight.dispatch import QueueConfig, RequestKind, RequestQueue, RequestSpec, Schedule
from roll_spotlight.spot_pool.ray_nodes import RayNodeWatcher, diff_nodes, is_spot_node
from roll_spotlight.spot_pool.pool import ElasticSpotPool, NodeState, SpotPoolConfig
from roll_spotlight.spot.market import MarketSchedule
from roll_spotlight.spot import CostLedger, EventKind, EventList, MarketConfig, MarketEvent, NodeEvent, SpotMarket, Trace
from roll_spotlight.spot.prices import default_prices
from tests.runtime_helpers import denoise_lease


class FakeLauncher:
    """Records what the pool asks for; ``unsaved`` and ``held`` say what kill/requeue report."""

    def __init__(self, unsaved: dict[str, int] | None = None, held: dict[str, int] | None = None) -> None:
        self.calls: list[tuple] = []
        self.unsaved, self.held = unsaved or {}, held or {}
        self.died: list[str] = []

    def start(self, name, node_id):
        self.calls.append(("start", name))

    def notify(self, name, seconds_left):
        self.calls.append(("notify", name, seconds_left))

    def kill(self, name):
        self.calls.append(("kill", name))
        return self.unsaved.get(name, 0)

    def requeue(self, name):
        self.calls.append(("requeue", name))
        return self.held.get(name, 0)

    def dead(self):
        died, self.died = self.died, []
        return died

    def advance(self):
        return 0

    def stop_all(self):
        self.calls.append(("stop_all",))


def event_trace() -> Trace:
    """Three named nodes: a (0..200 s), b (0..400 s), c (100 s..); trace ends at 600 s."""
    rows = [NodeEvent(0.0, "add", "a"), NodeEvent(0.0, "add", "b"), NodeEvent(100.0, "add", "c"),
            NodeEvent(200.0, "remove", "a"), NodeEvent(400.0, "remove", "b")]
    return Trace(name="fake", kind="events", measures="running", provider="aws",
                 zones={"z": EventList(tuple(rows), 0.0, 600.0)}, gpu_type="V100")


def fake_market(notice_s: float = 5.0) -> SpotMarket:
    # compression 10: a up 0, b up 0, c up 10, a down 20, b down 40 (wall seconds)
    return SpotMarket(event_trace(), MarketConfig(notice_s=notice_s, compression=10.0))


def test_pool_applies_market_events_in_order_and_only_when_due():
    launcher = FakeLauncher(unsaved={"spot-z/a": 0}, held={"spot-z/a": 0, "spot-z/b": 1})
    pool = ElasticSpotPool(MarketSchedule(fake_market()), launcher)
    assert [e.kind for e in pool.poll(0.0)] == [EventKind.NODE_UP, EventKind.NODE_UP]
    assert pool.poll(9.0) == []
    pool.poll(16.0)  # c up at 10, a notified at 15 (deadline 20)
    assert launcher.calls == [("start", "spot-z/a"), ("start", "spot-z/b"), ("start", "spot-z/c"),
                              ("notify", "spot-z/a", 4.0)]
    assert pool.nodes["z/a"].state is NodeState.NOTIFIED and pool.serving == 2
    launcher.calls.clear()
    pool.poll(36.0)  # a down at 20, b notified at 35 (deadline 40)
    assert launcher.calls == [("kill", "spot-z/a"), ("requeue", "spot-z/a"), ("notify", "spot-z/b", 4.0)]
    pool.poll(100.0)
    assert launcher.calls[3:] == [("kill", "spot-z/b"), ("requeue", "spot-z/b")]
    assert pool.nodes["z/b"].state is NodeState.GONE and pool.nodes["z/b"].down_at == 40.0
    s = pool.stats
    assert (s.nodes_up, s.notices, s.preemptions, s.preempted_after_notice, s.leases_requeued) == (3, 2, 2, 2, 1)


def test_the_pool_owns_the_workers_on_every_gpu_of_its_nodes():
    """A node of 2 GPUs runs ``spot-z/a`` and ``spot-z/a/g1``: both are spot workers when the
    update's micro-batches are split by kind (they were counted as on-demand on GPU 1)."""
    from roll_spotlight.spot_pool.pool import gpu_worker

    pool = ElasticSpotPool(MarketSchedule(fake_market()), FakeLauncher())
    pool.poll(0.0)
    assert all(pool.owns(gpu_worker("spot-z/a", gpu)) for gpu in range(4)) and pool.owns("spot-z/b/g1")
    assert not pool.owns("ondemand-1") and not pool.owns("spot-z/c/g1") and not pool.owns("spot-z/a/gx")


def test_no_notice_turns_every_preemption_into_a_plain_kill_and_counts_lost_steps():
    launcher = FakeLauncher(unsaved={"spot-z/a": 2, "spot-z/b": 1}, held={"spot-z/a": 1, "spot-z/b": 1})
    pool = ElasticSpotPool(MarketSchedule(fake_market()), launcher, config=SpotPoolConfig(no_notice=True))
    pool.poll(60.0)
    assert not [c for c in launcher.calls if c[0] == "notify"]
    assert (pool.stats.notices, pool.stats.notices_ignored, pool.stats.preemptions) == (0, 2, 2)
    assert (pool.stats.steps_lost, pool.stats.leases_requeued, pool.stats.preempted_after_notice) == (3, 2, 0)


def test_a_notice_applied_after_its_deadline_is_not_delivered():
    launcher = FakeLauncher()
    pool = ElasticSpotPool(MarketSchedule(fake_market()), launcher, config=SpotPoolConfig(min_notice_s=0.5))
    pool.poll(0.0)
    pool.poll(19.8)  # a's notice (due at 15) has 0.2 s left: too late to be of use
    assert not [c for c in launcher.calls if c[0] == "notify"]
    assert (pool.stats.notices, pool.stats.notices_late) == (0, 1)


def test_actor_death_is_a_node_down_without_notice_and_the_later_node_down_is_ignored():
    launcher = FakeLauncher(held={"spot-z/a": 1})
    pool = ElasticSpotPool(MarketSchedule(fake_market()), launcher)
    pool.poll(1.0)
    launcher.died = ["spot-z/a"]
    pool.poll(2.0)
    assert launcher.calls[-1] == ("requeue", "spot-z/a")  # no kill: the actor is already gone
    assert pool.nodes["z/a"].state is NodeState.GONE
    pool.poll(30.0)  # a's notice and NODE_DOWN find no worker
    assert ("kill", "spot-z/a") not in launcher.calls
    assert (pool.stats.actor_deaths, pool.stats.preemptions, pool.stats.events_ignored) == (1, 1, 2)


def test_ledger_bills_each_node_from_up_to_down_in_trace_seconds():
    ledger = CostLedger(default_prices("V100"))
    pool = ElasticSpotPool(MarketSchedule(fake_market()), FakeLauncher(), ledger, SpotPoolConfig(bill_scale=10.0))
    pool.poll(45.0)  # applied late, but billed at the events' times
    pool.close(60.0)
    # a: 0..20, b: 0..40, c: 10..60 wall seconds -> x10 trace seconds
    assert ledger.gpu_seconds() == {"spot/z": pytest.approx((20 + 40 + 50) * 10.0)}
    assert ledger.open_nodes == ()


def test_market_schedule_returns_each_event_once_with_node_deadlines():
    market = fake_market(notice_s=30.0)  # a's notice clamps onto its NODE_UP at 0
    schedule = MarketSchedule(market)
    first = schedule.due(0.0)
    assert [(e.kind, e.node_id) for e in first][-1] == (EventKind.NOTICE, "z/a")
    assert schedule.due(0.0) == []
    assert schedule.deadline("z/a") == 20.0 and schedule.deadline("z/c") is None
    assert len(first) + len(schedule.due(math.inf)) == len(market.events) and schedule.due(math.inf) == []


def test_a_lead_brings_later_node_ups_forward_and_keeps_the_deadlines():
    schedule = MarketSchedule(fake_market(), lead_s=4.0)  # c up at 10 -> 6; the fleet at 0 stays at 0
    assert [(e.kind, e.node_id) for e in schedule.due(5.9)] == [(EventKind.NODE_UP, "z/a"), (EventKind.NODE_UP, "z/b")]
    assert [(e.kind, e.node_id, e.time_s) for e in schedule.due(6.0)] == [(EventKind.NODE_UP, "z/c", 6.0)]
    assert schedule.deadline("z/a") == 20.0 and schedule.due(14.9) == []


def test_pool_config_names_the_bad_key():
    with pytest.raises(ValueError, match="bill_scale"):
        SpotPoolConfig(bill_scale=0.0)
    with pytest.raises(ValueError, match="min_notice_s"):
        SpotPoolConfig(min_notice_s=-1.0)


# ---------------------------------------------------------------------------------------------
# RayNodeWatcher: ray.nodes() snapshots -> market events


def node(node_id: str, *, alive: bool = True, labels: dict | None = None, resources: dict | None = None) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Labels": labels or {}, "Resources": resources or {"CPU": 8.0}}


SPOT = {"ray.io/market-type": "spot", "ray.io/availability-zone": "us-east-1f"}


class FakeCluster:
    def __init__(self) -> None:
        self.nodes: list[dict] = []
        self.draining: dict[str, int] = {}
        self.epoch = 1_000.0

    def watcher(self) -> RayNodeWatcher:
        return RayNodeWatcher(lambda: self.nodes, lambda: self.draining, epoch=lambda: self.epoch)


def kinds(events: list[MarketEvent]) -> list[tuple[EventKind, str]]:
    return [(e.kind, e.node_id) for e in events]


def test_is_spot_node_reads_the_market_label_a_spot_label_or_the_spot_resource():
    assert is_spot_node(node("a", labels={"ray.io/market-type": "SPOT"}))
    assert is_spot_node(node("b", labels={"spot": "true"}))
    assert is_spot_node(node("c", resources={"spot_gpu": 4.0}))
    assert not is_spot_node(node("d", labels={"ray.io/market-type": "on-demand", "spot": "false"}))


def test_diff_nodes_compares_known_nodes_with_a_snapshot():
    nodes = [node("s1", labels=SPOT), node("s2", alive=False, labels=SPOT), node("s4", labels=SPOT), node("x")]
    diff = diff_nodes({"s1": False, "s2": True, "s3": False}, nodes, {"s1": 5_000, "s4": 0, "x": 7_000})
    assert diff.downs == ["s2", "s3"] and diff.ups == [("s4", "us-east-1f")]
    assert diff.notices == [("s1", 5.0), ("s4", None)]  # x is not a spot node
    assert diff_nodes({"s1": True}, nodes[:1], {"s1": 5_000}).notices == []  # notified once


def test_watcher_turns_node_changes_into_up_notice_down():
    cluster = FakeCluster()
    watcher = cluster.watcher()
    cluster.nodes = [node("head"), node("s1", labels=SPOT), node("s2", resources={"spot_gpu": 1.0})]
    assert kinds(watcher.due(0.0)) == [(EventKind.NODE_UP, "s1"), (EventKind.NODE_UP, "s2")]
    assert watcher.due(1.0) == []
    cluster.draining = {"s1": int((cluster.epoch + 30.0) * 1000)}  # drained with 30 s left
    cluster.epoch += 2.0
    notice = watcher.due(2.0)
    assert kinds(notice) == [(EventKind.NOTICE, "s1")] and notice[0].zone == "us-east-1f"
    assert watcher.deadline("s1") == pytest.approx(30.0)  # on the watcher's clock: 2 + 28
    assert watcher.due(3.0) == []  # notified once
    cluster.nodes = [node("head"), node("s1", alive=False, labels=SPOT)]  # s1 dead, s2 vanished
    assert kinds(watcher.due(4.0)) == [(EventKind.NODE_DOWN, "s1"), (EventKind.NODE_DOWN, "s2")]
    assert watcher.due(5.0) == []


def test_watcher_sees_a_node_that_is_already_draining_as_up_then_notice():
    cluster = FakeCluster()
    watcher = cluster.watcher()
    cluster.nodes = [node("s3", labels={"spot": "1"}), node("gone", alive=False, labels={"spot": "1"})]
    cluster.draining = {"s3": 0}  # a drain without a deadline
    assert kinds(watcher.due(0.0)) == [(EventKind.NODE_UP, "s3"), (EventKind.NOTICE, "s3")]
    assert watcher.deadline("s3") is None


def test_pool_over_the_watcher_notifies_with_the_drain_deadline_or_the_default():
    cluster = FakeCluster()
    launcher = FakeLauncher()
    pool = ElasticSpotPool(cluster.watcher(), launcher, config=SpotPoolConfig(unknown_notice_s=25.0))
    cluster.nodes = [node("s1", labels=SPOT), node("s2", labels=SPOT)]
    pool.poll(0.0)
    cluster.draining = {"s1": int((cluster.epoch + 90.0) * 1000), "s2": 0}
    pool.poll(0.0)
    assert launcher.calls[2:] == [("notify", "spot-s1", pytest.approx(90.0)), ("notify", "spot-s2", 25.0)]
    cluster.nodes = []
    pool.poll(1.0)
    assert pool.stats.preempted_after_notice == 2


# ---------------------------------------------------------------------------------------------
# Preempt worker w at step s, in process: the pure queue and two executors (no Ray)

SCHEDULE = Schedule(num_steps=8, noise_level=0.7)


class Killed(Exception):
    """The worker's process vanished after a step (a kill without notice)."""


@pytest.fixture(scope="module")
def executors():
    import torch

    from roll_spotlight.worker.engine import RolloutEngine
    from tests.runtime_helpers import random_policy, tiny_config

    torch.set_num_threads(1)
    cfg = tiny_config()
    return {w: RolloutEngine(random_policy(cfg, seed=3), commit_every=2) for w in ("spot", "ondemand", "ref")}


def one_request_queue() -> tuple[RequestQueue, object]:
    queue = RequestQueue(QueueConfig(lease_s=60.0))
    queue.submit([RequestSpec(0, "two red circles", 1234, SCHEDULE, 0, RequestKind.ROLLOUT, 0)])
    return queue, queue.pull("spot")[0]


def stop_after(steps: int, *, kill: bool):
    count = [0]

    def should_stop() -> bool:
        count[0] += 1
        if count[0] == steps and kill:
            raise Killed
        return count[0] == steps

    return should_stop


@pytest.mark.parametrize("step", [1, 5])
def test_notice_at_step_s_commits_and_another_worker_resumes_bit_identically(executors, step):
    queue, lease = one_request_queue()
    committed = denoise_lease(executors["spot"], lease, stop_after(step, kill=False))
    assert committed.state.step_index == step and queue.commit("spot", committed.state)
    (resumed,) = queue.pull("ondemand")
    assert resumed.resume.step_index == step
    out = denoise_lease(executors["ondemand"], resumed).output
    ref = denoise_lease(executors["ref"], one_request_queue()[1]).output
    assert out.resumed_from == step
    assert np.array_equal(out.latents, ref.latents) and np.array_equal(out.log_probs, ref.log_probs)


@pytest.mark.parametrize("step", [4, 5])
def test_kill_without_notice_loses_at_most_commit_every_steps(executors, step):
    queue, lease = one_request_queue()
    with pytest.raises(Killed):  # checkpoints every 2 steps reach the queue; then the process dies
        denoise_lease(executors["spot"], lease, stop_after(step, kill=True), on_checkpoint=lambda s: queue.checkpoint("spot", s))
    assert queue.worker_lost("spot") == 1
    (resumed,) = queue.pull("ondemand")
    lost = step - resumed.resume.step_index
    assert 0 < lost <= 2
    out = denoise_lease(executors["ondemand"], resumed).output
    ref = denoise_lease(executors["ref"], one_request_queue()[1]).output
    assert np.array_equal(out.latents, ref.latents) and np.array_equal(out.log_probs, ref.log_probs)


class _Groups:
    """`ElasticGroups` as the launcher sees it: records notices and regroups; a regroup that
    loses members hands back one lease per lost node (their broken groups')."""

    def __init__(self, members):
        self.workers, self.calls, self.requeued = dict.fromkeys(members), [], 0

    def notice(self, members, seconds_left):
        self.calls.append(("notice", sorted(members)))

    def regroup(self, lost=(), newcomers=None):
        self.calls.append(("regroup", sorted(lost), dict(newcomers or {})))
        self.requeued += len({node for node, _ in lost})
        for member in lost:
            del self.workers[member]


def _elastic_launcher(nodes=("a", "b", "c")):
    from roll_spotlight.spot_pool.ray_nodes import RayWorkerLauncher

    launcher = RayWorkerLauncher("unused", None, None, gpus_per_node=2, elastic=object())
    for node in nodes:
        launcher.nodes[f"spot-{node}"] = [f"spot-{node}", f"spot-{node}/g1"]
        launcher.members |= {f"spot-{node}": (node, 0), f"spot-{node}/g1": (node, 1)}
    launcher.groups = _Groups(launcher.members.values())
    return launcher


def test_notices_of_one_poll_re_form_the_survivors_once_without_any_noticed_node():
    """Two elastic nodes noticed in the same poll: both groups are told at once, and the one
    regroup at the end of the poll drops every noticed member (a regroup per notice would plan
    the second noticed node into a new group, whose members then wait out its rendezvous)."""
    launcher = _elastic_launcher()
    launcher.notify("spot-a", 5.0)
    launcher.notify("spot-b", 5.0)
    assert launcher.groups.calls == [("notice", [("a", 0), ("a", 1)]), ("notice", [("b", 0), ("b", 1)])]
    launcher.advance()
    assert launcher.groups.calls[2:] == [("regroup", [("a", 0), ("a", 1), ("b", 0), ("b", 1)], {})]
    launcher.advance()
    assert len(launcher.groups.calls) == 3, "nothing new: no regroup"


def test_nodes_lost_in_one_poll_leave_in_one_regroup_that_reports_their_requeued_leases():
    """Two nodes whose workers died on their own and one killed at its NODE_DOWN, all in one
    poll (no notice: naive spot): nothing regroups until the poll's end, then one regroup drops
    all three (a regroup per loss planned a dead node's members into a new group, and the
    survivors waited out its rendezvous), and ``advance`` returns the leases it handed back."""
    launcher = _elastic_launcher(("a", "b", "c", "d"))
    assert (launcher.requeue("spot-a"), launcher.requeue("spot-b")) == (0, 0), "counted by the regroup"
    launcher._lose("spot-c")  # what `kill` does after ending the node's actors
    launcher._lose("spot-c")  # and its `requeue` again: the members are dropped once
    assert launcher.groups.calls == []
    assert launcher.advance() == 3
    lost = [(n, g) for n in "abc" for g in (0, 1)]
    assert launcher.groups.calls == [("regroup", lost, {})]
    assert sorted(launcher.groups.workers) == [("d", 0), ("d", 1)]
    assert launcher.advance() == 0 and len(launcher.groups.calls) == 1
