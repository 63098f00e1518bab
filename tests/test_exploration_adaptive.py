"""Adaptive exploration: what a round bought over random subsets, and the budget it leaves."""
import itertools
import math

import numpy as np
import pytest

from roll_spotlight.exploration import (
    AdaptiveBudget,
    AdaptiveConfig,
    all_equal_probability,
    random_subset_variance,
    round_contrast,
    select_max_variance,
)
from roll_spotlight.rewards import MeanBrightness, Reward, RewardOutput


class PromptOnlyReward(Reward):
    """A reward of the prompt alone: every seed of a prompt scores the same, so selection buys nothing."""

    def __init__(self, **kwargs):  # the config's reward kwargs (mode: mix) do not apply
        pass

    def score(self, images, prompts):
        return RewardOutput(np.array([len(p) % 3 / 2.0 for p in prompts]))


class Brightness(MeanBrightness):
    """Mean brightness, a reward that differs from seed to seed: selection buys contrast."""

    def __init__(self, **kwargs):
        pass


def _enumerate(values, k):
    subsets = [np.asarray(values)[list(c)] for c in itertools.combinations(range(len(values)), k)]
    return float(np.mean([s.var() for s in subsets])), float(np.mean([s.max() == s.min() for s in subsets]))


@pytest.mark.parametrize("values,k", [([0.1, 0.9, 0.5, 0.3, 0.7], 3), ([0, 0, 0, 1, 1, 0], 2),
                                      ([1, 1, 1, 1], 4), ([0.2, 0.2, 0.2, 0.8, 0.8], 3)])
def test_random_subset_statistics_match_enumeration(values, k):
    var, equal = _enumerate(values, k)
    assert random_subset_variance(values, k) == pytest.approx(var)
    assert all_equal_probability(values, k) == pytest.approx(equal)


def test_round_contrast_gain_and_equal_groups_removed():
    pools = {0: [0, 0, 0, 0, 0, 1, 0, 1], 1: [0.3] * 8, 2: [0.1, 0.2]}
    chosen = {slot: [pool[i] for i in select_max_variance(pool, 4)] for slot, pool in pools.items() if len(pool) >= 4}
    chosen[2] = pools[2]
    c = round_contrast(pools, chosen, 4)
    assert c.prompts == 3
    # pool 0: sigma^2 = 0.1875, a random 4 of 8 expects 0.1875 * 8/7 * 3/4; pool 1 has no spread;
    # prompt 2 had fewer than k explored seeds, nothing to choose: the same estimate on both sides
    rest = 0.0025 * 2 * 3 / 4
    assert c.selected_var == pytest.approx((0.25 + 0.0 + rest) / 3)
    assert c.random_var == pytest.approx((random_subset_variance(pools[0], 4) + 0.0 + rest) / 3)
    assert random_subset_variance(pools[0], 4) == pytest.approx(0.1875 * 8 / 7 * 3 / 4)
    assert c.gain == pytest.approx(math.sqrt(c.selected_var / c.random_var)) and c.gain > 1.2
    # prompt 0: a random 4 of 6 failures + 2 successes is all failures with probability C(6,4)/C(8,4)
    assert c.equal_random == pytest.approx((15 / 70 + 1.0 + 0.0) / 3)
    assert c.equal_selected == pytest.approx(1 / 3) and c.equal_removed == pytest.approx(15 / 210)
    flat = round_contrast({0: [0.5] * 6, 1: [0.2, 0.2]}, {0: [0.5] * 3, 1: [0.2, 0.2]}, 3)
    assert flat.gain == 1.0 and flat.equal_removed == 0.0
    assert math.isnan(round_contrast({0: []}, {}, 3).gain)
    with pytest.raises(ValueError, match="selected rewards"):
        round_contrast({0: [0.1, 0.2, 0.3]}, {0: [0.1]}, 3)


def _contrast(gain, removed=0.0):
    from roll_spotlight.exploration import RoundContrast

    return RoundContrast(prompts=4, selected_var=gain ** 2, random_var=1.0, equal_random=removed, equal_selected=0.0)


