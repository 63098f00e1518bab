"""Our Flow-GRPO step and KL against flow_grpo's formulas, transcribed here in plain torch.

The transcriptions follow flow_grpo's `sde_step_with_logprob` (sde and cps) and the KL of its
training scripts, `mean_dims((mean - ref_mean)^2) / (2 std_dev_t^2)` averaged over the batch, where
std_dev_t is what the step returns. They are written independently of roll_spotlight.flow_grpo and
evaluated the way flow_grpo does: float32, sigmas as per-sample (B, 1, 1) tensors taken from the
scheduler's sigma table, with sigma_max = sigmas[1] standing in for sigma on the first step. Inputs
are random packed Qwen-Image latents on every step of a 10-step 512x512 Qwen-Image schedule.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from roll_spotlight.flow_grpo import gaussian_mean_kl, rollout, sde_step, sigma_schedule
from roll_spotlight.training.grpo import FlowGRPOTrainer, GRPOConfig, ScoredBatch

NUM_STEPS = 10
SIGMAS = sigma_schedule(NUM_STEPS, 1024)  # 512x512: 32x32 packed tokens
LATENT = (3, 256, 64)  # (B, tokens, packed channels), as Qwen-Image's transformer sees them
A = 0.7
STEPS = list(range(NUM_STEPS))
# float32 rounding: the two sides evaluate the same formulas in a different order
ATOL, RTOL = 1e-6, 1e-5
KINDS = ("sde", "cps", "cps_gaussian", "ode")


# ---- flow_grpo, transcribed -------------------------------------------------------------------

def _table(step: int, batch: int):
    """sigma, sigma_prev (B, 1, 1) and sigma_max as flow_grpo reads them from the scheduler."""
    view = (batch, 1, 1)
    return SIGMAS[step].expand(batch).reshape(view), SIGMAS[step + 1].expand(batch).reshape(view), float(SIGMAS[1])


def reference_sde(v, x, step, a, eps=None, prev=None):
    sigma, sigma_prev, sigma_max = _table(step, x.shape[0])
    dt = sigma_prev - sigma
    std_dev_t = torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_max, sigma))) * a
    mean = x * (1 + std_dev_t**2 / (2 * sigma) * dt) + v * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
    if prev is None:
        prev = mean + std_dev_t * torch.sqrt(-1 * dt) * eps
    scale = std_dev_t * torch.sqrt(-1 * dt)
    log_prob = (-((prev - mean) ** 2) / (2 * scale**2) - torch.log(scale)
                - torch.log(torch.sqrt(2 * torch.as_tensor(math.pi))))
    return prev, log_prob.mean(dim=tuple(range(1, log_prob.ndim))), mean, std_dev_t


def reference_cps(v, x, step, a, eps=None, prev=None):
    sigma, sigma_prev, _ = _table(step, x.shape[0])
    std_dev_t = sigma_prev * math.sin(a * math.pi / 2)
    x0_hat = x - sigma * v
    x1_hat = x + v * (1 - sigma)
    mean = x0_hat * (1 - sigma_prev) + x1_hat * torch.sqrt(sigma_prev**2 - std_dev_t**2)
    if prev is None:
        prev = mean + std_dev_t * eps
    log_prob = -((prev - mean) ** 2)
    return prev, log_prob.mean(dim=tuple(range(1, log_prob.ndim))), mean, std_dev_t


def reference_kl(mean, ref_mean, std_dev_t):
    kl = ((mean - ref_mean) ** 2).mean(dim=tuple(range(1, mean.ndim)), keepdim=True) / (2 * std_dev_t**2)
    return torch.mean(kl)


# The two kinds flow_grpo has no function for: the exact Gaussian density of the cps transition
# (torch.distributions) and diffusers' Euler step.

def reference_cps_gaussian(v, x, step, a, eps=None, prev=None):
    prev, _, mean, std = reference_cps(v, x, step, a, eps, prev)
    if float(std.flatten()[0]) == 0:
        return prev, torch.zeros(x.shape[0]), mean, std
    density = torch.distributions.Normal(mean, std.expand_as(mean)).log_prob(prev)
    return prev, density.mean(dim=tuple(range(1, density.ndim))), mean, std


def reference_ode(v, x, step, a, eps=None, prev=None):
    sigma, sigma_prev, _ = _table(step, x.shape[0])
    mean = x + (sigma_prev - sigma) * v
    return (mean if prev is None else prev), torch.zeros(x.shape[0]), mean, torch.zeros_like(sigma)


REFERENCE = {"sde": reference_sde, "cps": reference_cps, "cps_gaussian": reference_cps_gaussian,
             "ode": reference_ode}


# ---- helpers ----------------------------------------------------------------------------------

def _random(step: int, n: int = 4):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(LATENT, generator=g) for _ in range(n)]


def _ours(kind, v, x, step, sigma_form, **kwargs):
    if sigma_form == "shared":  # what training and rollouts pass: 0-d sigmas
        s, s_next = SIGMAS[step], SIGMAS[step + 1]
    else:  # what flow_grpo passes: one sigma per sample
        s, s_next = SIGMAS[step].expand(LATENT[0]), SIGMAS[step + 1].expand(LATENT[0])
    return sde_step(v, x, s, s_next, noise_level=0.0 if kind == "ode" else A, kind=kind, **kwargs)


def _close(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=RTOL, msg=lambda m: f"{what}: {m}")


# ---- the step ---------------------------------------------------------------------------------

@pytest.mark.parametrize("sigma_form", ["shared", "per_sample"])
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("kind", KINDS)
def test_drawn_step_equals_flow_grpo(kind, step, sigma_form):
    v, x, eps, _ = _random(step)
    ours = _ours(kind, v, x, step, sigma_form, noise=eps)
    prev, log_prob, mean, std_dev_t = REFERENCE[kind](v, x, step, A, eps=eps)
    _close(ours.mean, mean, "mean")
    _close(ours.prev_sample, prev, "prev_sample")
    _close(ours.log_prob, log_prob, "log_prob")
    _close(ours.kl_std.expand(LATENT[0], 1, 1).reshape(-1), std_dev_t.reshape(-1), "kl_std")


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("kind", KINDS)
def test_scored_step_equals_flow_grpo(kind, step):
    """Training's case: a recorded x' scored under a velocity that has moved since the rollout."""
    v, x, eps, dv = _random(step)
    prev, *_ = REFERENCE[kind](v, x, step, A, eps=eps)
    moved = v + 0.05 * dv
    ours = _ours(kind, moved, x, step, "shared", prev_sample=prev)
    _, log_prob, mean, _ = REFERENCE[kind](moved, x, step, A, prev=prev)
    _close(ours.mean, mean, "mean")
    _close(ours.log_prob, log_prob, "log_prob")
    assert torch.equal(ours.prev_sample, prev)


def test_first_and_last_steps_take_flow_grpo_s_special_cases():
    """Step 0 (sigma == 1) divides by 1 - sigmas[1]; the last step lands on sigma 0, where cps is
    deterministic and "cps" scores -(x' - mean)^2 while "cps_gaussian" has no density."""
    assert float(SIGMAS[0]) == 1.0 and float(SIGMAS[-1]) == 0.0
    v, x, eps, dv = _random(0)
    first = _ours("sde", v, x, 0, "shared", noise=eps)
    expected_std_t = A * math.sqrt(1.0 / (1.0 - float(SIGMAS[1])))
    assert float(first.kl_std) == pytest.approx(expected_std_t, rel=1e-6)
    last = NUM_STEPS - 1
    for kind in ("cps", "cps_gaussian"):
        drawn = _ours(kind, v, x, last, "shared", noise=eps)
        assert float(drawn.std) == 0.0 and torch.equal(drawn.prev_sample, drawn.mean)
        assert torch.equal(drawn.log_prob, torch.zeros(LATENT[0]))
    moved = v + 0.05 * dv
    scored = _ours("cps", moved, x, last, "shared", prev_sample=drawn.prev_sample)
    _, log_prob, _, _ = reference_cps(moved, x, last, A, prev=drawn.prev_sample)
    assert bool((scored.log_prob < 0).all())
    _close(scored.log_prob, log_prob, "log_prob")


@pytest.mark.parametrize("step", STEPS[:-1])
def test_cps_gaussian_log_ratio_is_cps_times_one_over_twice_the_variance(step):
    """The two cps kinds give different PPO ratios: the Gaussian's log-ratio is flow_grpo's
    divided by 2 std^2 (the normalising constant cancels, the 1/(2 std^2) does not)."""
    v, x, eps, dv = _random(step)
    old = {k: _ours(k, v, x, step, "shared", noise=eps) for k in ("cps", "cps_gaussian")}
    assert torch.equal(old["cps"].prev_sample, old["cps_gaussian"].prev_sample)
    moved = v + 0.01 * dv
    new = {k: _ours(k, moved, x, step, "shared", prev_sample=old[k].prev_sample) for k in old}
    log_ratio = {k: (new[k].log_prob - old[k].log_prob).double() for k in old}
    std = float(old["cps"].std)
    torch.testing.assert_close(log_ratio["cps_gaussian"], log_ratio["cps"] / (2 * std * std), atol=1e-6, rtol=1e-4)


# ---- the KL -----------------------------------------------------------------------------------

@pytest.mark.parametrize("sigma_form", ["shared", "per_sample"])
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("kind", ["sde", "cps", "cps_gaussian"])
def test_kl_equals_flow_grpo(kind, step, sigma_form):
    v, x, eps, dv = _random(step)
    v_ref = v + 0.02 * dv
    new = _ours(kind, v, x, step, sigma_form, noise=eps)
    ref = _ours(kind, v_ref, x, step, sigma_form, noise=eps)
    ours = gaussian_mean_kl(new.mean, ref.mean, new.kl_std)
    _, _, mean, std_dev_t = REFERENCE[kind](v, x, step, A, eps=eps)
    _, _, ref_mean, _ = REFERENCE[kind](v_ref, x, step, A, eps=eps)
    theirs = reference_kl(mean, ref_mean, std_dev_t)
    if kind != "sde" and step == NUM_STEPS - 1:
        # a deterministic step: flow_grpo's formula divides by zero (its scripts never train it)
        assert not bool(torch.isfinite(theirs)) and ours.item() == 0.0
        return
    assert ours.item() > 0
    torch.testing.assert_close(ours, theirs, atol=0, rtol=RTOL)
    if kind == "sde":  # flow_grpo's sde KL is the transition Gaussians' exact KL times |dt|
        exact = gaussian_mean_kl(new.mean, ref.mean, new.std)
        dt = float(SIGMAS[step] - SIGMAS[step + 1])
        torch.testing.assert_close(ours, exact * dt, atol=0, rtol=1e-5)


class _TinyPolicy(torch.nn.Module):
    """Just the interface FlowGRPOTrainer calls: prompt conditioning and a velocity."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(dim + 2, dim)

    def trainable_parameters(self):
        return self.parameters()

    def encode_prompts(self, prompts):
        return torch.tensor([[float(len(p))] for p in prompts])

    def velocity(self, latents, sigma, cond):
        features = torch.cat([latents.flatten(1), cond, sigma[:, None]], dim=1)
        return self.linear(features).view_as(latents)


@pytest.mark.parametrize("kind", ["sde", "cps"])
def test_trainer_kl_metric_is_flow_grpo_s(kind):
    """The call site: the trainer's KL (before its update) is flow_grpo's, averaged over the
    noised steps, for a policy that has drifted from the frozen reference."""
    shape, group = (4, 8), 4
    policy = _TinyPolicy(int(np.prod(shape)))
    prompts = ["a"] * group + ["bb"] * group
    with torch.no_grad():
        cond = policy.encode_prompts(prompts)
        traj = rollout(lambda x, s: policy.velocity(x, s, cond), list(range(2 * group)), SIGMAS, shape,
                       noise_level=A, kind=kind)
    cfg = GRPOConfig(group_size=group, kl_beta=0.04, micro_batch_size=2 * group, clip_range=0.2)
    trainer = FlowGRPOTrainer(policy, cfg)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    rewards = np.array([0.1, 0.4, 0.2, 0.9, 0.5, 0.3, 0.8, 0.6])
    batch = ScoredBatch(traj, prompts, np.repeat([0, 1], group), rewards, A, kind)
    trained = STEPS if kind == "sde" else STEPS[:-1]  # cps: the step onto sigma 0 adds no KL
    expected = []
    with torch.no_grad():
        reference = trainer.reference
        for k in trained:
            x = traj.latents[:, k]
            sigma = SIGMAS[k].expand(2 * group)
            v = policy.velocity(x, sigma, policy.encode_prompts(prompts))
            v_ref = reference.velocity(x, sigma, reference.encode_prompts(prompts))
            step_fn = REFERENCE[kind]
            _, _, mean, std_dev_t = step_fn(v.reshape(2 * group, 1, -1), x.reshape(2 * group, 1, -1), k, A,
                                            prev=traj.latents[:, k + 1].reshape(2 * group, 1, -1))
            _, _, ref_mean, _ = step_fn(v_ref.reshape(2 * group, 1, -1), x.reshape(2 * group, 1, -1), k, A,
                                        prev=traj.latents[:, k + 1].reshape(2 * group, 1, -1))
            expected.append(float(reference_kl(mean, ref_mean, std_dev_t)))
    metrics = trainer.step(batch).metrics
    assert expected[0] > 0
    assert metrics["kl"] == pytest.approx(sum(expected) / NUM_STEPS, rel=1e-4)
