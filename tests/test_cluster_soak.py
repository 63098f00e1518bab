"""The local multi-node cluster harness and `python -m benchmarks.cluster_soak`.

Tier 1: the capacity check, bad input (exit 2 naming the flag before anything starts) and the
trace driver against a fake cluster. Tier 3 (`ray`, `slow`, about a minute and a half): a real
head and a spot raylet of 2 GPUs; the trace notices the node, its notice agent drains it through
the GCS, the run's cluster pool sees NOTICE, the held SP group commits, the raylet is killed at
the deadline and the node leaves the run, and every request completes once and bit for bit.
"""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from roll_spotlight.spot import EventList, NodeEvent, Trace
from roll_spotlight.worker.faults import FaultPlan
from roll_spotlight.spot.market import MarketConfig, SpotMarket
from benchmarks.cluster_soak import DEFAULTS, check_machine, main, run_cluster_soak
from roll_spotlight.cluster.local_cluster import HEAD_MB, ClusterTraceDriver, check_capacity, node_memory_mb


def _trace(*rows, end_s: float = 600.0) -> Trace:
    events = tuple(NodeEvent(t, op, node) for t, op, node in rows)
    return Trace(name="t", kind="events", measures="running", provider="aws",
                 zones={"z": EventList(events, 0.0, end_s)})


def test_capacity_names_the_flags_and_what_fits():
    fits = HEAD_MB + 4 * node_memory_mb(2)
    check_capacity(4, 2, fits)
    with pytest.raises(ValueError, match=r"--nodes 5 x --gpus-per-node 2 .* at most --nodes 4 here"):
        check_capacity(5, 2, fits)
    with pytest.raises(ValueError, match="--nodes must be an integer >= 0"):
        check_capacity(-1, 2, fits)


