"""train.ema_decay: the weight average validated in place of the live weights (TrainerCore)."""
from __future__ import annotations

import pytest
import torch

from roll_spotlight.runtime.trainer_core import WeightAverage


def module(value: float) -> torch.nn.Linear:
    lin = torch.nn.Linear(2, 2)
    with torch.no_grad():
        for p in lin.parameters():
            p.fill_(value)
    return lin


def test_average_follows_the_warmed_up_decay_and_swaps_back():
    lin = module(0.0)
    avg = WeightAverage(lin, decay=0.9)
    with torch.no_grad():
        lin.weight.fill_(1.0)
    avg.update(lin)  # d = min(0.9, 1/10) = 0.1: 0.1 * 0 + 0.9 * 1
    assert torch.allclose(avg.params["weight"], torch.full((2, 2), 0.9))
    with torch.no_grad():
        lin.weight.fill_(2.0)
    avg.update(lin)  # d = 2/11
    expected = (2 / 11) * 0.9 + (9 / 11) * 2.0
    assert torch.allclose(avg.params["weight"], torch.full((2, 2), expected))
    with avg.swapped_into(lin):
        assert torch.allclose(lin.weight, torch.full((2, 2), expected))
    assert torch.equal(lin.weight, torch.full((2, 2), 2.0))  # the live weights are back


def test_swap_restores_live_weights_when_evaluation_raises():
    lin = module(3.0)
    avg = WeightAverage(lin, decay=0.5)
    with torch.no_grad():
        lin.weight.fill_(5.0)
    with pytest.raises(RuntimeError):
        with avg.swapped_into(lin):
            raise RuntimeError("evaluation failed")
    assert torch.equal(lin.weight, torch.full((2, 2), 5.0))


def test_state_round_trip_and_mismatch():
    lin = module(1.0)
    avg = WeightAverage(lin, decay=0.9)
    avg.update(module(4.0))
    other = WeightAverage(module(0.0), decay=0.9)
    other.load_state_dict(avg.state_dict())
    assert other.updates == 1 and all(torch.equal(other.params[k], v) for k, v in avg.params.items())
    with pytest.raises(KeyError, match="trainable parameters"):
        WeightAverage(torch.nn.Linear(2, 2, bias=False), 0.9).load_state_dict(avg.state_dict())
    with pytest.raises(ValueError, match="train.ema_decay"):
        WeightAverage(lin, 1.0)


def test_trainer_core_validates_the_average_and_checkpoints_it():
    from tests.runtime_helpers import random_policy, tiny_config

    from roll_spotlight.runtime.trainer_core import TrainerCore

    cfg = tiny_config("train.ema_decay=0.9")
    core = TrainerCore(cfg, random_policy(cfg, seed=1))
    with torch.no_grad():
        for p in core.policy.parameters():
            p.add_(0.1)
    core.ema.update(core.policy)
    seen = {}
    import roll_spotlight.runtime.trainer_core as tc

    original = tc.evaluate

    def spy(policy, *args):
        seen["weights"] = {k: v.clone() for k, v in policy.named_parameters()}
        return original(policy, *args)

    tc.evaluate = spy
    try:
        core.evaluate()
    finally:
        tc.evaluate = original
    assert all(torch.equal(seen["weights"][k], v) for k, v in core.ema.params.items())
    state = core.state_dict()
    fresh = TrainerCore(cfg, random_policy(cfg, seed=1))
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh.ema.params[k], v) for k, v in core.ema.params.items())
    del state["ema"]
    with pytest.raises(KeyError, match="weight average"):
        fresh.load_state_dict(state)
