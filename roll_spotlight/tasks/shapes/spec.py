"""The vocabulary of the tiny GenEval-like world: colours, shapes, counts, relations, scene specs.

The world is deliberately small so that a 1-2M-parameter pixel-space DiT can learn it on a CPU:
four saturated colours that are pairwise >= 255 apart in RGB, three shapes whose bounding-box
fill differs a lot (square 1.0, circle ~0.78, triangle ~0.55), counts 1-4 and four relations, on a
plain black background (black is the easiest background to generate: a clamped output of 0).

A `SceneSpec` is the single source of truth shared by the prompt grammar, the renderer and the
detector. Its `tag` is recoverable from its structure (`infer_tag`), which is what lets
`parse_prompt(format_prompt(spec)) == spec` hold for every tag:

| tag           | structure                                             | example                              |
|---------------|-------------------------------------------------------|--------------------------------------|
| single_object | one object, count 1, colour free (None)               | "a circle"                           |
| colors        | one object, count 1, colour given                     | "a yellow square"                    |
| counting      | one object, count 2-4, colour given                   | "three green triangles"              |
| two_object    | two objects sharing exactly one of colour / shape     | "a red circle and a red square"      |
| color_attr    | two objects differing in both colour and shape        | "a red circle and a green square"    |
| position      | two different objects and a relation (A rel B)        | "a red circle left of a blue square" |

As in GenEval, `single_object` names no colour (any colour counts) and `colors` is the tag where the
colour is the point. `color_attr` needs distinct colour-shape bindings so that a swapped binding
("a green circle and a red square") is detectably wrong; `two_object` is the rest.
"""
from __future__ import annotations

from dataclasses import dataclass

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
}
BACKGROUND: tuple[int, int, int] = (0, 0, 0)
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
MAX_COUNT = 4
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
TAGS: tuple[str, ...] = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


@dataclass(frozen=True)
class ObjectSpec:
    """`count` objects of one shape and colour; `color=None` means any palette colour."""

    shape: str
    color: str | None
    count: int = 1

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"ObjectSpec.shape={self.shape!r} is not one of {SHAPES}")
        if self.color is not None and self.color not in COLORS:
            raise ValueError(f"ObjectSpec.color={self.color!r} is not one of {tuple(COLORS)} or None")
        if not (isinstance(self.count, int) and 1 <= self.count <= MAX_COUNT):
            raise ValueError(f"ObjectSpec.count={self.count!r} must be an int in [1, {MAX_COUNT}]")


@dataclass(frozen=True)
class SceneSpec:
    """A scene: objects, an optional relation `objects[0] <relation> objects[1]`, and its tag.

    Invariant (checked): `tag == infer_tag(objects, relation)`.
    """

    objects: tuple[ObjectSpec, ...]
    relation: str | None
    tag: str

    def __post_init__(self) -> None:
        if not isinstance(self.objects, tuple) or not all(isinstance(o, ObjectSpec) for o in self.objects):
            raise ValueError(f"SceneSpec.objects={self.objects!r} must be a tuple of ObjectSpec")
        if self.relation is not None and self.relation not in RELATIONS:
            raise ValueError(f"SceneSpec.relation={self.relation!r} is not one of {RELATIONS} or None")
        if self.tag not in TAGS:
            raise ValueError(f"SceneSpec.tag={self.tag!r} is not one of {TAGS}")
        inferred = infer_tag(self.objects, self.relation)
        if inferred != self.tag:
            raise ValueError(f"SceneSpec.tag={self.tag!r} does not match its structure, which is {inferred!r}")


def infer_tag(objects: tuple[ObjectSpec, ...], relation: str | None) -> str:
    """The tag a structure belongs to; ValueError if it belongs to none (see the module table)."""
    if len(objects) == 1 and relation is None:
        return _single_tag(objects[0])
    if len(objects) == 2:
        return _pair_tag(objects[0], objects[1], relation)
    raise ValueError(f"a scene has 1 object, or 2 objects (optionally related); got {len(objects)} "
                     f"objects with relation={relation!r}")


def _single_tag(obj: ObjectSpec) -> str:
    if obj.count > 1:
        if obj.color is None:
            raise ValueError(f"counting needs a colour: {obj!r}")
        return "counting"
    return "single_object" if obj.color is None else "colors"


def _pair_tag(a: ObjectSpec, b: ObjectSpec, relation: str | None) -> str:
    if a.color is None or b.color is None or a.count != 1 or b.count != 1:
        raise ValueError(f"two-object scenes need two coloured single objects: {a!r}, {b!r}")
    same_color, same_shape = a.color == b.color, a.shape == b.shape
    if same_color and same_shape:
        raise ValueError(f"two identical objects are a counting scene, not a pair: {a!r}")
    if relation is not None:
        return "position"
    return "two_object" if (same_color or same_shape) else "color_attr"
