"""Tier 1: the simulated cluster, driving the runtime's queue, exploration and SP planners."""
import dataclasses
import math

import pytest

from roll_spotlight.sim.baselines import get_baseline
from roll_spotlight.sim.costmodel import CostModel
from roll_spotlight.sim.api import simulate
from roll_spotlight.sim.spotfeed import fake_feed
from roll_spotlight.sim.system import ClusterSimulation, SimConfig
from roll_spotlight.spot.market import EventKind
from roll_spotlight.spot.prices import Price, PriceTable

SMALL = {"prompts_per_iteration": 8, "group_size": 8}


def _downs(feed, end_s):
    """NODE_DOWN events at or before ``end_s``: the preemptions a run ending then sees."""
    return sum(1 for e in feed.events if e.kind is EventKind.NODE_DOWN and e.time_s <= end_s)


def small_cost(**extra):
    return CostModel.from_dict({**SMALL, **extra})


def run_one(name, *, resolution=512, ondemand=8, spot=8, iterations=3, feed=None, cost=None, seed=0, **cfg):
    feed = feed or fake_feed([(0.0, "up", f"n{i}") for i in range(spot)])
    config = SimConfig(resolution=resolution, ondemand=ondemand, spot=spot, iterations=iterations, seed=seed,
                       **cfg)
    return ClusterSimulation(get_baseline(name), config, cost or small_cost(), feed).simulate()


def rollout_phase(cost, resolution, workers, images, batch, serial=False):
    """(seconds, images finishing last): the workers pull ``batch`` at a time in turn (one 8-GPU node)."""
    degree = cost.preferred_sp(resolution)
    runs = [[] for _ in range(workers)]
    left = images
    while left:
        for worker_runs in runs:
            take = min(batch, left)
            if take:
                worker_runs.append(take)
                left -= take
    ends = [sum(cost.rollout_s(resolution, degree, batch=b, serial=serial) for b in r) for r in runs]
    end = max(ends)
    return end, sum(r[-1] for r, e in zip(runs, ends) if r and e == pytest.approx(end, rel=1e-12))


def analytic_vanilla_s(cost, resolution, ondemand, batch, serial=False):
    """Sum of phases: rollout runs + reward tail + training + weight sync."""
    workers = ondemand // cost.preferred_sp(resolution)
    images = cost.images_per_iteration()
    rollout_s, last = rollout_phase(cost, resolution, workers, images, batch, serial)
    tail = math.ceil(last / cost.reward_workers) * cost.reward_s()
    return rollout_s + tail + cost.train_s(images, resolution, ondemand) + cost.local_weight_sync_s


@pytest.mark.parametrize("resolution, ondemand, batch, serial", [(512, 4, None, False), (1280, 8, None, False),
                                                                  (512, 4, 3, False), (512, 4, 1, True),
                                                                  (1280, 8, 1, True)])
def test_vanilla_iteration_is_the_analytic_sum_of_phases(resolution, ondemand, batch, serial):
    cost = small_cost()
    result = run_one("vanilla", resolution=resolution, ondemand=ondemand, spot=0, iterations=3, cost=cost,
                     max_batch=batch, serial_rollout=serial)
    expected = analytic_vanilla_s(cost, resolution, ondemand, batch or cost.max_batch(resolution), serial)
    assert result.iteration_times_s == pytest.approx([expected] * 3, rel=1e-9)
    assert result.time_per_iteration_s == pytest.approx(expected, rel=1e-9)
    assert result.preemptions == 0 and result.spot_idle_fraction is None


@pytest.mark.parametrize("name", ["vanilla", "naive_spot", "spotlight", "spotlight_train"])
def test_the_wall_phases_of_an_iteration_add_up_to_it(name):
    result = run_one(name, spot=0 if name == "vanilla" else 8)
    wall = result.phases_per_iteration["wall_s"]
    assert set(wall) == {"rollout", "reward", "train", "sync"}
    assert sum(wall.values()) == pytest.approx(result.time_per_iteration_s, rel=1e-9)
    assert wall["train"] == pytest.approx(result.mean_train_phase_s, rel=1e-9)
    for kind in ("ondemand", "spot"):
        per_iteration = result.phases_per_iteration[f"{kind}_gpu_s"]
        assert per_iteration == pytest.approx({p: s / 3 for p, s in result.phase_seconds[kind].items()})
    billed = result.ondemand_gpu_hours * 3600 / 3
    assert sum(result.phases_per_iteration["ondemand_gpu_s"].values()) == pytest.approx(billed, rel=1e-6)


