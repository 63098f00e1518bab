"""Tier 1: the simulator's entry points, on fake feeds and on the shipped public traces."""
import json

import pytest

from roll_spotlight.sim.api import main, project, simulate, time_to_target
from roll_spotlight.sim.spotfeed import spot_feed
from roll_spotlight.spot.market import EventKind

BAMBOO = "bamboo-spot-traces/aws/p3-trace.csv"
GCP = "skynomad-gcp-h100/h100_probe_counts_wide.csv"
SMALL = {"prompts_per_iteration": 8, "group_size": 8}


def _downs(feed, end_s):
    """NODE_DOWN events at or before ``end_s``: the preemptions a run ending then sees."""
    return sum(1 for e in feed.events if e.kind is EventKind.NODE_DOWN and e.time_s <= end_s)


def test_simulate_labels_every_number_simulated():
    result = simulate(None, resolution=512, ondemand=8, spot=8, iterations=2, cost_model=SMALL)
    assert result["kind"] == "simulated" and "simulated" in result["note"]
    assert list(result["baselines"]) == ["vanilla", "explore_critical", "naive_spot", "spotlight", "spotlight_train"]
    for name, r in result["baselines"].items():
        assert r["kind"] == "simulated", name
        for key in ("time_per_iteration_s", "cost_per_iteration_usd", "spot_idle_fraction",
                    "ondemand_idle_fraction", "preemptions", "regroups"):
            assert key in r, (name, key)
        assert "timeline" not in r
    json.dumps(result)  # JSON-ready


def test_time_to_target_multiplies_measured_iterations_by_simulated_costs():
    sim = simulate(None, resolution=512, ondemand=8, spot=8, iterations=2, cost_model=SMALL,
                   baselines=("vanilla", "spotlight"))
    out = time_to_target({"vanilla": 100, "spotlight": 40, "naive_spot": 50}, sim)
    assert "measured" in out["kind"] and "simulated" in out["kind"]
    assert set(out["baselines"]) == {"vanilla", "spotlight"}
    v = out["baselines"]["vanilla"]
    assert v["time_to_target_s"] == pytest.approx(100 * sim["baselines"]["vanilla"]["time_per_iteration_s"])
    assert v["cost_to_target_usd"] == pytest.approx(100 * sim["baselines"]["vanilla"]["cost_per_iteration_usd"])
    with pytest.raises(ValueError, match="spotlight"):
        time_to_target({"spotlight": -1}, sim)


