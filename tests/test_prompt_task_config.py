"""`task.name: prompts` in the run config: keys, start-up checks, the OCR prompt command."""
from __future__ import annotations

import json

import pytest

from roll_spotlight.cli import main
from roll_spotlight.config import ConfigError, RunConfig, TaskConfig, load_config
from tests.runtime_helpers import REPO

QWEN = ["model.preset=qwen_image", "model.path=/nonexistent/qwen", "model.image_size=512"]


def _files(tmp_path, train_lines, test_lines, suffix=".txt"):
    train, test = tmp_path / f"train{suffix}", tmp_path / f"test{suffix}"
    train.write_text("\n".join(train_lines) + "\n")
    test.write_text("\n".join(test_lines) + "\n")
    return str(train), str(test)


def test_prompt_files_need_both_files_and_a_real_text_encoder(tmp_path):
    with pytest.raises(ValueError, match="task.test_file"):
        TaskConfig(name="prompts", train_file="a.txt")
    with pytest.raises(ValueError, match="task.train_file.*task.name=prompts only"):
        TaskConfig(train_file="a.txt")
    train, test = _files(tmp_path, ["a sign saying \"Hi\""], ["a cup saying \"Yo\""])
    task = ["task.name=prompts", f"task.train_file={train}", f"task.test_file={test}"]
    with pytest.raises(ConfigError, match="model.preset=qwen_image"):
        load_config(RunConfig, REPO / "configs" / "tiny_shapes.yaml", task)
    cfg = load_config(RunConfig, REPO / "configs" / "tiny_shapes.yaml", [*task, *QWEN, "reward.name=ocr"])
    assert cfg.task.train_file == train


def test_geneval_reward_reads_metadata_from_the_task_files(tmp_path):
    line = json.dumps({"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"})
    train, test = _files(tmp_path, [line], [line], suffix=".jsonl")
    cfg = load_config(RunConfig, REPO / "configs" / "tiny_shapes.yaml",
                      ["task.name=prompts", f"task.train_file={train}", f"task.test_file={test}", *QWEN,
                       "reward.name=geneval", "reward.kwargs={detector_path: d, clip_path: c}"])
    assert cfg.reward.kwargs["metadata_file"] == [train, test]


def test_check_names_the_line_of_an_ocr_prompt_without_a_target(tmp_path, capsys):
    train, test = _files(tmp_path, ["a sign saying \"Hi\"", "a sign without a target"], ["a cup saying \"Yo\""])
    qwen = [*QWEN[:1], f"model.path={tmp_path}", *QWEN[2:]]  # an existing directory: the prompt check comes next
    code = main(["train", "--check", "--config", str(REPO / "configs" / "tiny_shapes.yaml"),
                 "-o", "task.name=prompts", "-o", f"task.train_file={train}", "-o", f"task.test_file={test}",
                 *[x for o in qwen for x in ("-o", o)], "-o", "reward.name=ocr", "-o", "reward.kwargs={}"])
    assert code == 2
    assert f"{train}:2" in capsys.readouterr().err


def test_prompts_ocr_command_writes_disjoint_train_and_test_files(tmp_path, capsys):
    assert main(["prompts", "ocr", "--out", str(tmp_path), "--train", "50", "--test", "10"]) == 0
    train = (tmp_path / "train.txt").read_text().splitlines()
    test = (tmp_path / "test.txt").read_text().splitlines()
    assert len(train) == 50 and len(test) == 10 and not set(train) & set(test)
    assert all(line.count('"') == 2 for line in train + test)
