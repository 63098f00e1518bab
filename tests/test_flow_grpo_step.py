"""sde_step and the seeded noise: closed forms, diffusers' Euler step, reproducibility."""

import math

import pytest
import torch

from roll_spotlight.flow_grpo import (
    INITIAL_NOISE_STEP,
    StepKind,
    initial_noise,
    noise_seed,
    sde_step,
    step_noise,
)
from roll_spotlight.flow_grpo.noise import _splitmix64

SHAPE = (3, 4, 6, 6)


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)


def _normal_log_prob(x, mean, std) -> torch.Tensor:
    lp = torch.distributions.Normal(mean.double(), std.double()).log_prob(x.double())
    return lp.reshape(x.shape[0], -1).mean(1)


@pytest.mark.parametrize("sigma,sigma_next", [(0.7, 0.55), (0.3, 0.0), (1.0, 0.93)])
def test_sde_step_matches_closed_form_and_normal_density(sigma, sigma_next):
    v, x, eps = _inputs()
    a = 0.7
    res = sde_step(v, x, sigma, sigma_next, noise_level=a, noise=eps)
    denominator_sigma = sigma_next if sigma == 1.0 else sigma
    std_t = a * math.sqrt(sigma / (1 - denominator_sigma))
    dt = sigma_next - sigma
    mean = x.double() * (1 + std_t**2 / (2 * sigma) * dt) + v.double() * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
    std = std_t * math.sqrt(-dt)
    torch.testing.assert_close(res.mean.double(), mean, atol=1e-5, rtol=1e-5)
    assert float(res.std) == pytest.approx(std, rel=1e-6)
    assert float(res.kl_std) == pytest.approx(std_t, rel=1e-6)
    torch.testing.assert_close(res.prev_sample.double(), mean + std * eps.double(), atol=1e-5, rtol=1e-5)
    expected = _normal_log_prob(res.prev_sample, res.mean, torch.full_like(res.mean, std))
    torch.testing.assert_close(res.log_prob.double(), expected, atol=1e-5, rtol=1e-6)
    assert res.log_prob.shape == (SHAPE[0],) and res.prev_sample.dtype == torch.float32


@pytest.mark.parametrize("kind", ["cps", "cps_gaussian"])
def test_cps_step_matches_closed_form_and_its_log_prob(kind):
    """Both cps kinds take the same step; "cps" scores it as flow_grpo does, -(x' - mean)^2
    averaged, "cps_gaussian" with the normal density."""
    v, x, eps = _inputs(1)
    sigma, sigma_next, a = 0.8, 0.6, 0.5
    res = sde_step(v, x, sigma, sigma_next, noise_level=a, kind=kind, noise=eps)
    std = sigma_next * math.sin(a * math.pi / 2)
    x0, eps_hat = x.double() - sigma * v.double(), x.double() + (1 - sigma) * v.double()
    mean = x0 * (1 - sigma_next) + eps_hat * math.sqrt(sigma_next**2 - std**2)
    torch.testing.assert_close(res.mean.double(), mean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res.prev_sample.double(), mean + std * eps.double(), atol=1e-5, rtol=1e-5)
    assert float(res.kl_std) == pytest.approx(std, rel=1e-6)
    if kind == "cps":
        expected = -((res.prev_sample.double() - res.mean.double()) ** 2).reshape(SHAPE[0], -1).mean(1)
    else:
        expected = _normal_log_prob(res.prev_sample, res.mean, torch.full_like(res.mean, std))
    torch.testing.assert_close(res.log_prob.double(), expected, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("kind", ["cps", "cps_gaussian"])
def test_cps_onto_zero_sigma_is_deterministic_with_zero_log_prob(kind):
    v, x, eps = _inputs(2)
    res = sde_step(v, x, 0.02, 0.0, noise_level=0.5, kind=kind, noise=eps)
    assert float(res.std) == 0.0 and float(res.kl_std) == 0.0
    assert torch.equal(res.log_prob, torch.zeros(SHAPE[0]))
    torch.testing.assert_close(res.prev_sample, x - 0.02 * v)


def _qwen_scheduler(num_steps: int, image_seq_len: int):
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift as diffusers_shift

    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256,
        max_image_seq_len=8192, shift=1.0, shift_terminal=0.02, time_shift_type="exponential",
    )
    mu = diffusers_shift(image_seq_len, 256, 8192, 0.5, 0.9)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
    return scheduler


def test_ode_step_equals_diffusers_euler_step():
    scheduler = _qwen_scheduler(num_steps=6, image_seq_len=64)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(SHAPE, generator=g)
    for i, t in enumerate(scheduler.timesteps):
        v = torch.randn(SHAPE, generator=g)
        sigma, sigma_next = scheduler.sigmas[i], scheduler.sigmas[i + 1]
        ours = sde_step(v, x, sigma, sigma_next, noise_level=0.0, kind="ode")
        theirs = scheduler.step(v, t, x).prev_sample
        assert torch.equal(ours.prev_sample, theirs), f"step {i}"
        assert torch.equal(ours.log_prob, torch.zeros(SHAPE[0])) and float(ours.std) == 0.0
        x = theirs


