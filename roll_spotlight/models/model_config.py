"""Configuration of the DiT policy (tiny pixel-space model or a real Qwen-Image checkpoint).

This module imports no torch, so configs can be built and validated anywhere (CLI, Hydra, tests).
"""

from __future__ import annotations

from dataclasses import dataclass

from roll_spotlight.checks import require, require_choice, require_each, require_int, require_number

PRESETS = ("tiny", "qwen_image")
DTYPES = ("float32", "bfloat16")
PREDICTIONS = ("velocity", "sample")


@dataclass
class ModelConfig:
    """Which DiT to build and how.

    `preset="tiny"` builds `TinyShapesDiT`: a small random-init `QwenImageTransformer2DModel` on
    pixel-space RGB images of `image_size` plus a learned word-level prompt encoder; the
    architecture knobs below apply to it only (`patch_size`, pixels per token side: the image
    tokens, and with them most of the FLOPs, fall with its square). `preset="qwen_image"` loads a
    diffusers-format pipeline directory from `path` (never downloads); `max_sequence_length` caps
    its text tokens and `prompt_cache_size` bounds how many prompts' embeddings are kept (on the
    CPU, least recently used dropped first; a Qwen-Image prompt of T tokens takes T x 3584 x 2 bytes, ~0.2 MB at T = 30).
    `path` is not read by `build_policy` for the tiny preset (a tiny base checkpoint is loaded
    with `load_tiny_policy`).

    `prediction` is what the transformer's output means. "velocity" (Qwen-Image's own choice,
    required for `qwen_image`) is noise - x_0. "sample" means the network predicts the clean x_0
    and the policy returns the velocity (x_sigma - x_0_hat) / sigma: in pixel space, where a token
    is a raw 2x2 RGB patch, a small network cannot copy the per-pixel noise it would have to predict
    as a velocity, and leftover noise speckles every sample; predicting the clean image does not
    have that problem. None picks "sample" for `tiny` and "velocity" for `qwen_image`.
    """

    preset: str = "tiny"
    path: str | None = None
    dtype: str = "float32"
    prediction: str | None = None   # None: "sample" for tiny, "velocity" for qwen_image
    gradient_checkpointing: bool = False
    image_size: int = 32
    patch_size: int = 2   # tiny: pixels per token side (even); qwen_image packs latents 2x2 (must be 2)
    device: str = "cpu"
    # tiny architecture
    num_layers: int = 2
    num_attention_heads: int = 4
    attention_head_dim: int = 32
    joint_attention_dim: int = 64
    axes_dims_rope: tuple[int, int, int] = (8, 12, 12)
    max_prompt_tokens: int = 16
    prompt_encoder_layers: int = 1
    # real text encoder
    max_sequence_length: int = 512
    # diffusers' attention dispatcher backend ("native" = torch SDPA; "flash" = flash-attn; see
    # models.attention); checked against what runs here when the policy is built
    attention_backend: str = "native"
    # the GPU memory a worker has, for the start-up memory plan (None: not checked)
    gpu_memory_gb: float | None = None
    prompt_cache_size: int = 4096   # prompts whose embeddings stay cached (on the CPU); 0: no cache

    def __post_init__(self) -> None:
        self.axes_dims_rope = tuple(int(a) for a in self.axes_dims_rope)
        self._validate_choices()
        self._validate_memory()
        self._validate_positive()
        self._validate_tiny_architecture()
        self._validate_image_size()

    def _validate_memory(self) -> None:
        require(isinstance(self.attention_backend, str) and bool(self.attention_backend), "model.attention_backend",
                self.attention_backend, "must be a backend name")
        require_number("model.gpu_memory_gb", self.gpu_memory_gb, optional=True)

    def _validate_choices(self) -> None:
        require_choice("model.preset", self.preset, PRESETS)
        if self.prediction is None:
            self.prediction = "sample" if self.preset == "tiny" else "velocity"
        require_choice("model.prediction", self.prediction, PREDICTIONS)
        require(self.preset == "tiny" or self.prediction == "velocity", "model.prediction", self.prediction,
                "must be 'velocity' for preset 'qwen_image' (the checkpoint predicts velocity)")
        require_choice("model.dtype", self.dtype, DTYPES)
        require(self.preset == "tiny" or bool(self.path), "model.path", self.path,
                "must name a local diffusers pipeline directory for preset 'qwen_image'")

    def _validate_positive(self) -> None:
        require_each(self, "model", ("image_size", "num_layers", "num_attention_heads", "attention_head_dim",
                                     "joint_attention_dim"), require_int)
        require_int("model.max_sequence_length", self.max_sequence_length, "[1, 1024]", why="(Qwen-Image's limit)")
        require_int("model.prompt_cache_size", self.prompt_cache_size, ">= 0", why="(0: no cache)")
        require_int("model.prompt_encoder_layers", self.prompt_encoder_layers, ">= 0")
        require_int("model.max_prompt_tokens", self.max_prompt_tokens, ">= 2", why="(one start token plus words)")

    def _validate_tiny_architecture(self) -> None:
        if len(self.axes_dims_rope) != 3:
            raise ValueError(
                f"model.axes_dims_rope must have 3 entries (frame, height, width), got {self.axes_dims_rope}"
            )
        if sum(self.axes_dims_rope) != self.attention_head_dim:
            raise ValueError(
                f"model.axes_dims_rope must sum to model.attention_head_dim={self.attention_head_dim}, "
                f"got {self.axes_dims_rope} (sum {sum(self.axes_dims_rope)})"
            )
        if any(a % 2 for a in self.axes_dims_rope):
            raise ValueError(f"model.axes_dims_rope entries must be even (rotary pairs), got {self.axes_dims_rope}")
        if self.joint_attention_dim % 4:
            raise ValueError(
                "model.joint_attention_dim must be divisible by 4 (prompt encoder heads), "
                f"got {self.joint_attention_dim}"
            )

    def tiny_transformer(self) -> dict:
        """The tiny model's diffusers transformer config: a token is a `patch_size` x `patch_size`
        RGB patch, packed as diffusers' 2x2 patch over cells of (patch_size / 2)^2 pixels."""
        cell = 3 * (self.patch_size // 2) ** 2
        return {"patch_size": 2, "in_channels": 4 * cell, "out_channels": cell, "num_layers": self.num_layers,
                "attention_head_dim": self.attention_head_dim, "num_attention_heads": self.num_attention_heads,
                "joint_attention_dim": self.joint_attention_dim, "axes_dims_rope": list(self.axes_dims_rope)}

    def _validate_image_size(self) -> None:
        if not isinstance(self.patch_size, int) or self.patch_size < 2 or self.patch_size % 2 \
                or (self.preset != "tiny" and self.patch_size != 2):
            raise ValueError(f"model.patch_size must be an even int >= 2 (2 for preset 'qwen_image', whose "
                             f"latents are packed 2x2), got {self.patch_size!r}")
        multiple = self.patch_size if self.preset == "tiny" else 16
        if self.image_size % multiple:
            raise ValueError(
                f"model.image_size must be divisible by {multiple} for preset {self.preset!r}, got {self.image_size}"
            )
