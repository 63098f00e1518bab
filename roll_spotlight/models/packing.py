"""2x2 patch packing in the token layout that `QwenImagePipeline` uses.

A (B, C, H, W) grid becomes (B, (H/2)*(W/2), 4*C) tokens in row-major order of 2x2 patches; each
token's features are ordered (channel, dy, dx). Keeping the pipeline's layout means a tiny model and
a real Qwen-Image checkpoint see latents the same way, and `img_shapes` for RoPE is (1, H/2, W/2).
"""

from __future__ import annotations

import torch


def pack_2x2(grid: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, (H/2)*(W/2), 4*C); H and W must be even."""
    b, c, h, w = grid.shape
    assert h % 2 == 0 and w % 2 == 0, f"grid {tuple(grid.shape)} needs even height and width"
    patches = grid.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_2x2(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(B, (H/2)*(W/2), 4*C) -> (B, C, H, W); the inverse of `pack_2x2`."""
    b, n, c4 = tokens.shape
    assert n == (height // 2) * (width // 2) and c4 % 4 == 0, f"tokens {tuple(tokens.shape)} vs grid {height}x{width}"
    patches = tokens.reshape(b, height // 2, width // 2, c4 // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return patches.reshape(b, c4 // 4, height, width)


def img_shapes_for(batch_size: int, height: int, width: int) -> list[list[tuple[int, int, int]]]:
    """The transformer's `img_shapes` argument for a batch of (height x width) latent grids."""
    return [[(1, height // 2, width // 2)]] * batch_size
