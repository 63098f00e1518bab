"""The base diagnostics: probe prompts, the posterior-mean reference and the model's swap errors."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from roll_spotlight.config.strict import load_config
from roll_spotlight.models import build_policy
import benchmarks.base_diagnostics as D
from roll_spotlight.config.run import RunConfig
from roll_spotlight.training.prompt_pools import task_vocab

REPO = Path(__file__).resolve().parents[1]


def test_probe_set_swaps_exactly_one_word():
    probes = D.probe_set(2, colors=("red", "blue"))
    assert len(probes.prompts) == len(probes.seeds) == 2 * 3 * 2 == len(set(probes.seeds))
    for true, shape, color in zip(probes.prompts, probes.shape_swapped, probes.color_swapped):
        t, s, c = true.split(), shape.split(), color.split()
        assert t[1] == s[1] and t[2] != s[2]
        assert t[2] == c[2] and t[1] != c[1]
    with pytest.raises(ValueError, match="per_prompt"):
        D.probe_set(0)
    with pytest.raises(ValueError, match="colors"):
        D.probe_set(1, colors=("red", "mauve"))


def test_reference_pays_for_a_swapped_word():
    probes = D.probe_set(1, colors=("red", "green"))
    errors = D.posterior_errors(probes, [0.6], size=32, bank=300)
    row = errors[0.6]
    assert row["shape_swapped"] > 1.5 * row["true"]
    assert row["color_swapped"] > 2 * row["true"]
    with pytest.raises(ValueError, match="sigmas"):
        D.posterior_errors(probes, [1.0], size=32, bank=48)


class _Knows:
    """A stub policy whose velocity points exactly at the rendered image of the true prompt."""

    def __init__(self, policy, x0: torch.Tensor) -> None:
        self.cfg, self._policy, self._x0, self.training = policy.cfg, policy, x0, False

    def encode_images(self, images):
        return self._policy.encode_images(images)

    def encode_prompts(self, prompts):
        return prompts

    def velocity(self, xt, sigma, cond):
        return (xt - self._x0) / sigma.view(-1, 1, 1)

    def eval(self):
        return self

    def train(self, mode=True):
        return self


def test_model_errors_measure_the_x0_error_of_the_policy():
    torch.manual_seed(0)
    cfg = load_config(RunConfig, REPO / "configs" / "tiny_shapes.yaml", ["model.num_layers=1"])
    policy = build_policy(cfg.model, vocab=task_vocab(cfg.task))
    probes = D.probe_set(1, colors=("red", "green"))
    images = torch.from_numpy(D.rendered(probes.prompts, probes.seeds, 32)).permute(0, 3, 1, 2) * 0.5 + 0.5
    exact = D.model_errors(_Knows(policy, policy.encode_images(images)), probes, [0.5, 0.9])
    assert all(v < 1e-10 for row in exact.values() for v in row.values())
    random = D.model_errors(policy, probes, [0.5, 0.9])
    assert set(random) == {0.5, 0.9} and all(set(r) == set(D.SWAPS) for r in random.values())
    assert all(math.isfinite(v) and v > 1e-3 for r in random.values() for v in r.values())
    assert policy.training  # restored
    costs = D.swap_costs(random)
    assert costs[0.5]["shape"] == pytest.approx(random[0.5]["shape_swapped"] / random[0.5]["true"])
