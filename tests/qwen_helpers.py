"""The tiny random Qwen-Image pipeline directory for tests (built by `roll_spotlight.models.tiny_qwen`)."""
from __future__ import annotations

from roll_spotlight.models.tiny_qwen import TEXT_DIM, Z_DIM, make_tiny_qwen, tiny_qwen_components

save_tiny_qwen = make_tiny_qwen

__all__ = ["TEXT_DIM", "Z_DIM", "make_tiny_qwen", "save_tiny_qwen", "tiny_qwen_components"]
