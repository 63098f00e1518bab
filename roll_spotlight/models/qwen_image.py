"""The real path: a Qwen-Image pipeline directory (transformer, VAE, Qwen2.5-VL text encoder).

Components are loaded one by one from the subfolders `QwenImagePipeline.save_pretrained` writes
(`transformer/`, `vae/`, `text_encoder/`, `tokenizer/`) with `local_files_only=True`, so nothing is
ever downloaded. Prompts are encoded by calling `QwenImagePipeline.encode_prompt` on a pipeline
object built around the loaded components (not a reimplementation): the chat template, the
dropped system-prompt tokens and the truncation then follow whatever diffusers version is
installed. Latents are packed 2x2 and normalised with the VAE's latents_mean/std exactly as the
pipeline does before `vae.decode`.

Only the transformer trains (all of it, or its LoRA adapters). The VAE and text encoder are
frozen and stay in eval mode even after `policy.train()`; prompt embeddings (the negative prompt's
too) are cached per prompt string, so the text encoder runs once per prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch
from diffusers import (
    AutoencoderKLQwenImage,
    FlowMatchEulerDiscreteScheduler,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
)
from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

from roll_spotlight.models.policy import Conditioning, DiTPolicy
from roll_spotlight.models.model_config import ModelConfig
from roll_spotlight.models.packing import pack_2x2, unpack_2x2
from roll_spotlight.models.tiny import TORCH_DTYPES

SUBFOLDERS = ("transformer", "vae", "text_encoder", "tokenizer")


def check_pipeline_dir(path: str | Path) -> Path:
    """The directory as a Path, or FileNotFoundError naming what is missing."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"Qwen-Image pipeline directory not found: {root}")
    missing = [name for name in SUBFOLDERS if not (root / name).is_dir()]
    if missing:
        raise FileNotFoundError(f"Qwen-Image pipeline directory {root} lacks subfolder(s) {missing}")
    return root


class QwenImagePolicy(DiTPolicy):
    """Qwen-Image transformer + frozen VAE and text encoder; build with `from_pretrained(cfg)`.

    Weight versions carry the transformer only (`published_modules`): the frozen VAE and text
    encoder are loaded from `model.path` by every worker.
    """

    published_modules = ("transformer",)

    def __init__(
        self,
        cfg: ModelConfig,
        transformer: QwenImageTransformer2DModel,
        vae: AutoencoderKLQwenImage,
        text_encoder: Qwen2_5_VLForConditionalGeneration,
        tokenizer: Qwen2Tokenizer,
    ) -> None:
        self.vae_scale_factor = 2 ** len(vae.temperal_downsample)
        if cfg.image_size % (2 * self.vae_scale_factor):
            raise ValueError(
                f"model.image_size={cfg.image_size} must be divisible by {2 * self.vae_scale_factor} for this VAE"
            )
        grid = cfg.image_size // self.vae_scale_factor
        super().__init__(cfg, transformer, (grid, grid))
        self.vae = vae.requires_grad_(False).eval()
        self.text_encoder = text_encoder.requires_grad_(False).eval()
        self._pipe = QwenImagePipeline(FlowMatchEulerDiscreteScheduler(), vae, text_encoder, tokenizer, transformer)
        z_dim = vae.config.z_dim
        self.register_buffer("latents_mean", torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1))
        self.register_buffer("latents_std", torch.tensor(vae.config.latents_std).view(1, z_dim, 1, 1, 1))
        self._prompt_cache: OrderedDict[str, Conditioning] = OrderedDict()

    @classmethod
    def from_pretrained(cls, cfg: ModelConfig | str | Path, **overrides) -> QwenImagePolicy:
        """Load from `cfg.path` (or a directory, with ModelConfig fields as keyword overrides)."""
        if not isinstance(cfg, ModelConfig):
            cfg = ModelConfig(preset="qwen_image", path=str(cfg), **overrides)
        root = check_pipeline_dir(cfg.path)
        dtype = TORCH_DTYPES[cfg.dtype]
        local = {"local_files_only": True}
        policy = cls(
            cfg,
            QwenImageTransformer2DModel.from_pretrained(root / "transformer", torch_dtype=dtype, **local),
            AutoencoderKLQwenImage.from_pretrained(root / "vae", torch_dtype=dtype, **local),
            Qwen2_5_VLForConditionalGeneration.from_pretrained(root / "text_encoder", dtype=dtype, **local),
            Qwen2Tokenizer.from_pretrained(root / "tokenizer", **local),
        )
        return policy.to(cfg.device)

    def train(self, mode: bool = True) -> QwenImagePolicy:
        super().train(mode)
        self.vae.eval()
        self.text_encoder.eval()
        return self

    @torch.no_grad()
    def encode_text(self, prompts: list[str]) -> Conditioning:
        """Text-encoder hidden states (template tokens dropped) and a long mask, as the pipeline builds
        them, one prompt at a time through the prompt cache (see `_encode_one`)."""
        return Conditioning.cat([self._encode_one(p) for p in prompts]).to(self.device)

    def _encode_one(self, prompt: str) -> Conditioning:
        """One prompt's conditioning (on the CPU), from the LRU cache of `model.prompt_cache_size`
        prompts or the text encoder. Encoding each prompt alone makes its embedding independent of
        its batch mates, so every worker computes the same one; the cache lets the frozen 7B text
        encoder sit off the GPU once a run's prompts have been seen."""
        hit = self._prompt_cache.get(prompt)
        if hit is not None:
            self._prompt_cache.move_to_end(prompt)
            return hit
        embeds, mask = self._pipe.encode_prompt(
            [prompt], device=self.text_encoder.device, max_sequence_length=self.cfg.max_sequence_length
        )
        if mask is None:  # the pipeline drops an all-ones mask
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        cond = Conditioning(embeds.cpu(), mask.long().cpu())
        if self.cfg.prompt_cache_size:
            self._prompt_cache[prompt] = cond
            while len(self._prompt_cache) > self.cfg.prompt_cache_size:
                self._prompt_cache.popitem(last=False)
        return cond

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1] -> normalised, packed VAE latents (the posterior mode), float32."""
        size = self.cfg.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (3, size, size):
            raise ValueError(f"encode_images expects (B, 3, {size}, {size}) images, got {tuple(images.shape)}")
        pixels = (images * 2.0 - 1.0).to(self.vae.device, self.vae.dtype)[:, :, None]
        z = self.vae.encode(pixels).latent_dist.mode()
        z = (z - self.latents_mean.to(z.dtype)) / self.latents_std.to(z.dtype)
        return pack_2x2(z[:, :, 0].float())

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Packed latents -> float32 images in [0, 1]."""
        if tuple(latents.shape[1:]) != self.latent_shape:
            raise ValueError(f"decode expects latents (B, {self.latent_shape}), got {tuple(latents.shape)}")
        z = unpack_2x2(latents.to(self.vae.dtype), *self.latent_grid)[:, :, None]
        z = z * self.latents_std.to(z.dtype) + self.latents_mean.to(z.dtype)
        pixels = self.vae.decode(z, return_dict=False)[0][:, :, 0]
        return ((pixels.float() + 1.0) / 2.0).clamp(0.0, 1.0)