def test_budget_halves_then_stops_and_a_probe_restores_it():
    ctl = AdaptiveBudget(AdaptiveConfig(seeds_per_prompt=64, group_size=16, window=2, probe_every=3))
    assert ctl.seeds_per_prompt(1) == 64
    assert ctl.observe(_contrast(1.0))["explore/budget_scale"] == 1.0  # warming up: one round of two
    out = ctl.observe(_contrast(1.01))
    assert out["explore/budget_scale"] == 0.5 and "halved" in out["explore/reason"]
    assert ctl.seeds_per_prompt(2) == 32 and ctl.records == []
    ctl.observe(_contrast(1.0, removed=0.01))
    out = ctl.observe(_contrast(1.02))
    assert out["explore/budget_scale"] == 0.0 and "stopped" in out["explore/reason"]
    assert [ctl.seeds_per_prompt(i) for i in range(4, 10)] == [0, 0, 64, 0, 0, 64]  # probes every 3rd
    ctl.observe(_contrast(1.3))
    out = ctl.observe(_contrast(1.1), spearman=0.7)
    assert out["explore/budget_scale"] == 1.0 and "buys contrast" in out["explore/reason"]
    # a good contrast whose stale ranking does not survive the update also cuts the budget
    ctl.observe(_contrast(1.4), spearman=0.1)
    out = ctl.observe(_contrast(1.4), spearman=0.2)
    assert out["explore/budget_scale"] == 0.5 and "ranking does not hold" in out["explore/reason"]
    # removing all-equal groups is worth exploring for even without a std gain
    ctl.observe(_contrast(1.0, removed=0.2))
    assert ctl.observe(_contrast(1.0, removed=0.1))["explore/budget_scale"] == 1.0
    restored = AdaptiveBudget(ctl.config)
    restored.load_state_dict(ctl.state_dict())
    assert (restored.scale, restored.reason, restored.records) == (ctl.scale, ctl.reason, ctl.records)


def test_adaptive_keys_are_checked():
    from roll_spotlight.config.strict import ConfigError
    from tests.runtime_helpers import tiny_config

    for key, value in [("adaptive_window", 0), ("adaptive_probe_every", -1), ("adaptive_min_spearman", 2),
                       ("adaptive_min_equal_removed", 1.5), ("adaptive_min_gain", 0), ("adaptive_screen_above", 2), ("num_steps", 0),
                       ("selection", "best"), ("baseline", "prompt"), ("kind", "cps")]:
        with pytest.raises(ConfigError, match=f"exploration.{key}"):
            tiny_config("exploration.mode=stale", f"exploration.{key}={value}")


# --- the loop: both branches, deterministically ------------------------------------------------------

ADAPTIVE = ["exploration.mode=stale", "exploration.seeds_per_prompt=6", "exploration.seeds_per_pull=2",
            "exploration.min_seeds_before_abandon=2", "exploration.adaptive=true", "exploration.adaptive_window=1",
            "exploration.adaptive_probe_every=0", "exploration.adaptive_min_spearman=-1", "max_steps=4",
            "eval_steps=0", "exploration.adaptive_screen_above=1"]  # the seed budget alone (no prompt screening)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _adaptive_run(tmp_path, name, reward):
    from roll_spotlight.startup import start_run
    from roll_spotlight.training.metrics import read_metrics
    from tests.runtime_helpers import random_policy, tiny_config

    cfg = tiny_config(*ADAPTIVE, f"reward.name=tests.test_exploration_adaptive:{reward}")
    start_run(cfg, tmp_path / name, policy=random_policy(cfg), progress=False)
    return [r for r in read_metrics(tmp_path / name) if r["step"] >= 1]


def test_a_reward_where_selection_buys_contrast_keeps_the_budget(tmp_path):
    rows = _adaptive_run(tmp_path, "bright", "Brightness")
    budget = 6 * 2  # seeds_per_prompt x rollout_batch_size
    assert [r["explored_seeds"] for r in rows] == [budget, budget, budget, 0]
    measured = [r for r in rows if "explore/contrast_gain" in r]
    assert len(measured) == 3 and all(r["explore/contrast_gain"] > 1.05 for r in measured), measured
    assert all(r["explore/budget_scale"] == 1.0 and "buys contrast" in r["explore/reason"] for r in measured)


