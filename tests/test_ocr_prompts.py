"""Tier 1: the shipped OCR prompt generator and the OCR prompt-file check."""
import collections

import numpy as np
import pytest

from roll_spotlight.tasks.ocr_prompts import (
    MAX_TARGET_CHARS,
    PHRASES,
    TEMPLATES,
    WORD_COUNT_WEIGHTS,
    check_ocr_prompt_file,
    make_ocr_prompts,
    split_phrases,
    write_ocr_prompts,
)
from roll_spotlight.tasks.ocr_text import quoted_target
from roll_spotlight.tasks.prompt_files import load_prompt_file


def test_phrases_match_their_word_count_and_length():
    for words, phrases in PHRASES.items():
        assert len(set(phrases)) == len(phrases)
        for phrase in phrases:
            assert len(phrase.split()) == words and len(phrase) <= MAX_TARGET_CHARS and '"' not in phrase


def test_templates_quote_the_target_once():
    for template in TEMPLATES:
        assert template.count('"') == 2 and '"{text}"' in template
        assert quoted_target(template.format(text="Hello There")) == "Hello There"


def test_train_and_test_targets_are_disjoint():
    for words in PHRASES:
        train, test = split_phrases(words)
        assert train and test and not set(train) & set(test)
    train_targets = {quoted_target(p) for p in make_ocr_prompts("train", 3000, seed=1)}
    test_targets = {quoted_target(p) for p in make_ocr_prompts("test", 500, seed=1)}
    assert not train_targets & test_targets


def test_seeded_distinct_and_length_distribution():
    prompts = make_ocr_prompts("train", 4000, seed=7)
    assert prompts == make_ocr_prompts("train", 4000, seed=7)
    assert prompts != make_ocr_prompts("train", 4000, seed=8)
    assert len(set(prompts)) == len(prompts)
    words = collections.Counter(len(quoted_target(p).split()) for p in prompts)
    for count, weight in WORD_COUNT_WEIGHTS.items():  # multinomial draw: within 4 standard deviations
        sd = np.sqrt(len(prompts) * weight * (1 - weight))
        assert abs(words[count] - len(prompts) * weight) < 4 * sd
    median = np.median([len(quoted_target(p)) for p in prompts])
    assert 12 <= median <= 20  # flow_grpo's OCR prompts: median 17 characters


def test_write_and_check(tmp_path):
    train, test = write_ocr_prompts(tmp_path / "ocr", n_train=300, n_test=40, seed=3)
    assert len(load_prompt_file(train)) == 300 and len(load_prompt_file(test)) == 40
    assert not {r.text for r in load_prompt_file(train)} & {r.text for r in load_prompt_file(test)}
    assert len(check_ocr_prompt_file(test)) == 40


def test_too_many_prompts_is_an_error():
    with pytest.raises(ValueError, match="n_test"):
        make_ocr_prompts("test", 10**6, seed=0)
    with pytest.raises(ValueError, match="n_train=0"):
        make_ocr_prompts("train", 0, seed=0)


@pytest.mark.parametrize("line,message", [
    ("A poster with no quoted text", "no text in a pair of double quotes"),
    ('A sign reading "   " at dusk', "quoted OCR target"),
])
def test_check_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "train.txt"
    path.write_text('A sign that says "Open"\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message) as info:
        check_ocr_prompt_file(path)
    assert f"{path}:3" in str(info.value)
