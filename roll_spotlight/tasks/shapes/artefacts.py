"""What the shapes reward cannot see: light in the black background between the shapes.

The detector snaps every pixel to the nearest palette colour (or background) within a wide
tolerance, so a faint haze or a texture over the background scores the same as black. Two
measures over each image's background pixels (nearest palette entry is the background, and so
are all 8 neighbours, so the blurred rims of shapes do not count):

- `level`: their mean intensity, 0-255 (a clean background is 0);
- `grid`: the spread (population std) of that mean over the pixel positions inside one token's
  patch (2 x 2 pixels in the tiny model): a texture that repeats with the patch grid, which is
  what a drift of the per-token output projection or of its input draws.

Images with no background pixel at some patch position give NaN (ignored in the run's means).
"""
from __future__ import annotations

import numpy as np

from roll_spotlight.tasks.shapes.detect import _PALETTE

PATCH = 2  # pixels per token side in the tiny model (32 x 32 RGB packed 2 x 2)


def background_mask(image: np.ndarray) -> np.ndarray:
    """bool (H, W): pixels whose nearest palette entry is the background, with every neighbour too."""
    dist = ((image.astype(np.float32)[:, :, None, :] - _PALETTE) ** 2).sum(-1)
    bg = np.pad(dist.argmin(-1) == 0, 1, constant_values=True)
    h, w = image.shape[:2]
    core = np.ones((h, w), dtype=bool)
    for dy in range(3):
        for dx in range(3):
            core &= bg[dy:dy + h, dx:dx + w]
    return core


def background_artefacts(images: np.ndarray, patch: int = PATCH) -> tuple[np.ndarray, np.ndarray]:
    """(level, grid) per image of uint8 (B, H, W, 3) `images` (module docstring)."""
    levels, grids = [], []
    for image in images:
        mask = background_mask(image)
        intensity = image.astype(np.float64).mean(-1)
        levels.append(intensity[mask].mean() if mask.any() else np.nan)
        phases = [intensity[a::patch, b::patch][mask[a::patch, b::patch]] for a in range(patch) for b in range(patch)]
        grids.append(np.std([p.mean() for p in phases]) if all(p.size for p in phases) else np.nan)
    return np.asarray(levels), np.asarray(grids)