def test_prev_sample_is_scored_not_drawn_and_gradients_reach_the_mean_only():
    v, x, eps = _inputs(4)
    drawn = sde_step(v, x, 0.6, 0.5, noise_level=0.8, noise=eps)
    v_param = v.clone().requires_grad_(True)
    target = drawn.prev_sample.clone().requires_grad_(True)
    scored = sde_step(v_param, x, 0.6, 0.5, noise_level=0.8, prev_sample=target)
    assert torch.equal(scored.log_prob.detach(), drawn.log_prob)
    assert torch.equal(scored.prev_sample, drawn.prev_sample)
    scored.log_prob.sum().backward()
    assert v_param.grad is not None and v_param.grad.abs().sum() > 0
    assert target.grad is None


def test_per_sample_sigmas_equal_separate_scalar_calls():
    v, x, eps = _inputs(6)
    sigmas, sigmas_next = torch.tensor([0.9, 0.5, 0.2]), torch.tensor([0.8, 0.45, 0.0])
    batched = sde_step(v, x, sigmas, sigmas_next, noise_level=0.7, noise=eps)
    assert batched.std.shape == (3, 1, 1, 1)
    for i in range(3):
        single = sde_step(v[i : i + 1], x[i : i + 1], float(sigmas[i]), float(sigmas_next[i]), noise_level=0.7,
                          noise=eps[i : i + 1])
        torch.testing.assert_close(batched.prev_sample[i : i + 1], single.prev_sample, atol=0, rtol=0)
        torch.testing.assert_close(batched.log_prob[i : i + 1], single.log_prob, atol=1e-6, rtol=0)


def test_bf16_inputs_are_upcast_to_float32():
    v, x, eps = _inputs(7)
    res = sde_step(v.bfloat16(), x.bfloat16(), 0.6, 0.5, noise_level=0.7, noise=eps)
    ref = sde_step(v.bfloat16().float(), x.bfloat16().float(), 0.6, 0.5, noise_level=0.7, noise=eps)
    assert res.log_prob.dtype == torch.float32 and torch.equal(res.log_prob, ref.log_prob)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(kind="sdee", noise_level=0.7), "sdee"),
        (dict(kind="sde", noise_level=0.0), "noise_level"),
        (dict(kind="cps", noise_level=0.5), "noise has shape None"),
        (dict(kind="sde", noise_level=0.7, noise=torch.zeros(2)), "noise has shape"),
    ],
)
def test_invalid_arguments_raise_value_error(kwargs, match):
    v, x, _ = _inputs()
    with pytest.raises(ValueError, match=match):
        sde_step(v, x, 0.6, 0.5, **kwargs)


def test_step_kind_parse_accepts_enum_and_string():
    assert StepKind.parse("cps") is StepKind.CPS and StepKind.parse(StepKind.ODE) is StepKind.ODE
    assert StepKind.parse("cps_gaussian") is StepKind.CPS_GAUSSIAN


def test_splitmix64_matches_the_published_reference_output():
    # First output of splitmix64 from state 0 (Vigna's reference implementation).
    assert _splitmix64(0) == 0xE220A8397B1DCDAF


def test_noise_seed_is_63_bit_and_distinct_over_seeds_and_steps():
    values = {noise_seed(seed, step) for seed in range(50) for step in range(-1, 20)}
    assert len(values) == 50 * 21
    assert all(0 <= value < 2**63 for value in values)
    assert noise_seed(7, 3) == noise_seed(7, 3)
    with pytest.raises(ValueError, match="step=-2"):
        noise_seed(1, -2)
    with pytest.raises(ValueError, match="seed=-1"):
        noise_seed(-1, 0)


def test_noise_is_reproducible_and_independent_of_batch_composition():
    shape = (4, 8, 8)
    batch = initial_noise([5, 6, 7, 8], shape)
    assert batch.shape == (4, *shape) and batch.dtype == torch.float32
    assert torch.equal(initial_noise([7], shape)[0], batch[2])
    assert torch.equal(initial_noise([8, 5], shape), batch[[3, 0]])
    assert torch.equal(initial_noise([5, 6, 7, 8], shape), batch)
    steps = step_noise([6, 5], 3, shape)
    assert torch.equal(steps[1], step_noise([9, 5], 3, shape)[1])
    assert not torch.equal(steps[1], step_noise([5], 4, shape)[0])
    assert not torch.equal(steps[1], batch[0])
    assert torch.equal(initial_noise([5], shape, dtype=torch.bfloat16)[0], batch[0].bfloat16())
    assert INITIAL_NOISE_STEP == -1
    with pytest.raises(ValueError, match="step=-1"):
        step_noise([1], -1, shape)
