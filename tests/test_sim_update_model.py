"""Tier 1: the simulator's model of the update (spot training: TRAIN micro-batches through the queue)."""
import dataclasses
from collections import defaultdict

import pytest

from roll_spotlight.sim.baselines import BaselineSpec, Exploration, Recovery, Training, get_baseline
from roll_spotlight.sim.costmodel import CostModel
from roll_spotlight.sim.api import simulate
from roll_spotlight.sim.spotfeed import fake_feed
from roll_spotlight.sim.system import ClusterSimulation, SimConfig
from roll_spotlight.dispatch.requests import plan_micro_batches

# 16 prompts x 16 images = 256 samples: 64 chunks x 2 trained steps = 128 micro-batches
COST = CostModel.from_dict({"prompts_per_iteration": 16, "group_size": 16})
N_MB = 128


def simulation(*, ondemand=4, spot=4, feed=None, cost=COST, resolution=512, iterations=2, name="spotlight_train"):
    feed = feed or fake_feed([(0.0, "up", f"n{i}") for i in range(spot)])
    config = SimConfig(resolution=resolution, ondemand=ondemand, spot=spot, iterations=iterations)
    return ClusterSimulation(get_baseline(name), config, cost, feed)


def accepted_by_iteration(sim):
    out = defaultdict(list)
    for report in sim.trainer.log:
        if report.accepted:
            out[report.iteration] += report.indices
    return out


def assert_each_micro_batch_once(sim, iterations):
    by_it = accepted_by_iteration(sim)
    assert sorted(by_it) == list(range(iterations))
    for it, indices in by_it.items():
        assert sorted(indices) == list(range(N_MB)), it


def first_train_start(result, cost=COST):
    """Start of iteration 0's training phase in a run without preemptions."""
    return result.iteration_times_s[0] - cost.local_weight_sync_s - result.mean_train_phase_s


def merged_feed(*feeds):
    events = tuple(sorted((e for f in feeds for e in f.events), key=lambda e: e.time_s))
    return dataclasses.replace(feeds[0], events=events)


def test_micro_batch_plan_is_chunk_major_step_minor():
    plan = plan_micro_batches(range(10), range(2), 4)
    assert [(mb.index, mb.rows, mb.step) for mb in plan[:3]] == [(0, (0, 1, 2, 3), 0), (1, (0, 1, 2, 3), 1),
                                                                 (2, (4, 5, 6, 7), 0)]
    assert plan[-1].rows == (8, 9) and len(plan) == COST.train_micro_batches(10) == 6


def test_spot_training_splits_the_update_and_beats_training_on_demand_only():
    sim = simulation()
    result = sim.simulate()
    assert_each_micro_batch_once(sim, 2)
    assert result.train["micro_batches_per_iteration"] == N_MB and result.train["refused_reports"] == 0
    assert result.train["spot_share"] == pytest.approx(0.5)         # 4 on-demand + 4 spot GPUs, no market
    vanilla = simulation(spot=0, name="vanilla").simulate()
    assert result.mean_train_phase_s < 0.6 * vanilla.mean_train_phase_s
    assert result.time_per_iteration_s < vanilla.time_per_iteration_s
    assert result.explored_seeds_per_iteration == 0                  # spot GPUs train, they do not explore


@pytest.mark.parametrize("resolution", [512, 1280])
def test_without_spot_gpus_training_is_vanillas_plus_reports_and_the_step(resolution):
    """8 on-demand GPUs on the trainer's node: each GPU runs 32 micro-batches in 8 leases of 4, each
    lease ends with a gradient report over NVLink (an SP-4 group first sums inside the group)."""
    sim = simulation(ondemand=8, spot=0, resolution=resolution)
    result = sim.simulate()
    vanilla = simulation(ondemand=8, spot=0, resolution=resolution, name="vanilla").simulate()
    train_s = COST.train_s(COST.images_per_iteration(), resolution, 8)
    assert vanilla.mean_train_phase_s == pytest.approx(train_s)
    degree = COST.preferred_sp(resolution)
    reports_per_worker = N_MB // 8 // int(COST.train_lease_micro_batches)
    overhead = reports_per_worker * COST.gradient_report_s(False, degree) + COST.optimizer_step_s
    assert result.mean_train_phase_s == pytest.approx(train_s + overhead, rel=1e-9)
    assert result.time_per_iteration_s == pytest.approx(vanilla.time_per_iteration_s + overhead, rel=1e-9)
    assert result.train["spot_share"] == 0.0 and result.lost_gpu_s == 0
    assert_each_micro_batch_once(sim, 2)


def test_no_market_is_deterministic():
    first = simulate(None, resolution=512, ondemand=4, spot=4, iterations=2, baselines=("spotlight_train",),
                     cost_model=COST)
    again = simulate(None, resolution=512, ondemand=4, spot=4, iterations=2, baselines=("spotlight_train",),
                     cost_model=COST)
    assert first == again
    times = first["baselines"]["spotlight_train"]["iteration_times_s"]
    assert times == pytest.approx([times[0]] * len(times), rel=1e-12)


