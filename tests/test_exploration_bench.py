import json

import numpy as np
import pytest

from benchmarks.planner_bench import METHODS, SWEEP_KEYS, SWEEP_METHODS, main, run_budget_sweep, run_planner_bench
from benchmarks.synthetic_prompts import Bernoulli, Bimodal, BetaReward, ConstantReward, random_prompt_set, reward_of


def test_small_bench_returns_the_keys():
    result = run_planner_bench(seeds=2, n_prompts=8, group_size=4, budget_pulls=24, workers=3, preempted_workers=1)
    for key in ("planner_over_uniform", "planner_over_oracle", "planner_over_uniform_with_abandon",
                "decision_time_ms_per_pull", "methods", "setup", "ratio_statistic", "baselines",
                "oracle_over_uniform", "oracle_over_uniform_with_abandon", "planner_population_over_uniform",
                "planner_population_over_uniform_with_abandon", "decision_time_note", "machine",
                "planner_unscreened_over_uniform", "planner_unscreened_over_oracle"):
        assert key in result
    assert not any("no_abandon" in key for key in result), "renamed: uniform is plain round robin now"
    assert set(result["baselines"]) == {"uniform", "uniform_abandon"}
    assert set(result["decision_time_ms_per_pull_by_planner"]) == {"planner", "planner_population", "planner_unscreened"}
    assert set(result["methods"]) == set(METHODS)
    for method in METHODS:
        spread = result["methods"][method]["selected_variance"]
        assert 0.0 <= spread["min"] <= spread["mean"] <= spread["max"] <= 0.25
        assert len(result["methods"][method]["per_seed"]) == 2
    assert result["planner_over_uniform"] > 0 and result["planner_over_oracle"] > 0
    assert result["decision_time_ms_per_pull"] > 0
    budget_seeds = 24 * 4
    for method in ("planner", "planner_population", "planner_unscreened", "uniform", "uniform_abandon", "oracle"):
        assert 0 < result["methods"][method]["explored_seeds_mean"] <= budget_seeds
    json.dumps(result)  # JSON-serialisable


def test_headline_is_against_plain_uniform_allocation():
    # "uniform" is the benchmark's uniform allocation: plain round robin, nothing abandoned or replaced.
    # "uniform_abandon" adds the planner's abandonment and replacement; both ratios are reported.
    result = run_planner_bench(seeds=3, n_prompts=8, group_size=4, budget_pulls=24, workers=3, preempted_workers=1)
    methods = result["methods"]
    assert methods["uniform"]["abandoned_mean"] == 0
    assert methods["uniform_abandon"]["abandoned_mean"] > 0, "the synthetic mix has all-equal prompts"

    def mean(method):
        return float(np.mean(methods[method]["per_seed"]))

    assert result["planner_over_uniform"] == pytest.approx(mean("planner") / mean("uniform"))
    assert result["planner_over_uniform_with_abandon"] == pytest.approx(mean("planner") / mean("uniform_abandon"))
    assert result["oracle_over_uniform"] == pytest.approx(mean("oracle") / mean("uniform"))
    assert result["oracle_over_uniform_with_abandon"] == pytest.approx(mean("oracle") / mean("uniform_abandon"))
    assert result["planner_over_oracle"] == pytest.approx(mean("planner") / mean("oracle"))
    assert "plain round robin" in result["baselines"]["uniform"]
    assert "abandonment" in result["baselines"]["uniform_abandon"]


def test_bench_is_deterministic_apart_from_timing():
    kwargs = dict(seeds=1, n_prompts=6, group_size=4, budget_pulls=12, workers=2, methods=("planner", "uniform"))
    a, b = run_planner_bench(**kwargs), run_planner_bench(**kwargs)
    assert a["methods"] == b["methods"]


