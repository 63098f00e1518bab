"""DiT policies: the tiny pixel-space Qwen-Image model for CPU runs and the real Qwen-Image path.

`QwenImagePolicy` is imported lazily (on first attribute access) because it pulls in the
transformers Qwen2.5-VL stack, which tiny runs never need.
"""

from __future__ import annotations

from typing import Sequence

from roll_spotlight.models.base import Conditioning, DiTPolicy
from roll_spotlight.models.config import ModelConfig
from roll_spotlight.models.tiny import TinyShapesDiT, WordTokenizer, load_tiny_policy, save_policy

__all__ = [
    "Conditioning",
    "DiTPolicy",
    "ModelConfig",
    "QwenImagePolicy",
    "TinyShapesDiT",
    "WordTokenizer",
    "build_policy",
    "load_tiny_policy",
    "save_policy",
]


def build_policy(cfg: ModelConfig, vocab: Sequence[str] | None = None) -> DiTPolicy:
    """A fresh policy for `cfg.preset`: "tiny" needs the task `vocab`; "qwen_image" loads `cfg.path`."""
    if cfg.preset == "tiny":
        if not vocab:
            raise ValueError("build_policy: preset 'tiny' needs the task vocabulary (vocab=...)")
        return TinyShapesDiT(cfg, vocab)
    elif cfg.preset == "qwen_image":
        from roll_spotlight.models.qwen_image import QwenImagePolicy

        return QwenImagePolicy.from_pretrained(cfg)
    else:
        raise ValueError(f"model.preset must be 'tiny' or 'qwen_image', got {cfg.preset!r}")


def __getattr__(name: str):
    if name == "QwenImagePolicy":
        from roll_spotlight.models.qwen_image import QwenImagePolicy

        return QwenImagePolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
