"""Paired statistics between two evaluations of the same validation pairs."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from roll_spotlight.training.evaluate import Evaluation, paired_gain


def _ev(rewards, strict=None) -> Evaluation:
    rewards = np.asarray(rewards, dtype=np.float64)
    return Evaluation(rewards, np.asarray(strict if strict is not None else np.zeros_like(rewards)))


def test_paired_gain_is_the_mean_difference_with_its_standard_error():
    before, after = _ev([0.1, 0.2, 0.3, 0.4], [0, 0, 1, 0]), _ev([0.2, 0.2, 0.5, 0.4], [1, 0, 1, 0])
    out = paired_gain(before, after)
    diff = np.array([0.1, 0.0, 0.2, 0.0])
    assert out["gain"] == pytest.approx(diff.mean())
    assert out["gain_se"] == pytest.approx(diff.std(ddof=1) / 2)
    assert out["z"] == pytest.approx(out["gain"] / out["gain_se"])
    assert out["strict_change"] == pytest.approx(0.25)


@pytest.mark.parametrize("shift, z", [(0.0, 0.0), (0.1, math.inf), (-0.1, -math.inf)])
def test_zero_spread_gives_a_defined_z_without_warnings(shift, z):
    base = _ev([0.2, 0.4, 0.6])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = paired_gain(base, _ev(base.rewards + shift))
    assert out["gain_se"] == pytest.approx(0.0, abs=1e-15)
    if shift == 0.0:
        assert out["z"] == 0.0
    else:
        assert out["z"] == z or abs(out["z"]) > 1e6  # float rounding can leave a tiny nonzero spread
