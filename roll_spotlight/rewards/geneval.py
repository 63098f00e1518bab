"""`geneval` reward: GenEval's rules (`geneval_rules`) on Mask2Former detections and CLIP colours.

The reward sees only prompts; each prompt's GenEval metadata (what the image must include) comes
from the metadata files it is built with (`metadata_file`: one path or a list, usually the task's
train and test files) or from a prompt -> metadata mapping given in code. A prompt found in neither
is a ValueError naming it. Config::

    reward_fn:
      name: geneval
      kwargs:
        detector_path: /models/mask2former-swin-small-coco-instance   # Mask2FormerForUniversalSegmentation
        clip_path: /models/clip-vit-large-patch14                       # CLIPModel + CLIPProcessor
        metadata_file: [data/geneval/train_metadata.jsonl, data/geneval/test_metadata.jsonl]
        mode: partial          # which score is the reward: partial | strict | geneval

rewards = the chosen score; info always holds all three ("strict", "partial", "geneval"; see
`geneval_rules`). Directories are checked when the reward is built, weights read on the first score.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from roll_spotlight.checks import require_choice, require_int
from roll_spotlight.rewards.reward import Reward, RewardOutput
from roll_spotlight.rewards.geneval_rules import (
    Detection,
    GenevalRules,
    evaluate,
    select_detections,
)
from roll_spotlight.tasks.prompt_files import (
    load_prompt_file,
    metadata_by_prompt,
    validate_geneval_metadata,
)

GENEVAL_MODES = ("partial", "strict", "geneval")
KEY = "reward_fn.kwargs"

Detector = Callable[[np.ndarray, list[float]], list[dict[str, list[Detection]]]]  # images, cutoffs
ColorModel = Callable[[np.ndarray, str, list[Detection]], list[str]]  # image, class, detections


class GenevalReward(Reward):
    """GenEval score of each image for its prompt's metadata. `detector` / `color_model` may be
    injected (tests, other detectors); otherwise they are built from `detector_path` / `clip_path`."""

    def __init__(self, detector_path: str | None = None, clip_path: str | None = None,
                 metadata_file: str | Sequence[str] | None = None,
                 metadata: Mapping[str, Mapping[str, Any]] | None = None, mode: str = "partial",
                 device: str = "auto", batch_size: int = 4, top_k: int = 100,
                 detector: Detector | None = None, color_model: ColorModel | None = None,
                 **thresholds: float) -> None:
        require_choice(f"{KEY}.mode", mode, GENEVAL_MODES)
        require_int(f"{KEY}.batch_size", batch_size)
        unknown = sorted(set(thresholds) - set(GenevalRules.__dataclass_fields__))
        if unknown:
            raise ValueError(f"{KEY}.{unknown[0]} is not a GenevalReward option")
        self.mode, self.rules = mode, GenevalRules(**thresholds)
        self.metadata = _metadata_table(metadata_file, metadata)
        self._detector, self._colors = detector, color_model
        self._clip_path, self._device = clip_path, device
        if detector is None or color_model is None:
            from roll_spotlight.rewards.geneval_models import (
                Mask2FormerDetector,
                local_model_dir,
                resolve_device,
            )

            self._device = resolve_device(device)
            if detector is None:
                self._detector = Mask2FormerDetector(detector_path, f"{KEY}.detector_path", self._device,
                                                     batch_size, top_k)
            if color_model is None:
                local_model_dir(clip_path, f"{KEY}.clip_path", ("clip",))

    def score(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        metas = [self._lookup(prompt) for prompt in prompts]  # fail on an unknown prompt before any model work
        cutoffs = [self.rules.counting_threshold if m["tag"] == "counting" else self.rules.threshold for m in metas]
        detections = self._detector(images, cutoffs)
        colors = self._color_model()
        results = []
        for image, meta, found in zip(images, metas, detections):
            objects = select_detections(found, meta["tag"], self.rules)
            results.append(evaluate(objects, meta, lambda name, dets, im=image: colors(im, name, list(dets)),
                                    self.rules))
        info = {key: np.array([float(getattr(r, key)) for r in results]) for key in GENEVAL_MODES}
        return RewardOutput(info[self.mode].copy(), info)

    def _lookup(self, prompt: str) -> Mapping[str, Any]:
        meta = self.metadata.get(prompt)
        if meta is None:
            raise ValueError(f"geneval reward: no GenEval metadata for prompt {prompt!r} in "
                             f"{KEY}.metadata_file ({len(self.metadata)} prompts known)")
        return meta

    def _color_model(self) -> ColorModel:
        if self._colors is None:
            from roll_spotlight.rewards.geneval_models import (
                ClipColorClassifier,
                load_clip,
            )

            self._colors = ClipColorClassifier(load_clip(self._clip_path, f"{KEY}.clip_path", self._device))
        return self._colors


def _metadata_table(files: str | Sequence[str] | None,
                    mapping: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    """prompt -> validated metadata from the files and the mapping (files first)."""
    if files is None and mapping is None:
        raise ValueError(f"{KEY}.metadata_file must name the GenEval metadata.jsonl file(s) of the prompts")
    paths = [files] if isinstance(files, str) else list(files or [])
    records = [record for path in paths for record in load_prompt_file(path, "geneval")]
    table = metadata_by_prompt(records, source=f"{KEY}.metadata_file")
    for prompt, meta in (mapping or {}).items():
        checked = validate_geneval_metadata(dict(meta), where=f"metadata[{prompt!r}]")
        if checked["prompt"] != prompt:
            raise ValueError(f"metadata[{prompt!r}] describes another prompt {checked['prompt']!r}")
        table[prompt] = checked
    return table
