"""Flow-GRPO policy loss for one denoising step: PPO clip on the step's transition ratio, plus KL.

    ratio = exp(logp - logp_old)
    policy_loss = mean_b max(-A ratio, -A clamp(ratio, 1 - c, 1 + c))
    kl = mean_b [ mean_dims (mean - ref_mean)^2 / (2 kl_std^2) ]
    loss = policy_loss + kl_beta kl

The clip range is tiny (1e-4 typical) because one step's log-density moves a lot per update. The
KL is flow_grpo's, so that its users' kl_beta carries over: `std` is the step's `kl_std`
(step.py), flow_grpo's std_dev_t. For "cps" that makes it the exact KL between the policy's and the
reference's transition Gaussians (they share std, which depends on the schedule only); for "sde"
std_dev_t leaves out the transition's sqrt(-dt), so the term is the exact KL times |dt| (a sixth to
a fiftieth of it on a 10-step Qwen-Image schedule). Diagnostics (clip_fraction, ratio_mean,
approx_kl = 0.5 mean (logp - logp_old)^2) are detached floats-as-tensors.
Computed in float32, upcast once: logp - logp_old is a difference of two large, nearly equal
numbers; in bf16 it would round to a multiple of the ratio's whole clip range.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PolicyLoss:
    """loss is the scalar to backpropagate; the rest are 0-d tensors for logging."""

    loss: torch.Tensor
    policy_loss: torch.Tensor
    kl: torch.Tensor
    clip_fraction: torch.Tensor
    ratio_mean: torch.Tensor
    approx_kl: torch.Tensor


def gaussian_mean_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """flow_grpo's KL term: mean_dims (mean - ref_mean)^2 / (2 std^2) per sample, then over the batch.

    `std` is 0-d or (B, 1, ..., 1): pass the step's `kl_std`. With a given std this is
    KL(N(mean, std^2) || N(ref_mean, std^2)) averaged over dims. A sample with std == 0 (a
    deterministic step, e.g. "cps" onto sigma 0) contributes 0: flow_grpo's formula divides by zero
    there, and its scripts never train that step.
    """
    mean, ref_mean, std = mean.float(), ref_mean.detach().float(), std.detach().float()
    squared = ((mean - ref_mean) ** 2).reshape(mean.shape[0], -1).mean(dim=1)
    std = std.reshape(-1)  # (1,) or (B,)
    positive = std > 0
    twice_var = 2.0 * torch.where(positive, std, torch.ones_like(std)) ** 2
    per_sample = torch.where(positive, squared / twice_var, torch.zeros_like(squared))
    return per_sample.mean()


def _check_shapes(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor) -> None:
    if log_prob.dim() != 1 or log_prob.shape != old_log_prob.shape or log_prob.shape != advantages.shape:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)}, old_log_prob {tuple(old_log_prob.shape)} and advantages "
            f"{tuple(advantages.shape)} must all be the same (B,) shape"
        )


def _kl_term(kl_beta: float, mean, ref_mean, std, like: torch.Tensor) -> torch.Tensor:
    if kl_beta == 0:
        return like.new_zeros(())
    if mean is None or ref_mean is None or std is None:
        raise ValueError(f"kl_beta={kl_beta} needs mean, ref_mean and std")
    return gaussian_mean_kl(mean, ref_mean, std)


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_range: float = 1e-4,
    kl_beta: float = 0.0,
    mean: torch.Tensor | None = None,
    ref_mean: torch.Tensor | None = None,
    std: torch.Tensor | None = None,
) -> PolicyLoss:
    """The loss of one step for a batch; old_log_prob and advantages are treated as constants."""
    if not clip_range > 0:
        raise ValueError(f"clip_range={clip_range} must be > 0")
    if not kl_beta >= 0:
        raise ValueError(f"kl_beta={kl_beta} must be >= 0")
    _check_shapes(log_prob, old_log_prob, advantages)
    log_ratio = log_prob.float() - old_log_prob.detach().float()
    adv = advantages.detach().float()
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    surrogate = torch.maximum(unclipped, clipped).mean()
    kl = _kl_term(kl_beta, mean, ref_mean, std, surrogate)
    with torch.no_grad():
        clip_fraction = ((ratio - 1.0).abs() > clip_range).float().mean()
        approx_kl = 0.5 * (log_ratio * log_ratio).mean()
    return PolicyLoss(
        loss=surrogate + kl_beta * kl,
        policy_loss=surrogate.detach(),
        kl=kl.detach(),
        clip_fraction=clip_fraction,
        ratio_mean=ratio.detach().mean(),
        approx_kl=approx_kl,
    )
