"""Flow-GRPO math as pure tensor functions (torch only; no diffusers, ray or torch.distributed).

- step:       sde_step (kinds "sde", "cps", "cps_gaussian", "ode") -> StepResult with the log-prob
- noise:      per-sample seeded noise, so trajectories are pure functions of their seeds
- schedule:   Qwen-Image's sigma schedule (equal to diffusers' FlowMatchEulerDiscreteScheduler)
- advantages: group-relative advantages with the zero-std mask
- loss:       PPO-clip policy loss plus flow_grpo's KL to a reference
- window:     which steps get noise
- rollout:    step-level batched denoising in slots (RolloutSlots, denoise), seeded resumable
              rollouts and training-time log-prob recomputation
"""

from .advantages import Advantages, group_advantages
from .loss import PolicyLoss, gaussian_mean_kl, policy_loss
from .noise import INITIAL_NOISE_STEP, initial_noise, noise_seed, step_noise
from .rollout import (RolloutHistory, RolloutSlots, RolloutState, SlotVelocityFn, Trajectory, VelocityFn, denoise,
                      noise_plan, recompute_log_probs, rollout)
from .schedule import calculate_shift, sigma_schedule
from .step import StepKind, StepResult, cps_log_prob, gaussian_log_prob, sde_step
from .window import SdeWindow, sde_window_steps

__all__ = [
    "INITIAL_NOISE_STEP",
    "Advantages",
    "PolicyLoss",
    "RolloutHistory",
    "RolloutSlots",
    "RolloutState",
    "SdeWindow",
    "SlotVelocityFn",
    "StepKind",
    "StepResult",
    "Trajectory",
    "VelocityFn",
    "calculate_shift",
    "cps_log_prob",
    "denoise",
    "gaussian_log_prob",
    "gaussian_mean_kl",
    "group_advantages",
    "initial_noise",
    "noise_plan",
    "noise_seed",
    "policy_loss",
    "recompute_log_probs",
    "rollout",
    "sde_step",
    "sde_window_steps",
    "sigma_schedule",
    "step_noise",
]
