"""One denoising transition x_t -> x_{t+1} of Flow-GRPO, with the log-probability of the sample drawn.

The formulas are flow_grpo's `sde_step_with_logprob` (docs/design.md section 4 writes them out;
tests/test_flow_grpo_reference.py checks every kind against independent transcriptions): "sde"
(the reverse SDE, Gaussian log-density), "cps" (coefficients-preserving sampling, flow_grpo's score
-(x' - mean)^2, not a density), "cps_gaussian" (the "cps" transition with its exact Gaussian
log-density: comparable across kinds, but its PPO ratio is not flow_grpo's), "ode" (Euler, std 0).
Log-probs are averaged over the non-batch dims; a Gaussian kind with std 0 has log_prob 0 (never
train on it). `kl_std` is what flow_grpo divides the KL by: std_t for "sde" (without sqrt(-dt)),
the transition std for the "cps" kinds.

Everything runs in float32, upcast once: the log-density subtracts nearly equal numbers and
divides by std^2, and in bf16 the PPO ratio (clip range 1e-4) would be rounding noise. The
latent-sized work is plain +, -, *, / and per-row coefficients come from the sigma tensors, so a
sample's result does not depend on its batch mates (shared or per-row sigmas alike).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch


_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class StepKind(str, enum.Enum):
    SDE = "sde"
    CPS = "cps"
    CPS_GAUSSIAN = "cps_gaussian"
    ODE = "ode"

    @classmethod
    def parse(cls, kind: str | StepKind) -> StepKind:
        try:
            return cls(kind)
        except ValueError:
            known = [k.value for k in cls]
            raise ValueError(f"kind={kind!r} is not one of {known}") from None


@dataclass(frozen=True)
class StepResult:
    """prev_sample (B, ...), log_prob (B,), mean (B, ...); std, the transition's, and kl_std, the one
    the KL divides by (module docstring), are 0-d or (B, 1, ..., 1); all float32."""

    prev_sample: torch.Tensor
    log_prob: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    kl_std: torch.Tensor


def _as_sigma(sigma: float | torch.Tensor, sample: torch.Tensor, name: str) -> torch.Tensor:
    """A float32 sigma on sample's device: 0-d when shared, (B, 1, ..., 1) when per sample."""
    value = torch.as_tensor(sigma, dtype=torch.float32, device=sample.device)
    if value.dim() == 0:
        return value
    if value.shape != (sample.shape[0],):
        raise ValueError(f"{name} has shape {tuple(value.shape)}; expected () or ({sample.shape[0]},)")
    return value.view(-1, *([1] * (sample.dim() - 1)))


def _sde_moments(x, v, sigma, sigma_next, a: float):
    """(mean, transition std, kl std)."""
    dt = sigma_next - sigma
    std_t = a * torch.sqrt(sigma / (1.0 - torch.where(sigma == 1.0, sigma_next, sigma)))
    var_t = std_t * std_t
    coef_x = 1.0 + var_t / (2.0 * sigma) * dt
    coef_v = (1.0 + var_t * (1.0 - sigma) / (2.0 * sigma)) * dt
    return x * coef_x + v * coef_v, std_t * torch.sqrt(-dt), std_t


def _cps_moments(x, v, sigma, sigma_next, a: float):
    std = sigma_next * math.sin(a * math.pi / 2.0)
    x0 = x - v * sigma
    eps_hat = x + v * (1.0 - sigma)
    coef_eps = torch.sqrt(torch.clamp(sigma_next * sigma_next - std * std, min=0.0))
    return x0 * (1.0 - sigma_next) + eps_hat * coef_eps, std, std


def _ode_moments(x, v, sigma, sigma_next, a: float):
    dt = sigma_next - sigma
    return x + v * dt, torch.zeros_like(dt), torch.zeros_like(dt)


