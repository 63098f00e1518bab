"""A typed, picklable recipe for the ``QwenImageTransformer2DModel`` an SP worker holds.

Workers receive the spec (not a module) so a Ray actor builds its model in its own process. The
random init is seeded, so two workers built from one spec hold identical weights; a newcomer built
with another ``init_seed`` visibly holds different weights until a transfer overwrites them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

__all__ = ["QwenModelSpec"]


@dataclass(frozen=True)
class QwenModelSpec:
    num_layers: int = 2
    num_attention_heads: int = 4
    attention_head_dim: int = 32
    joint_attention_dim: int = 64
    in_channels: int = 64
    out_channels: int = 16
    axes_dims_rope: tuple[int, int, int] = (8, 12, 12)
    init_seed: int = 0

    def __post_init__(self) -> None:
        if sum(self.axes_dims_rope) != self.attention_head_dim:
            raise ValueError(
                f"axes_dims_rope={self.axes_dims_rope} must sum to attention_head_dim={self.attention_head_dim}"
            )
        if self.in_channels != 4 * self.out_channels:
            raise ValueError(f"in_channels={self.in_channels} must be 4 * out_channels={self.out_channels}")
        if min(self.num_layers, self.num_attention_heads, self.joint_attention_dim) < 1:
            raise ValueError(f"num_layers, num_attention_heads, joint_attention_dim must be >= 1: {self}")

    def build(self, device: str | torch.device = "cpu") -> torch.nn.Module:
        from diffusers.models.transformers.transformer_qwenimage import QwenImageTransformer2DModel

        torch.manual_seed(self.init_seed)
        model = QwenImageTransformer2DModel(
            patch_size=2,
            in_channels=self.in_channels,
            out_channels=self.out_channels,
            num_layers=self.num_layers,
            attention_head_dim=self.attention_head_dim,
            num_attention_heads=self.num_attention_heads,
            joint_attention_dim=self.joint_attention_dim,
            guidance_embeds=False,
            axes_dims_rope=self.axes_dims_rope,
        )
        return model.to(device).eval().requires_grad_(False)

    @staticmethod
    def load(path: str, device: str | torch.device = "cpu") -> torch.nn.Module:
        """A cold start: ``from_pretrained`` of a ``save_pretrained`` directory (no random init)."""
        from diffusers.models.transformers.transformer_qwenimage import QwenImageTransformer2DModel

        model = QwenImageTransformer2DModel.from_pretrained(path, local_files_only=True)
        return model.to(device).eval().requires_grad_(False)

    @property
    def approx_mb(self) -> float:
        """fp32 size estimate: per block 8 d^2 attention + 16 d^2 MLPs + 12 d^2 modulation, plus the
        input/output projections, timestep MLP and output norm."""
        d = self.num_attention_heads * self.attention_head_dim
        fixed = d * (2 * self.in_channels + self.joint_attention_dim + 256) + 3 * d * d
        params = self.num_layers * 36 * d * d + fixed
        return params * 4 / 2**20

    @classmethod
    def sized(cls, model_mb: float, *, num_attention_heads: int = 8, init_seed: int = 0) -> "QwenModelSpec":
        """Real Qwen-Image head_dim (128), rope axes and text width; layers set to reach ``model_mb``."""
        base = cls(num_attention_heads=num_attention_heads, attention_head_dim=128, joint_attention_dim=3584,
                   axes_dims_rope=(16, 56, 56), num_layers=1, init_seed=init_seed)
        per_layer = replace(base, num_layers=2).approx_mb - base.approx_mb
        layers = max(1, round((model_mb - (base.approx_mb - per_layer)) / per_layer))
        return replace(base, num_layers=layers)
