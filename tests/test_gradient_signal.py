"""The gradient-agreement diagnostic: its statistics on gradients of known signal, and the trainer's
`gradient` (what one update applies, without applying it)."""
from __future__ import annotations

import math

import pytest
import torch

from benchmarks.gradient_signal import agreement, by_parameter, flatten, measure
from tests.runtime_helpers import random_policy, tiny_config
from tests.test_grpo_dp import CFG, _problem


def _batches(signal_scale: float, batches: int = 8, size: int = 40_000, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    signal = signal_scale * torch.randn(size, generator=gen)
    return [signal + torch.randn(size, generator=gen) for _ in range(batches)]


@pytest.mark.parametrize("scale", [0.5, 1.0])
def test_agreement_recovers_a_known_per_entry_correlation(scale):
    rho = scale ** 2 / (scale ** 2 + 1)  # corr(g_i, g_j) per entry = var(signal) / (var(signal) + var(noise))
    a = agreement(_batches(scale))
    assert a.batches == 8 and a.pairs == 28
    assert a.correlation == pytest.approx(rho, abs=0.02)
    assert a.signal_fraction == pytest.approx(rho, abs=4 * a.signal_fraction_se + 0.01)
    assert a.sign_agreement == pytest.approx(0.5 + math.asin(rho) / math.pi, abs=0.01)


def test_pure_noise_agrees_by_chance_only():
    a = agreement(_batches(0.0))
    assert abs(a.sign_agreement - 0.5) < 4 * a.sign_agreement_se + 1e-3
    assert abs(a.signal_fraction) < 4 * a.signal_fraction_se + 1e-3
    assert 0 < a.sign_agreement_se < 0.01


def test_identical_gradients_are_all_signal_and_zeros_are_not_counted_as_agreement():
    g = torch.tensor([1.0, -2.0, 0.0, 3.0])
    a = agreement([g, g.clone(), g.clone()])
    assert a.signal_fraction == pytest.approx(1.0) and a.sign_agreement == 1.0 and a.correlation == pytest.approx(1.0)
    opposite = agreement([g, -g, g])
    assert opposite.sign_agreement == pytest.approx(1 / 3)  # 1 of 3 pairs agrees; the zero entry counts in none


def test_agreement_rejects_too_few_or_mismatched_batches():
    with pytest.raises(ValueError, match="at least 3"):
        agreement([torch.ones(3), torch.ones(3)])
    with pytest.raises(ValueError, match="differ in size"):
        agreement([torch.ones(3), torch.ones(3), torch.ones(4)])
    with pytest.raises(ValueError, match="no gradient for"):
        flatten({"a": torch.ones(2)}, ["a", "b"])


def test_trainer_gradient_is_the_gradient_step_applies_and_changes_nothing():
    from roll_spotlight.training.grpo import FlowGRPOTrainer

    policy, batch = _problem()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    cfg = type(CFG)(**{**CFG.__dict__, "inner_epochs": 1, "kl_beta": 0.0})
    trainer = FlowGRPOTrainer(policy, cfg)
    grads = trainer.gradient(batch)
    assert set(grads) == {"embed.weight", "linear.weight", "linear.bias"}
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert not trainer.optimizer.state  # no optimiser step was taken
    applied = {}
    original = trainer.optimizer.step

    def capture(*args, **kwargs):
        applied.update({n: p.grad.clone() for n, p in policy.named_parameters()})
        return original(*args, **kwargs)

    trainer.optimizer.step = capture
    trainer.step(batch)
    total = torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))
    scale = min(1.0, cfg.max_grad_norm / (float(total) + 1e-6))  # clip_grad_norm_ scales by max_norm / (norm + 1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(applied[name], g * scale, rtol=1e-5, atol=1e-8)


def test_measure_on_the_tiny_config_reports_finite_statistics_and_leaves_the_weights():
    cfg = tiny_config()
    policy = random_policy(cfg)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    report = measure(cfg, policy, 3)
    assert [b["iteration"] for b in report["batches"]] == [100_000, 100_001, 100_002]
    assert report["samples_per_batch"] == cfg.rollout_batch_size * cfg.train.group_size
    overall = report["overall"]
    assert overall["batches"] == 3 and overall["pairs"] == 3
    assert all(math.isfinite(overall[k]) for k in ("signal_fraction", "sign_agreement", "correlation"))
    assert 0.0 <= overall["sign_agreement"] <= 1.0
    shares = [row["energy_share"] for row in report["by_parameter"]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1.0 + 1e-9
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())


def test_by_parameter_ranks_by_energy():
    gen = torch.Generator().manual_seed(1)
    grads = [{"big": 10 * torch.randn(50, generator=gen), "small": torch.randn(50, generator=gen)} for _ in range(4)]
    rows = by_parameter(grads)
    assert [r["parameter"] for r in rows] == ["big", "small"]
    assert rows[0]["energy_share"] > 0.9
