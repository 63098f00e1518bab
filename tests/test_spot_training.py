"""Spot workers in training: the run's `spot:` section, its market, prices and cost ledger (tier 1),
and a short Ray training run whose one spot worker is preempted mid-rollout (tier 3): the curve and
every rollout output must equal those of the same run without spot, bit for bit."""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest

from roll_spotlight.config.strict import ConfigError, load_config
from roll_spotlight.dispatch.queue import QueueStats
from roll_spotlight.worker.faults import FaultPlan
from roll_spotlight.spot_pool.training_pool import TrainingSpotPool, training_market, training_notice_s, training_prices
from roll_spotlight.spot.market import MIN_NOTICE_S
from roll_spotlight.spot_pool.pool import ElasticSpotPool, SpotPoolConfig
from roll_spotlight.spot.market import MarketSchedule
from roll_spotlight.spot import CostLedger, EventKind, EventList, MarketConfig, NodeEvent, SpotMarket, Trace
from roll_spotlight.spot.synthetic import synthetic_trace
from roll_spotlight.config.run import RunConfig, SpotConfig
from tests.runtime_helpers import REPO, tiny_config


# ---------------------------------------------------------------------------------------------
# Tier 1: config, market, prices, ledger


def test_spot_is_on_in_the_quickstart_with_the_synthetic_market_and_off_in_the_learning_configs():
    quick = load_config(RunConfig, REPO / "configs" / "quickstart.yaml").spot
    assert quick.enabled and quick.trace is None and quick.max_workers >= 1
    for name in ("tiny_shapes.yaml", "tiny_shapes_spotlight.yaml"):
        assert not load_config(RunConfig, REPO / "configs" / name).spot.enabled, name


def test_the_quickstart_explores_on_spot_as_the_product_ships():
    cfg = load_config(RunConfig, REPO / "configs" / "quickstart.yaml")
    assert cfg.train.use_lora and cfg.spot_trains()  # spot workers train micro-batches beside the trainer
    assert cfg.exploration.mode == "stale" and cfg.exploration.adaptive
    assert cfg.exploration.seeds_per_prompt == 2 * cfg.train.group_size  # docs/learning.md: the study's pool


@pytest.mark.parametrize("override, key", [
    ("spot.bogus=1", "spot.bogus"),
    ("spot.max_workers=0", "spot.max_workers"),
    ("spot.compression=0", "spot.compression"),
    ("spot.notice_s=-1", "spot.notice_s"),
    ("spot.commit_every=-2", "spot.commit_every"),
    ("spot.victims=oldest", "spot.victims"),
    ("spot.spot_usd_per_gpu_hour=-1", "spot.spot_usd_per_gpu_hour"),
])
def test_bad_spot_keys_fail_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        tiny_config(override)


def test_training_market_caps_the_synthetic_fleet_and_compresses_the_notice():
    spot = SpotConfig(enabled=True, max_workers=2, compression=30.0)
    market = training_market(spot)
    assert market.trace.name.startswith("synthetic/") and market.config.cap_nodes == 2
    alive = max(len(market.alive_at(e.time_s)) for e in market.events)
    assert alive == 2
    assert market.notice_s == training_notice_s(spot, "aws") == 120.0 / 30.0
    assert training_notice_s(dataclasses.replace(spot, compression=600.0), "aws") == MIN_NOTICE_S
    assert training_notice_s(dataclasses.replace(spot, notice_s=7.5), "gcp") == 7.5
    downs = [e for e in market.events if e.kind is EventKind.NODE_DOWN]
    notices = {e.node_id: e.time_s for e in market.events if e.kind is EventKind.NOTICE}
    assert downs and all(math.isclose(d.time_s - notices[d.node_id], market.notice_s) for d in downs)


def test_training_market_reads_a_real_trace_file(shipped_traces):
    path = shipped_traces / "bamboo-spot-traces" / "aws" / "p3-trace.csv"
    market = training_market(SpotConfig(enabled=True, trace=str(path), max_workers=3, compression=60.0))
    assert market.trace.provider == "aws" and len(market) > 0
    assert max(len(market.alive_at(e.time_s)) for e in market.events) <= 3


