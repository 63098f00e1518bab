"""What the shapes reward cannot see: haze and a patch-grid texture on the black background."""
from __future__ import annotations

import numpy as np
import pytest

from roll_spotlight.tasks.shapes.artefacts import background_artefacts, background_mask


def scene(haze: float = 0.0, grid: float = 0.0) -> np.ndarray:
    """A red square on black, with a uniform haze and a texture on one pixel of every 2 x 2 patch."""
    image = np.full((32, 32, 3), haze)
    image[0::2, 0::2] += grid
    image[8:16, 8:16] = (255, 0, 0)
    return image.clip(0, 255).astype(np.uint8)


def test_a_clean_background_scores_zero_and_the_shapes_rims_are_left_out():
    level, grid = background_artefacts(scene()[None])
    assert level[0] == 0.0 and grid[0] == 0.0
    mask = background_mask(scene())
    assert not mask[7:17, 7:17].any() and mask[0, 0] and mask[31, 31]


def test_haze_raises_the_level_and_a_patch_grid_texture_the_grid():
    level, grid = background_artefacts(np.stack([scene(haze=12.0), scene(grid=20.0)]))
    assert level[0] == pytest.approx(12.0) and grid[0] == pytest.approx(0.0)
    assert level[1] == pytest.approx(5.0) and grid[1] == pytest.approx(np.std([20.0, 0, 0, 0]))


def test_the_reward_cannot_see_either():
    from roll_spotlight.rewards.shapes_reward import ShapesReward

    prompt = ["a red square"]
    clean, dirty = (ShapesReward(mode="mix")(scene(**kw)[None], prompt).rewards[0]
                    for kw in ({}, {"haze": 30.0, "grid": 40.0}))
    assert clean == dirty


def test_an_image_with_no_background_gives_nan():
    level, grid = background_artefacts(np.full((1, 8, 8, 3), 255, dtype=np.uint8))
    assert np.isnan(level[0]) and np.isnan(grid[0])
