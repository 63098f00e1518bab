"""Programmatic GenEval-style detector for the shapes world (numpy only).

Pipeline: (1) each pixel takes the nearest of palette + background, and counts as a palette colour
only within `color_tolerance` of it (tolerant of the washed-out colours of a half-trained model);
(2) 8-connected components of equal colour, found by vectorised min-label propagation with pointer
jumping; components smaller than `min_component_frac` of the image are speckle and ignored;
(3) a component whose top third is much narrower than its bottom third (`taper`) is a
triangle, otherwise its shape is the ideal mask (`render.shape_mask`, fitted to its bounding box)
with the highest IoU; None when the chosen shape's IoU is below `min_shape_iou` (the taper rule is
there because blur erodes a small triangle's apex, which makes IoU alone call it a square);
(4) relations compare the centroids of the largest matching components.

Scoring (`score`) follows GenEval's strictness: `strict` is 1.0 iff every object has exactly its
count of components of its colour and shape, no component of a mentioned colour is left unexplained,
and the relation holds. `partial` is the mean of per-criterion credits in [0, 1]:
per object, colour present, shape present (in that colour) and count credit 1 - |found - n| / n
(clipped at 0); one extras credit 1 / (1 + unexplained components); and the relation (0/1).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roll_spotlight.tasks.shapes.render import relation_holds, shape_mask
from roll_spotlight.tasks.shapes.spec import BACKGROUND, COLORS, SHAPES, ObjectSpec, SceneSpec

_COLOR_NAMES = tuple(COLORS)
_PALETTE = np.array([BACKGROUND, *COLORS.values()], dtype=np.float32)  # index 0 is the background


@dataclass(frozen=True)
class DetectorConfig:
    color_tolerance: float = 150.0      # max RGB distance from a palette colour (pure colours are >= 255 apart)
    min_component_frac: float = 6 / 1024  # speckle threshold: 6 px at 32x32, 24 px at 64x64
    min_shape_iou: float = 0.5          # below this no shape is assigned (the component still counts)
    triangle_taper: float = 0.6         # top-third / bottom-third width below which a blob is a triangle
    relation_margin_frac: float = 0.05  # centroid offset needed for a relation, fraction of the width

    def __post_init__(self) -> None:
        checks = {
            "color_tolerance": 0 < self.color_tolerance <= 442,
            "min_component_frac": 0 <= self.min_component_frac < 1,
            "min_shape_iou": 0 <= self.min_shape_iou <= 1,
            "triangle_taper": 0 <= self.triangle_taper <= 1,
            "relation_margin_frac": 0 <= self.relation_margin_frac < 1,
        }
        for key, ok in checks.items():
            if not ok:
                raise ValueError(f"DetectorConfig.{key}={getattr(self, key)!r} is out of range")


@dataclass(frozen=True)
class Component:
    color: str
    shape: str | None
    area: int
    centroid: tuple[float, float]     # (y, x)
    iou: float


@dataclass(frozen=True)
class SceneScore:
    strict: float
    partial: float
    details: dict[str, Any] = field(default_factory=dict)


def segment_colors(image: np.ndarray, tolerance: float) -> np.ndarray:
    """int (H, W) map: -1 background, k >= 0 the index of the palette colour `_COLOR_NAMES[k]`."""
    pixels = image.astype(np.float32)[:, :, None, :]
    dist = np.sqrt(((pixels - _PALETTE) ** 2).sum(-1))
    nearest = dist.argmin(-1)
    within = np.take_along_axis(dist, nearest[..., None], -1)[..., 0] <= tolerance
    return np.where((nearest > 0) & within, nearest - 1, -1)


def label_components(classes: np.ndarray) -> np.ndarray:
    """8-connected components of equal non-negative class; int (H, W) labels, -1 for background.

    Labels start as pixel indices and only decrease, so a label always names a pixel of the same
    component whose own label is <= it; that makes pointer jumping (`flat[flat]`) valid.
    """
    h, w = classes.shape
    sentinel = h * w
    fg = classes >= 0
    labels = np.where(fg, np.arange(h * w).reshape(h, w), sentinel)
    pad_cls = np.pad(classes, 1, constant_values=-1)
    while True:
        pad_lab = np.pad(labels, 1, constant_values=sentinel)
        best = labels.copy()
        for dy in (0, 1, 2):
            for dx in (0, 1, 2):
                same = pad_cls[dy:dy + h, dx:dx + w] == classes
                best = np.minimum(best, np.where(same, pad_lab[dy:dy + h, dx:dx + w], sentinel))
        flat = np.where(fg, best, sentinel).ravel()
        flat[flat < sentinel] = flat[flat[flat < sentinel]]
        new = flat.reshape(h, w)
        if np.array_equal(new, labels):
            break
        labels = new
    _, dense = np.unique(np.where(fg, labels, -1), return_inverse=True)
    return np.where(fg, dense.reshape(h, w) - (0 if fg.all() else 1), -1)


@functools.lru_cache(maxsize=4096)
def _template(shape: str, height: int, width: int) -> np.ndarray:
    mask = shape_mask(shape, height, width)
    mask.flags.writeable = False
    return mask


def taper(crop: np.ndarray) -> float:
    """Mean row width of the top third over that of the bottom third (triangle ~0.27, others ~1)."""
    k = max(1, crop.shape[0] // 3)
    return float(crop[:k].sum(1).mean() / max(crop[-k:].sum(1).mean(), 1.0))


def classify_shape(crop: np.ndarray, config: DetectorConfig) -> tuple[str | None, float]:
    """Shape of a bounding-box crop of one component and its IoU with that shape's ideal mask."""
    ious = {}
    for shape in SHAPES:
        template = _template(shape, *crop.shape)
        ious[shape] = float((crop & template).sum() / (crop | template).sum())
    best = "triangle" if taper(crop) < config.triangle_taper else max(ious, key=ious.__getitem__)
    return (best if ious[best] >= config.min_shape_iou else None), ious[best]