def test_prices_default_to_the_traces_gpu_and_config_prices_replace_them_with_a_source():
    trace = synthetic_trace()
    table = training_prices(SpotConfig(), trace)
    assert table.gpu_type == "V100" and table.price("spot").usd_per_gpu_hour < table.price("ondemand").usd_per_gpu_hour
    custom = training_prices(SpotConfig(spot_usd_per_gpu_hour=1.5, gpu_type="H100"), trace)
    assert custom.gpu_type == "H100" and custom.price("spot/any-zone").usd_per_gpu_hour == 1.5
    assert "spot.spot_usd_per_gpu_hour" in custom.price("spot").source
    assert custom.price("ondemand").usd_per_gpu_hour == pytest.approx(82.52543396 / 8)


class FakeLauncher:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def start(self, name, node_id):
        self.calls.append(("start", name))

    def notify(self, name, seconds_left):
        self.calls.append(("notify", name))

    def kill(self, name):
        self.calls.append(("kill", name))
        return 0

    def requeue(self, name):
        return 1

    def dead(self):
        return []

    def advance(self):
        return 0

    def stop_all(self):
        self.calls.append(("stop_all",))


def two_node_market() -> SpotMarket:
    """Node a: 0..100 s, node b: 50 s.. (trace seconds; compression 10, notice 2 wall seconds)."""
    rows = (NodeEvent(0.0, "add", "a"), NodeEvent(50.0, "add", "b"), NodeEvent(100.0, "remove", "a"))
    trace = Trace(name="two", kind="events", measures="running", provider="aws",
                  zones={"z": EventList(rows, 0.0, 400.0)}, gpu_type="V100")
    return SpotMarket(trace, MarketConfig(notice_s=2.0, compression=10.0))


def completion(request_id: int, worker: str, resumed_from: int = 0):
    return SimpleNamespace(request=SimpleNamespace(request_id=request_id), worker=worker,
                           output=SimpleNamespace(resumed_from=resumed_from))


def test_training_pool_bills_both_pools_on_one_clock_and_reports_flat_metrics():
    now = [0.0]
    market = two_node_market()
    ledger = CostLedger(training_prices(SpotConfig(), market.trace))
    pool = ElasticSpotPool(MarketSchedule(market), FakeLauncher(), ledger, SpotPoolConfig(bill_scale=10.0))
    pool.poll(0.0)
    spot = TrainingSpotPool(pool, ledger, lambda: now[0], ondemand_gpus=3)
    now[0] = 9.0
    spot.poll()  # b up at 5, a notified at 8 (1 s before its deadline)
    now[0] = 20.0
    spot.poll()  # a down at 10
    for c in (completion(0, "ondemand-0"), completion(1, "spot-z/b", resumed_from=2), completion(1, "spot-z/b")):
        spot.record(c)
    m = spot.metrics(QueueStats(commits=1, resumed_from_commit=1))
    counts = (m["spot/nodes_started"], m["spot/notices"], m["spot/preemptions"], m["spot/workers_serving"])
    assert counts == (2, 1, 1, 1)
    assert (m["spot/completed_on_spot"], m["spot/outputs_resumed"], m["spot/duplicate_completions"]) == (1, 1, 1)
    assert m["spot/commits"] == 1 and m["spot/requests_failed"] == 0
    # on demand: 3 GPUs x 20 s; spot: a 0..10 s, b 5..20 s; all x10 (trace seconds)
    assert m["cost/gpu_s/ondemand"] == pytest.approx(3 * 20 * 10.0)
    assert m["cost/gpu_s/spot/z"] == pytest.approx((10 + 15) * 10.0)
    assert m["cost/usd"] == pytest.approx(m["cost/usd/ondemand"] + m["cost/usd/spot/z"])
    assert m["cost/usd"] < m["cost/all_ondemand_usd"] and 0 < m["cost/savings_fraction"] < 1
    now[0] = 30.0
    final = spot.close()
    assert ledger.open_nodes == () and pool.launcher.calls[-1] == ("stop_all",)
    assert final.total_gpu_hours * 3600 == pytest.approx((3 * 30 + 10 + 25) * 10.0)


