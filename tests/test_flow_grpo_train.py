"""Advantages, the PPO-clip + KL loss, and the SDE window."""

import math
import random

import pytest
import torch

from roll_spotlight.flow_grpo import (
    SdeWindow,
    gaussian_mean_kl,
    group_advantages,
    policy_loss,
    sde_step,
    sde_window_steps,
)


def test_group_advantages_per_group():
    rewards = [1.0, 2.0, 3.0, 5.0, 5.0, 5.0, 0.0, 10.0]
    adv = group_advantages(rewards, [7, 7, 7, 3, 3, 3, 9, 9])
    s0 = math.sqrt(2 / 3)
    expected = [-1 / (s0 + 1e-4), 0.0, 1 / (s0 + 1e-4), 0.0, 0.0, 0.0, -5 / 5.0001, 5 / 5.0001]
    torch.testing.assert_close(adv.values, torch.tensor(expected), atol=1e-6, rtol=1e-6)
    assert adv.zero_std_mask.tolist() == [False] * 3 + [True] * 3 + [False] * 2
    assert adv.zero_std_ratio == pytest.approx(1 / 3)
    torch.testing.assert_close(adv.group_std, torch.tensor([s0] * 3 + [0.0] * 3 + [5.0] * 2))


def test_zero_std_group_advantage_is_exactly_zero_despite_rounding():
    adv = group_advantages([0.1, 0.1, 0.1, 0.0, 1.0], [0, 0, 0, 1, 1])
    assert adv.values[:3].tolist() == [0.0, 0.0, 0.0]
    assert adv.zero_std_mask.tolist() == [True, True, True, False, False]


def test_global_std_and_clip():
    rewards = torch.tensor([0.0, 1.0, 2.0, 4.0])
    adv = group_advantages(rewards, [0, 0, 1, 1], std_mode="global")
    std = rewards.std(correction=0)
    expected = torch.tensor([-0.5, 0.5, -1.0, 1.0]) / (std + 1e-4)
    torch.testing.assert_close(adv.values, expected)
    clipped = group_advantages(rewards, [0, 0, 1, 1], std_mode="global", clip=0.6)
    torch.testing.assert_close(clipped.values, expected.clamp(-0.6, 0.6))
    assert clipped.values.abs().max().item() == pytest.approx(0.6)


@pytest.mark.parametrize(
    "rewards,kwargs,match",
    [
        ([1.0, float("nan")], {}, "NaN"),
        ([1.0, 2.0], {"std_mode": "batch"}, "std_mode='batch'"),
        ([1.0, 2.0], {"clip": 0.0}, "clip=0.0"),
        ([], {}, "empty"),
    ],
)
def test_invalid_advantage_inputs_raise(rewards, kwargs, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, list(range(len(rewards))), **kwargs)


def _logp(param: torch.Tensor, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return sde_step(param, x, 0.6, 0.5, noise_level=0.7, prev_sample=target).log_prob


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_gradient_step_moves_log_prob_with_the_advantage_sign(sign):
    g = torch.Generator().manual_seed(0)
    x, eps = torch.randn(2, 3, 4, 4, generator=g), torch.randn(2, 3, 4, 4, generator=g)
    velocity = torch.randn(2, 3, 4, 4, generator=g).requires_grad_(True)
    target = sde_step(velocity.detach() + 0.3, x, 0.6, 0.5, noise_level=0.7, noise=eps).prev_sample
    before = _logp(velocity, x, target)
    out = policy_loss(before, before.detach(), torch.tensor([sign, sign]))
    out.loss.backward()
    with torch.no_grad():
        after = _logp(velocity - 1e-3 * velocity.grad, x, target)
    assert bool((sign * (after - before.detach()) > 0).all())


def test_clipped_ratio_stops_the_gradient_and_counts_in_clip_fraction():
    log_prob = torch.tensor([0.0, 1e-3, -1e-3, 1e-5], requires_grad=True)
    advantages = torch.tensor([1.0, 1.0, -1.0, 1.0])
    out = policy_loss(log_prob, torch.zeros(4), advantages, clip_range=1e-4)
    assert out.clip_fraction.item() == pytest.approx(0.5)
    ratio = torch.exp(log_prob.detach())
    assert out.ratio_mean.item() == pytest.approx(ratio.mean().item())
    assert out.approx_kl.item() == pytest.approx(0.5 * (log_prob.detach() ** 2).mean().item())
    out.loss.backward()
    grad = log_prob.grad
    assert grad[1].item() == 0.0 and grad[2].item() == 0.0
    assert grad[0].item() == pytest.approx(-0.25) and grad[3].item() < 0
    assert out.kl.item() == 0.0


def test_kl_is_zero_for_equal_means_and_matches_formula_otherwise():
    mean = torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(1))
    std = torch.tensor(0.05)
    assert gaussian_mean_kl(mean, mean.clone(), std).item() == 0.0
    ref = mean + 0.01
    kl = gaussian_mean_kl(mean, ref, std)
    assert kl.item() == pytest.approx(0.01**2 / (2 * 0.05**2), rel=1e-4)
    lp = torch.zeros(3)
    out = policy_loss(lp, lp, torch.ones(3), kl_beta=0.1, mean=mean, ref_mean=ref, std=std)
    assert out.kl.item() == pytest.approx(kl.item())
    assert out.loss.item() == pytest.approx(out.policy_loss.item() + 0.1 * kl.item())
    same = policy_loss(lp, lp, torch.ones(3), kl_beta=0.1, mean=mean, ref_mean=mean, std=std)
    assert same.kl.item() == 0.0


def test_invalid_loss_arguments_raise():
    lp = torch.zeros(3)
    with pytest.raises(ValueError, match="kl_beta=0.1 needs"):
        policy_loss(lp, lp, torch.ones(3), kl_beta=0.1)
    with pytest.raises(ValueError, match="same"):
        policy_loss(lp, lp, torch.ones(2))
    with pytest.raises(ValueError, match="clip_range=0"):
        policy_loss(lp, lp, torch.ones(3), clip_range=0)


def test_sde_window_mask_and_membership():
    window = SdeWindow(2, 5)
    assert window.mask(8).tolist() == [False, False, True, True, True, False, False, False]
    assert 2 in window and 4 in window and 5 not in window
    with pytest.raises(ValueError, match="start=3, end=2"):
        SdeWindow(3, 2)
    with pytest.raises(ValueError, match="num_steps=4"):
        window.mask(4)


def test_sde_window_steps_is_deterministic_and_stays_in_range():
    windows = [sde_window_steps(10, 3, seed, within=(0, 5)) for seed in range(40)]
    assert windows == [sde_window_steps(10, 3, seed, within=(0, 5)) for seed in range(40)]
    assert {w.start for w in windows} == {0, 1, 2}
    assert all(w.end - w.start == 3 and w.end <= 5 for w in windows)
    rng = random.Random(4)
    assert sde_window_steps(10, 2, rng) == sde_window_steps(10, 2, random.Random(4))
    with pytest.raises(ValueError, match="window_size=6"):
        sde_window_steps(10, 6, 0, within=(0, 5))
