"""Tier 1: the managed spot job (SkyPilot style) beside vanilla on demand."""
import dataclasses

import pytest

from roll_spotlight.sim.costmodel import CostModel
from roll_spotlight.sim.managed_job import CHECKPOINT_EVERY, checkpoint_bytes, restart_s, simulate_managed_job
from roll_spotlight.sim.api import simulate
from roll_spotlight.sim.spotfeed import fake_feed
from roll_spotlight.spot.prices import Price, PriceTable

SMALL = {"prompts_per_iteration": 8, "group_size": 8}
PRICES = PriceTable("H100", {"ondemand": Price(10.0, "test"), "spot": Price(2.0, "test")})
UP = [(0.0, "up", f"n{i}") for i in range(8)]


def _run(rows, iterations=20, **kwargs):
    feed = dataclasses.replace(fake_feed(rows), prices=PRICES)
    result = simulate(None, feed=feed, resolution=512, ondemand=8, spot=8, iterations=iterations, cost_model=SMALL,
                      baselines=("vanilla", "managed_spot"), **kwargs)
    return result["baselines"]["vanilla"], result["baselines"]["managed_spot"]


def test_without_a_preemption_it_is_vanilla_at_the_spot_price():
    vanilla, job = _run(UP)
    assert job["kind"] == "simulated" and job["spot_gpus"] == 8 and job["ondemand_gpus"] == 0
    assert job["time_per_iteration_s"] == pytest.approx(vanilla["time_per_iteration_s"], rel=1e-12)
    assert job["spot_gpu_hours"] == pytest.approx(vanilla["ondemand_gpu_hours"], rel=1e-12)
    assert job["cost_per_iteration_usd"] == pytest.approx(vanilla["cost_per_iteration_usd"] * 2.0 / 10.0, rel=1e-12)
    assert job["preemptions"] == job["lost_gpu_s"] == job["redone_iterations"] == job["waiting_s"] == 0


def test_more_preemptions_lose_more_work_and_time():
    one = UP + [(100.0, "down", "n3"), (150.0, "up", "n8")]
    three = one + [(600.0, "down", "n1"), (650.0, "up", "n9"), (1100.0, "down", "n8"), (1150.0, "up", "n10")]
    vanilla, clean = _run(UP, iterations=60)
    _, once = _run(one, iterations=60)
    _, thrice = _run(three, iterations=60)
    assert (once["preemptions"], thrice["preemptions"]) == (1, 3)
    assert 0 < once["lost_gpu_s"] < thrice["lost_gpu_s"]
    assert clean["time_per_iteration_s"] < once["time_per_iteration_s"] < thrice["time_per_iteration_s"]
    assert clean["cost_per_iteration_usd"] < once["cost_per_iteration_usd"] < thrice["cost_per_iteration_usd"]
    cost = CostModel.from_dict(SMALL)
    # each preemption: the wait for capacity (50 s), the relaunch, and the work since the checkpoint again
    assert once["waiting_s"] == pytest.approx(50.0) and once["restarting_s"] == pytest.approx(restart_s(cost))
    assert once["sim_end_s"] == pytest.approx(clean["sim_end_s"] + 50.0 + restart_s(cost) + once["lost_gpu_s"] / 8)
    # billed: all but the wait
    assert once["spot_gpu_hours"] == pytest.approx(8 * (once["sim_end_s"] - 50.0) / 3600)


def test_a_longer_checkpoint_period_redoes_more_iterations():
    rows = UP + [(500.0, "down", "n3"), (500.0, "up", "n8")]
    feed = dataclasses.replace(fake_feed(rows), prices=PRICES)
    cost = CostModel.from_dict(SMALL)
    runs = [simulate_managed_job(feed, cost, gpus=8, gpus_per_node=1, iteration_s=30.0, iterations=40,
                                 checkpoint_every=every) for every in (1, 5, 30)]
    assert [r["redone_iterations"] for r in runs] == [0, 1, 16]   # 16 iterations done by 500 s, 480 s + 5.1 s save
    assert runs[0]["lost_gpu_s"] < runs[1]["lost_gpu_s"] < runs[2]["lost_gpu_s"]
    assert runs[0]["lost_gpu_s"] == pytest.approx(8 * (500.0 - 480.0))
    assert runs[2]["sim_end_s"] > runs[0]["sim_end_s"]


def test_restart_cost_is_a_cold_join_and_the_checkpoint_read():
    cost = CostModel()
    assert checkpoint_bytes(cost) == pytest.approx(3 * cost.adapter_bytes())    # adapters + AdamW's m and v
    assert restart_s(cost) == pytest.approx(cost.cold_join_s() + 3 * cost.adapter_bytes() / 1e9)
    assert CHECKPOINT_EVERY == 1


def test_a_feed_without_enough_gpus_again_fails_naming_the_job():
    rows = UP + [(100.0, "down", "n3")]
    with pytest.raises(RuntimeError, match="managed_spot: .* ran out of 8 spot GPUs"):
        _run(rows)


@pytest.mark.parametrize("every", [0, 2.5, True])
def test_a_bad_checkpoint_period_names_the_field(every):
    feed = dataclasses.replace(fake_feed(UP), prices=PRICES)
    with pytest.raises(ValueError, match="checkpoint_every"):
        simulate_managed_job(feed, CostModel(), gpus=8, gpus_per_node=1, iteration_s=30.0, iterations=4,
                             checkpoint_every=every)
