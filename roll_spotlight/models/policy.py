"""The policy interface every Flow-GRPO component talks to, and the prompt conditioning it carries.

Conventions (shared with `flow_grpo/`): latents are packed tokens (B, N, C); sigma runs from 1
(pure noise) to 0 (data) and x_sigma = (1 - sigma) * x_0 + sigma * noise; the velocity is
d x_sigma / d sigma = noise - x_0, returned in float32 whatever the model dtype, because the SDE
step and its log-probability are computed in float32.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from roll_spotlight.models.model_config import ModelConfig
from roll_spotlight.models.guidance import check_guidance, true_cfg
from roll_spotlight.models.lora import ADAPTER_NAME, LoraConfig, apply_lora, is_lora_key
from roll_spotlight.models.packing import img_shapes_for


@dataclass
class Conditioning:
    """Encoded prompts: `embeds` (B, L, D) and `mask` (B, L) long, 1 = real token, 0 = padding.

    `negative` is the negative prompt's conditioning, row for row (its own length L'), present when
    the policy guides (true CFG); every batch operation applies to both.
    """

    embeds: torch.Tensor
    mask: torch.Tensor
    negative: Conditioning | None = None

    def __post_init__(self) -> None:
        if self.embeds.dim() != 3 or self.mask.shape != self.embeds.shape[:2]:
            raise ValueError(
                f"Conditioning needs embeds (B, L, D) and mask (B, L), got {tuple(self.embeds.shape)} "
                f"and {tuple(self.mask.shape)}"
            )
        if self.negative is not None and self.negative.batch_size != self.batch_size:
            raise ValueError(f"Conditioning: negative has batch {self.negative.batch_size}, prompts {self.batch_size}")

    @property
    def batch_size(self) -> int:
        return self.embeds.shape[0]

    def _neg(self, fn) -> Conditioning | None:
        return None if self.negative is None else fn(self.negative)

    def index(self, idx: torch.Tensor | Sequence[int] | slice | int) -> Conditioning:
        """Rows `idx` of the batch (an int keeps the batch dimension)."""
        if isinstance(idx, int):
            idx = slice(idx, idx + 1)
        elif not isinstance(idx, slice):
            idx = torch.as_tensor(idx, dtype=torch.long, device=self.embeds.device)
        return Conditioning(self.embeds[idx], self.mask[idx], self._neg(lambda n: n.index(idx)))

    def repeat_interleave(self, n: int) -> Conditioning:
        """Each row repeated `n` times in place: one prompt -> its group of `n` samples."""
        return Conditioning(self.embeds.repeat_interleave(n, dim=0), self.mask.repeat_interleave(n, dim=0),
                            self._neg(lambda neg: neg.repeat_interleave(n)))

    def to(self, device: torch.device | str) -> Conditioning:
        return Conditioning(self.embeds.to(device), self.mask.to(device), self._neg(lambda n: n.to(device)))

    @staticmethod
    def cat(parts: Sequence[Conditioning]) -> Conditioning:
        """Concatenate along the batch, zero-padding to the longest L (real text encoders vary L)."""
        if not parts:
            raise ValueError("Conditioning.cat needs at least one part")
        with_negative = {p.negative is not None for p in parts}
        if len(with_negative) > 1:
            raise ValueError("Conditioning.cat: some parts carry a negative prompt and some do not")
        length = max(p.embeds.shape[1] for p in parts)
        embeds = [torch.nn.functional.pad(p.embeds, (0, 0, 0, length - p.embeds.shape[1])) for p in parts]
        masks = [torch.nn.functional.pad(p.mask, (0, length - p.mask.shape[1])) for p in parts]
        negative = Conditioning.cat([p.negative for p in parts]) if with_negative == {True} else None
        return Conditioning(torch.cat(embeds), torch.cat(masks), negative)


class DiTPolicy(torch.nn.Module, abc.ABC):
    """A text-conditioned flow-matching DiT: prompts -> conditioning -> velocity, plus the latent codec.

    Subclasses call `super().__init__(cfg, transformer, latent_grid)` and implement `encode_text`,
    `decode` and `encode_images`. `velocity` is the only call on the denoising hot path (rollouts,
    exploration, validation and the training recompute all go through it), so guidance lives there,
    and the shapes it checks against are fixed here once instead of being read from configs per call.

    Two run-level switches, each one call after construction:
    - `set_guidance(scale, negative_prompt)` (`sampling.guidance_scale`, `sampling.negative_prompt`):
      true CFG inside `velocity`; `encode_prompts` then attaches the negative prompt's conditioning.
    - `enable_lora(LoraConfig)` (`train.lora`): adapters on the transformer; everything else freezes,
      a weight version is the adapter tensors only, and `adapters_disabled()` is the KL reference.
    """

    def __init__(self, cfg: ModelConfig, transformer: torch.nn.Module, latent_grid: tuple[int, int]) -> None:
        super().__init__()
        self.cfg = cfg
        self.transformer = transformer
        self.latent_grid = latent_grid
        self.latent_shape = ((latent_grid[0] // 2) * (latent_grid[1] // 2), int(transformer.config.in_channels))
        self.guidance_scale = 1.0
        self.negative_prompt: str | None = None
        self.lora: LoraConfig | None = None
        self.attention = None  # a models.attention.BackendCheck once a non-default backend is set
        if cfg.gradient_checkpointing:
            transformer.enable_gradient_checkpointing()

    # ------------------------------------------------------------------ prompts and guidance

    @abc.abstractmethod
    def encode_text(self, prompts: list[str]) -> Conditioning:
        """Encode a batch of prompts, without the negative (with grad if the encoder trains and grad is on)."""

    def encode_prompts(self, prompts: list[str]) -> Conditioning:
        """The conditioning `velocity` needs: the prompts, plus the negative prompt row for row when guiding."""
        cond = self.encode_text(list(prompts))
        if not self.guided:
            return cond
        negative = self.encode_text([self.negative_prompt])
        rows = cond.batch_size
        negative = Conditioning(negative.embeds.expand(rows, -1, -1), negative.mask.expand(rows, -1))
        return Conditioning(cond.embeds, cond.mask, negative.to(cond.embeds.device))

    @property
    def guided(self) -> bool:
        return self.guidance_scale > 1.0

    def set_guidance(self, scale: float, negative_prompt: str | None) -> None:
        """True CFG with `scale` (Qwen-Image's `true_cfg_scale`; 1 = off) against `negative_prompt`.
        ValueError naming `sampling.guidance_scale` or `sampling.negative_prompt` when the scale is
        below 1, or guidance is asked for and the negative prompt is missing or cannot be encoded."""
        scale = check_guidance(scale, negative_prompt)
        if scale > 1.0:
            try:
                with torch.no_grad():
                    self.encode_text([negative_prompt])
            except ValueError as err:
                raise ValueError(f"sampling.negative_prompt={negative_prompt!r} cannot be encoded by "
                                 f"{type(self).__name__}: {err}") from err
        self.guidance_scale, self.negative_prompt = scale, negative_prompt

    # ------------------------------------------------------------------ codec

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

    # ------------------------------------------------------------------ attention backend

    def set_attention_backend(self, name: str) -> None:
        """`model.attention_backend` through diffusers' dispatcher (models.attention); ValueError
        listing the backends that run here when `name` does not."""
        from roll_spotlight.models.attention import apply_attention_backend

        self.attention = apply_attention_backend(self.transformer, name)

    def _text_mask(self, mask: torch.Tensor) -> torch.Tensor | None:
        from roll_spotlight.models.attention import text_mask_for_backend

        return text_mask_for_backend(mask, self.attention)

    # ------------------------------------------------------------------ velocity

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """Predicted velocity (B, N, C) in float32 at noise level `sigma` (B,) in [0, 1]; guided (see
        `guidance.true_cfg`) when `set_guidance` turned CFG on: both branches in one forward of 2B
        rows, the prompts and the negative padded and masked to one text length, unless the
        attention backend takes no mask and the lengths differ (then two forwards)."""
        batch = latents.shape[0]
        if tuple(latents.shape[1:]) != self.latent_shape or sigma.shape != (batch,) or cond.batch_size != batch:
            raise ValueError(
                f"velocity expects latents (B, {self.latent_shape[0]}, {self.latent_shape[1]}), sigma (B,) and a "
                f"conditioning of batch B; got latents {tuple(latents.shape)}, sigma {tuple(sigma.shape)}, "
                f"conditioning batch {cond.batch_size}"
            )
        if not self.guided:
            return self._unguided_velocity(latents, sigma, cond)
        if cond.negative is None:
            raise ValueError(f"velocity: guidance is on (sampling.guidance_scale={self.guidance_scale}) but the "
                             "conditioning has no negative prompt; build it with policy.encode_prompts")
        positive = Conditioning(cond.embeds, cond.mask)
        if self.attention is not None and not self.attention.accepts_mask and \
                cond.embeds.shape[1] != cond.negative.embeds.shape[1]:
            v_cond, v_neg = (self._unguided_velocity(latents, sigma, c) for c in (positive, cond.negative))
        else:
            both = Conditioning.cat([positive, cond.negative])
            v_cond, v_neg = self._unguided_velocity(latents.repeat(2, 1, 1), sigma.repeat(2), both).chunk(2)
        return true_cfg(v_cond, v_neg, self.guidance_scale)

    def _unguided_velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        out = self.transformer(
            hidden_states=latents.to(self.dtype),
            encoder_hidden_states=cond.embeds.to(self.dtype),
            encoder_hidden_states_mask=cond.mask if self.attention is None else self._text_mask(cond.mask),
            timestep=sigma.to(self.dtype),
            img_shapes=img_shapes_for(latents.shape[0], *self.latent_grid),
            return_dict=False,
        )[0].float()
        if self.cfg.prediction == "sample":  # the network predicts x_0; sigma >= the schedule's last nonzero value
            return (latents.float() - out) / sigma.float().clamp(min=1e-4).view(-1, 1, 1)
        return out

    def trainable_parameters(self) -> Iterator[torch.nn.Parameter]:
        return (p for p in self.parameters() if p.requires_grad)

    # ------------------------------------------------------------------ LoRA

    def enable_lora(self, cfg: LoraConfig) -> None:
        """Add adapters `cfg` to the transformer and freeze everything else (prompt encoders included).
        ValueError naming `train.lora.target_modules` when a target matches no Linear layer."""
        if self.lora is not None:
            raise ValueError(f"{type(self).__name__} already has LoRA adapters ({self.lora})")
        apply_lora(self.transformer, cfg)
        for name, param in self.named_parameters():
            param.requires_grad_(is_lora_key(name))
        self.lora = cfg

    @contextlib.contextmanager
    def adapters_disabled(self) -> Iterator[DiTPolicy]:
        """The base model inside the block (the KL reference without a second copy); adapters and
        their requires_grad flags are restored on exit."""
        if self.lora is None:
            raise ValueError("adapters_disabled: this policy has no LoRA adapters (train.use_lora is off)")
        flags = {name: p.requires_grad for name, p in self.transformer.named_parameters()}
        self.transformer.disable_adapters()
        try:
            yield self
        finally:
            self.transformer.enable_adapters()
            for name, p in self.transformer.named_parameters():
                p.requires_grad_(flags[name])

    def save_lora(self, directory: str | Path) -> Path:
        """Write the adapters as diffusers LoRA weights (`pytorch_lora_weights.safetensors`, keys
        `transformer.*`, the peft config as metadata): `QwenImagePipeline.load_lora_weights(directory)`
        loads them into an ordinary pipeline."""
        if self.lora is None:
            raise ValueError("save_lora: this policy has no LoRA adapters (train.use_lora is off)")
        from diffusers import QwenImagePipeline
        from peft.utils import get_peft_model_state_dict

        layers = get_peft_model_state_dict(self.transformer, adapter_name=ADAPTER_NAME)
        metadata = {k: sorted(v) if isinstance(v, set) else v
                    for k, v in self.transformer.peft_config[ADAPTER_NAME].to_dict().items()}
        QwenImagePipeline.save_lora_weights(Path(directory), transformer_lora_layers=layers,
                                            transformer_lora_adapter_metadata=metadata)
        return Path(directory)

    def load_lora(self, directory: str | Path) -> None:
        """Load adapters written by `save_lora` (or any diffusers Qwen-Image LoRA of the same shape)."""
        if self.lora is None:
            raise ValueError("load_lora: enable_lora(train.lora) first; this policy has no adapters")
        from diffusers import QwenImagePipeline
        from peft.utils import set_peft_model_state_dict

        state = QwenImagePipeline.lora_state_dict(str(directory))
        state = {k[len("transformer."):]: v for k, v in state.items() if k.startswith("transformer.")}
        result = set_peft_model_state_dict(self.transformer, state, adapter_name=ADAPTER_NAME)
        missing = [k for k in result.missing_keys if is_lora_key(k)]
        if result.unexpected_keys or missing:
            raise KeyError(f"LoRA weights in {directory} do not fit train.lora={self.lora}: "
                           f"unexpected {result.unexpected_keys[:5]}, missing {missing[:5]}")

    # ------------------------------------------------------------------ weight versions

    #: Submodules a weight update carries; None: the whole state dict. Modules outside it are frozen
    #: and every worker loads them itself (Qwen-Image: the VAE and text encoder, ~8B parameters that
    #: would otherwise cross the object store with every training step). With LoRA on, a version is
    #: the transformer's adapter tensors only, whatever this says.
    published_modules: tuple[str, ...] | None = None

    def published_state(self) -> dict[str, torch.Tensor]:
        """The state a new weight version consists of (keys as in `state_dict`)."""
        if self.lora is not None:
            return {f"transformer.{k}": v for k, v in self.transformer.state_dict().items() if is_lora_key(k)}
        if self.published_modules is None:
            return self.state_dict()
        return {f"{name}.{key}": value for name in self.published_modules
                for key, value in getattr(self, name).state_dict().items()}

    def load_published_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load a weight version written by `published_state`; every key it needs must be there and
        no other key may be, so two policies of different configurations cannot silently mix."""
        if self.published_modules is None and self.lora is None and not any(map(is_lora_key, state)):
            self.load_state_dict(state)
            return
        expected = set(self.published_state())
        unknown, missing = sorted(set(state) - expected), sorted(expected - set(state))
        if unknown or missing:
            hint = ("; the version carries LoRA adapters: call enable_lora(train.lora) on this worker first"
                    if self.lora is None and any(map(is_lora_key, unknown)) else "")
            raise KeyError(f"weight version does not match {type(self).__name__} (published_modules="
                           f"{self.published_modules}, lora={self.lora is not None}): unknown keys {unknown[:5]}, "
                           f"missing keys {missing[:5]}{hint}")
        if self.lora is not None:
            self.transformer.load_state_dict({k[len("transformer."):]: v for k, v in state.items()}, strict=False)
            return
        for name in self.published_modules:
            prefix = f"{name}."
            getattr(self, name).load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
