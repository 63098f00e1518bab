"""Group-relative advantages (GRPO): each reward against the mean of its own prompt's group.

    A_i = clip((r_i - mean_{g(i)}) / (std + eps), -clip, +clip)

`std` is the population std of the sample's group ("group") or of the whole batch ("global").
A group whose rewards are all equal carries no learning signal (docs/design.md section 4): its advantages are
exactly 0 (not a rounding residue of r - mean), `zero_std_mask` flags its samples so the trainer can
drop them, and `zero_std_ratio` reports the fraction of such groups. Equality is tested exactly
(max == min), so a tiny float std never hides a degenerate group, nor invents one.
Computed in float32 (rewards are upcast once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

_STD_MODES = ("group", "global")


@dataclass(frozen=True)
class Advantages:
    """values, zero_std_mask, group_std: (N,) per sample; group_std is the std of the sample's group."""

    values: torch.Tensor
    zero_std_mask: torch.Tensor
    zero_std_ratio: float
    group_std: torch.Tensor


def _validate(rewards: torch.Tensor, group_index: torch.Tensor, std_mode: str, eps: float, clip: float):
    if std_mode not in _STD_MODES:
        raise ValueError(f"std_mode={std_mode!r} is not one of {_STD_MODES}")
    if not eps >= 0:
        raise ValueError(f"eps={eps} must be >= 0")
    if not clip > 0:
        raise ValueError(f"clip={clip} must be > 0")
    if rewards.dim() != 1 or rewards.shape != group_index.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_index.shape)} must be one 1-D shape"
        )
    if rewards.numel() == 0:
        raise ValueError("rewards must not be empty")
    if not torch.isfinite(rewards).all():
        bad = torch.nonzero(~torch.isfinite(rewards)).flatten().tolist()
        raise ValueError(f"rewards contain NaN or inf at indices {bad}; sanitize them first")


def _per_group(values: torch.Tensor, index: torch.Tensor, num_groups: int, reduce: str) -> torch.Tensor:
    out = values.new_zeros(num_groups)
    return out.scatter_reduce(0, index, values, reduce=reduce, include_self=False)


def group_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: torch.Tensor | Sequence[int],
    *,
    std_mode: str = "group",
    eps: float = 1e-4,
    clip: float = 5.0,
) -> Advantages:
    """Advantages for N samples; `group_ids` (N,) says which prompt group each reward belongs to."""
    r = torch.as_tensor(rewards).to(torch.float32)
    ids = torch.as_tensor(group_ids)
    _validate(r, ids, std_mode, eps, clip)
    _, index = torch.unique(ids, return_inverse=True)
    num_groups = int(index.max()) + 1
    mean = _per_group(r, index, num_groups, "mean")[index]
    group_std = _per_group((r - mean) ** 2, index, num_groups, "mean").sqrt()[index]
    zero_std = _per_group(r, index, num_groups, "amax") == _per_group(r, index, num_groups, "amin")
    std = group_std if std_mode == "group" else r.std(correction=0).expand_as(r)
    values = ((r - mean) / (std + eps)).clamp(-clip, clip)
    values = torch.where(zero_std[index], torch.zeros_like(values), values)
    ratio = float(zero_std.float().mean())
    return Advantages(values=values, zero_std_mask=zero_std[index], zero_std_ratio=ratio, group_std=group_std)