def test_report_shows_the_ledger_and_counters_of_the_last_row(tmp_path):
    import json

    from roll_spotlight.run_report import _spot_lines, write_report

    now = [0.0]
    market = two_node_market()
    ledger = CostLedger(training_prices(SpotConfig(), market.trace))
    pool = ElasticSpotPool(MarketSchedule(market), FakeLauncher(), ledger, SpotPoolConfig(bill_scale=10.0))
    pool.poll(0.0)
    spot = TrainingSpotPool(pool, ledger, lambda: now[0], ondemand_gpus=2)
    now[0] = 36.0  # 2 GPUs x 36 s x 10 = 0.2 on-demand GPU-hours
    metrics = spot.metrics(QueueStats(commits=4))
    base = {"reward_mean": 0.1, "val_reward": 0.2, "val_reward_se": 0.01, "val_strict": 0.3}
    rows = [{"step": 1} | base, {"step": 2} | base | metrics]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = write_report(tmp_path).read_text()
    assert "## Spot workers and cost" in report
    assert "| ondemand | 0.200 |" in report and "| spot/z |" in report and "| commits | 4 |" in report
    assert _spot_lines([{"step": 1} | base]) == []


def test_report_timeline_marks_notices_commits_and_preemptions(tmp_path):
    import json

    from roll_spotlight.run_report import write_report

    rows = [{"step": 1, "reward_mean": 0.1, "val_reward": 0.2, "val_reward_se": 0.01, "val_strict": 0.3}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    events = [{"worker": "spot-a", "phase": "rollout", "start": 0.0, "end": 2.0},
              {"worker": "spot-a", "phase": "notice", "start": 1.5, "end": 1.5},
              {"worker": "spot-a", "phase": "commit", "start": 2.0, "end": 2.0},
              {"worker": "spot-a", "phase": "preempted", "start": 3.0, "end": 3.0},
              {"worker": "spot-b", "phase": "died", "start": 4.0, "end": 4.0},
              {"worker": "trainer", "phase": "train", "start": 0.0, "end": 4.0}]
    (tmp_path / "timeline.json").write_text(json.dumps(events))
    report = write_report(tmp_path).read_text()
    assert "Marks: 1 notice, 1 commit, 1 preempted, 1 died." in report
    assert "| spot-b | 0.00 |" in report  # a worker with only a mark has no busy time
    assert (tmp_path / "timeline.png").stat().st_size > 0


def test_train_with_a_missing_trace_fails_before_anything_runs(tmp_path, capsys):
    from roll_spotlight.cli import main

    run_dir = tmp_path / "run"
    code = main(["train", "--config", str(REPO / "configs" / "tiny_shapes.yaml"), "--trace",
                 str(tmp_path / "absent.csv"), "--run-dir", str(run_dir)])
    assert code == 2 and "--trace" in capsys.readouterr().err
    assert not run_dir.exists()


def test_trace_flag_turns_spot_on_with_that_market(tmp_path):
    from roll_spotlight.cli import _with_trace, build_parser

    trace = tmp_path / "t.csv"
    trace.write_text("x")
    args = build_parser().parse_args(["train", "--config", "c.yaml", "--trace", str(trace)])
    cfg = _with_trace(tiny_config(), args.trace)
    assert cfg.spot.enabled and cfg.spot.trace == str(trace)
    assert _with_trace(tiny_config(), None).spot == SpotConfig()


# ---------------------------------------------------------------------------------------------
# Tier 3: a Ray training run with a spot worker preempted mid-rollout

NOTICE_AT = 30.0  # pool-clock units (one per read: the market moves only while the backend polls)
NOTICE_S = 3.0
HOLD_AT_STEP = 2
class CountingClock:
    """Advances one unit per read, so market time passes only while the backend polls the pool."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def one_spot_node_market(spot: SpotConfig) -> SpotMarket:
    """The synthetic generator with one node and no replacement: n0 up at 0, its notice at clock
    NOTICE_AT, its NODE_DOWN NOTICE_S later (compression chosen so)."""
    trace = synthetic_trace(nodes=1, mtbp_s=600.0, mean_batch=1.0, span_s=1_200.0, replace_delay_s=10_000.0, seed=3)
    down = next(ev.time_s for ev in trace.zones["synthetic"].events if ev.op == "remove")
    spot = dataclasses.replace(spot, compression=down / (NOTICE_AT + NOTICE_S), notice_s=NOTICE_S)
    market = training_market(spot, trace)
    assert [(e.kind, e.node_id) for e in market.events] == [
        (EventKind.NODE_UP, "synthetic/n0"), (EventKind.NOTICE, "synthetic/n0"), (EventKind.NODE_DOWN, "synthetic/n0")]
    assert market.events[1].time_s == pytest.approx(NOTICE_AT)
    return market


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from roll_spotlight.runtime.ray_backend import RayClusterConfig, init_ray

    init_ray(RayClusterConfig(num_cpus=2, ondemand_workers=1, spot_pool_slots=2))
    yield ray
    ray.shutdown()


def recorded(backend) -> list:
    """Wrap the backend's rollouts (alone or scored) so every output it returns is kept, in order."""
    outputs: list = []
    rollouts, rollouts_scored = backend.rollouts, backend.rollouts_scored
    inside = [0]  # rollouts_scored may call rollouts: count those outputs once

    def record(specs):
        out = rollouts(specs)
        if not inside[0]:
            outputs.extend(out)
        return out

    def record_scored(specs):
        inside[0] += 1
        try:
            out, scored = rollouts_scored(specs)
        finally:
            inside[0] -= 1
        outputs.extend(out)
        return out, scored

    backend.rollouts, backend.rollouts_scored = record, record_scored
    return outputs


def comparable(rows: list[dict]) -> list[dict]:
    """The rows without times (keys ending in _s) and the spot pool's own counters."""
    return [{k: v for k, v in r.items() if not k.endswith("_s") and not k.startswith(("spot/", "cost/"))}
            for r in rows]


@pytest.mark.ray
@pytest.mark.slow
def test_training_with_a_preempted_spot_worker_equals_training_without_spot(tmp_path, ray_cluster):
    import torch

    from roll_spotlight.runtime.coordinator import Coordinator
    from roll_spotlight.runtime.local import LocalBackend
    from roll_spotlight.runtime.ray_backend import RayBackend, RayClusterConfig
    from roll_spotlight.training.metrics import read_metrics
    from tests.runtime_helpers import random_policy, save_random_policy

    torch.set_num_threads(1)
    cfg = tiny_config("rollout_batch_size=4", "spot.enabled=true", "spot.commit_every=1")
    off = dataclasses.replace(cfg, spot=SpotConfig())
    reference = LocalBackend(off, random_policy(off))  # the reference loop; test_runtime_ray: Ray == local
    ref_outputs = recorded(reference)
    ref = Coordinator(off, reference, tmp_path / "off", progress=False).train()

    hold = lambda node: {"faults": FaultPlan(hold_at_step=HOLD_AT_STEP)} if node == "synthetic/n0" else {}  # noqa: E731
    backend = RayBackend(cfg, save_random_policy(cfg, tmp_path / "policy.pt"), RayClusterConfig(ondemand_workers=1, trainer_threads=1),
                         spot_market=one_spot_node_market(cfg.spot), spot_clock=CountingClock(),
                         spot_worker_kwargs=hold)
    outputs = recorded(backend)
    try:
        result = Coordinator(cfg, backend, tmp_path / "on", progress=False).train()
    finally:
        backend.close()

    rows, ref_rows = read_metrics(tmp_path / "on"), read_metrics(tmp_path / "off")
    assert comparable(rows) == comparable(ref_rows)
    assert np.array_equal(result.base.rewards, ref.base.rewards)
    assert np.array_equal(result.final.rewards, ref.final.rewards)
    assert len(outputs) == len(ref_outputs) == cfg.max_steps * cfg.rollout_batch_size * cfg.train.group_size
    mismatched = sum(not (np.array_equal(a.latents, b.latents) and np.array_equal(a.log_probs, b.log_probs)
                          and np.array_equal(a.image, b.image)) for a, b in zip(outputs, ref_outputs))
    assert mismatched == 0
    spot = rows[-1]
    assert spot["spot/notices"] == 1 and spot["spot/preemptions"] == 1, "n0 was parked until its notice"
    # n0 parks in its first batch, the base's validation (on the workers): the row another worker
    # resumes is a validation pair, which the base's rewards above compare bit for bit
    assert spot["spot/outputs_resumed"] >= 1
    assert (spot["spot/requests_failed"], spot["spot/duplicate_completions"], spot["spot/late_completions_rejected"]) \
        == (0, 0, 0)
    assert spot["cost/gpu_s/spot/synthetic"] > 0 and spot["cost/usd"] < spot["cost/all_ondemand_usd"]


def test_a_wall_clock_pool_polls_its_market_while_the_driver_is_busy():
    """A notice that falls due while the driver validates or waits for the trainer must still be
    delivered on time: the background poller advances the market without any driver poll."""
    import time

    now = [0.0]
    market = two_node_market()
    ledger = CostLedger(training_prices(SpotConfig(), market.trace))
    pool = ElasticSpotPool(MarketSchedule(market), FakeLauncher(), ledger, SpotPoolConfig(bill_scale=10.0))
    polled: list[float] = []
    real_poll = pool.poll
    pool.poll = lambda t: (polled.append(t), real_poll(t))[1]
    spot = TrainingSpotPool(pool, ledger, lambda: now[0], ondemand_gpus=1, background_poll_s=0.005)
    deadline = time.monotonic() + 10.0
    while not polled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert polled, "the background poller never polled"
    spot.close()
    after_close = len(polled)
    time.sleep(0.05)
    assert len(polled) == after_close  # closed: the poller has stopped
    assert spot._poller is not None and not spot._poller.is_alive()


def test_report_says_who_trained_the_micro_batches_and_what_the_reward_cannot_see(tmp_path):
    import json

    from roll_spotlight.run_report import write_report

    base = {"reward_mean": 0.1, "val_reward": 0.2, "val_reward_se": 0.01, "val_strict": 0.3}
    train = {"train/micro_batches": 12.0, "train/micro_batches_trainer": 3.0, "train/micro_batches_spot": 6.0,
             "train/workers": 4.0, "train/spot_workers": 2.0, "train/reports_refused": 1.0,
             "train/spot_saved_s": 2.5, "spot/placement": "training saves more: every spot worker trains first"}
    rows = [{"step": 1} | base | train, {"step": 2} | base | train]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = {"val_reward": 0.5, "val_reward_se": 0.01, "val_strict": 0.2, "val_bg_level": 0.4, "val_bg_grid": 0.1}
    (tmp_path / "summary.json").write_text(json.dumps({
        "base": evals, "final": evals | {"val_bg_level": 3.5, "val_bg_grid": 1.25},
        "paired": {"gain": 0.1, "gain_se": 0.02, "z": 5.0, "strict_change": 0.0}}))
    report = write_report(tmp_path).read_text()
    assert "24 micro-batches: 6 on the trainer, 6 on on-demand rollout workers, 12 on spot workers (50.0%" in report
    assert "spot workers were 50.0% of the workers" in report and "Refused reports: 2" in report
    assert "every spot worker trains first" in report
    assert "| final | 0.5000 ± 0.0100 | 0.200 | 3.50 | 1.250 |" in report


def test_the_pool_knows_the_queue_names_of_its_workers_and_of_their_sp_groups():
    """Queue training's split counts a report as spot work when its name is a spot worker's or an
    elastic SP group's (any generation, also one that has since been re-formed)."""
    market = two_node_market()
    ledger = CostLedger(training_prices(SpotConfig(), market.trace))
    launcher = FakeLauncher()
    launcher.regroups = [SimpleNamespace(formed=("gen0/spot/sp0",)), SimpleNamespace(formed=("gen1/spot/sp0",))]
    pool = ElasticSpotPool(MarketSchedule(market), launcher, ledger, SpotPoolConfig(bill_scale=10.0))
    pool.poll(0.0)
    spot = TrainingSpotPool(pool, ledger, lambda: 0.0, ondemand_gpus=2)
    assert spot.is_spot("spot-z/a") and spot.is_spot("gen0/spot/sp0") and spot.is_spot("gen1/spot/sp0")
    assert not spot.is_spot("trainer") and not spot.is_spot("actor_infer-0") and not spot.is_spot("gen2/spot/sp0")


def test_a_failed_background_poll_is_raised_to_the_driver_not_swallowed():
    import threading

    class FailingPool:
        config = SpotPoolConfig()
        polled = threading.Event()

        def poll(self, now):
            self.polled.set()
            raise ValueError("node table unreadable")

        def close(self, now):
            pass

    pool = FailingPool()
    ledger = CostLedger(training_prices(SpotConfig(), two_node_market().trace))
    spot = TrainingSpotPool(pool, ledger, lambda: 1.0, ondemand_gpus=1, background_poll_s=0.01)
    assert pool.polled.wait(10.0)
    spot._poller.join(10.0)
    assert isinstance(spot.poller_error, ValueError)
    with pytest.raises(RuntimeError, match="background poll failed"):
        spot.poll()
    with pytest.raises(RuntimeError, match="background poll failed"):
        spot.close()
