"""Seeded, resumable denoising loop run by persistent SP workers (torch only; no Ray, no dist).

A rollout is a pure function of (weights, request, seed): the initial latent comes from
``initial_noise(seed)`` and the SDE noise of step ``k`` from ``step_noise(seed, k)``, so the state
at any step boundary (step index + full latent) is enough to resume on another group of any SP
degree and end with the same latent as an uninterrupted run.

The noise comes from ``roll_spotlight.flow_grpo.noise``, the scheme every rollout of the project uses.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch

from roll_spotlight.flow_grpo.noise import initial_noise, step_noise

__all__ = [
    "RolloutRequest",
    "SPRolloutState",
    "denoise",
    "initial_noise",
    "sde_step",
    "start_state",
    "step_noise",
]


# Seeds determine trajectories with the project's one noise scheme (per-sample CPU generators
# seeded from a mix of (seed, step)), shared with the Flow-GRPO rollouts.
_initial, _step = initial_noise, step_noise


@dataclass(frozen=True)
class RolloutRequest:
    """One image to denoise: packed-latent grid ``(h, w)`` tokens of ``channels`` each."""

    request_id: str
    seed: int
    prompt_embeds: np.ndarray  # (T, joint_attention_dim)
    prompt_mask: np.ndarray  # (T,) 1 = valid, 0 = pad
    grid: tuple[int, int]
    channels: int
    num_steps: int
    noise_level: float = 0.7

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError(f"num_steps={self.num_steps} must be >= 1")
        if min(self.grid) < 1 or self.channels < 1:
            raise ValueError(f"grid={self.grid} and channels={self.channels} must be positive")
        if self.prompt_embeds.ndim != 2 or self.prompt_mask.shape != self.prompt_embeds.shape[:1]:
            raise ValueError(
                f"prompt_embeds {self.prompt_embeds.shape} must be (T, D) and prompt_mask "
                f"{self.prompt_mask.shape} must be (T,)"
            )
        if not 0.0 <= self.noise_level:
            raise ValueError(f"noise_level={self.noise_level} must be >= 0")

    @property
    def sigmas(self) -> np.ndarray:
        """Linear flow-matching schedule from 1 (noise) to 0 (data), float64."""
        return np.linspace(1.0, 0.0, self.num_steps + 1)


@dataclass(frozen=True)
class SPRolloutState:
    """Committed state at a step boundary: the full packed latent before step ``step``."""

    request_id: str
    seed: int
    step: int
    latent: np.ndarray  # (h*w, channels) float32


def start_state(request: RolloutRequest) -> SPRolloutState:
    shape = (request.grid[0] * request.grid[1], request.channels)
    latent = _initial([request.seed], shape)[0].numpy()
    return SPRolloutState(request.request_id, request.seed, 0, latent)


def sde_step(latent: torch.Tensor, velocity: torch.Tensor, sigma: float, sigma_next: float,
             eps: torch.Tensor, noise_level: float) -> torch.Tensor:
    """Euler step of the flow ODE plus ``noise_level * sqrt(-dt)`` Gaussian noise (not on the last
    step, which lands on data). A stand-in for the Flow-GRPO SDE step; the resume logic only needs
    it to be deterministic given ``eps``."""
    dt = sigma_next - sigma
    nxt = latent + velocity * dt
    if sigma_next > 0.0 and noise_level > 0.0:
        nxt = nxt + noise_level * (-dt) ** 0.5 * eps
    return nxt


def _velocity(model: torch.nn.Module, request: RolloutRequest, latent: torch.Tensor, sigma: float) -> torch.Tensor:
    out = model(
        hidden_states=latent[None],
        encoder_hidden_states=torch.tensor(request.prompt_embeds)[None].to(latent),
        encoder_hidden_states_mask=torch.tensor(request.prompt_mask)[None].long().to(latent.device),
        timestep=torch.tensor([sigma], dtype=latent.dtype, device=latent.device),
        img_shapes=[[(1, *request.grid)]],
        return_dict=False,
    )[0]
    return out[0]


@torch.no_grad()
def denoise(model: torch.nn.Module, request: RolloutRequest, state: SPRolloutState, until_step: int) -> SPRolloutState:
    """Run steps ``state.step .. until_step-1``; every SP rank calls this with identical arguments
    and gets the identical full latent back (the model gathers its output)."""
    assert state.request_id == request.request_id and 0 <= state.step <= until_step <= request.num_steps
    sigmas = request.sigmas
    device = next(model.parameters()).device
    latent = torch.tensor(state.latent, device=device)  # copies: Ray hands out read-only arrays
    for step in range(state.step, until_step):
        velocity = _velocity(model, request, latent, float(sigmas[step]))
        eps = _step([request.seed], step, tuple(latent.shape), device=device)[0]
        latent = sde_step(latent, velocity, float(sigmas[step]), float(sigmas[step + 1]), eps, request.noise_level)
    return replace(state, step=until_step, latent=latent.cpu().numpy())