def test_a_colocated_reward_runs_after_the_rollouts_on_the_rollout_gpus():
    cost = small_cost(reward_workers=2, reward_s_ocr=0.5)
    servers = run_one("vanilla", ondemand=4, spot=0, cost=cost, max_batch=1)
    colocated = run_one("vanilla", ondemand=4, spot=0, cost=cost, reward_colocated=True, max_batch=1)
    images = cost.images_per_iteration()
    phase_s = images * 0.5 / 2                  # every image scored after the last rollout, 2 at a time
    assert colocated.phases_per_iteration["wall_s"]["reward"] == pytest.approx(phase_s)
    tail_s = 2 * 0.5                            # servers: only the last wave of 4 images, 2 at a time
    assert servers.phases_per_iteration["wall_s"]["reward"] == pytest.approx(tail_s)
    assert colocated.time_per_iteration_s == pytest.approx(servers.time_per_iteration_s + phase_s - tail_s)
    assert colocated.phases_per_iteration["ondemand_gpu_s"]["reward"] == pytest.approx(4 * phase_s)
    assert servers.phase_seconds["ondemand"]["reward"] == 0.0


def test_exploration_on_the_critical_path_costs_rollout_time():
    cost = small_cost()
    vanilla = run_one("vanilla", spot=0, cost=cost)
    critical = run_one("explore_critical", spot=0, cost=cost)
    batch = cost.max_batch(512)
    images = cost.images_per_iteration()
    more = images + cost.prompts_per_iteration * cost.explore_seeds_critical
    extra_s = rollout_phase(cost, 512, 8, more, batch)[0] - rollout_phase(cost, 512, 8, images, batch)[0]
    assert critical.time_per_iteration_s == pytest.approx(vanilla.time_per_iteration_s + extra_s, rel=1e-9)
    assert critical.explored_seeds_per_iteration == 8 * (8 + cost.explore_seeds_critical)
    assert critical.mean_group_reward_std > vanilla.mean_group_reward_std  # max-variance subset


def test_spotlight_keeps_spot_gpus_busier_than_naive_spot():
    naive = run_one("naive_spot", iterations=4, max_batch=4)      # 64 images: 4 per worker
    spotlight = run_one("spotlight", iterations=4, max_batch=4)
    assert naive.spot_idle_fraction > 0.4
    assert spotlight.spot_idle_fraction < naive.spot_idle_fraction - 0.2   # explores while the trainer trains
    assert spotlight.explored_seeds_per_iteration > 0 == naive.explored_seeds_per_iteration
    # exploration is off the critical path: same time per iteration as naive spot without preemptions
    assert spotlight.time_per_iteration_s == pytest.approx(naive.time_per_iteration_s, rel=1e-9)
    assert spotlight.time_per_iteration_s < run_one("vanilla", spot=0, max_batch=4).time_per_iteration_s


def test_cost_prices_spot_and_ondemand_hours_separately():
    prices = PriceTable("H100", {"ondemand": Price(10.0, "test"), "spot": Price(2.0, "test")})
    feed = dataclasses.replace(fake_feed([(0.0, "up", f"n{i}") for i in range(4)]), prices=prices)
    result = run_one("naive_spot", spot=4, feed=feed)
    end_h = result.sim_end_s / 3600
    assert result.ondemand_gpu_hours == pytest.approx(8 * end_h)
    assert result.spot_gpu_hours == pytest.approx(4 * end_h)
    assert result.ondemand_usd == pytest.approx(10.0 * 8 * end_h)
    assert result.spot_usd == pytest.approx(2.0 * 4 * end_h)
    assert result.cost_per_iteration_usd == pytest.approx((10.0 * 8 + 2.0 * 4) * end_h / 3)
    dearer = dataclasses.replace(feed, prices=PriceTable("H100", {"ondemand": Price(10.0, "t"),
                                                                   "spot": Price(10.0, "t")}))
    assert run_one("naive_spot", spot=4, feed=dearer).spot_usd == pytest.approx(5 * result.spot_usd)


