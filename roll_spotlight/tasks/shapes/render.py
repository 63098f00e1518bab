"""Deterministic renderer of shapes scenes: hard-edged palette shapes on a black background.

Geometry is shared with the detector through `shape_mask`: a shape always fills its box edge to
edge, so a rendered object's bounding box is exactly its box, and the detector can classify a
component by comparing it with the three ideal masks fitted to that bounding box.

Sizes are legible at 32x32 and scale linearly with `size`; an object's side shrinks as the scene
fills (11-15 px alone, 7-9 px among four), so shapes are as large as the layout allows. Objects never overlap and
keep a gap of >= 2 px (scaled), so each is one connected component. A relation `A rel B` is
rendered with the mask centroids >= `RELATION_MARGIN * size` apart along the relation's axis.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from roll_spotlight.tasks.shapes.spec import BACKGROUND, COLORS, SceneSpec

# object side in pixels at size 32, by the number of objects in the scene
SIDE_RANGE_32 = {1: (11, 15), 2: (9, 12), 3: (8, 10), 4: (7, 9)}
GAP_32 = 2                # min empty pixels between objects at size 32
BORDER_32 = 1             # min empty pixels to the image edge at size 32
RELATION_MARGIN = 0.25    # centroid offset along the relation axis, as a fraction of the size
_MAX_TRIES = 200
LAYOUTS = ("free", "slots")
# slot layouts at size 32: (centre y, centre x) of each slot, side range and jitter (px) by object count
_SLOTS_32 = {
    1: (((16.0, 16.0),), (13, 15), 1),
    2: (((16.0, 8.5), (16.0, 23.5)), (10, 12), 1),      # a horizontal pair; transposed for a vertical one
    3: (((8.5, 8.5), (8.5, 23.5), (23.5, 8.5), (23.5, 23.5)), (9, 10), 1),
    4: (((8.5, 8.5), (8.5, 23.5), (23.5, 8.5), (23.5, 23.5)), (9, 10), 1),
}
_HORIZONTAL = {"left of": False, "right of": True}   # relation -> whether the first object takes the right slot
_VERTICAL = {"above": False, "below": True}          # relation -> whether the first object takes the lower slot


@dataclass(frozen=True)
class Placement:
    """One drawn object: its shape, colour and box (top, left, side)."""

    shape: str
    color: str
    top: int
    left: int
    side: int

    def centroid(self) -> tuple[float, float]:
        """(y, x) of the mask centroid in pixel-centre coordinates."""
        ys, xs = np.nonzero(shape_mask(self.shape, self.side, self.side))
        return self.top + float(ys.mean()), self.left + float(xs.mean())


def shape_mask(shape: str, height: int, width: int) -> np.ndarray:
    """Boolean (height, width) mask of `shape` touching all four edges of its box.

    Pixel (i, j) is tested at its centre, except the triangle rows, which use their lower edge so
    that the apex row is never empty. The triangle points up with its base on the bottom row.
    """
    ys = (np.arange(height) + 0.5)[:, None]
    xs = (np.arange(width) + 0.5)[None, :]
    if shape == "square":
        return np.ones((height, width), dtype=bool)
    if shape == "circle":
        u, v = (xs - width / 2) / (width / 2), (ys - height / 2) / (height / 2)
        return u * u + v * v <= 1.0
    if shape == "triangle":
        return np.abs(xs - width / 2) <= (width / 2) * (ys + 0.5) / height + 1e-9
    raise ValueError(f"shape={shape!r} has no mask")


def _scaled(pixels_at_32: int, size: int) -> int:
    return max(1, int(round(pixels_at_32 * size / 32)))


def _instances(spec: SceneSpec, rng: np.random.Generator) -> list[tuple[str, str]]:
    """(shape, colour) of every object to draw; a free colour is drawn from the palette."""
    names = list(COLORS)
    out = []
    for obj in spec.objects:
        color = obj.color if obj.color is not None else names[int(rng.integers(len(names)))]
        out += [(obj.shape, color)] * obj.count
    return out


def _fits(box: Placement, placed: list[Placement], gap: int) -> bool:
    for other in placed:
        apart_y = box.top >= other.top + other.side + gap or other.top >= box.top + box.side + gap
        apart_x = box.left >= other.left + other.side + gap or other.left >= box.left + box.side + gap
        if not (apart_y or apart_x):
            return False
    return True


def relation_holds(a: tuple[float, float], b: tuple[float, float], relation: str, margin: float) -> bool:
    """Whether centroid `a` (y, x) is `relation` of centroid `b` by more than `margin` pixels."""
    offsets = {"left of": b[1] - a[1], "right of": a[1] - b[1], "above": b[0] - a[0], "below": a[0] - b[0]}
    if relation not in offsets:
        raise ValueError(f"relation={relation!r} is not one of {tuple(offsets)}")
    return offsets[relation] > margin


def _try_layout(spec: SceneSpec, rng: np.random.Generator, size: int) -> list[Placement] | None:
    instances = _instances(spec, rng)
    lo, hi = (_scaled(s, size) for s in SIDE_RANGE_32[min(len(instances), max(SIDE_RANGE_32))])
    gap, border = _scaled(GAP_32, size), _scaled(BORDER_32, size)
    placed: list[Placement] = []
    for shape, color in instances:
        side = int(rng.integers(lo, hi + 1))
        for _ in range(_MAX_TRIES):
            top, left = (int(v) for v in rng.integers(border, size - border - side + 1, size=2))
            box = Placement(shape, color, top, left, side)
            if _fits(box, placed, gap):
                placed.append(box)
                break
        else:
            return None
    if spec.relation is not None:
        a, b = placed[0].centroid(), placed[1].centroid()
        if not relation_holds(a, b, spec.relation, RELATION_MARGIN * size):
            return None
    return placed


def _slot_centres(spec: SceneSpec, n: int, rng: np.random.Generator) -> list[tuple[float, float]]:
    """Slot centres at size 32 in instance order: the relation fixes a pair's axis and order,
    the seed fixes everything else (a pair's axis and order, which grid cell three objects leave empty)."""
    slots = list(_SLOTS_32[n][0])
    if n == 2:
        vertical = spec.relation in _VERTICAL if spec.relation is not None else bool(rng.integers(2))
        if vertical:
            slots = [(x, y) for y, x in slots]
        swap = (_VERTICAL | _HORIZONTAL)[spec.relation] if spec.relation is not None else bool(rng.integers(2))
        return slots[::-1] if swap else slots
    if n >= 3:
        order = rng.permutation(len(slots))[:n]
        return [slots[i] for i in order]
    return slots


def _slot_layout(spec: SceneSpec, rng: np.random.Generator, size: int) -> list[Placement]:
    instances = _instances(spec, rng)
    n = len(instances)
    (lo, hi), jitter = _SLOTS_32[n][1], _SLOTS_32[n][2]
    scale = size / 32
    placed = []
    for (shape, color), (cy, cx) in zip(instances, _slot_centres(spec, n, rng)):
        side = _scaled(int(rng.integers(lo, hi + 1)), size)
        dy, dx = (int(v) for v in rng.integers(-jitter, jitter + 1, size=2))
        top = int(round(cy * scale - side / 2)) + _scaled(abs(dy), size) * int(np.sign(dy))
        left = int(round(cx * scale - side / 2)) + _scaled(abs(dx), size) * int(np.sign(dx))
        border = _scaled(BORDER_32, size)
        top, left = (min(max(v, border), size - border - side) for v in (top, left))
        placed.append(Placement(shape, color, top, left, side))
    return placed


def layout(spec: SceneSpec, seed: int, size: int = 32, style: str = "free") -> list[Placement]:
    """The placements of a scene; a pure function of (spec, seed, size, style).

    `style="free"`: objects anywhere (rejection sampling). `style="slots"`: objects in a few
    canonical slots, jittered by a pixel: one object centred, two side by side or stacked
    (a relation fixes which and in what order), three or four in the cells of a 2x2 grid. Slots
    take much of the layout's randomness away, which is what lets a tiny DiT settle the layout
    from the prompt early in sampling and spend the later steps on the shapes.
    """
    if size < 16:
        raise ValueError(f"size={size!r} must be >= 16 for legible shapes")
    if style not in LAYOUTS:
        raise ValueError(f"layout style={style!r} is not one of {LAYOUTS}")
    rng = np.random.default_rng(seed)
    if style == "slots":
        return _slot_layout(spec, rng, size)
    for _ in range(_MAX_TRIES):
        placed = _try_layout(spec, rng, size)
        if placed is not None:
            return placed
    raise AssertionError(f"no layout found for {spec!r} at size {size}")  # unreachable at sizes >= 16


def render(spec: SceneSpec, seed: int, size: int = 32, style: str = "free") -> np.ndarray:
    """uint8 (size, size, 3) image of the scene; deterministic in (spec, seed, size, style)."""
    image = np.empty((size, size, 3), dtype=np.uint8)
    image[:] = BACKGROUND
    for box in layout(spec, seed, size, style):
        region = image[box.top:box.top + box.side, box.left:box.left + box.side]
        region[shape_mask(box.shape, box.side, box.side)] = COLORS[box.color]
    return image
