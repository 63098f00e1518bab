"""Tier 1: prompt sets from files (one prompt per line, GenEval metadata.jsonl) and their errors."""
import json

import pytest

from roll_spotlight.tasks.prompt_files import (
    GENEVAL_CLASSES,
    GENEVAL_COLORS,
    TXT_TAG,
    PromptFileTask,
    load_prompt_file,
    metadata_by_prompt,
    prompt_format,
)

COUNTING = {"tag": "counting", "prompt": "a photo of three cups",
            "include": [{"class": "cup", "count": 3}], "exclude": [{"class": "cup", "count": 4}]}
POSITION = {"tag": "position", "prompt": "a photo of a cow right of a laptop",
            "include": [{"class": "laptop", "count": 1}, {"class": "cow", "count": 1, "position": ["right of", 0]}]}
COLOR = {"tag": "color_attr", "prompt": "a photo of a pink handbag and a black scissors",
         "include": [{"class": "handbag", "count": 1, "color": "pink"},
                     {"class": "scissors", "count": 1, "color": "black"}]}


def _jsonl(path, objects):
    path.write_text("".join(json.dumps(o) + "\n" for o in objects), encoding="utf-8")
    return path


def test_vocabularies_are_geneval_sizes():
    assert len(GENEVAL_CLASSES) == len(set(GENEVAL_CLASSES)) == 80
    assert len(GENEVAL_COLORS) == 10 and "computer mouse" in GENEVAL_CLASSES


def test_txt_lines_are_stripped_and_blank_lines_skipped(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text('  a sign that says "Open"  \n\nA poster\r\n', encoding="utf-8")
    records = load_prompt_file(path)
    assert [r.text for r in records] == ['a sign that says "Open"', "A poster"]
    assert {r.tag for r in records} == {TXT_TAG} and records[1].where.endswith("train.txt:3")
    assert all(r.metadata is None for r in records)


def test_geneval_lines_keep_tag_and_metadata(tmp_path):
    records = load_prompt_file(_jsonl(tmp_path / "test_metadata.jsonl", [COUNTING, POSITION, COLOR]))
    assert [r.tag for r in records] == ["counting", "position", "color_attr"]
    assert records[1].text == POSITION["prompt"] and records[1].metadata == POSITION


def test_format_from_suffix_or_explicit(tmp_path):
    assert prompt_format("a/b.txt") == "txt" and prompt_format("m.jsonl") == "geneval"
    assert prompt_format("prompts.list", "txt") == "txt"
    with pytest.raises(ValueError, match="task.format"):
        prompt_format("prompts.list")
    with pytest.raises(ValueError, match="task.format='csv'"):
        prompt_format("a.txt", "csv")
    path = _jsonl(tmp_path / "prompts.data", [COUNTING])
    assert load_prompt_file(path, "geneval")[0].metadata == COUNTING


@pytest.mark.parametrize("content,where", [
    (b"", "empty"),
    (b"\n  \n", "empty"),
    (b"fine\n\xff\xfe bad\n", ":2: not UTF-8"),
])
def test_bad_txt_files(tmp_path, content, where):
    path = tmp_path / "p.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=where) as info:
        load_prompt_file(path)
    assert str(path) in str(info.value)


def _bad(**changes):
    obj = json.loads(json.dumps(POSITION))
    for key, value in changes.items():
        if value is None:
            obj.pop(key)
        else:
            obj[key] = value
    return json.dumps(obj)


@pytest.mark.parametrize("line,message", [
    ('{"tag": "x", "prompt": ', "malformed JSON"),
    ("[1, 2]", "expected a JSON object"),
    (_bad(prompt=None), "key 'prompt'"),
    (_bad(tag=None), "key 'tag'"),
    (_bad(include=None), "key 'include'"),
    (_bad(include=[{"class": "unicorn", "count": 1}]), r"include\[0\].class='unicorn'"),
    (_bad(include=[{"class": "cow", "count": 0}]), r"include\[0\].count=0"),
    (_bad(include=[{"class": "cow"}]), r"include\[0\].count=None"),
    (_bad(include=[{"class": "cow", "count": 1, "color": "teal"}]), r"include\[0\].color='teal'"),
    (_bad(include=[{"class": "cow", "count": 1, "size": 2}]), r"include\[0\]: unknown key 'size'"),
    (_bad(include=[{"class": "cow", "count": 1, "position": ["left of", 0]}]), r"include\[0\].position\[1\]=0"),
    (_bad(include=[{"class": "cow", "count": 1}, {"class": "dog", "count": 1, "position": ["near", 0]}]),
     r"include\[1\].position\[0\]='near'"),
    (_bad(exclude=[{"class": "cow", "count": 2, "color": "red"}]), r"exclude\[0\]: unknown key 'color'"),
])
def test_bad_geneval_lines_name_file_line_and_key(tmp_path, line, message):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(COUNTING) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message) as info:
        load_prompt_file(path)
    assert f"{path}:2" in str(info.value)


def test_metadata_by_prompt_accepts_repeats_rejects_conflicts(tmp_path):
    records = load_prompt_file(_jsonl(tmp_path / "m.jsonl", [COUNTING, COUNTING, COLOR]))
    assert set(metadata_by_prompt(records)) == {COUNTING["prompt"], COLOR["prompt"]}
    other = dict(COUNTING, tag="single_object")
    records = load_prompt_file(_jsonl(tmp_path / "n.jsonl", [COUNTING, other]))
    with pytest.raises(ValueError, match="n.jsonl:2"):
        metadata_by_prompt(records)


def test_prompt_file_task_pool_and_validation(tmp_path):
    from roll_spotlight.config.run import TaskConfig
    from roll_spotlight.training.prompt_pools import VAL_SEED_BASE, train_pool, validation_set

    train = _jsonl(tmp_path / "train_metadata.jsonl", [COUNTING, POSITION])
    test = _jsonl(tmp_path / "test_metadata.jsonl", [COLOR, COUNTING, POSITION])
    cfg = TaskConfig(name="prompts", train_file=str(train), test_file=str(test))
    pool = train_pool(cfg)
    assert len(pool) == 2 and pool.tags == ("counting", "position") and pool.texts[0] == COUNTING["prompt"]
    val = validation_set(cfg)
    assert val.texts[0] == COLOR["prompt"] and val.seeds == (VAL_SEED_BASE, VAL_SEED_BASE + 1, VAL_SEED_BASE + 2)
    assert val.tags == ("color_attr", "counting", "position")
    capped = validation_set(TaskConfig(name="prompts", train_file=str(train), test_file=str(test), val_prompts=2))
    assert capped.texts == val.texts[:2]


def test_prompt_file_task_config_errors(tmp_path):
    with pytest.raises(ValueError, match="task.train_file"):
        PromptFileTask("", "t.txt")
    with pytest.raises(ValueError, match="task.format='yaml'"):
        PromptFileTask("a.txt", "b.txt", "yaml")
    task = PromptFileTask(str(tmp_path / "missing.txt"), str(tmp_path / "t.txt"))
    with pytest.raises(ValueError, match="missing.txt: cannot read"):
        task.train_records()
