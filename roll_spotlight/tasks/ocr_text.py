"""The text an OCR prompt asks for, and the normal form two texts are compared in.

An OCR prompt carries its target between its first pair of double quotes; the prompt generator
checks its prompts with these, and the `ocr` reward scores recognised text against that target
after both are lower-cased with all whitespace removed. They live with the tasks, below the
rewards, so that writing prompts needs no reward.
"""
from __future__ import annotations


def quoted_target(prompt: str) -> str:
    """The text inside the first pair of double quotes; ValueError naming the prompt otherwise."""
    parts = prompt.split('"')
    if len(parts) < 3:
        raise ValueError(f"OCR prompt {prompt!r} has no text in a pair of double quotes")
    return parts[1]


def normalize_text(text: str) -> str:
    return "".join(text.split()).lower()
