"""A CPU-sized Qwen-Image-architecture policy in pixel space, for learning runs on these machines.

`TinyShapesDiT` uses the real diffusers `QwenImageTransformer2DModel` (so Flow-GRPO, SP and the
dispatcher exercise the same forward as the 20B model) with two substitutions that keep it
trainable on a CPU in minutes:

- No VAE. The "latent" is the RGB image itself scaled to [-1, 1] (x = 2 * image - 1), packed 2x2
  like Qwen-Image latents. With `model.patch_size` p a token is a p x p RGB patch: the image is
  first cut into cells of p/2 x p/2 pixels (stacked as channels, as a VAE's latent pixel stacks its
  features), then packed 2x2, so an S x S image becomes (S/p)^2 tokens of 3 p^2 channels (p = 2:
  256 tokens of 12 channels at 32 x 32; p = 4: 64 tokens of 48). `decode` is the inverse and clamps
  to [0, 1], since sampled latents may leave [-1, 1].
- No LLM text encoder. A `WordTokenizer` over a closed task vocabulary feeds a small learned
  `PromptEncoder` (trainable with the transformer). Unknown words are an error, not silently
  dropped, because a prompt the task cannot express would otherwise train on garbage.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import torch
from diffusers import QwenImageTransformer2DModel

from roll_spotlight.models.policy import Conditioning, DiTPolicy
from roll_spotlight.models.model_config import ModelConfig
from roll_spotlight.models.packing import pack_2x2, unpack_2x2

_WORD = re.compile(r"[^\W_]+")
PAD_ID = 0
START_ID = 1
CHECKPOINT_FORMAT = "roll_spotlight.tiny_policy.v2"  # v2: ModelConfig.prediction
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def split_words(text: str) -> list[str]:
    """Lower-case and split on whitespace and punctuation ("Two red circles." -> two, red, circles)."""
    return _WORD.findall(text.lower())


class WordTokenizer:
    """Closed-vocabulary word tokenizer.

    Ids: 0 = padding, 1 = a start token that every prompt begins with (so no row is all padding,
    which would make the prompt encoder's attention undefined), 2.. = the vocabulary in order.
    `max_tokens` counts the start token, so a prompt holds at most `max_tokens - 1` words.
    """

    def __init__(self, vocab: Sequence[str], max_tokens: int) -> None:
        words = [w.lower() for w in vocab]
        bad = [w for w in words if split_words(w) != [w]]
        if not words or bad or len(set(words)) != len(words):
            raise ValueError(f"vocab must be non-empty, unique, single words; got {list(vocab)!r} (bad: {bad!r})")
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be >= 2, got {max_tokens}")
        self.vocab = tuple(words)
        self.max_tokens = max_tokens
        self._ids = {w: i + 2 for i, w in enumerate(words)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab) + 2

    def ids_of(self, prompt: str) -> list[int]:
        words = split_words(prompt)
        unknown = [w for w in words if w not in self._ids]
        if unknown:
            raise ValueError(f"unknown word {unknown[0]!r} in prompt {prompt!r} (vocab: {len(self.vocab)} words)")
        if len(words) + 1 > self.max_tokens:
            raise ValueError(
                f"prompt {prompt!r} has {len(words)} words; max_tokens={self.max_tokens} allows {self.max_tokens - 1}"
            )
        return [START_ID] + [self._ids[w] for w in words]

    def __call__(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids (B, max_tokens) long and mask (B, max_tokens) long, right-padded."""
        ids = torch.full((len(prompts), self.max_tokens), PAD_ID, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            tokens = self.ids_of(prompt)
            ids[row, : len(tokens)] = torch.tensor(tokens)
        return ids, (ids != PAD_ID).long()


class PromptEncoder(torch.nn.Module):
    """Word + position embeddings followed by `layers` pre-norm transformer encoder layers.

    Output embeddings at padded positions are zeroed, so a Conditioning is a pure function of the
    real tokens (the DiT masks them too; zeroing keeps saved conditionings comparable).
    """

    def __init__(self, vocab_size: int, dim: int, max_tokens: int, layers: int, heads: int = 4) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"prompt encoder dim={dim} must be divisible by heads={heads}")
        self.words = torch.nn.Embedding(vocab_size, dim, padding_idx=PAD_ID)
        self.positions = torch.nn.Embedding(max_tokens, dim)
        layer = torch.nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=2 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False) if layers else None
        self.norm = torch.nn.LayerNorm(dim)

    def train(self, mode: bool = True) -> PromptEncoder:
        """The encoder layers stay in training mode (dropout is 0, so it is the same function):
        in eval mode under no_grad, torch takes a fused inference kernel that differs from the
        autograd path by ~1e-7, and rollouts (no grad) must condition exactly as the training
        recompute (grad) does, or the first importance ratio is not exactly 1."""
        super().train(mode)
        if self.encoder is not None:
            self.encoder.train(True)
        return self

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.words(ids) + self.positions(positions)[None]
        if self.encoder is not None:
            x = self.encoder(x, src_key_padding_mask=mask == 0)
        x = self.norm(x) * mask[..., None].to(x.dtype)
        return x, mask


