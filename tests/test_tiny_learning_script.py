"""benchmarks/tiny_learning.py checks every seed's config before the first seed trains."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from roll_spotlight.config.strict import ConfigError

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


def test_threads_option_sets_torch_threads_before_training(tmp_path):
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        with pytest.raises(ConfigError, match="max_stepz"):  # fails at the config check, after the threads
            _script().main(["--config", str(REPO / "configs" / "tiny_shapes.yaml"), "--threads", "1",
                            "--out", str(tmp_path), "-o", "max_stepz=3"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_negative_threads_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _script().main(["--threads", "-1", "--out", str(tmp_path)])
    assert "--threads" in capsys.readouterr().err
