"""DiT policies: the tiny pixel-space Qwen-Image model for CPU runs and the real Qwen-Image path.

Everything but `ModelConfig` is imported lazily (on first attribute access): configs are
validated in processes that must not pay for torch and diffusers (the CLI, ROLL's driver), and
`QwenImagePolicy` pulls in the transformers Qwen2.5-VL stack, which tiny runs never need.
"""

from __future__ import annotations

from typing import Sequence

from roll_spotlight.lazy import lazy_exports
from roll_spotlight.models.model_config import ModelConfig
from roll_spotlight.models.lora import LoraConfig

_LAZY = {
    "Conditioning": "roll_spotlight.models.policy",
    "DiTPolicy": "roll_spotlight.models.policy",
    "TinyShapesDiT": "roll_spotlight.models.tiny",
    "WordTokenizer": "roll_spotlight.models.tiny",
    "load_tiny_policy": "roll_spotlight.models.tiny",
    "save_policy": "roll_spotlight.models.tiny",
    "QwenImagePolicy": "roll_spotlight.models.qwen_image",
    "make_tiny_qwen": "roll_spotlight.models.tiny_qwen",
    "weight_version_bytes": "roll_spotlight.models.lora",
}

__all__ = [
    "Conditioning",
    "DiTPolicy",
    "LoraConfig",
    "ModelConfig",
    "QwenImagePolicy",
    "TinyShapesDiT",
    "WordTokenizer",
    "build_policy",
    "load_tiny_policy",
    "make_tiny_qwen",
    "save_policy",
    "weight_version_bytes",
]


def build_policy(cfg: ModelConfig, vocab: Sequence[str] | None = None):
    """A fresh policy for `cfg.preset`: "tiny" needs the task `vocab`; "qwen_image" loads `cfg.path`."""
    if cfg.preset == "tiny":
        if not vocab:
            raise ValueError("build_policy: preset 'tiny' needs the task vocabulary (vocab=...)")
        from roll_spotlight.models.tiny import TinyShapesDiT

        return TinyShapesDiT(cfg, vocab)
    elif cfg.preset == "qwen_image":
        from roll_spotlight.models.qwen_image import QwenImagePolicy

        return QwenImagePolicy.from_pretrained(cfg)
    else:
        raise ValueError(f"model.preset must be 'tiny' or 'qwen_image', got {cfg.preset!r}")


__getattr__ = lazy_exports(__name__, _LAZY)
