"""Prompt grammar of the shapes world: parse, format, vocabulary, deterministic prompt sets.

Grammar (lower case, words separated by single spaces)::

    scene    := object | object "and" object | object relation object
    object   := "a" [colour] shape | number colour shape "s"
    number   := "two" | "three" | "four"
    relation := "left of" | "right of" | "above" | "below"

Which structures are allowed, and the tag of each, is defined once in `spec.infer_tag`.

Train and validation sets are drawn from distinct seeds but from the same finite prompt space
(`enumerate_specs`: 3 + 12 + 36 + 60 + 72 + 528 = 711 prompts), so they overlap in text, as
GenEval-like sets do. Measured with `text_overlap`: 87% of a 256-prompt "val" set (seed 0) occurs in a
1024-prompt "train" set (seed 0): every single_object, colors and counting prompt, 39-40 of 43 two-object
prompts and 15 of 43 position prompts. What differs between them is the initial noise (and, for
rendered targets, the layout seed).
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from roll_spotlight.tasks.shapes.spec import COLORS, RELATIONS, SHAPES, TAGS, ObjectSpec, SceneSpec, infer_tag

NUMBER_WORDS: dict[int, str] = {2: "two", 3: "three", 4: "four"}
_WORD_NUMBERS = {w: n for n, w in NUMBER_WORDS.items()}
_PLURALS = {f"{s}s": s for s in SHAPES}
VOCAB: tuple[str, ...] = (
    ("a", "and", "of", "left", "right", "above", "below")
    + tuple(NUMBER_WORDS.values()) + tuple(COLORS) + SHAPES + tuple(_PLURALS)
)
MAX_PROMPT_WORDS = 8  # "a yellow triangle left of a green square"
SPLITS: dict[str, int] = {"train": 0, "val": 1, "test": 2}


@dataclass(frozen=True)
class TaskPrompt:
    text: str
    tag: str
    spec: SceneSpec


def format_object(obj: ObjectSpec) -> str:
    words = [obj.color] if obj.color is not None else []
    if obj.count == 1:
        return " ".join(["a", *words, obj.shape])
    return " ".join([NUMBER_WORDS[obj.count], *words, obj.shape + "s"])


def format_prompt(spec: SceneSpec) -> str:
    """Canonical text of a scene; `parse_prompt(format_prompt(s)) == s` for every valid spec."""
    first = format_object(spec.objects[0])
    if len(spec.objects) == 1:
        return first
    joiner = "and" if spec.relation is None else spec.relation
    return f"{first} {joiner} {format_object(spec.objects[1])}"


class _Tokens:
    """A cursor over the words of one prompt that raises errors naming the prompt and the word."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.words = text.strip().lower().split()
        self.pos = 0

    def peek(self) -> str | None:
        return self.words[self.pos] if self.pos < len(self.words) else None

    def take(self) -> str:
        word = self.peek()
        if word is None:
            raise ValueError(f"cannot parse prompt {self.text!r}: it ends early (after word {self.pos})")
        self.pos += 1
        return word

    def error(self, word: str, expected: str) -> ValueError:
        return ValueError(f"cannot parse prompt {self.text!r}: unexpected word {word!r} at position "
                          f"{self.pos - 1}, expected {expected}")


def _parse_object(tok: _Tokens) -> ObjectSpec:
    word = tok.take()
    if word == "a":
        count, shapes = 1, {s: s for s in SHAPES}
    elif word in _WORD_NUMBERS:
        count, shapes = _WORD_NUMBERS[word], _PLURALS
    else:
        raise tok.error(word, f"'a' or a number {tuple(_WORD_NUMBERS)}")
    word = tok.take()
    color = None
    if word in COLORS:
        color, word = word, tok.take()
    if word not in shapes:
        raise tok.error(word, f"a colour {tuple(COLORS)} or a shape {tuple(shapes)}")
    return ObjectSpec(shape=shapes[word], color=color, count=count)


def _parse_joiner(tok: _Tokens) -> str | None:
    """Returns None for 'and', else the relation."""
    word = tok.take()
    if word == "and":
        return None
    if word in ("left", "right"):
        if tok.take() != "of":
            raise tok.error(tok.words[tok.pos - 1], "'of'")
        return f"{word} of"
    if word in RELATIONS:
        return word
    raise tok.error(word, f"'and' or a relation {RELATIONS}")


def parse_prompt(text: str) -> SceneSpec:
    """Parse a prompt of the grammar; ValueError naming the prompt (and the bad word) otherwise."""
    tok = _Tokens(text)
    objects = [_parse_object(tok)]
    relation = None
    if tok.peek() is not None:
        relation = _parse_joiner(tok)
        objects.append(_parse_object(tok))
    if tok.peek() is not None:
        raise tok.error(tok.take(), "the end of the prompt")
    try:
        return SceneSpec(tuple(objects), relation, infer_tag(tuple(objects), relation))
    except ValueError as err:
        raise ValueError(f"prompt {text!r} is outside the grammar: {err}") from err


def tokenize(text: str) -> tuple[int, ...]:
    """Indices into VOCAB of the words of a prompt (for a learned word-embedding prompt encoder)."""
    index = {w: i for i, w in enumerate(VOCAB)}
    words = text.strip().lower().split()
    unknown = [w for w in words if w not in index]
    if unknown:
        raise ValueError(f"prompt {text!r} has words outside VOCAB: {unknown}")
    return tuple(index[w] for w in words)


@functools.lru_cache(maxsize=None)
def enumerate_specs(tag: str) -> tuple[SceneSpec, ...]:
    """Every scene of one tag, in a fixed order (the finite prompt space sampled from)."""
    if tag not in TAGS:
        raise ValueError(f"tag={tag!r} is not one of {TAGS}")
    singles = [ObjectSpec(s, c) for c in COLORS for s in SHAPES]
    candidates: list[tuple[tuple[ObjectSpec, ...], str | None]] = []
    candidates += [((ObjectSpec(s, None),), None) for s in SHAPES]
    candidates += [((ObjectSpec(s, c, n),), None) for n in range(1, 5) for c in COLORS for s in SHAPES]
    for a, b in itertools.permutations(singles, 2):
        candidates += [((a, b), None)] + [((a, b), r) for r in RELATIONS]
    return tuple(SceneSpec(objs, rel, tag) for objs, rel in candidates if infer_tag(objs, rel) == tag)


def make_prompt_set(split: str, n: int, seed: int, tags: Sequence[str] | None = None) -> list[TaskPrompt]:
    """`n` prompts, tags taken round-robin (balanced), each spec drawn uniformly within its tag.

    Deterministic in (split, n, seed, tags); different splits use different random streams.
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not one of {tuple(SPLITS)}")
    if n < 0:
        raise ValueError(f"n={n!r} must be >= 0")
    tags = tuple(TAGS if tags is None else tags)
    if not tags or any(t not in TAGS for t in tags):
        raise ValueError(f"tags={tags!r} must be a non-empty subset of {TAGS}")
    rng = np.random.default_rng([seed, SPLITS[split]])
    prompts = []
    for i in range(n):
        space = enumerate_specs(tags[i % len(tags)])
        spec = space[int(rng.integers(len(space)))]
        prompts.append(TaskPrompt(format_prompt(spec), spec.tag, spec))
    return prompts


def text_overlap(a: Sequence[TaskPrompt], b: Sequence[TaskPrompt]) -> float:
    """Fraction of the prompts of `b` whose text also occurs in `a`."""
    texts = {p.text for p in a}
    return sum(p.text in texts for p in b) / max(len(b), 1)
