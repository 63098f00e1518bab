"""GenEval's scoring rules on detections (numpy only; the detector and CLIP live in `geneval.py`).

From GenEval's evaluation/evaluate_images.py:
* keep a class's detections with score > `threshold` (0.3), or > `counting_threshold` (0.9) when
  the prompt's tag is "counting"; at most `max_objects` (16) per class, most confident first;
  drop a detection whose box IoU with a kept one is >= `max_overlap` (1.0 = never, GenEval's default);
* include clauses are ANDed, exclude clauses ORed; colour and position are judged on the
  `count` most confident detections only; colour is a zero-shot label (`ColorFn`);
* position: A is `relation` of B when the centre offset, shrunk by `position_threshold` (0.1) x the
  summed box sizes per axis, points mostly (> 0.5 of the unit offset) in that direction.

Three scores per image (`ImageScore`), as flow_grpo's GenEval reward server reports them:
* `geneval`: GenEval's own verdict (at least `count` objects; its benchmark metric);
* `strict`: flow_grpo's training verdict, with exact counts (found == count);
* `partial`: the mean credit over the prompt's conditions (count, colour, position of each include
  clause; exclude clauses not implied by an exact count): count credit max(0, 1 - |found - n| / n),
  colour credit the fraction of the n objects of the asked colour, position 0/1; a clause whose count
  is wrong gets 0 for its colour and position. flow_grpo's counting credit can go negative and
  its position credit is added even after a miss; here both are clamped/fixed so partial is in [0, 1].
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from roll_spotlight.checks import require_each, require_int, require_number
from roll_spotlight.tasks.prompt_files import GENEVAL_CLASSES


@dataclass(frozen=True)
class Detection:
    """One detected instance: box (x1, y1, x2, y2) in pixels, confidence, optional boolean mask (H, W)."""

    box: tuple[float, float, float, float]
    score: float
    mask: np.ndarray | None = None


Objects = Mapping[str, Sequence[Detection]]  # class name -> kept detections, most confident first
ColorFn = Callable[[str, Sequence[Detection]], list[str]]  # (class, detections) -> one colour each


@dataclass(frozen=True)
class GenevalRules:
    """GenEval's thresholds (its command-line defaults)."""

    threshold: float = 0.3
    counting_threshold: float = 0.9
    max_objects: int = 16
    max_overlap: float = 1.0
    position_threshold: float = 0.1

    def __post_init__(self) -> None:
        key = "reward_fn.kwargs"
        require_each(self, key, ("threshold", "counting_threshold", "max_overlap"), require_number, "[0, 1]")
        require_int("reward_fn.kwargs.max_objects", self.max_objects)
        require_number("reward_fn.kwargs.position_threshold", self.position_threshold, ">= 0")


@dataclass(frozen=True)
class ImageScore:
    geneval: bool
    strict: bool
    partial: float
    reasons: tuple[str, ...] = ()


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU with GenEval's inclusive-pixel convention (width = x2 - x1 + 1)."""
    def area(box: Sequence[float]) -> float:
        return max(box[2] - box[0] + 1, 0) * max(box[3] - box[1] + 1, 0)

    inter = area([max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])])
    union = area(a) + area(b) - inter
    return inter / union if union else 0.0


def select_detections(detections: Mapping[str, Sequence[Detection]], tag: str, rules: GenevalRules) -> dict[str, list[Detection]]:
    """Per class: threshold (the counting one for tag "counting"), top `max_objects`, then greedy NMS."""
    cutoff = rules.counting_threshold if tag == "counting" else rules.threshold
    kept: dict[str, list[Detection]] = {}
    for name, found in detections.items():
        ranked = sorted((d for d in found if d.score > cutoff), key=lambda d: -d.score)[:rules.max_objects]
        chosen: list[Detection] = []
        for det in ranked:
            if rules.max_overlap >= 1.0 or all(box_iou(det.box, c.box) < rules.max_overlap for c in chosen):
                chosen.append(det)
        if chosen:
            kept[name] = chosen
    return kept


