"""The sigma schedule Qwen-Image samples with, rebuilt without diffusers.

It reproduces what ``QwenImagePipeline`` obtains from ``FlowMatchEulerDiscreteScheduler`` configured
with Qwen-Image's published scheduler config and ``set_timesteps(sigmas=linspace(1, 1/N, N), mu=...)``:

    t_i      = linspace(1, 1/N, N)
    shifted  = e^mu / (e^mu + (1/t - 1))          (dynamic "exponential" shift; mu from the image size)
    stretched: 1 - s scaled so that the last sigma equals `shift_terminal` (0.02)
    sigmas   = [stretched..., 0.0]                 (N + 1 values, sigmas[0] == 1.0 exactly)

Computed in float64, returned as float32 (diffusers computes in float32; the two agree to ~1e-7).
Keeping our own copy lets the core run without importing diffusers, and the test pins it to diffusers.
"""

from __future__ import annotations

import math

import torch

_TIME_SHIFT_TYPES = ("exponential", "linear")


def calculate_shift(
    image_seq_len: int,
    base_seq_len: int = 256,
    max_seq_len: int = 8192,
    base_shift: float = 0.5,
    max_shift: float = 0.9,
) -> float:
    """mu: linear in the number of image tokens, base_shift at base_seq_len, max_shift at max_seq_len.

    Defaults are Qwen-Image's scheduler config (diffusers' own function defaults differ: 4096 / 1.15).
    """
    if max_seq_len == base_seq_len:
        raise ValueError(f"max_seq_len={max_seq_len} must differ from base_seq_len={base_seq_len}")
    slope = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * slope + (base_shift - slope * base_seq_len)


def _time_shift(t: torch.Tensor, mu: float, time_shift_type: str) -> torch.Tensor:
    if time_shift_type == "exponential":
        return math.exp(mu) / (math.exp(mu) + (1.0 / t - 1.0))
    if time_shift_type == "linear":
        return mu / (mu + (1.0 / t - 1.0))
    raise ValueError(f"time_shift_type={time_shift_type!r} is not one of {_TIME_SHIFT_TYPES}")


def shift_sigmas(t: torch.Tensor, image_seq_len: int) -> torch.Tensor:
    """Qwen-Image's resolution shift applied to raw times `t` in (0, 1] (no terminal stretch):
    `shift_sigmas(u, n)` for u uniform draws sigmas at the density the sampler visits them."""
    return _time_shift(t, calculate_shift(image_seq_len), "exponential")


def _stretch_to_terminal(sigmas: torch.Tensor, shift_terminal: float) -> torch.Tensor:
    one_minus = 1.0 - sigmas
    scale = one_minus[-1] / (1.0 - shift_terminal)
    return 1.0 - one_minus / scale


def sigma_schedule(
    num_steps: int,
    image_seq_len: int,
    *,
    shift_terminal: float | None = 0.02,
    use_dynamic_shifting: bool = True,
    base_shift: float = 0.5,
    max_shift: float = 0.9,
    base_seq_len: int = 256,
    max_seq_len: int = 8192,
    shift: float = 1.0,
    time_shift_type: str = "exponential",
) -> torch.Tensor:
    """float32 sigmas of length num_steps + 1, from 1.0 down to shift_terminal, then 0.0.

    `image_seq_len` is the packed token count (latent H/2 * W/2; 1024 for 512x512 Qwen-Image).
    """
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps} must be >= 1")
    if shift_terminal and num_steps < 2:
        raise ValueError(f"num_steps={num_steps} must be >= 2 when shift_terminal={shift_terminal} is set")
    if time_shift_type not in _TIME_SHIFT_TYPES:
        raise ValueError(f"time_shift_type={time_shift_type!r} is not one of {_TIME_SHIFT_TYPES}")
    if shift_terminal is not None and not 0.0 <= shift_terminal < 1.0:
        raise ValueError(f"shift_terminal={shift_terminal} must be in [0, 1)")
    t = torch.linspace(1.0, 1.0 / num_steps, num_steps, dtype=torch.float64)
    if use_dynamic_shifting:
        mu = calculate_shift(image_seq_len, base_seq_len, max_seq_len, base_shift, max_shift)
        sigmas = _time_shift(t, mu, time_shift_type)
    else:
        sigmas = shift * t / (1.0 + (shift - 1.0) * t)
    if shift_terminal:
        sigmas = _stretch_to_terminal(sigmas, shift_terminal)
    return torch.cat([sigmas, sigmas.new_zeros(1)]).to(torch.float32)