class TinyShapesDiT(DiTPolicy):
    """Pixel-space tiny Qwen-Image DiT with a word-level prompt encoder (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, vocab: Sequence[str]) -> None:
        if cfg.preset != "tiny":
            raise ValueError(f"TinyShapesDiT needs model.preset='tiny', got {cfg.preset!r}")
        transformer = QwenImageTransformer2DModel(**cfg.tiny_transformer(), guidance_embeds=False)
        self.cell = cfg.patch_size // 2  # pixels per side of one latent "pixel" (see the module docstring)
        super().__init__(cfg, transformer, (cfg.image_size // self.cell, cfg.image_size // self.cell))
        self.tokenizer = WordTokenizer(vocab, cfg.max_prompt_tokens)
        self.prompt_encoder = PromptEncoder(
            self.tokenizer.vocab_size, cfg.joint_attention_dim, cfg.max_prompt_tokens, cfg.prompt_encoder_layers
        )
        self.to(device=cfg.device, dtype=TORCH_DTYPES[cfg.dtype])

    def encode_text(self, prompts: list[str]) -> Conditioning:
        """Word ids through the learned prompt encoder (with grad when it trains; never cached, since
        its weights move). A negative prompt must use task words too (" " or "" is the start token only)."""
        ids, mask = self.tokenizer(prompts)
        embeds, mask = self.prompt_encoder(ids.to(self.device), mask.to(self.device))
        return Conditioning(embeds, mask)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, S, S) in [0, 1] -> packed latents 2 * image - 1, float32."""
        size = self.cfg.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (3, size, size):
            raise ValueError(f"encode_images expects (B, 3, {size}, {size}) images, got {tuple(images.shape)}")
        return pack_2x2(torch.nn.functional.pixel_unshuffle(images.float() * 2.0 - 1.0, self.cell))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Packed latents -> float32 images in [0, 1] (clamped)."""
        if tuple(latents.shape[1:]) != self.latent_shape:
            raise ValueError(f"decode expects latents (B, {self.latent_shape}), got {tuple(latents.shape)}")
        grid = torch.nn.functional.pixel_shuffle(unpack_2x2(latents.float(), *self.latent_grid), self.cell)
        return ((grid + 1.0) / 2.0).clamp(0.0, 1.0)


def save_policy(policy: TinyShapesDiT, path: str | Path, extra: dict[str, Any] | None = None) -> None:
    """Save weights, ModelConfig and vocabulary in one file loadable with `weights_only=True`.

    `extra` must hold only plain values (numbers, strings, lists, dicts, tensors), e.g. the
    training step; it comes back unchanged from `load_tiny_policy`.
    """
    if not isinstance(policy, TinyShapesDiT):
        raise TypeError(
            f"save_policy supports TinyShapesDiT, got {type(policy).__name__}; "
            "save a real Qwen-Image policy with policy.transformer.save_pretrained(dir)"
        )
    payload = {
        "format": CHECKPOINT_FORMAT,
        "config": asdict(policy.cfg),
        "vocab": list(policy.tokenizer.vocab),
        "state_dict": policy.state_dict(),
        "extra": dict(extra or {}),
    }
    torch.save(payload, Path(path))


def load_tiny_policy(path: str | Path, device: str | None = None) -> tuple[TinyShapesDiT, dict[str, Any]]:
    """Rebuild a `TinyShapesDiT` saved by `save_policy`; returns (policy, extra)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tiny policy checkpoint not found: {path}")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a {CHECKPOINT_FORMAT} checkpoint (format {payload.get('format')!r})")
    config = dict(payload["config"])
    if device is not None:
        config["device"] = device
    policy = TinyShapesDiT(ModelConfig(**config), payload["vocab"])
    policy.load_state_dict(payload["state_dict"])
    return policy, payload["extra"]
