"""The tiny GenEval-like shapes world (numpy only): grammar, renderer and detector.

Typical use::

    prompts = make_prompt_set("train", 256, seed=0)
    image = render(prompts[0].spec, seed=7)            # uint8 (32, 32, 3)
    result = score(image, parse_prompt(prompts[0].text))  # SceneScore(strict, partial, details)
"""
from roll_spotlight.tasks.shapes.detect import Component, DetectorConfig, SceneScore, detect, score
from roll_spotlight.tasks.shapes.prompts import (
    MAX_PROMPT_WORDS,
    VOCAB,
    TaskPrompt,
    enumerate_specs,
    format_prompt,
    make_prompt_set,
    parse_prompt,
    text_overlap,
    tokenize,
)
from roll_spotlight.tasks.shapes.render import layout, render, shape_mask
from roll_spotlight.tasks.shapes.spec import (
    BACKGROUND,
    COLORS,
    RELATIONS,
    SHAPES,
    TAGS,
    ObjectSpec,
    SceneSpec,
    infer_tag,
)

__all__ = [
    "BACKGROUND", "COLORS", "RELATIONS", "SHAPES", "TAGS", "VOCAB", "MAX_PROMPT_WORDS",
    "ObjectSpec", "SceneSpec", "TaskPrompt", "Component", "DetectorConfig", "SceneScore",
    "infer_tag", "parse_prompt", "format_prompt", "tokenize", "enumerate_specs", "make_prompt_set",
    "text_overlap", "render", "layout", "shape_mask", "detect", "score",
]