def test_a_kill_loses_only_the_unreported_micro_batches():
    clean = simulation().simulate()
    mb_s = COST.train_micro_batch_s(512)
    kill_t = first_train_start(clean) + 5.5 * mb_s      # in the second lease of every spot GPU
    feed = fake_feed([(0.0, "up", f"n{i}") for i in range(4)] + [(kill_t, "down", "n0")], notice_s=0.0)
    sim = simulation(feed=feed)
    result = sim.simulate()
    assert result.preemptions == 1
    assert_each_micro_batch_once(sim, 2)                  # requeued and trained once elsewhere
    spot_workers = {r.worker for r in sim.trainer.log if r.kind == "spot"}
    killed = [w for w in spot_workers if max(r.at_s for r in sim.trainer.log if r.worker == w) < kill_t]
    assert len(killed) == 1
    last_report = max(r.at_s for r in sim.trainer.log if r.worker == killed[0])
    assert [r.accepted for r in sim.trainer.log if r.worker == killed[0]] == [True]   # its first sum stays
    assert result.lost_gpu_s == pytest.approx(kill_t - last_report, rel=1e-9)          # only the partial sum
    assert result.train["lost_micro_batches"] == 2        # one finished, one in hand
    assert result.time_per_iteration_s > clean.time_per_iteration_s


def test_a_notice_finishes_the_micro_batch_in_hand_and_hands_back_the_rest():
    clean = simulation().simulate()
    mb_s = COST.train_micro_batch_s(512)
    notice_t = first_train_start(clean) + 2.5 * mb_s     # in the third micro-batch of the first lease
    feed = fake_feed([(0.0, "up", f"n{i}") for i in range(4)] + [(notice_t + 60.0, "down", "n0")], notice_s=60.0)
    sim = simulation(feed=feed)
    result = sim.simulate()
    assert result.notices == result.preemptions == 1
    assert_each_micro_batch_once(sim, 2)
    noticed = [r for r in sim.trainer.log if r.kind == "spot" and r.iteration == 0 and len(r.indices) == 3]
    assert len(noticed) == 1 and noticed[0].accepted      # 3 finished, the 4th handed back unstarted
    assert noticed[0].at_s < notice_t + mb_s
    assert result.lost_gpu_s == 0 and result.train["lost_micro_batches"] == 0


def test_a_short_notice_reports_what_finished_and_loses_the_micro_batch_in_hand():
    clean = simulation().simulate()
    mb_s = COST.train_micro_batch_s(512)
    notice_t = first_train_start(clean) + 2.5 * mb_s
    notice_s = 0.3 * mb_s                                  # the third micro-batch cannot finish in time
    long_notice = fake_feed([(0.0, "up", f"n{i}") for i in range(4)])
    short = fake_feed([(notice_t + notice_s, "down", "n0")], notice_s=notice_s)
    sim = simulation(feed=merged_feed(long_notice, short))
    result = sim.simulate()
    assert_each_micro_batch_once(sim, 2)
    early = [r for r in sim.trainer.log if r.kind == "spot" and r.iteration == 0 and len(r.indices) == 2]
    assert len(early) == 1 and early[0].accepted
    assert result.lost_gpu_s == pytest.approx(0.5 * mb_s, rel=1e-6)
    assert result.train["lost_micro_batches"] == 1


def test_gradient_bytes_move_time_as_the_cost_model_says():
    """One spot GPU: its reports are alone on the trainer's network link, so its seconds in REPORT
    are its reports x adapter bytes / network bandwidth; the on-demand GPU reports over NVLink."""
    seconds = {}
    for gb in (1.70, 17.0):
        cost = COST.with_overrides({"lora_adapter_gb": gb})
        sim = simulation(ondemand=1, spot=1, cost=cost)
        result = sim.simulate()
        spot_reports = sum(1 for r in sim.trainer.log if r.kind == "spot")
        link_s = gb * 1e9 / (cost.network_gb_s * 1e9)
        assert cost.gradient_report_s(True) == pytest.approx(link_s)
        assert result.phase_seconds["spot"]["report"] == pytest.approx(spot_reports * link_s, rel=1e-9)
        assert_each_micro_batch_once(sim, 2)
        seconds[gb] = result.mean_train_phase_s
    assert seconds[17.0] > seconds[1.70]


def test_reports_share_the_trainers_network_link():
    sim = simulation(ondemand=1, spot=4)
    result = sim.simulate()
    spot_reports = sum(1 for r in sim.trainer.log if r.kind == "spot")
    # the four spot GPUs finish their first leases together: the second waits one link time, the
    # third two, the fourth three (later leases are staggered by those waits)
    link_s = COST.gradient_report_s(True)
    assert result.phase_seconds["spot"]["report"] >= (spot_reports + 6) * link_s - 1e-9


def test_spot_training_is_declared_as_data():
    spec = get_baseline("spotlight_train")
    assert spec.training is Training.QUEUE and spec.uses_spot and spec.commit_on_notice
    assert spec.exploration is Exploration.NONE and spec.recovery is Recovery.WARM
    assert get_baseline("spotlight").training is Training.ONDEMAND
    with pytest.raises(ValueError, match="train or explore"):
        BaselineSpec("both", True, True, Exploration.OFF_PATH, True, Recovery.WARM, Training.QUEUE)