_MOMENTS = {
    StepKind.SDE: _sde_moments,
    StepKind.CPS: _cps_moments,
    StepKind.CPS_GAUSSIAN: _cps_moments,
    StepKind.ODE: _ode_moments,
}


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """log N(x; mean, std^2) averaged over non-batch dims, (B,); zeros where std == 0."""
    positive = std > 0
    safe_std = torch.where(positive, std, torch.ones_like(std))
    density = -((x - mean) ** 2) / (2.0 * safe_std * safe_std) - torch.log(safe_std) - _LOG_SQRT_2PI
    density = torch.where(positive, density, torch.zeros_like(density))
    return density.reshape(density.shape[0], -1).mean(dim=1)


def cps_log_prob(x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """flow_grpo's CPS score -(x - mean)^2 averaged over non-batch dims, (B,): the Gaussian
    log-density without its constants and without the 1/(2 std^2) factor."""
    score = -((x - mean) ** 2)
    return score.reshape(score.shape[0], -1).mean(dim=1)


def _log_prob(kind: StepKind, x_next, mean, std) -> torch.Tensor:
    if kind is StepKind.CPS:
        return cps_log_prob(x_next, mean)
    return gaussian_log_prob(x_next, mean, std)


def sde_step(
    velocity: torch.Tensor,
    sample: torch.Tensor,
    sigma: float | torch.Tensor,
    sigma_next: float | torch.Tensor,
    *,
    noise_level: float,
    kind: str | StepKind = "sde",
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    noised: torch.Tensor | None = None,
) -> StepResult:
    """Take (or, with `prev_sample`, score) one transition; see the module docstring for the math.

    With `prev_sample` nothing is drawn: its log-prob under the current velocity is returned and it
    is echoed back (training recomputes log-probs this way). It is detached, so gradients reach the
    policy only through `mean`. Otherwise the standard normal draw is `noise` (a sample's own:
    `noise.step_noise(seeds, step, ...)`). sigma/sigma_next: floats, 0-d or (B,) tensors.
    `noised` (B,) bool: rows where it is False take an ODE step instead (log_prob 0, `noise` unused
    there), so rows of a step-level batch each keep their own noise plan; the others' bits are
    those of a batch of `kind` alone.
    """
    step_kind = StepKind.parse(kind)
    if step_kind is not StepKind.ODE and not noise_level > 0:
        raise ValueError(f"noise_level={noise_level} must be > 0 for kind={step_kind.value!r}")
    x = sample.to(torch.float32)
    v = velocity.to(device=x.device, dtype=torch.float32)
    if v.shape != x.shape:
        raise ValueError(f"velocity has shape {tuple(v.shape)}; expected {tuple(x.shape)}")
    s, s_next = _as_sigma(sigma, x, "sigma"), _as_sigma(sigma_next, x, "sigma_next")
    mean, std, kl_std = _MOMENTS[step_kind](x, v, s, s_next, float(noise_level))
    if noised is not None:
        mean, std, kl_std = _ode_where_not(noised, (mean, std, kl_std), x, v, s, s_next)
    if prev_sample is not None:
        if prev_sample.shape != x.shape:
            raise ValueError(f"prev_sample has shape {tuple(prev_sample.shape)}; expected {tuple(x.shape)}")
        x_next = prev_sample.detach().to(torch.float32)
    elif step_kind is StepKind.ODE:
        x_next = mean
    else:
        if noise is None or noise.shape != x.shape:
            got = None if noise is None else tuple(noise.shape)
            raise ValueError(f"noise has shape {got}; expected {tuple(x.shape)} (a draw per sample, step_noise)")
        x_next = mean + std * noise.to(device=x.device, dtype=torch.float32)
    log_prob = _log_prob(step_kind, x_next, mean, std)
    if noised is not None:
        log_prob = torch.where(noised.to(log_prob.device), log_prob, torch.zeros_like(log_prob))
    return StepResult(prev_sample=x_next, log_prob=log_prob, mean=mean, std=std, kl_std=kl_std)


def _ode_where_not(noised: torch.Tensor, moments, x, v, sigma, sigma_next):
    """(mean, std, kl_std) of `moments` on the noised rows, the ODE step's elsewhere (std 0)."""
    flag = noised.to(x.device).view(-1, *([1] * (x.dim() - 1)))
    ode = _ode_moments(x, v, sigma, sigma_next, 0.0)
    return tuple(torch.where(flag, m, o) for m, o in zip(moments, ode))
