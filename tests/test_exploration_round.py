"""Exploration in the loop: fresh (critical path) and stale (Spotlight) modes, rank monitor, resume."""
import shutil

import numpy as np
import pytest
import torch

from roll_spotlight.config.strict import ConfigError
from roll_spotlight.exploration import RankMonitor, RankReport
from roll_spotlight.runtime.exploration_round import ExplorationRound
from roll_spotlight.startup import start_run
from roll_spotlight.training.metrics import read_metrics
from tests.runtime_helpers import random_policy, tiny_config

EXPLORE = ["exploration.seeds_per_prompt=6", "exploration.seeds_per_pull=2", "exploration.min_seeds_before_abandon=2"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _run(tmp_path, name, *extra, **kw):
    cfg = tiny_config(*EXPLORE, *extra)
    return cfg, start_run(cfg, tmp_path / name, policy=random_policy(cfg), progress=False, **kw)


def test_budget_below_group_size_is_rejected():
    with pytest.raises(ConfigError, match="exploration.seeds_per_prompt"):
        tiny_config("exploration.mode=stale", "exploration.seeds_per_prompt=2")


def test_screen_seeds_is_checked_and_reaches_the_planner():
    with pytest.raises(ConfigError, match="exploration.screen_seeds"):
        tiny_config("exploration.mode=stale", "exploration.screen_seeds=-1")
    cfg = tiny_config(*EXPLORE, "exploration.mode=stale", "exploration.seeds_per_pull=4",
                      "exploration.min_seeds_before_abandon=4", "exploration.screen_seeds=2")
    explore = ExplorationRound(cfg.exploration, cfg.train.group_size, [(0, "a square"), (1, "a red circle")],
                               schedule=None, weight_version=0, iteration=1, run_seed=0)
    assert explore.planner.config.screen_seeds == 2
    assert [len(explore.planner.next_pull(0.0).seeds) for _ in range(2)] == [2, 2]


def test_stale_mode_explores_next_prompts_and_monitors_rank(tmp_path):
    cfg, result = _run(tmp_path, "stale", "exploration.mode=stale", "max_steps=3")
    rows = [r for r in read_metrics(tmp_path / "stale") if r["step"] >= 1]
    budget = cfg.exploration.seeds_per_prompt * cfg.rollout_batch_size
    assert [r["explored_seeds"] for r in rows] == [budget, budget, 0]  # nothing to explore after the last
    # iterations 2 and 3 regenerate seeds explored under the previous weights: rank pairs exist
    assert all("rank_spearman" in r and 2 <= r["rank_pairs"] <= 6 for r in rows[1:])
    assert "rank_spearman" not in rows[0]


def test_stale_exploration_runs_with_the_weights_before_the_update(tmp_path, monkeypatch):
    """In one process the update runs before exploration, but exploration must still use version t."""
    from roll_spotlight.runtime.local import LocalBackend

    seen = []
    explore = LocalBackend.explore

    def recording(self, specs):
        outputs = explore(self, specs)
        seen.append(({s.weight_version for s in specs}, self.core.weight_version,
                     {o.weight_version for o in outputs}))
        return outputs

    monkeypatch.setattr(LocalBackend, "explore", recording)
    _, _ = _run(tmp_path, "stale", "exploration.mode=stale", "max_steps=3", "train.learning_rate=1e-2")
    assert seen, "stale mode explored nothing"
    for named, trained, used in seen:
        (version,) = named
        assert used == {version} and version == trained - 1, (named, trained, used)
    rows = [r for r in read_metrics(tmp_path / "stale") if r.get("rank_pairs")]
    # at this learning rate one update changes rewards: stale and fresh rewards of a seed differ
    assert any(r["rank_spearman"] != 1.0 for r in rows), rows


def test_stale_mode_is_deterministic_and_resumes_exactly(tmp_path):
    _, full = _run(tmp_path, "full", "exploration.mode=stale", "max_steps=3", "save_steps=1")
    _, again = _run(tmp_path, "again", "exploration.mode=stale", "max_steps=3")
    assert np.array_equal(full.final.rewards, again.final.rewards)
    # a run killed after iteration 1: its checkpoint holds the round explored for iteration 2
    shutil.copytree(tmp_path / "full", tmp_path / "cut")
    _, resumed = _run(tmp_path, "cut", "exploration.mode=stale", "max_steps=3", "save_steps=1",
                      resume=tmp_path / "cut" / "checkpoints" / "iter-000001")
    assert np.array_equal(resumed.final.rewards, full.final.rewards)
    cut = {r["step"]: r for r in read_metrics(tmp_path / "cut")}
    ref = {r["step"]: r for r in read_metrics(tmp_path / "full")}
    assert cut[2]["rank_spearman"] == ref[2]["rank_spearman"]


def test_fresh_mode_trains_on_explored_selection(tmp_path):
    cfg, _ = _run(tmp_path, "fresh", "exploration.mode=fresh")
    rows = [r for r in read_metrics(tmp_path / "fresh") if r["step"] >= 1]
    assert all(r["explored_seeds"] == cfg.exploration.seeds_per_prompt * cfg.rollout_batch_size for r in rows)
    assert all(r["trained_samples"] <= cfg.rollout_batch_size * cfg.train.group_size for r in rows)


def test_fallback_to_random_seeds_when_rank_is_low(tmp_path, caplog, monkeypatch):
    def low_rank(self, stale, fresh, groups=None):
        return RankReport(spearman=-0.5, kendall=-0.4, n=len(stale), fallback_active=True, message="low")

    monkeypatch.setattr(RankMonitor, "update", low_rank)
    _, _ = _run(tmp_path, "fb", "exploration.mode=stale", "max_steps=3", "exploration.rank_threshold=0.5")
    rows = [r for r in read_metrics(tmp_path / "fb") if r["step"] >= 1]
    assert rows[1].get("rank_fallback") == 1.0
    assert "falling back" in caplog.text
    assert "rank_spearman" not in rows[2], "after the fallback, seeds are random: no stale pairs"


def test_explore_schedule_defaults_to_the_rollouts_and_rescales_the_window():
    from roll_spotlight.dispatch.requests import Schedule
    from roll_spotlight.runtime.exploration_round import explore_schedule

    roll = Schedule(10, 0.7, "sde", 2, 5)
    cfg = tiny_config("exploration.mode=stale").exploration
    assert explore_schedule(roll, cfg) is roll
    four = tiny_config("exploration.mode=stale", "exploration.num_steps=4").exploration
    assert explore_schedule(roll, four) == Schedule(4, 0.7, "sde", 1, 2)
    assert explore_schedule(Schedule(10, 0.7, "sde", 0, 1), four) == Schedule(4, 0.7, "sde", 0, 1)  # >= 1 noised
    assert explore_schedule(Schedule(10, 0.7, "cps"), four) == Schedule(4, 0.7, "cps")  # all steps noised
    ode = tiny_config("exploration.mode=stale", "exploration.kind=ode", "exploration.num_steps=2").exploration
    assert explore_schedule(roll, ode) == Schedule(2, 0.7, "ode", 0, 0)


def test_cheap_explore_requests_reach_the_backend_and_are_not_trained_on(tmp_path, monkeypatch):
    from roll_spotlight.runtime.local import LocalBackend

    explored, rolled = [], []
    explore, rollouts = LocalBackend.explore, LocalBackend.rollouts

    def recording_explore(self, specs):
        explored.extend(s.schedule for s in specs)
        return explore(self, specs)

    def recording_rollouts(self, specs, **kw):
        if kw.get("phase", "rollout") != "explore":
            rolled.extend(specs)
        return rollouts(self, specs, **kw)

    monkeypatch.setattr(LocalBackend, "explore", recording_explore)
    monkeypatch.setattr(LocalBackend, "rollouts", recording_rollouts)
    cfg, _ = _run(tmp_path, "cheap", "exploration.mode=fresh", "exploration.num_steps=2", "exploration.kind=ode",
                  "max_steps=1")
    assert explored and {(s.num_steps, s.kind) for s in explored} == {(2, "ode")}
    # fresh mode: every selected seed is regenerated with the rollouts' schedule before training
    assert len(rolled) == cfg.rollout_batch_size * cfg.train.group_size
    assert {(s.schedule.num_steps, s.schedule.kind) for s in rolled} == {(cfg.sampling.num_steps, cfg.sampling.kind)}


def test_top_bottom_selection_reaches_the_planner():
    cfg = tiny_config(*EXPLORE, "exploration.mode=stale", "exploration.selection=top_bottom")
    rnd = ExplorationRound(cfg.exploration, 4, [(0, "a square")], schedule=None, weight_version=0, iteration=1,
                           run_seed=0)
    for seed, reward in zip(rnd.planner.next_pull(0.0).seeds + rnd.planner.next_pull(0.0).seeds +
                            rnd.planner.next_pull(0.0).seeds, [0.5, 0.1, 0.9, 0.2, 0.8, 0.3]):
        rnd.planner.observe(0, seed, reward, 1.0)
        rnd.explored[(0, seed)] = type("E", (), {"reward": reward})()
    assert sorted(rnd.stale_rewards(0, rnd.selection()[0])) == [0.1, 0.2, 0.8, 0.9]
    assert rnd.pool_baseline(0) == pytest.approx((np.mean([0.5, 0.1, 0.9, 0.2, 0.8, 0.3]),
                                                  np.std([0.5, 0.1, 0.9, 0.2, 0.8, 0.3])))


def test_pool_baseline_reaches_the_local_trainers_advantages(tmp_path, monkeypatch):
    """exploration.baseline=pool: the update's advantages are taken against each prompt's explored pool."""
    from roll_spotlight.flow_grpo import group_advantages
    from roll_spotlight.flow_grpo.advantages import baselined_advantages
    from roll_spotlight.training.grpo import FlowGRPOTrainer

    used = []
    advantages = FlowGRPOTrainer.advantages

    def recording(self, batch):
        adv = advantages(self, batch)
        used.append((batch, adv.values.clone()))
        return adv

    monkeypatch.setattr(FlowGRPOTrainer, "advantages", recording)
    cfg, _ = _run(tmp_path, "pool", "exploration.mode=stale", "exploration.baseline=pool", "max_steps=3")
    g = cfg.train.group_size
    assert len(used) == 3 and used[0][0].baselines is None  # iteration 1 had nothing explored for it
    for batch, values in used[1:]:
        base = batch.baselines
        assert base.shape == (cfg.rollout_batch_size * g, 2)
        assert all(np.array_equal(base[i], base[i - i % g]) for i in range(len(base)))  # one per group
        assert np.all(np.isfinite(base))
        rewards, ids = torch.as_tensor(batch.rewards, dtype=torch.float32), torch.as_tensor(batch.group_ids)
        std_mode, clip = cfg.train.std_mode, cfg.train.adv_clip
        pool = baselined_advantages(rewards, ids, torch.as_tensor(base), std_mode=std_mode, clip=clip).values
        own = group_advantages(rewards, ids, std_mode=std_mode, clip=clip).values
        assert torch.equal(values, pool)
        assert not torch.allclose(values, own)  # the selected groups' own statistics are not the pool's


def test_pool_baseline_refuses_a_backend_without_baselines(tmp_path):
    """A backend written to the four-argument start_train fails before the first iteration, not at the second."""
    from roll_spotlight.runtime.coordinator import Coordinator
    from roll_spotlight.runtime.local import LocalBackend

    class FourArguments(LocalBackend):
        def start_train(self, outputs, prompts, group_ids, rewards):
            return super().start_train(outputs, prompts, group_ids, rewards)

    cfg = tiny_config(*EXPLORE, "exploration.mode=stale", "exploration.baseline=pool", "max_steps=1")
    with pytest.raises(ValueError, match="exploration.baseline='pool'.*FourArguments"):
        Coordinator(cfg, FourArguments(cfg, random_policy(cfg)), tmp_path / "old", progress=False)
    Coordinator(cfg, LocalBackend(cfg, random_policy(cfg)), tmp_path / "local", progress=False)  # ours take it
