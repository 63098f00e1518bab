"""benchmarks/tiny_learning.py checks every seed's config before the first seed trains."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from roll_spotlight.configuration import ConfigError

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("tiny_learning_script", REPO / "benchmarks" / "tiny_learning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reward_kwargs_the_reward_does_not_take_fail_before_training(tmp_path):
    # the config's shapes kwargs ({mode: mix}) stay when only the name is overridden
    with pytest.raises(ConfigError, match=r"reward\.kwargs.*'brightness'|'brightness'.*reward\.kwargs"):
        _script().run(str(REPO / "configs" / "tiny_shapes.yaml"), [0, 1], tmp_path / "runs",
                      ["reward.name=brightness"])
    assert not (tmp_path / "runs").exists()


def test_unknown_key_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="max_stepz"):
        _script().run(str(REPO / "configs" / "tiny_shapes.yaml"), [0], tmp_path / "runs", ["max_stepz=3"])