def test_too_many_nodes_is_one_line_exit_2_before_anything_starts(capsys):
    ps_before = _my_ray_processes()
    assert main(["--nodes", "100000", "--gpus-per-node", "2", "--minutes", "0.1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("python -m benchmarks.cluster_soak: --nodes 100000")
    assert _my_ray_processes() == ps_before, "nothing may start before the check"


@pytest.mark.parametrize("argv, flag", [(["--provider", "ibm"], "--provider must be null or one of"),
                                        (["--minutes", "0"], "--minutes"),
                                        (["--sp-degree", "3"], "--sp-degree"),
                                        (["--trace", "/nonexistent/trace.csv"], "/nonexistent/trace.csv")])
def test_bad_input_names_the_flag(argv, flag, capsys):
    assert main(argv) == 2
    assert flag in capsys.readouterr().err


def test_sp_groups_must_fit_the_nodes():
    with pytest.raises(ValueError, match="--gpus-per-node"):
        check_machine(replace(DEFAULTS, nodes=1, gpus_per_node=1, sp_degree=2), available_mb=1e9)


class FakeCluster:
    def __init__(self) -> None:
        self.calls = []

    def add_spot_node(self, name, zone=""):
        self.calls.append(("up", name, zone))

    def notice(self, name, deadline_s):
        self.calls.append(("notice", name, deadline_s))

    def kill(self, name):
        self.calls.append(("kill", name))
        return True


def test_the_trace_driver_starts_notices_and_kills_raylets_at_the_markets_times():
    trace = _trace((0.0, "add", "a"), (0.0, "add", "b"), (10.0, "remove", "a"), (20.0, "add", "c"),
                   (30.0, "remove", "b"))
    market = SpotMarket(trace, MarketConfig(notice_s=4.0))
    cluster, killed = FakeCluster(), []
    driver = ClusterTraceDriver(market, cluster, epoch0=1000.0, before_kill=lambda n, noticed: killed.append((n, noticed)))
    driver.tick(0.0)
    assert cluster.calls == [("up", "spot-0", "z"), ("up", "spot-1", "z")]
    driver.tick(9.0)
    assert cluster.calls[2:] == [("notice", "spot-0", 1010.0)], "the deadline is the market's NODE_DOWN, in epoch s"
    driver.tick(40.0)
    assert cluster.calls[3:] == [("kill", "spot-0"), ("up", "spot-2", "z"), ("notice", "spot-1", 1030.0),
                                 ("kill", "spot-1")]
    assert killed == [("spot-0", True), ("spot-1", True)]
    assert (driver.stats.joins, driver.stats.notices, driver.stats.kills_after_notice) == (3, 2, 2)


def test_a_drop_without_notice_is_a_plain_kill():
    market = SpotMarket(_trace((0.0, "add", "a"), (10.0, "remove", "a")), MarketConfig(notice_s=4.0))
    cluster, killed = FakeCluster(), []
    driver = ClusterTraceDriver(market, cluster, epoch0=0.0, no_notice=True,
                                before_kill=lambda n, noticed: killed.append((n, noticed)))
    driver.tick(11.0)
    assert cluster.calls == [("up", "spot-0", "z"), ("kill", "spot-0")] and killed == [("spot-0", False)]
    assert (driver.stats.kills_without_notice, driver.stats.kills_after_notice, driver.stats.notices) == (1, 0, 0)


def test_a_raylet_start_never_holds_up_the_caller_and_a_node_killed_first_never_starts(monkeypatch):
    """Raylets start one after another on the cluster's starter thread: adding a node while the
    last raylet has not made its socket returns with the node queued (so the trace's driver,
    whose notices have 2-second deadlines when compressed, is never held up), and a node killed
    before its turn is never started. ``sleep`` processes stand in for raylets and agents."""
    import subprocess

    from roll_spotlight.cluster.local_cluster import LocalCluster, LocalClusterConfig

    def sleeper(*_args):
        return subprocess.Popen(["sleep", "60"], start_new_session=True)

    started = []
    cluster = LocalCluster(LocalClusterConfig(provider="k8s"))
    cluster.address = "127.0.0.1:1"
    monkeypatch.setattr(cluster, "_start_agent", sleeper)
    monkeypatch.setattr(cluster, "_sockets", set)  # no raylet ever makes its socket
    monkeypatch.setattr(cluster, "_ray_start", lambda name, args, env: started.append(name) or sleeper())
    try:
        cluster.add_spot_node("a")
        cluster.add_spot_node("b")  # waits for a's socket on the starter thread, not here
        assert cluster.nodes["b"].raylet is None and "b" not in started
        assert cluster.kill("b") is False, "b never ran"
        assert cluster.kill("a") is True  # a exits: the starter moves on, and skips b
    finally:
        cluster.close()
    assert started == ["a"] and cluster.nodes == {}


def _my_ray_processes() -> set[int]:
    import psutil

    out = set()
    for proc in psutil.process_iter(["cmdline", "uids"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if proc.info["uids"] and proc.info["uids"].real == os.getuid() and "ray start" in cmd:
            out.add(proc.pid)
    return out


@pytest.mark.ray
@pytest.mark.slow
def test_notice_drain_commit_node_gone_and_nothing_lost(tmp_path):
    import ray

    if ray.is_initialized():
        pytest.skip("drives a Ray cluster of its own; this process is connected to another")
    ray_address_file = Path("/tmp/ray/ray_current_cluster")
    before = ray_address_file.stat().st_mtime_ns if ray_address_file.exists() else None
    # one spot node of 2 GPUs (one SP-2 group): noticed 4 s into the 15 s run, killed 4 s later
    trace = _trace((0.0, "add", "a"), (8.0, "remove", "a"), (600.0, "add", "later"))
    cfg = replace(DEFAULTS, duration_s=15.0, speedup=1.0, nodes=1, gpus_per_node=2, sp_degree=2, notice_s=4.0,
                  num_steps=6, drain_timeout_s=60.0)
    report = run_cluster_soak(cfg, trace, worker_kwargs=lambda node_id: {"faults": FaultPlan(hold_at_step=3)})
    summary = json.dumps({k: report[k] for k in ("cluster", "notices", "preemptions", "commits", "lost")})
    assert report["cluster"] == {"joins": 1, "notices": 1, "kills_after_notice": 1, "kills_without_notice": 0,
                                 "gone_before_kill": 0,  # its workers kept it busy to the deadline
                                 "deaths": {"AUTOSCALER_DRAIN_PREEMPTED": 1}}, summary
    # the run saw the raylet join, drain (the agent's DrainNode, nothing else notifies) and go
    assert (report["spot_nodes_started"], report["notices"], report["preemptions"]) == (1, 1, 1), summary
    assert report["preempted_after_notice"] == 1 and report["notices_late"] == 0
    # the held group committed at step 3 and the on-demand worker resumed it, bit for bit
    assert report["commits"] >= 1 and report["resumed_from_commit"] >= 1 and report["outputs_resumed"] >= 1
    assert report["regroups_after_loss"] >= 1 and report["time_lost_per_preemption_s"]["count"] >= 1
    for key in ("lost", "duplicated", "mismatched", "denoise_steps_lost_after_notice", "leftover_processes"):
        assert report[key] == 0, (key, summary)
    assert report["requests_completed"] == report["requests_submitted"] > 0
    after = ray_address_file.stat().st_mtime_ns if ray_address_file.exists() else None
    assert after == before, "the harness must never record its cluster in /tmp/ray"
