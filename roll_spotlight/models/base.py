"""The policy interface every Flow-GRPO component talks to, and the prompt conditioning it carries.

Conventions (shared with `flow_grpo/`): latents are packed tokens (B, N, C); sigma runs from 1
(pure noise) to 0 (data) and x_sigma = (1 - sigma) * x_0 + sigma * noise; the velocity is
d x_sigma / d sigma = noise - x_0, returned in float32 whatever the model dtype, because the SDE
step and its log-probability are computed in float32.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from roll_spotlight.models.config import ModelConfig
from roll_spotlight.models.packing import img_shapes_for


@dataclass
class Conditioning:
    """Encoded prompts: `embeds` (B, L, D) and `mask` (B, L) long, 1 = real token, 0 = padding."""

    embeds: torch.Tensor
    mask: torch.Tensor

    def __post_init__(self) -> None:
        if self.embeds.dim() != 3 or self.mask.shape != self.embeds.shape[:2]:
            raise ValueError(
                f"Conditioning needs embeds (B, L, D) and mask (B, L), got {tuple(self.embeds.shape)} "
                f"and {tuple(self.mask.shape)}"
            )

    @property
    def batch_size(self) -> int:
        return self.embeds.shape[0]

    def index(self, idx: torch.Tensor | Sequence[int] | slice | int) -> Conditioning:
        """Rows `idx` of the batch (an int keeps the batch dimension)."""
        if isinstance(idx, int):
            idx = slice(idx, idx + 1)
        elif not isinstance(idx, slice):
            idx = torch.as_tensor(idx, dtype=torch.long, device=self.embeds.device)
        return Conditioning(self.embeds[idx], self.mask[idx])

    def repeat_interleave(self, n: int) -> Conditioning:
        """Each row repeated `n` times in place: one prompt -> its group of `n` samples."""
        return Conditioning(self.embeds.repeat_interleave(n, dim=0), self.mask.repeat_interleave(n, dim=0))

    def to(self, device: torch.device | str) -> Conditioning:
        return Conditioning(self.embeds.to(device), self.mask.to(device))

    @staticmethod
    def cat(parts: Sequence[Conditioning]) -> Conditioning:
        """Concatenate along the batch, zero-padding to the longest L (real text encoders vary L)."""
        if not parts:
            raise ValueError("Conditioning.cat needs at least one part")
        length = max(p.embeds.shape[1] for p in parts)
        embeds = [torch.nn.functional.pad(p.embeds, (0, 0, 0, length - p.embeds.shape[1])) for p in parts]
        masks = [torch.nn.functional.pad(p.mask, (0, length - p.mask.shape[1])) for p in parts]
        return Conditioning(torch.cat(embeds), torch.cat(masks))


class DiTPolicy(torch.nn.Module, abc.ABC):
    """A text-conditioned flow-matching DiT: prompts -> conditioning -> velocity, plus the latent codec.

    Subclasses call `super().__init__(cfg, transformer, latent_grid)` and implement the abstract
    methods. `velocity` is the only call on the denoising hot path, so the shapes it checks against
    are fixed here once instead of being read from configs per call.
    """

    def __init__(self, cfg: ModelConfig, transformer: torch.nn.Module, latent_grid: tuple[int, int]) -> None:
        super().__init__()
        self.cfg = cfg
        self.transformer = transformer
        self.latent_grid = latent_grid
        self.latent_shape = ((latent_grid[0] // 2) * (latent_grid[1] // 2), int(transformer.config.in_channels))
        if cfg.gradient_checkpointing:
            transformer.enable_gradient_checkpointing()

    @abc.abstractmethod
    def encode_prompts(self, prompts: list[str]) -> Conditioning:
        """Encode a batch of prompts (with grad if the encoder is trainable and grad is enabled)."""

    @abc.abstractmethod
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Packed latents (B, N, C) -> float32 images (B, 3, H, W) in [0, 1]."""

    @abc.abstractmethod
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [0, 1] -> packed latents (B, N, C) in float32."""

    @property
    def image_seq_len(self) -> int:
        """Number of image tokens N (what Qwen-Image's dynamic timestep shift is keyed on)."""
        return self.latent_shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.dtype

    @property
    def device(self) -> torch.device:
        return self.transformer.device

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """Predicted velocity (B, N, C) in float32 at noise level `sigma` (B,) in [0, 1]."""
        batch = latents.shape[0]
        if tuple(latents.shape[1:]) != self.latent_shape or sigma.shape != (batch,) or cond.batch_size != batch:
            raise ValueError(
                f"velocity expects latents (B, {self.latent_shape[0]}, {self.latent_shape[1]}), sigma (B,) and a "
                f"conditioning of batch B; got latents {tuple(latents.shape)}, sigma {tuple(sigma.shape)}, "
                f"conditioning batch {cond.batch_size}"
            )
        out = self.transformer(
            hidden_states=latents.to(self.dtype),
            encoder_hidden_states=cond.embeds.to(self.dtype),
            encoder_hidden_states_mask=cond.mask,
            timestep=sigma.to(self.dtype),
            img_shapes=img_shapes_for(batch, *self.latent_grid),
            return_dict=False,
        )[0].float()
        if self.cfg.prediction == "sample":  # the network predicts x_0; sigma >= the schedule's last nonzero value
            return (latents.float() - out) / sigma.float().clamp(min=1e-4).view(-1, 1, 1)
        return out

    def trainable_parameters(self) -> Iterator[torch.nn.Parameter]:
        return (p for p in self.parameters() if p.requires_grad)

    #: Submodules a weight update carries; None: the whole state dict. Modules outside it are frozen
    #: and every worker loads them itself (Qwen-Image: the VAE and text encoder, ~8B parameters that
    #: would otherwise cross the object store with every training step).
    published_modules: tuple[str, ...] | None = None

    def published_state(self) -> dict[str, torch.Tensor]:
        """The state a new weight version consists of (keys as in `state_dict`)."""
        if self.published_modules is None:
            return self.state_dict()
        return {f"{name}.{key}": value for name in self.published_modules
                for key, value in getattr(self, name).state_dict().items()}

    def load_published_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load a weight version written by `published_state`; every key it needs must be there and
        no other key may be, so two policies of different configurations cannot silently mix."""
        if self.published_modules is None:
            self.load_state_dict(state)
            return
        expected = set(self.published_state())
        unknown, missing = sorted(set(state) - expected), sorted(expected - set(state))
        if unknown or missing:
            raise KeyError(f"weight version does not match {type(self).__name__}.published_modules="
                           f"{self.published_modules}: unknown keys {unknown[:5]}, missing keys {missing[:5]}")
        for name in self.published_modules:
            prefix = f"{name}."
            getattr(self, name).load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