def test_main_prints_json(capsys):
    assert main(["--seeds", "1", "--n-prompts", "6", "--group-size", "4", "--budget-pulls", "12",
                 "--workers", "2", "--preempted-workers", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["setup"]["seeds"] == 1 and "planner_over_uniform" in out
    assert list(out)[:3] == ["kind", "command", "note"]
    assert out["command"] == ("python -m benchmarks.planner_bench --seeds 1 --n-prompts 6 --group-size 4 --budget-pulls 12 "
                              "--workers 2 --preempted-workers 0 --json")
    assert "6.4 seeds per prompt" in out["note"]
    assert "next_pull" in out["decision_time_note"] and out["machine"]["cpu_count"] >= 1


def test_synthetic_distributions_have_the_stated_variance():
    rng = np.random.default_rng(0)
    for dist in (ConstantReward(1.0), Bernoulli(0.2), BetaReward(2.0, 5.0),
                 Bimodal(0.8, BetaReward(3, 20), BetaReward(20, 3))):
        samples = dist.sample(rng, (200_000,))
        assert samples.min() >= 0.0 and samples.max() <= 1.0
        assert np.var(samples) == pytest.approx(dist.variance, abs=2e-3)


def test_rewards_are_a_pure_function_of_the_seed():
    dist = random_prompt_set(3, 4)[1]
    assert reward_of(3, 1, dist, 12345) == reward_of(3, 1, dist, 12345)
    assert len({reward_of(3, 1, dist, s) for s in range(50)}) > 1 or dist.variance == 0


def test_budget_sweep_rows_equal_the_bench_at_that_budget():
    small = dict(seeds=2, n_prompts=8, group_size=4, seeds_per_pull=2, workers=3, preempted_workers=1)
    rows = run_budget_sweep([3, 6], **small)
    assert [(r["seeds_per_prompt"], r["budget_pulls"]) for r in rows] == [(3.0, 12), (6.0, 24)]
    direct = run_planner_bench(budget_pulls=24, methods=SWEEP_METHODS, **small)
    for key in SWEEP_KEYS:
        assert rows[1][key] == direct[key], key
    assert set(rows[1]) == {"seeds_per_prompt", "budget_pulls", "planner_over_uniform",
                            "planner_over_uniform_with_abandon", "planner_over_oracle", "oracle_over_uniform",
                            "oracle_over_uniform_with_abandon", "planner_unscreened_over_uniform",
                            "planner_unscreened_over_oracle"}
    with pytest.raises(ValueError, match="seeds per prompt"):
        run_budget_sweep([0], **small)


def test_main_budget_sweep(capsys):
    args = ["--seeds", "1", "--n-prompts", "6", "--group-size", "4", "--budget-pulls", "12", "--workers", "2",
            "--preempted-workers", "0"]
    assert main([*args, "--budget-sweep", "4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [row["seeds_per_prompt"] for row in result["budget_sweep"]] == [4.0]
    assert main([*args, "--budget-sweep", "4"]) == 0
    text = capsys.readouterr().out
    assert "budget 4 seeds/prompt: planner/uniform" in text and "planner/uniform with abandonment" in text
    assert "planner_over_uniform_with_abandon:" in text and "decision time: " in text
    with pytest.raises(SystemExit):
        main([*args, "--budget-sweep", "-1"])
    assert "--budget-sweep values must be > 0" in capsys.readouterr().err


def test_first_seed_shifts_the_bench_seed_range():
    small = dict(n_prompts=6, group_size=4, budget_pulls=12, workers=2, preempted_workers=0,
                 methods=("planner", "uniform"))
    both = run_planner_bench(seeds=2, **small)
    second = run_planner_bench(seeds=1, first_seed=1, **small)
    assert second["setup"]["first_seed"] == 1 and both["setup"]["first_seed"] == 0
    for method in ("planner", "uniform"):
        assert second["methods"][method]["per_seed"] == both["methods"][method]["per_seed"][1:]
    with pytest.raises(ValueError, match="first_seed"):
        run_planner_bench(seeds=1, first_seed=-1, **small)


def test_main_first_seed(capsys):
    args = ["--seeds", "1", "--n-prompts", "6", "--group-size", "4", "--budget-pulls", "12", "--workers", "2",
            "--preempted-workers", "0", "--json"]
    assert main([*args, "--first-seed", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["first_seed"] == 3


def test_decision_time_note_says_when_the_machine_was_shared():
    from benchmarks.planner_bench import _decision_time_note

    busy = _decision_time_note({"cpu_count": 2, "load_average_before": [1.9, 1.8, 1.7]})
    quiet = _decision_time_note({"cpu_count": 2, "load_average_before": [0.1, 0.2, 0.2]})
    assert "shared machine" in busy and "1.90 on 2 cores" in busy
    assert "shared machine" not in quiet and "0.10 on 2 cores" in quiet
    assert "not available" in _decision_time_note({"cpu_count": 2, "load_average_before": None})