def _component(mask: np.ndarray, color: str, config: DetectorConfig) -> Component:
    ys, xs = np.nonzero(mask)
    top, left = int(ys.min()), int(xs.min())
    crop = mask[top:ys.max() + 1, left:xs.max() + 1]
    shape, iou = classify_shape(crop, config)
    return Component(color, shape, int(ys.size), (float(ys.mean()), float(xs.mean())), iou)


def detect(image: np.ndarray, config: DetectorConfig | None = None) -> list[Component]:
    """Objects in a uint8 (H, W, 3) image, largest first."""
    config = config or DetectorConfig()
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be uint8 (H, W, 3), got {image.dtype} {image.shape}")
    classes = segment_colors(image, config.color_tolerance)
    labels = label_components(classes)
    min_area = config.min_component_frac * image.shape[0] * image.shape[1]
    comps = []
    for label in range(int(labels.max()) + 1):
        mask = labels == label
        if mask.sum() >= min_area:
            color = _COLOR_NAMES[int(classes[mask][0])]
            comps.append(_component(mask, color, config))
    return sorted(comps, key=lambda c: -c.area)


def _matches_color(obj: ObjectSpec, comp: Component) -> bool:
    return obj.color is None or comp.color == obj.color


def _object_credits(obj: ObjectSpec, comps: list[Component]) -> dict[str, Any]:
    in_color = [c for c in comps if _matches_color(obj, c)]
    found = sum(c.shape == obj.shape for c in in_color)
    return {"color": obj.color, "shape": obj.shape, "want": obj.count, "found": found,
            "color_present": float(bool(in_color)), "shape_present": float(found > 0),
            "count_credit": max(0.0, 1.0 - abs(found - obj.count) / obj.count)}


def _unexplained(spec: SceneSpec, comps: list[Component]) -> int:
    """Components of a mentioned colour (None: every colour) that match no object of the spec."""
    mentioned = [c for c in comps if any(_matches_color(o, c) for o in spec.objects)]
    return sum(not any(_matches_color(o, c) and c.shape == o.shape for o in spec.objects) for c in mentioned)


def _relation_ok(spec: SceneSpec, comps: list[Component], width: int, margin_frac: float) -> bool:
    firsts = [next((c for c in comps if _matches_color(o, c) and c.shape == o.shape), None) for o in spec.objects]
    if firsts[0] is None or firsts[1] is None:
        return False
    return relation_holds(firsts[0].centroid, firsts[1].centroid, spec.relation, margin_frac * width)


def score(image: np.ndarray, spec: SceneSpec, config: DetectorConfig | None = None) -> SceneScore:
    """Strict and partial GenEval-like scores of one image against a scene (see module doc)."""
    config = config or DetectorConfig()
    comps = detect(image, config)
    objects = [_object_credits(o, comps) for o in spec.objects]
    extras = _unexplained(spec, comps)
    credits = [v for o in objects for v in (o["color_present"], o["shape_present"], o["count_credit"])]
    credits.append(1.0 / (1.0 + extras))
    relation = None
    if spec.relation is not None:
        relation = _relation_ok(spec, comps, image.shape[1], config.relation_margin_frac)
        credits.append(float(relation))
    strict = all(o["found"] == o["want"] for o in objects) and extras == 0 and relation is not False
    details = {"objects": objects, "extras": extras, "relation": relation, "components": comps}
    return SceneScore(strict=float(strict), partial=float(np.mean(credits)), details=details)
