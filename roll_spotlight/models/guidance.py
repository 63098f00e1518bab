"""Qwen-Image's "true" classifier-free guidance: a second forward on the negative prompt.

With scale w > 1, the guided prediction is diffusers' `QwenImagePipeline` formula

    comb   = v_neg + w * (v_cond - v_neg)
    guided = comb * (|v_cond| / |comb|)          (norms over the channel axis of each token)

i.e. the extrapolated direction rescaled per token to the conditional prediction's norm. flow_grpo
trains on the same guided velocity (its `compute_log_prob`), so the rollout's log-probs and the
training recompute see one policy. w == 1 is no guidance (one forward).

`check_guidance` imports no torch, so run configs can validate the sampling section with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def check_guidance(scale: float, negative_prompt: str | None) -> float:
    """The validated scale; ValueError naming `sampling.guidance_scale` / `sampling.negative_prompt`."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale >= 1.0:
        raise ValueError(f"sampling.guidance_scale must be a number >= 1 (1 = no guidance), got {scale!r}")
    if scale > 1.0 and negative_prompt is None:
        raise ValueError(f"sampling.negative_prompt must be a string when sampling.guidance_scale={scale} > 1 "
                         "(true CFG runs the transformer on it; flow_grpo uses ' ')")
    if negative_prompt is not None and not isinstance(negative_prompt, str):
        raise ValueError(f"sampling.negative_prompt must be a string or null, got {negative_prompt!r}")
    return float(scale)


def true_cfg(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Guided prediction from conditional and negative-prompt predictions (B, N, C)."""
    import torch

    comb = uncond + scale * (cond - uncond)
    cond_norm = torch.linalg.vector_norm(cond, dim=-1, keepdim=True)
    comb_norm = torch.linalg.vector_norm(comb, dim=-1, keepdim=True)
    return comb * (cond_norm / comb_norm.clamp_min(torch.finfo(comb.dtype).tiny))