def test_cli_prints_json_and_table(tmp_path, capsys):
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(SMALL))
    assert main(["--resolution", "512", "--iterations", "2", "--cost", str(cost), "--json",
                 "--baselines", "vanilla,naive_spot"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kind"] == "simulated" and set(result["baselines"]) == {"vanilla", "naive_spot"}
    assert main(["--resolution", "1280", "--iterations", "1", "--cost", str(cost),
                 "--baselines", "vanilla"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("SIMULATED") and "vanilla" in table


def test_project_scales_with_model_size():
    small = project("gcp", ondemand=8, spot=8, params_b=10.0, resolution=512, iterations=2,
                    baselines=("vanilla",), cost_overrides=SMALL)
    large = project("gcp", ondemand=8, spot=8, params_b=40.0, resolution=512, iterations=2,
                    baselines=("vanilla",), cost_overrides=SMALL)
    t_small = small["baselines"]["vanilla"]["time_per_iteration_s"]
    t_large = large["baselines"]["vanilla"]["time_per_iteration_s"]
    # 4x the FLOPs per image; a 10B model's 512^2 forward is below the knee, so less than 4x
    assert 1.2 < t_large / t_small < 4.0
    assert small["kind"] == "simulated" and small["what_if"]["params_b"] == 10.0
    with pytest.raises(ValueError, match="params_b"):
        project("aws", params_b=0)


def test_bamboo_trace_short_window(shipped_traces):
    result = simulate(shipped_traces / BAMBOO, resolution=512, ondemand=8, spot=8, iterations=6, start_s=1800.0,
                      cost_model={"prompts_per_iteration": 16, "group_size": 16},
                      baselines=("naive_spot", "spotlight"))
    feed = spot_feed(shipped_traces / BAMBOO, spot_nodes=8, start_s=1800.0)
    assert result["trace"]["provider"] == "aws" and result["trace"]["notice_s"] == 120.0
    for name, r in result["baselines"].items():
        assert r["preemptions"] == _downs(feed, r["sim_end_s"]) >= 1, name
        assert r["notices"] >= r["preemptions"]
    naive, spotlight = result["baselines"]["naive_spot"], result["baselines"]["spotlight"]
    assert spotlight["spot_idle_fraction"] < naive["spot_idle_fraction"]
    assert spotlight["lost_gpu_s"] <= naive["lost_gpu_s"]


def test_gcp_probe_trace_uses_zone_prices(shipped_traces):
    result = simulate(shipped_traces / GCP, resolution=512, ondemand=8, spot=8, iterations=2, zones=["us-central1-b"],
                      cost_model=SMALL, baselines=("naive_spot",))
    assert result["trace"]["notice_s"] == 30.0
    r = result["baselines"]["naive_spot"]
    od_price, spot_price = 82.52543396 / 8, 18.979008 / 8  # zones.csv / prices/, us-central1
    expected = r["ondemand_gpu_hours"] * od_price + r["spot_gpu_hours"] * spot_price
    assert r["ondemand_usd"] + r["spot_usd"] == pytest.approx(expected, rel=1e-4)


# ------------------------------------------------------------------------------ budget and fair cost
def _priced_feed(ondemand_usd, spot_usd, nodes=8):
    import dataclasses

    from roll_spotlight.sim.spotfeed import fake_feed
    from roll_spotlight.spot.prices import Price, PriceTable

    feed = fake_feed([(0.0, "up", f"n{i}") for i in range(nodes)])
    return dataclasses.replace(feed, prices=PriceTable("H100", {"ondemand": Price(ondemand_usd, "test"),
                                                                "spot": Price(spot_usd, "test")}))


@pytest.mark.parametrize("spot_usd, expected", [(5.0, 12), (2.5, 10), (1.2, 8), (10.0, 16)])
def test_fair_cost_vanilla_gets_the_ondemand_gpus_spotlights_dollars_buy(spot_usd, expected):
    """Spot held throughout: Spotlight pays 8 x 10 + 8 x spot per hour, so vanilla gets
    8 + floor(8 x spot / 10) on-demand GPUs (the price ratio decides the count)."""
    tiny = {"prompts_per_iteration": 4, "group_size": 4}
    result = simulate(None, resolution=512, ondemand=8, spot=8, iterations=2, cost_model=tiny,
                      baselines=("vanilla", "spotlight"), fair_cost=True, feed=_priced_feed(10.0, spot_usd))
    fair = result["fair_cost"]
    assert fair["ondemand_gpus"] == expected == 8 + int(8 * spot_usd / 10.0 + 1e-9)
    assert fair["spotlight_usd_per_hour"] == pytest.approx(80.0 + 8 * spot_usd)
    row = result["baselines"]["vanilla_fair_cost"]
    assert row["ondemand_gpus"] == expected and row["spot_gpus"] == 0 and row["spot_usd"] == 0
    # what vanilla pays per hour on those GPUs never exceeds what Spotlight pays
    assert row["cost_per_iteration_usd"] / row["time_per_iteration_s"] * 3600 <= fair["spotlight_usd_per_hour"] + 1e-6
    if expected > 8:   # more GPUs roll out and train: faster than the equal-on-demand vanilla
        assert row["time_per_iteration_s"] < result["baselines"]["vanilla"]["time_per_iteration_s"]


def test_fair_cost_needs_spotlight_and_a_price():
    from roll_spotlight.sim.shape_budget import fair_cost_ondemand

    assert fair_cost_ondemand({"time_per_iteration_s": 1800.0, "cost_per_iteration_usd": 60.0}, 10.0, 4) == 12
    assert fair_cost_ondemand({"time_per_iteration_s": 3600.0, "cost_per_iteration_usd": 30.0}, 10.0, 4) == 4
    with pytest.raises(ValueError, match="price"):
        fair_cost_ondemand({"time_per_iteration_s": 1.0, "cost_per_iteration_usd": 1.0}, 0.0, 1)
    with pytest.raises(ValueError, match="spotlight"):
        simulate(None, resolution=512, ondemand=2, spot=2, iterations=1, cost_model=SMALL,
                 baselines=("vanilla",), fair_cost=True)


def test_exploration_budget_is_spot_seconds_of_training_over_a_full_rollout():
    from roll_spotlight.sim.shape_budget import exploration_budget
    from roll_spotlight.sim.costmodel import CostModel

    cost = CostModel()
    today, paper = exploration_budget(cost, 512, 8, 8), exploration_budget(cost, 512, 4, 8)
    train_s = cost.train_s(cost.images_per_iteration(), 512, 8)
    per_seed_s = cost.rollout_s(512, 1, 10, batch=16) / 16
    assert today["batch"] == cost.max_batch(512) == 16
    assert today["seeds_per_iteration"] == pytest.approx(8 * train_s / per_seed_s)
    serial = exploration_budget(cost, 512, 8, 8, serial=True)
    assert serial["seeds_per_iteration"] == pytest.approx(8 * train_s / cost.rollout_s(512, 1, 10, serial=True))
    assert today["full_step"] and today["explore_steps"] == cost.sampling_steps
    assert paper["seeds_per_iteration"] == pytest.approx(2 * today["seeds_per_iteration"])  # half the trainers
    assert paper["seeds_per_prompt"] == pytest.approx(paper["seeds_per_iteration"] / cost.prompts_per_iteration)
    sp4 = exploration_budget(cost, 1280, 8, 8)        # SP 4: one explored seed holds 4 GPUs
    assert sp4["sp_degree"] == 4 and sp4["gpu_s_per_explored_seed"] == pytest.approx(
        4 * cost.rollout_s(1280, 4, 10, batch=4) / 4)
    cheap = exploration_budget(cost.with_overrides({"explore_steps": 5}), 512, 8, 8)
    assert not cheap["full_step"] and cheap["seeds_per_iteration"] == pytest.approx(2 * today["seeds_per_iteration"])
    assert "exploration_budget" in simulate(None, resolution=512, ondemand=2, spot=2, iterations=1, cost_model=SMALL,
                                            baselines=("vanilla",))