def test_a_reward_where_selection_buys_nothing_stops_exploring(tmp_path):
    rows = _adaptive_run(tmp_path, "flat", "PromptOnlyReward")
    # iteration 2 measures the round explored for it (each prompt abandoned after 2 equal rewards):
    # gain 1.0, nothing removed -> 6 x 0.5 = 3 seeds per prompt, the group size: nothing left to
    # select, so exploration stops
    assert rows[1]["explore/contrast_gain"] == 1.0 and rows[1]["explore/equal_removed"] == 0.0
    assert rows[1]["explore/budget_scale"] == 0.0 and "stopped" in rows[1]["explore/reason"]
    assert [r["explored_seeds"] for r in rows] == [4, 0, 0, 0]
    assert rows[2]["explore/budget_scale"] == 0.0 and "explore/contrast_gain" not in rows[2]


# --- the target switch: seed selection, prompt screening or none -------------------------------------

def test_switch_follows_the_all_equal_share_and_the_screens_value():
    from roll_spotlight.exploration.adaptive import TargetSwitch

    sw = TargetSwitch("seeds", screen_above=0.3, min_value=0.05, window=2, probe_every=3)
    sw.observe(0.1)
    assert sw.observe(0.2)["explore/target"] == "seeds"  # few all-equal groups: seed selection
    sw.observe(0.6)
    assert sw.observe(0.7)["explore/target"] == "prompts" and "prompt screening" in sw.reason
    sw.observe(0.6, 0.3)
    assert sw.observe(0.6, 0.2)["explore/target"] == "prompts" and "removes 0.250" in sw.reason
    sw.observe(0.7, 0.0)
    assert sw.observe(0.7, 0.02)["explore/target"] == "off"  # most groups all equal, the screen removes none
    sw.observe(0.7)
    assert sw.observe(0.8)["explore/target"] == "off"
    assert sw.observe(0.8)["explore/target"] == "prompts" and "probing" in sw.reason
    pass_fail = TargetSwitch("seeds", 0.3, 0.05, 2, 3)
    pass_fail.observe(0.1, graded=False)
    assert pass_fail.observe(0.2, graded=False)["explore/target"] == "off"  # 0/1 rewards: no seed selection
    assert "pass/fail" in pass_fail.reason
    pass_fail.observe(0.5, graded=False)
    assert pass_fail.observe(0.6, graded=False)["explore/target"] == "prompts"  # the trained groups' share rose
    restored = TargetSwitch("seeds", 0.3, 0.05, 2, 3)
    restored.load_state_dict(sw.state_dict())
    assert (restored.target, restored.reason, restored.records) == (sw.target, sw.reason, sw.records)


def test_a_run_whose_groups_are_all_equal_screens_then_stops(tmp_path):
    """Every group all equal: the switch turns to prompt screening after one iteration; the screen
    removes none (every candidate is as flat), so exploration stops."""
    from roll_spotlight.startup import start_run
    from roll_spotlight.training.metrics import read_metrics
    from tests.runtime_helpers import random_policy, tiny_config

    cfg = tiny_config(*ADAPTIVE[:-1], "exploration.prompt_screen_seeds=2",
                      "reward.name=tests.test_exploration_adaptive:PromptOnlyReward")
    start_run(cfg, tmp_path / "flat", policy=random_policy(cfg), progress=False)
    rows = [r for r in read_metrics(tmp_path / "flat") if r["step"] >= 1]
    assert [r["explore/target"] for r in rows] == ["prompts", "off", "off", "off"], [r["explore/switch"] for r in rows]
    assert rows[1]["screen/skipped"] >= 0.0 and rows[1]["groups_all_equal"] == 1.0
    assert [r["explored_seeds"] for r in rows] == [2 * 2 * 2, 0, 0, 0]  # 2 seeds x 4 candidates, then none