def relative_position(a: Sequence[float], b: Sequence[float], threshold: float) -> set[str]:
    """Relations of box a to box b (image y grows downwards, so "above" is a negative dy)."""
    boxes = np.array([a[:4], b[:4]], dtype=np.float64).reshape(2, 2, 2)
    center_a, center_b = boxes.mean(axis=1)
    size_a, size_b = np.abs(boxes[:, 1] - boxes[:, 0])
    offset = center_a - center_b
    revised = np.maximum(np.abs(offset) - threshold * (size_a + size_b), 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    relations = {"left of": dx < -0.5, "right of": dx > 0.5, "above": dy < -0.5, "below": dy > 0.5}
    return {name for name, holds in relations.items() if holds}


def evaluate(objects: Objects, metadata: Mapping[str, Any], colors: ColorFn, rules: GenevalRules) -> ImageScore:
    """The three scores of one image's kept detections against its GenEval metadata."""
    colors = _memo(colors)
    geneval_ok, reasons = _geneval_verdict(objects, metadata, colors, rules)
    strict_ok, credits = _exact_verdict(objects, metadata, colors, rules)
    return ImageScore(geneval_ok, strict_ok, float(np.mean(credits)), tuple(reasons))


def _memo(colors: ColorFn) -> ColorFn:
    """Both verdicts ask the colours of the same top-n detections; classify each list once."""
    cache: dict[tuple[str, int], list[str]] = {}

    def lookup(name: str, found: Sequence[Detection]) -> list[str]:
        key = (name, len(found))
        if key not in cache:
            cache[key] = list(colors(name, found))
        return cache[key]

    return lookup


def _geneval_verdict(objects: Objects, metadata: Mapping[str, Any], colors: ColorFn,
                     rules: GenevalRules) -> tuple[bool, list[str]]:
    """GenEval's `evaluate`: at least `count` of each included class; fewer than `count` excluded."""
    reasons: list[str] = []
    groups: list[Sequence[Detection] | None] = []
    for clause in metadata["include"]:
        found = list(objects.get(clause["class"], []))[:clause["count"]]
        ok = len(found) >= clause["count"]
        if not ok:
            reasons.append(f"expected {clause['class']}>={clause['count']}, found {len(found)}")
        ok = ok and _color_ok(clause, found, colors, reasons)
        ok = ok and _position_ok(clause, found, groups, rules, reasons)
        groups.append(found if ok else None)
    for clause in metadata.get("exclude", []):
        if len(objects.get(clause["class"], [])) >= clause["count"]:
            reasons.append(f"expected {clause['class']}<{clause['count']}")
    return not reasons, reasons


def _exact_verdict(objects: Objects, metadata: Mapping[str, Any], colors: ColorFn,
                   rules: GenevalRules) -> tuple[bool, list[float]]:
    """flow_grpo's strict verdict (exact counts) and the per-condition credits of `partial`."""
    credits: list[float] = []
    groups: list[Sequence[Detection] | None] = []
    ignore: list[str] = []
    for clause in metadata["include"]:
        n, found = clause["count"], list(objects.get(clause["class"], []))
        credits.append(max(0.0, 1.0 - abs(len(found) - n) / n))
        ok = len(found) == n
        if "color" in clause:
            hits = colors(clause["class"], found).count(clause["color"]) if ok else 0
            credits.append(hits / n)
            ok = ok and hits == n
        if "position" in clause:
            ok = ok and _position_ok(clause, found, groups, rules, ignore)
            credits.append(float(ok))
        groups.append(found if ok else None)
    exact = {c["class"]: c["count"] for c in metadata["include"]}
    for clause in metadata.get("exclude", []):
        if clause["class"] in exact and exact[clause["class"]] < clause["count"]:
            continue  # implied by the exact count of an include clause
        credits.append(float(len(objects.get(clause["class"], [])) < clause["count"]))
    return all(c == 1.0 for c in credits), credits


def _color_ok(clause: Mapping[str, Any], found: Sequence[Detection], colors: ColorFn, reasons: list[str]) -> bool:
    if "color" not in clause:
        return True
    got = colors(clause["class"], found)
    if got.count(clause["color"]) >= clause["count"]:
        return True
    reasons.append(f"expected {clause['color']} {clause['class']}>={clause['count']}, found colours {got}")
    return False


def _position_ok(clause: Mapping[str, Any], found: Sequence[Detection], groups: list[Sequence[Detection] | None],
                 rules: GenevalRules, reasons: list[str]) -> bool:
    """Every one of `found` stands in `relation` to every detection of the target clause."""
    if "position" not in clause:
        return True
    relation, target = clause["position"]
    if groups[target] is None:
        reasons.append(f"no target for {clause['class']} to be {relation}")
        return False
    for det in found:
        for other in groups[target]:
            if relation not in relative_position(det.box, other.box, rules.position_threshold):
                reasons.append(f"expected {clause['class']} {relation} target")
                return False
    return True


def check_class_names(names: Sequence[str]) -> None:
    """Every GenEval class must be detectable, or every prompt naming a missing one scores 0."""
    missing = sorted(set(GENEVAL_CLASSES) - set(names))
    if missing:
        raise ValueError(f"the detector does not report GenEval classes {missing}")