def _mid_run_preemption_feed(base, cost, batch):
    """Spot node n0 reclaimed 80% into the first spot rollout run (of ``batch`` images) of
    iteration 1 (timed from a clean run), with a notice at 50%: the run cannot finish by the deadline."""
    run_s = cost.rollout_s(1280, 4, batch=batch)
    train_end = base.iteration_times_s[0] - cost.local_weight_sync_s
    # spot workers wait for the new weights (the adapters) and the next iteration's requests
    first_run = train_end + max(cost.publish_s(), cost.local_weight_sync_s)
    rows = [(0.0, "up", f"n{i}") for i in range(8)] + [(first_run + 0.8 * run_s, "down", "n0")]
    return fake_feed(rows, notice_s=0.3 * run_s)


@pytest.mark.parametrize("batch", [1, 4])
def test_commit_on_notice_saves_work_and_warm_regroup_avoids_restarts(batch):
    cost = small_cost()
    clean = run_one("spotlight", resolution=1280, iterations=3, cost=cost, max_batch=batch)
    feed = _mid_run_preemption_feed(clean, cost, batch)
    naive = run_one("naive_spot", resolution=1280, iterations=3, feed=feed, cost=cost, max_batch=batch)
    spotlight = run_one("spotlight", resolution=1280, iterations=3, feed=feed, cost=cost, max_batch=batch)
    assert naive.preemptions == spotlight.preemptions == 1
    assert naive.notices == spotlight.notices == 1
    assert spotlight.commits == batch and naive.commits == 0      # a notice commits every row of the batch
    # naive loses 80% of a run on 4 GPUs; spotlight only the part of a step past the last boundary
    assert naive.lost_gpu_s == pytest.approx(0.8 * cost.rollout_s(1280, 4, batch=batch) * 4, rel=1e-6)
    assert spotlight.lost_gpu_s < 4 * cost.step_s(1280, 4, batch=batch)
    assert naive.cold_restarts == 1 and spotlight.cold_restarts == 0
    assert spotlight.regroups >= 1
    assert spotlight.time_per_iteration_s < naive.time_per_iteration_s


def test_preemptions_match_the_feed_within_the_window():
    rows = [(0.0, "up", f"n{i}") for i in range(6)]
    rows += [(20.0, "down", "n0"), (45.0, "down", "n1"), (46.0, "up", "n6"), (70.0, "down", "n2"),
             (1e9, "down", "n3")]
    feed = fake_feed(rows, notice_s=30.0)
    for name in ("naive_spot", "spotlight"):
        result = run_one(name, spot=6, iterations=4, feed=feed)
        assert result.preemptions == _downs(feed, result.sim_end_s) >= 2


def test_deterministic_by_seed():
    feed = fake_feed([(0.0, "up", f"n{i}") for i in range(8)] + [(30.0, "down", "n3")])
    first = simulate(None, feed=feed, resolution=512, ondemand=8, spot=8, iterations=3, seed=7,
                     baselines=("spotlight",), cost_model=SMALL)
    again = simulate(None, feed=feed, resolution=512, ondemand=8, spot=8, iterations=3, seed=7,
                     baselines=("spotlight",), cost_model=SMALL)
    other = simulate(None, feed=feed, resolution=512, ondemand=8, spot=8, iterations=3, seed=8,
                     baselines=("spotlight",), cost_model=SMALL)
    assert first == again
    assert (first["baselines"]["spotlight"]["mean_group_reward_std"]
            != other["baselines"]["spotlight"]["mean_group_reward_std"])


def test_timeline_intervals_cover_billed_time():
    result = run_one("spotlight", iterations=2, record_timeline=True)
    assert result.timeline
    spot_s = sum(end - start for gpu, start, end, _ in result.timeline if gpu.startswith("spothost"))
    assert spot_s == pytest.approx(result.spot_gpu_hours * 3600, rel=1e-9)
    assert {phase for *_, phase in result.timeline} >= {"rollout", "explore", "train"}


def test_config_rejects_impossible_shapes():
    with pytest.raises(ValueError, match="ondemand"):
        SimConfig(resolution=512, ondemand=0, spot=8, iterations=1)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="max_batch"):
            SimConfig(resolution=512, ondemand=1, spot=0, iterations=1, max_batch=bad)
    with pytest.raises(ValueError, match="serial_rollout"):
        SimConfig(resolution=512, ondemand=1, spot=0, iterations=1, max_batch=4, serial_rollout=True)
    with pytest.raises(ValueError, match="unknown baseline"):
        get_baseline("fastest")
