"""The ROLL launcher's answers to bad recipes (tier 4, `-m roll`): one line on stderr naming the key
and the recipe file, exit status 2, no traceback (``--debug`` shows it), and missing model, prompt
and reward-model directories found before ROLL's ``init()`` could start a cluster."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.roll

RECIPES = Path(__file__).resolve().parents[1] / "configs" / "roll"
ENV_DIRS = ("QWEN_IMAGE_DIR", "OCR_PROMPTS_DIR", "PICKSCORE_PROMPTS_DIR", "PICKSCORE_DIR", "PICKSCORE_PROCESSOR_DIR")


@pytest.fixture
def user(tmp_path, monkeypatch):
    """A user in their own directory (ROLL writes ./output/logs there) naming the recipes' folder
    relatively, with no model directories set, and a fake `ray` command first on PATH that records
    any call: ROLL's init() shells out to `ray status` / `ray start` to start a cluster."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'ray-called'}\nexit 1\n")
    (bin_dir / "ray").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    for name in ENV_DIRS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return os.path.relpath(RECIPES, tmp_path)


def _launch(*argv: str) -> tuple[int, str]:
    """The launcher as a user runs it (a process of its own: ROLL's loggers outlive a test's capture)."""
    out = subprocess.run([sys.executable, "-m", "roll_spotlight.launch", *argv], capture_output=True, text=True)
    assert not Path("ray-called").exists(), "ROLL's init() ran the ray command"
    return out.returncode, out.stderr


def _one_line_error(err: str) -> str:
    """The error's one line (other stderr lines are log records, e.g. the patches applied)."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("python -m roll_spotlight.launch: error: ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("override, key", [
    ("++trainer.world_size=1", "role 'trainer'"),              # a role name of earlier recipes
    ("++spot.max_wrokers=3", "unknown key 'spot.max_wrokers'"),
    ("max_steps=abc", '"max_steps"'),                           # a ROLL key of the wrong type (dacite)
    ("nosuchkey=1", "'nosuchkey'"),                             # a Hydra override of a key the recipe lacks
    ("actor_infer.world_size=0", "actor_infer.world_size"),
    ("++patches=[no_such_patch]", "patches"),
])
def test_a_bad_recipe_is_one_line_naming_key_and_file(user, override, key):
    code, err = _launch("--config_path", user, "--config_name", "tiny_shapes_roll", override)
    line = _one_line_error(err)
    assert code == 2 and key in line and os.path.join(user, "tiny_shapes_roll.yaml") in line


@pytest.mark.parametrize("check", [True, False], ids=["check", "launch"])
def test_a_typo_added_with_plus_is_an_unknown_top_level_key(user, check):
    """dacite would drop `pipline` silently; the launcher names it before ROLL's init()."""
    code, err = _launch("--config_path", user, "--config_name", "tiny_shapes_roll", "+pipline.foo=1",
                        *(["--check"] if check else []))
    line = _one_line_error(err)
    assert code == 2 and "unknown top-level key 'pipline'" in line
    assert os.path.join(user, "tiny_shapes_roll.yaml") in line


def test_a_missing_recipe_is_named(user):
    code, err = _launch("--config_path", user, "--config_name", "tiny_shapes_rol", "--check")
    assert code == 2 and os.path.join(user, "tiny_shapes_rol.yaml") in _one_line_error(err)


def test_debug_shows_the_traceback(user):
    code, err = _launch("--config_path", user, "--config_name", "tiny_shapes_roll", "++spot.max_wrokers=3", "--debug")
    assert code != 0 and "Traceback" in err and "ConfigError: unknown key 'spot.max_wrokers'" in err


@pytest.mark.parametrize("recipe, keys", [
    ("qwen_image_ocr_512", ["pretrain=/missing/QWEN_IMAGE_DIR", "(set $QWEN_IMAGE_DIR)",
                            "task.train_file=/missing/OCR_PROMPTS_DIR/train.txt", "(set $OCR_PROMPTS_DIR)"]),
    ("qwen_image_pickscore_512", ["pretrain=", "reward_fn.kwargs.model_path=/missing/PICKSCORE_DIR",
                                  "(set $PICKSCORE_DIR)", "reward_fn.kwargs.processor_path=",
                                  "(set $PICKSCORE_PROCESSOR_DIR)"]),
])
@pytest.mark.parametrize("check", [True, False], ids=["check", "launch"])
def test_missing_directories_stop_the_launch_before_rolls_init(user, recipe, keys, check):
    code, err = _launch("--config_path", user, "--config_name", recipe, *(["--check"] if check else []))
    line = _one_line_error(err)
    assert code == 2 and os.path.join(user, f"{recipe}.yaml") in line
    assert all(key in line for key in keys), line


def test_only_an_unset_model_directory_names_only_it(user, tmp_path, monkeypatch):
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for split in ("train", "test"):
        (prompts / f"{split}.txt").write_text('a sign that reads "Open"\n')
    monkeypatch.setenv("OCR_PROMPTS_DIR", str(prompts))
    code, err = _launch("--config_path", user, "--config_name", "qwen_image_ocr_512", "--check")
    line = _one_line_error(err)
    assert code == 2 and "pretrain=/missing/QWEN_IMAGE_DIR: no such directory (set $QWEN_IMAGE_DIR)" in line
    assert "task." not in line


def test_the_pipeline_checks_paths_before_it_builds_clusters(user):
    """A pipeline started by another launcher (after ROLL's init()) still stops before its clusters."""
    from roll_spotlight.config.strict import ConfigError
    from roll_spotlight.roll import SpotlightPipeline
    from roll_spotlight.roll.spotlight_config import compose_mapping, from_mapping

    cfg = from_mapping(compose_mapping(user, "qwen_image_ocr_512"), source="qwen_image_ocr_512.yaml")
    with pytest.raises(ConfigError, match=r"qwen_image_ocr_512.yaml: .*pretrain=/missing/QWEN_IMAGE_DIR"):
        SpotlightPipeline(cfg)
