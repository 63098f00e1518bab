"""Synthetic tasks with programmatic rewards, small enough to learn on a CPU.

`roll_spotlight.tasks.shapes` is a GenEval-like world (coloured shapes, counts, relations) for a
tiny pixel-space DiT. Everything here is numpy only; nothing imports torch.
"""
from roll_spotlight.tasks.shapes import (
    TAGS,
    VOCAB,
    SceneSpec,
    TaskPrompt,
    format_prompt,
    make_prompt_set,
    parse_prompt,
    render,
    score,
)

__all__ = ["TAGS", "VOCAB", "SceneSpec", "TaskPrompt", "format_prompt", "make_prompt_set",
           "parse_prompt", "render", "score"]
