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


def test_numpy_2_next_to_roll_is_a_problem_with_the_fix(monkeypatch):
    """ROLL pins numpy<2; opencv-python 5 (pulled by an unbounded OCR extra) upgrades it."""
    _fake(monkeypatch, {"roll": "0.3.0", "peft": "0.18.1", "numpy": "2.4.6", "pyarrow": "25.0.1",
                        "opencv-python": "5.0.0.93"})
    report = check_environment(raise_on_problem=False)
    assert len(report.problems) == 1 and "numpy 2.4.6" in report.problems[0]
    assert "pip install 'numpy<2'" in report.problems[0]


def test_opencv_that_needs_numpy_2_is_a_problem_next_to_numpy_1(monkeypatch):
    versions = {"roll": "0.3.0", "peft": "0.18.1", "numpy": "1.26.4", "pyarrow": "25.0.1"}
    _fake(monkeypatch, versions | {"opencv-python": "4.12.0.88"})
    report = check_environment(raise_on_problem=False)
    assert len(report.problems) == 1 and "opencv-python<4.12" in report.problems[0]
    _fake(monkeypatch, versions | {"opencv-python": "4.11.0.86"})
    assert check_environment().ok


def test_ocr_and_roll_extras_keep_rolls_numpy_pin():
    """`pip install '.[roll,ocr]'` beside ROLL must not pull NumPy 2 (issue: opencv-python 5 did)."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[1] / "setup.py").read_text())
    table = next(k.value for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg == "extras_require")
    extras = {ast.literal_eval(key): ast.literal_eval(value) for key, value in zip(table.keys, table.values)
              if ast.literal_eval(key) in ("ocr", "roll")}  # the other extras may name shared lists
    assert any(r.replace(" ", "").startswith("opencv-python") and "<4.12" in r for r in extras["ocr"]), extras["ocr"]
    assert "numpy<2" in [r.replace(" ", "") for r in extras["roll"]], extras["roll"]


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
