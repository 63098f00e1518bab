"""Seeded rollouts of a DiT policy: the bridge between a model and the Flow-GRPO math.

A rollout is a pure function of (weights, prompt, seed, schedule): the initial noise comes from the
seed and the noise of step k from a mix of (seed, k) (see `roll_spotlight.flow_grpo.noise`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from roll_spotlight.flow_grpo import SdeWindow, Trajectory, rollout, sigma_schedule
from roll_spotlight.config.run import SamplingConfig


@dataclass(frozen=True)
class RolloutSpec:
    """Everything besides weights, prompt and seed that fixes a trajectory."""

    num_steps: int
    noise_level: float
    kind: str
    window: tuple[int, int] | None

    def sde_window(self) -> SdeWindow | None:
        return None if self.window is None else SdeWindow(*self.window)


def choose_window(cfg: SamplingConfig, *, seed: int, iteration: int) -> tuple[int, int] | None:
    """The noised steps of one iteration (shared by all its rollouts, as in Flow-GRPO)."""
    if cfg.sde_window in (0, cfg.num_steps):
        return None
    lo, hi = cfg.window_range
    start = int(np.random.default_rng([seed, iteration, 0x3D]).integers(lo, hi + 1))
    return (start, start + cfg.sde_window)


def train_spec(cfg: SamplingConfig, window: tuple[int, int] | None) -> RolloutSpec:
    return RolloutSpec(cfg.num_steps, cfg.noise_level, cfg.kind, window)


def eval_spec(cfg: SamplingConfig) -> RolloutSpec:
    """Validation samples deterministically (ODE), so a (prompt, seed) pair has one image."""
    return RolloutSpec(cfg.eval_num_steps, cfg.noise_level, "ode", None)


def sigmas_for(policy, spec: RolloutSpec) -> torch.Tensor:
    return sigma_schedule(spec.num_steps, policy.image_seq_len)


@torch.no_grad()
def generate(policy, prompts: Sequence[str], seeds: Sequence[int], spec: RolloutSpec,
             *, keep_latents: bool = True) -> Trajectory:
    """Run seeded rollouts for `prompts`/`seeds` (same length) under `spec`."""
    if len(prompts) != len(seeds):
        raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
    cond = policy.encode_prompts(list(prompts))

    def velocity_fn(latents: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return policy.velocity(latents, sigma, cond)

    kind = "sde" if spec.kind == "ode" else spec.kind
    window = SdeWindow(0, 0) if spec.kind == "ode" else spec.sde_window()
    return rollout(velocity_fn, list(seeds), sigmas_for(policy, spec), policy.latent_shape,
                   noise_level=spec.noise_level, kind=kind, window=window, keep_latents=keep_latents)


def to_uint8_images(policy, latents: torch.Tensor) -> np.ndarray:
    """Decode final latents to (B, H, W, 3) uint8, the format every reward accepts."""
    with torch.no_grad():
        images = policy.decode(latents).clamp(0, 1)
    return (images.permute(0, 2, 3, 1).float().cpu().numpy() * 255.0).round().astype(np.uint8)


def generate_in_chunks(policy, prompts, seeds, spec, chunk: int = 64) -> np.ndarray:
    """Final images only, in chunks (validation sets are larger than a training batch)."""
    out = []
    for lo in range(0, len(prompts), chunk):
        traj = generate(policy, prompts[lo:lo + chunk], seeds[lo:lo + chunk], spec, keep_latents=False)
        out.append(to_uint8_images(policy, traj.final))
    return np.concatenate(out, axis=0)
