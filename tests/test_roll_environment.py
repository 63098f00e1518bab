"""The dependency decision next to ROLL (peft >= 0.18.1) and the start-up check that enforces it."""
from __future__ import annotations

import pytest

from roll_spotlight.roll import environment
from roll_spotlight.roll.environment import EnvironmentProblem, check_environment, release


def test_release_parses_versions():
    assert release("0.18.1") == (0, 18, 1)
    assert release("0.18.1.dev0") == (0, 18, 1)
    assert release("2.48.0rc1") == (2, 48, 0)
    with pytest.raises(ValueError):
        release("dev")


def _fake(monkeypatch, versions: dict, roll: bool = True):
    monkeypatch.setattr(environment, "_version", lambda dist: versions.get(dist))
    monkeypatch.setattr(environment, "roll_available", lambda: roll)
    monkeypatch.setattr(environment.importlib.util, "find_spec", lambda name: object() if roll else None)


def test_roll_pinned_peft_is_a_problem_with_the_fix(monkeypatch):
    _fake(monkeypatch, {"roll": "0.3.0", "peft": "0.12.0", "numpy": "1.26.4", "pyarrow": "25.0.1"})
    with pytest.raises(EnvironmentProblem) as err:
        check_environment()
    assert "peft 0.12.0" in str(err.value) and "pip install 'peft>=0.18.1'" in str(err.value)


def test_recommended_set_passes(monkeypatch):
    _fake(monkeypatch, {"roll": "0.3.0", "peft": "0.18.1", "numpy": "1.26.4", "pyarrow": "25.0.1"})
    report = check_environment()
    assert report.ok and report.peft_version == "0.18.1" and not report.notes


def test_pyarrow_26_with_numpy_1_is_a_problem(monkeypatch):
    _fake(monkeypatch, {"roll": "0.3.0", "peft": "0.18.1", "numpy": "1.26.4", "pyarrow": "26.0.0"})
    report = check_environment(raise_on_problem=False)
    assert not report.ok and "pyarrow<26" in report.problems[0]


def test_missing_roll_gives_install_instructions(monkeypatch):
    _fake(monkeypatch, {"peft": "0.18.1"}, roll=False)
    report = check_environment(raise_on_problem=False)
    assert "ROLL is not installed" in report.problems[0] and "v0.3.0" in report.problems[0]


def test_other_roll_version_is_a_note_not_a_problem(monkeypatch):
    _fake(monkeypatch, {"roll": "0.4.0", "peft": "0.18.1"})
    report = check_environment()
    assert report.ok and "0.4.0" in report.notes[0]


@pytest.mark.roll
def test_installed_environment_satisfies_the_decision(tmp_path, monkeypatch):
    """In a real ROLL environment: the check passes and both sides of the conflict import."""
    monkeypatch.chdir(tmp_path)
    report = check_environment(import_model=True)
    assert release(report.peft_version) >= environment.PEFT_MIN
    from diffusers import QwenImageTransformer2DModel  # noqa: F401
    from roll.distributed.strategy.fsdp2_strategy import FSDP2TrainStrategy  # noqa: F401
