"""Prompt sets read from files, in the two formats flow_grpo's users keep them.

* ``txt``: one prompt per line (UTF-8); surrounding whitespace is stripped and blank lines are
  skipped. Every prompt gets the tag ``TXT_TAG``.
* ``geneval``: GenEval's ``metadata.jsonl``, one JSON object per line::

      {"tag": "position", "prompt": "a photo of a cow right of a laptop",
       "include": [{"class": "laptop", "count": 1},
                   {"class": "cow", "count": 1, "position": ["right of", 0]}],
       "exclude": [{"class": "cow", "count": 2}]}              # optional

  ``class`` is one of GenEval's 80 COCO names, ``color`` one of its 10 colours, ``position`` a
  relation and the index of an *earlier* include clause (GenEval reads the target's detections when
  it scores this clause, so a later index cannot be scored).

Every error is a ValueError naming the file, the 1-based line and the offending key, raised while
loading, i.e. at start-up. numpy only; no torch.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROMPT_FORMATS = ("txt", "geneval")
SUFFIX_FORMATS = {".txt": "txt", ".jsonl": "geneval"}
TXT_TAG = "prompt"

# The 80 COCO thing classes under the names GenEval's detector reports them (its object_names.txt).
GENEVAL_CLASSES: tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite",
    "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich", "orange",
    "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch", "potted plant", "bed",
    "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote", "computer keyboard",
    "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase",
    "scissors", "teddy bear", "hair drier", "toothbrush",
)
GENEVAL_COLORS: tuple[str, ...] = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown",
                                   "black", "white")
GENEVAL_RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")


@dataclass(frozen=True)
class PromptRecord:
    """One prompt: its text, its tag (per-tag metrics), for GenEval lines the whole JSON object, and
    where it was read ("file:line", for later error messages)."""

    text: str
    tag: str
    metadata: Mapping[str, Any] | None = None
    where: str = ""


def prompt_format(path: str | Path, format: str | None = None) -> str:
    """The explicit format if given, else the one of the suffix (.txt, .jsonl)."""
    if format is not None:
        if format not in PROMPT_FORMATS:
            raise ValueError(f"task.format={format!r} is not one of {PROMPT_FORMATS}")
        return format
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIX_FORMATS:
        raise ValueError(f"{path}: cannot tell the prompt format from the suffix {suffix!r} "
                         f"(known: {sorted(SUFFIX_FORMATS)}); set task.format to one of {PROMPT_FORMATS}")
    return SUFFIX_FORMATS[suffix]


def load_prompt_file(path: str | Path, format: str | None = None) -> list[PromptRecord]:
    """All prompts of a file, in file order; ValueError naming file, line and key on a bad line."""
    fmt = prompt_format(path, format)
    records = [_geneval_record(text, where) if fmt == "geneval" else PromptRecord(text, TXT_TAG, None, where)
               for where, text in _numbered_lines(path)]
    if not records:
        raise ValueError(f"{path}: the prompt file is empty")
    return records


def _numbered_lines(path: str | Path) -> Iterator[tuple[str, str]]:
    """("file:line", stripped text) of each non-blank line."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ValueError(f"{path}: cannot read the prompt file ({err.strerror})") from err
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}:{number}: not UTF-8 ({err.reason} at byte {err.start})") from None
        if text:
            yield f"{path}:{number}", text


def _geneval_record(text: str, where: str) -> PromptRecord:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: malformed JSON ({err.msg} at column {err.colno})") from None
    metadata = validate_geneval_metadata(obj, where=where)
    return PromptRecord(metadata["prompt"], metadata["tag"], metadata, where)


def validate_geneval_metadata(obj: Any, where: str = "metadata") -> dict[str, Any]:
    """The GenEval metadata object, checked; ValueError naming `where` and the key path."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in ("prompt", "tag"):
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            raise ValueError(f"{where}: key {key!r} must be a non-empty string, got {obj.get(key)!r}")
    include = obj.get("include")
    if not isinstance(include, list) or not include:
        raise ValueError(f"{where}: key 'include' must be a non-empty list of clauses, got {include!r}")
    for index, clause in enumerate(include):
        _check_clause(clause, f"{where}: include[{index}]", earlier=index)
    exclude = obj.get("exclude", [])
    if not isinstance(exclude, list):
        raise ValueError(f"{where}: key 'exclude' must be a list of clauses, got {exclude!r}")
    for index, clause in enumerate(exclude):
        _check_clause(clause, f"{where}: exclude[{index}]", earlier=None)
    return obj


def _check_clause(clause: Any, where: str, earlier: int | None) -> None:
    """One include (earlier = its index) or exclude (earlier = None) clause."""
    if not isinstance(clause, dict):
        raise ValueError(f"{where}: expected an object with 'class' and 'count', got {clause!r}")
    allowed = {"class", "count", "color", "position"} if earlier is not None else {"class", "count"}
    unknown = sorted(set(clause) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (allowed: {sorted(allowed)})")
    if clause.get("class") not in GENEVAL_CLASSES:
        raise ValueError(f"{where}.class={clause.get('class')!r} is not one of GenEval's 80 COCO classes")
    count = clause.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"{where}.count={count!r} must be an integer >= 1")
    if "color" in clause and clause["color"] not in GENEVAL_COLORS:
        raise ValueError(f"{where}.color={clause['color']!r} is not one of {GENEVAL_COLORS}")
    if "position" in clause:
        _check_position(clause["position"], f"{where}.position", earlier)


def _check_position(position: Any, where: str, earlier: int | None) -> None:
    if not (isinstance(position, list) and len(position) == 2):
        raise ValueError(f"{where}={position!r} must be [relation, index of an earlier include clause]")
    relation, target = position
    if relation not in GENEVAL_RELATIONS:
        raise ValueError(f"{where}[0]={relation!r} is not one of {GENEVAL_RELATIONS}")
    if isinstance(target, bool) or not isinstance(target, int) or not 0 <= target < (earlier or 0):
        raise ValueError(f"{where}[1]={target!r} must index an earlier include clause (0..{(earlier or 0) - 1})")


def metadata_by_prompt(records: Sequence[PromptRecord], source: str = "prompt files") -> dict[str, Mapping[str, Any]]:
    """prompt text -> metadata; a prompt repeated with different metadata is a ValueError."""
    table: dict[str, Mapping[str, Any]] = {}
    for record in records:
        if record.metadata is None:
            continue
        known = table.setdefault(record.text, record.metadata)
        if known != record.metadata:
            raise ValueError(f"{record.where or source}: prompt {record.text!r} appears earlier with other metadata "
                             f"({json.dumps(known, sort_keys=True)} and {json.dumps(record.metadata, sort_keys=True)})")
    return table


@dataclass(frozen=True)
class PromptFileTask:
    """`task.name: prompts`: training and validation prompts from two files (read once, at start-up)."""

    train_file: str
    test_file: str
    format: str | None = None

    def __post_init__(self) -> None:
        for key in ("train_file", "test_file"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ValueError(f"task.{key}={getattr(self, key)!r} must name a prompt file")
        if self.format is not None:
            prompt_format(self.train_file, self.format)

    def train_records(self) -> list[PromptRecord]:
        return load_prompt_file(self.train_file, self.format)

    def test_records(self) -> list[PromptRecord]:
        return load_prompt_file(self.test_file, self.format)

