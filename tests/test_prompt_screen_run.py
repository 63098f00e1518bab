"""Prompt screening in the loop (`exploration.target: prompts`): the draw, its metrics, the weights, resume."""
import shutil

import numpy as np
import pytest
import torch

from roll_spotlight.config.strict import ConfigError
from roll_spotlight.startup import start_run
from roll_spotlight.training.metrics import read_metrics
from tests.runtime_helpers import random_policy, tiny_config

SCREEN = ["exploration.target=prompts", "exploration.prompt_screen_seeds=2", "max_steps=3",
          "exploration.adaptive=false"]  # the screen alone (the switch: tests/test_exploration_adaptive.py)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _run(tmp_path, name, *extra, **kw):
    cfg = tiny_config(*SCREEN, *extra)
    return cfg, start_run(cfg, tmp_path / name, policy=random_policy(cfg), progress=False, **kw)


def _recording_advantages(monkeypatch) -> list:
    from roll_spotlight.training.grpo import FlowGRPOTrainer

    used, advantages = [], FlowGRPOTrainer.advantages

    def recording(self, batch):
        adv = advantages(self, batch)
        used.append((batch, adv.values.clone()))
        return adv

    monkeypatch.setattr(FlowGRPOTrainer, "advantages", recording)
    return used


def test_screen_keys_are_checked():
    with pytest.raises(ConfigError, match="exploration.prompt_floor"):
        tiny_config("exploration.prompt_floor=0")
    with pytest.raises(ConfigError, match="exploration.prompt_candidates"):
        tiny_config("exploration.prompt_candidates=1")
    with pytest.raises(ConfigError, match="exploration.unbiased"):
        tiny_config("exploration.unbiased=true")  # target seeds: needs pps, pool, uniform
    tiny_config("exploration.unbiased=true", "exploration.target=prompts")


def test_stale_screen_explores_candidates_draws_and_resumes_exactly(tmp_path):
    cfg, full = _run(tmp_path, "full", "exploration.mode=stale", "save_steps=1")
    rows = [r for r in read_metrics(tmp_path / "full") if r["step"] >= 1]
    candidates = cfg.exploration.prompt_candidates * cfg.rollout_batch_size
    assert [r["explored_seeds"] for r in rows] == [2 * candidates, 2 * candidates, 0]
    for r in rows:
        assert 0.0 <= r["screen/skipped"] <= 1.0 and 0.0 <= r["groups_all_equal"] <= 1.0
        assert r["screen/predicted_batch"] <= 1.0 and r["explore_s"] >= 0.0
    _, again = _run(tmp_path, "again", "exploration.mode=stale")
    assert np.array_equal(full.final.rewards, again.final.rewards)
    shutil.copytree(tmp_path / "full", tmp_path / "cut")  # killed after iteration 1: history in the checkpoint
    _, resumed = _run(tmp_path, "cut", "exploration.mode=stale", "save_steps=1",
                      resume=tmp_path / "cut" / "checkpoints" / "iter-000001")
    assert np.array_equal(resumed.final.rewards, full.final.rewards)
    cut = {r["step"]: r for r in read_metrics(tmp_path / "cut")}
    assert [cut[s]["screen/predicted_batch"] for s in (2, 3)] == [r["screen/predicted_batch"] for r in rows[1:]]


def test_fresh_screen_explores_on_the_critical_path(tmp_path):
    cfg, _ = _run(tmp_path, "fresh", "exploration.mode=fresh")
    rows = [r for r in read_metrics(tmp_path / "fresh") if r["step"] >= 1]
    candidates = cfg.exploration.prompt_candidates * cfg.rollout_batch_size
    assert all(r["explored_seeds"] == 2 * candidates for r in rows)


def test_unbiased_screen_weights_each_group_by_its_inclusion(tmp_path, monkeypatch):
    used = _recording_advantages(monkeypatch)
    cfg, _ = _run(tmp_path, "hw", "exploration.mode=stale", "exploration.unbiased=true",
                  "exploration.prompt_candidates=3")
    g, b = cfg.train.group_size, cfg.rollout_batch_size
    rows = [r for r in read_metrics(tmp_path / "hw") if r["step"] >= 1]
    assert len(used) == 3
    for (batch, values), row in zip(used, rows):
        base = np.asarray(batch.baselines)
        assert base.shape == (b * g, 3) and np.all(np.isnan(base[:, :2]))
        weights = base[:, 2]
        assert np.all(weights > 0) and weights.max() == pytest.approx(row["screen/max_weight"])
        assert all(weights[i] == weights[i - i % g] for i in range(len(weights)))  # one weight per group
        from roll_spotlight.flow_grpo import group_advantages

        own = group_advantages(torch.as_tensor(batch.rewards, dtype=torch.float32), torch.as_tensor(batch.group_ids),
                               std_mode=cfg.train.std_mode, clip=cfg.train.adv_clip).values
        assert torch.allclose(values, own * torch.as_tensor(weights, dtype=torch.float32))


def test_unbiased_seed_selection_weights_by_inclusion(tmp_path, monkeypatch):
    used = _recording_advantages(monkeypatch)
    cfg, _ = _run(tmp_path, "pps", "exploration.target=seeds", "exploration.mode=stale", "exploration.unbiased=true",
                  "exploration.selection=pps", "exploration.baseline=pool", "exploration.planner=uniform",
                  "exploration.seeds_per_prompt=6", "exploration.seeds_per_pull=2",
                  "exploration.min_seeds_before_abandon=6")
    assert used[0][0].baselines is None  # iteration 1: nothing explored for it
    for batch, _ in used[1:]:
        weights = np.asarray(batch.baselines)[:, 2]
        # a pool of 6 for a group of 3: k / (n pi) with pi in (0, 1]
        assert np.all(weights >= 3 / 6 - 1e-12) and np.all(np.isfinite(weights))
