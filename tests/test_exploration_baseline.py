"""Advantages against the explored pool's statistics (`exploration.baseline: pool`)."""
import math

import numpy as np
import pytest
import torch

from roll_spotlight.flow_grpo import group_advantages
from roll_spotlight.flow_grpo.advantages import baselined_advantages

NAN = math.nan


def test_no_baseline_is_group_advantages_exactly():
    rewards = [0.1, 0.9, 0.5, 0.3, 0.3, 0.3]
    ids = [0, 0, 0, 1, 1, 1]
    own = group_advantages(rewards, ids)
    none = baselined_advantages(rewards, ids, [[NAN, NAN]] * 6)
    assert torch.equal(none.values, own.values)
    assert torch.equal(none.zero_std_mask, own.zero_std_mask)
    assert none.zero_std_ratio == own.zero_std_ratio == 0.5
    # a pool without spread gives nothing to scale by: the group's own statistics again
    flat = baselined_advantages(rewards, ids, [[0.4, 0.0]] * 6)
    assert torch.equal(flat.values, own.values)


def test_pool_baseline_normalises_by_the_pool_and_keeps_equal_groups():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    ids = [0, 0, 0, 1, 1, 1]
    base = [[0.25, 0.5]] * 3 + [[0.5, 0.25]] * 3
    adv = baselined_advantages(rewards, ids, base, eps=1e-4, clip=5.0)
    expected = torch.tensor([0.75 / 0.5001, -0.25 / 0.5001, 0.75 / 0.5001] + [0.5 / 0.2501] * 3)
    assert torch.allclose(adv.values, expected)
    # group 1 is all equal: its own normalisation gives zeros and drops it; against the pool its
    # successes are above the prompt's mean, so it is kept with a positive advantage
    assert not adv.zero_std_mask.any() and adv.zero_std_ratio == 0.0
    assert float(adv.group_std[3]) == 0.0
    clipped = baselined_advantages([9.0, 0.0], [0, 0], [[0.0, 1.0]] * 2, clip=2.0)
    assert clipped.values.tolist()[0] == 2.0


def test_mixed_groups_and_validation():
    rewards, ids = [0.2, 0.2, 0.8, 0.1], [0, 0, 1, 1]
    adv = baselined_advantages(rewards, ids, [[NAN, NAN], [NAN, NAN], [0.5, 0.1], [0.5, 0.1]])
    assert adv.zero_std_mask.tolist() == [True, True, False, False] and adv.zero_std_ratio == 0.5
    assert adv.values[:2].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="same baseline"):
        baselined_advantages(rewards, ids, [[NAN, NAN], [0.1, 0.2], [0.5, 0.1], [0.5, 0.1]])
    with pytest.raises(ValueError, match="same baseline"):
        baselined_advantages(rewards, ids, [[0.1, 0.2], [0.1, 0.3], [0.5, 0.1], [0.5, 0.1]])
    with pytest.raises(ValueError, match=r"shape \(N, 2\)"):
        baselined_advantages(rewards, ids, [[0.1, 0.2]])
    with pytest.raises(ValueError, match="std must be >= 0"):
        baselined_advantages(rewards, ids, [[0.1, -0.2]] * 4)


def test_trainer_uses_the_batch_baselines():
    from roll_spotlight.training.grpo import FlowGRPOTrainer, ScoredBatch
    from tests.runtime_helpers import random_policy, tiny_config

    cfg = tiny_config()
    trainer = FlowGRPOTrainer(random_policy(cfg), cfg.train)
    rewards, ids = np.array([1.0, 1.0, 0.0, 1.0]), np.array([0, 0, 1, 1])
    plain = trainer.advantages(ScoredBatch(None, ["a"] * 4, ids, rewards, 0.7, "sde"))
    assert plain.values[:2].tolist() == [0.0, 0.0]
    pooled = trainer.advantages(ScoredBatch(None, ["a"] * 4, ids, rewards, 0.7, "sde",
                                            baselines=np.array([[0.5, 0.5]] * 4)))
    assert pooled.values[:2].tolist() == pytest.approx([0.5 / 0.5001] * 2)
    assert not pooled.zero_std_mask.any()
