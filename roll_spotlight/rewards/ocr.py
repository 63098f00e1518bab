"""OCR reward for text rendering (Flow-GRPO's formula), with RapidOCR on CPU.

The target is the text inside the prompt's first pair of double quotes. Target and recognised text
are lower-cased with all whitespace removed; then

    reward = 1 - min(levenshtein(recognised, target), len(target)) / len(target)

and 1.0 whenever the target is a substring of the recognised text (extra text is not penalised).
`rapidocr_onnxruntime` is imported lazily, on the first score, and its engine is built once; its
wheel bundles the PP-OCRv4 models, so it runs offline.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from roll_spotlight.rewards.reward import Reward, RewardOutput
from roll_spotlight.tasks.ocr_text import normalize_text, quoted_target

TextRecognizer = Callable[[np.ndarray], str]  # uint8 RGB (H, W, 3) -> recognised text


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert, delete, substitute; each cost 1), O(len(a) * len(b)) time, O(len(b)) memory."""
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def ocr_text_reward(recognized: str, target: str) -> float:
    """Flow-GRPO's OCR reward of a recognised text against a target (both normalised here)."""
    target, recognized = normalize_text(target), normalize_text(recognized)
    if not target:
        raise ValueError("OCR target text is empty after removing whitespace")
    if target in recognized:
        return 1.0
    return 1.0 - min(levenshtein(recognized, target), len(target)) / len(target)


class RapidOcrRecognizer:
    """RapidOCR (onnxruntime) behind the `TextRecognizer` signature; detected lines are joined in
    RapidOCR's reading order (top to bottom, left to right)."""

    def __init__(self) -> None:
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as err:
            raise ImportError("OcrReward needs rapidocr_onnxruntime: pip install 'roll_spotlight[ocr]'") from err
        self._engine = RapidOCR()

    def __call__(self, image: np.ndarray) -> str:
        result, _ = self._engine(np.ascontiguousarray(image[:, :, ::-1]))  # RapidOCR takes arrays as BGR
        return "".join(line[1] for line in result) if result else ""


class OcrReward(Reward):
    """OCR accuracy of the quoted text of each prompt; `recognizer` is injectable for tests."""

    def __init__(self, recognizer: TextRecognizer | None = None) -> None:
        self._recognizer = recognizer

    def score(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        targets = [quoted_target(p) for p in prompts]  # fail on a bad prompt before any OCR work
        if self._recognizer is None:
            self._recognizer = RapidOcrRecognizer()
        recognized = [self._recognizer(image) for image in images]
        rewards = [ocr_text_reward(text, target) for text, target in zip(recognized, targets)]
        exact = [float(normalize_text(t) == normalize_text(r)) for t, r in zip(targets, recognized)]
        return RewardOutput(np.array(rewards), {"exact_match": np.array(exact)})
