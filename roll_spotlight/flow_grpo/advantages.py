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


def baselined_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: torch.Tensor | Sequence[int],
    baselines: torch.Tensor | Sequence[Sequence[float]],
    *,
    std_mode: str = "group",
    eps: float = 1e-4,
    clip: float = 5.0,
) -> Advantages:
    """Advantages against given per-sample baselines: A_i = clip((r_i - m_i) / (s_i + eps)).

    `baselines` (N, 2) holds each sample's (mean, std), e.g. the stale statistics of every explored
    seed of its prompt (`exploration.baseline: pool`): a group chosen for contrast is not a random
    sample of its prompt's seeds, so its own mean and std are not the on-policy ones. A row of NaN,
    or a std of 0 (no spread to scale by), means "no baseline": that sample's group gets
    `group_advantages` as usual. Every sample of a group must carry the same baseline.

    A baselined group is never zero-std: equal rewards above or below the pool's mean still say
    which way to move, so `zero_std_mask` flags only the groups left to `group_advantages` whose
    rewards are all equal; `zero_std_ratio` is the share of groups flagged, `group_std` stays the
    group's own std (a diagnostic). With no baseline given this equals `group_advantages` exactly.
    """
    r = torch.as_tensor(rewards).to(torch.float32)
    ids = torch.as_tensor(group_ids)
    base = torch.as_tensor(baselines).to(torch.float32)
    _validate(r, ids, std_mode, eps, clip)
    if base.shape != (r.shape[0], 2):
        raise ValueError(f"baselines must have shape (N, 2) = ({r.shape[0]}, 2), got {tuple(base.shape)}")
    mean_b, std_b = base[:, 0], base[:, 1]
    given = torch.isfinite(mean_b) & torch.isfinite(std_b) & (std_b > 0)
    if bool((torch.isfinite(std_b) & (std_b < 0)).any()):
        raise ValueError("baselines: a std must be >= 0")
    own = group_advantages(r, ids, std_mode=std_mode, eps=eps, clip=clip)
    _, index = torch.unique(ids, return_inverse=True)
    num_groups = int(index.max()) + 1
    some = _per_group(given.float(), index, num_groups, "amax")[index] > 0
    every = _per_group(given.float(), index, num_groups, "amin")[index] > 0
    if bool((some != every).any()):
        raise ValueError("baselines: every sample of a group must carry the same baseline (or none)")
    for stat in (mean_b, std_b):
        safe = torch.where(given, stat, torch.zeros_like(stat))
        spread = _per_group(safe, index, num_groups, "amax") - _per_group(safe, index, num_groups, "amin")
        if bool((spread[index][given] != 0).any()):
            raise ValueError("baselines: every sample of a group must carry the same baseline (or none)")
    safe_mean = torch.where(given, mean_b, torch.zeros_like(mean_b))
    safe_std = torch.where(given, std_b, torch.ones_like(std_b))
    against = ((r - safe_mean) / (safe_std + eps)).clamp(-clip, clip)
    values = torch.where(given, against, own.values)
    mask = own.zero_std_mask & ~given
    ratio = float(_per_group(mask.float(), index, num_groups, "amax").mean())
    return Advantages(values=values, zero_std_mask=mask, zero_std_ratio=ratio, group_std=own.group_std)
