"""Seeded noise: the initial latent and every SDE step's draw are pure functions of (seed, step).

Why: a rollout must be resumable on another worker, in another batch, bit for bit (docs/design.md section 4,
"Seeds determine trajectories"). So no noise ever comes from a shared or batch-wide generator: each
sample draws from its own CPU ``torch.Generator`` seeded with ``noise_seed(seed, step)``, always in
float32, and only then moves to the target device and dtype. The CPU generator makes the stream
independent of the device; drawing per sample makes it independent of the batch composition.

Invariant: ``noise_seed`` is a fixed function (splitmix64 finaliser over the seed, then over the
step); changing it changes every trajectory ever recorded, so treat it as a file format.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_MASK64 = (1 << 64) - 1
INITIAL_NOISE_STEP = -1
"""The `step` under which the initial noise x_0 is drawn; denoising steps use 0..T-1."""


def _splitmix64(value: int) -> int:
    """One splitmix64 output for state `value` (Steele, Lea, Flood 2014); a bijection on 64 bits."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def noise_seed(seed: int, step: int) -> int:
    """The 63-bit generator seed for sample `seed` at denoising `step` (-1: the initial noise).

    63 bits keep the value a non-negative int64, which every torch generator accepts.
    """
    if not 0 <= seed <= _MASK64:
        raise ValueError(f"seed={seed} must be an integer in [0, 2**64)")
    if step < INITIAL_NOISE_STEP:
        raise ValueError(f"step={step} must be >= {INITIAL_NOISE_STEP}")
    return _splitmix64(_splitmix64(seed) ^ (step & _MASK64)) >> 1


def _draw(seeds: Sequence[int], steps: Sequence[int | None], shape: tuple[int, ...], device, dtype) -> torch.Tensor:
    if len(seeds) == 0:
        raise ValueError("seeds must not be empty")
    generator = torch.Generator(device="cpu")
    draws = torch.zeros((len(seeds), *shape), dtype=torch.float32)
    for row, (seed, step) in enumerate(zip(seeds, steps, strict=True)):
        if step is not None:
            generator.manual_seed(noise_seed(int(seed), step))
            torch.randn(tuple(shape), generator=generator, dtype=torch.float32, out=draws[row])
    return to_device(draws, device, dtype)


def to_device(host: torch.Tensor, device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A host tensor onto ``device`` without making the host wait: through pinned memory to a GPU."""
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        return host.pin_memory().to(device=device, dtype=dtype, non_blocking=True)
    return host.to(device=device, dtype=dtype)


def initial_noise(
    seeds: Sequence[int],
    shape: tuple[int, ...],
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """x_0 for each seed: a (len(seeds), *shape) standard normal tensor."""
    return _draw(seeds, [INITIAL_NOISE_STEP] * len(seeds), shape, device, dtype)


def step_noise(
    seeds: Sequence[int],
    step: int | Sequence[int | None],
    shape: tuple[int, ...],
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The standard normal draw of denoising `step` (0-based) for each seed, (len(seeds), *shape);
    `step` a sequence: each row's own step (rows of a step-level batch stand at different steps),
    None for a row that draws nothing (zeros: an ODE step)."""
    steps = [step] * len(seeds) if isinstance(step, int) else list(step)
    if any(k is not None and k < 0 for k in steps):
        raise ValueError(f"step={step} must be >= 0 (the initial noise has its own function)")
    return _draw(seeds, steps, shape, device, dtype)
