"""`pickscore` reward: the PickScore_v1 preference model (a CLIP-H fine-tune) from local directories.

score = logit_scale.exp() * cosine(image embedding, prompt embedding), as PickScore defines it, and
the reward is score / `normalize_by` (26 by default, flow_grpo's scaling to about [0, 1]); the
unscaled score is info["pickscore_raw"]. PickScore_v1's repository holds the model only; its
processor is laion's CLIP-ViT-H-14 one, so `processor_path` may name a second directory
(default: the model directory). Config::

    reward_fn:
      name: pickscore
      kwargs:
        model_path: /models/PickScore_v1
        processor_path: /models/CLIP-ViT-H-14-laion2B-s32B-b79K

Directories are checked when the reward is built, weights read on the first score; nothing is
downloaded.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from roll_spotlight.checks import require_int, require_number
from roll_spotlight.rewards.reward import Reward, RewardOutput

KEY = "reward_fn.kwargs"
MAX_TEXT_TOKENS = 77  # CLIP's context length


class PickScoreReward(Reward):
    def __init__(self, model_path: str | None = None, processor_path: str | None = None, device: str = "auto",
                 batch_size: int = 16, normalize_by: float = 26.0) -> None:
        from roll_spotlight.rewards.geneval_models import (
            local_model_dir,
            resolve_device,
        )

        local_model_dir(model_path, f"{KEY}.model_path", ("clip",))
        if processor_path is not None and not Path(processor_path).is_dir():
            raise ValueError(f"{KEY}.processor_path={processor_path!r}: no such directory "
                             "(nothing is downloaded; put the CLIP processor there)")
        require_int(f"{KEY}.batch_size", batch_size)
        require_number(f"{KEY}.normalize_by", normalize_by)
        self.model_path, self.processor_path = model_path, processor_path
        self.device, self.batch_size, self.normalize_by = resolve_device(device), batch_size, float(normalize_by)
        self._clip = None

    def score(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        if self._clip is None:
            from roll_spotlight.rewards.geneval_models import load_clip

            self._clip = load_clip(self.model_path, f"{KEY}.model_path", self.device,
                                   self.processor_path, f"{KEY}.processor_path")
        raw = np.concatenate([self._scores(images[i:i + self.batch_size], prompts[i:i + self.batch_size])
                              for i in range(0, len(images), self.batch_size)])
        return RewardOutput(raw / self.normalize_by, {"pickscore_raw": raw})

    def _scores(self, images: np.ndarray, prompts: list[str]) -> np.ndarray:
        import torch

        from roll_spotlight.rewards.geneval_models import embedding

        clip = self._clip
        pixels = clip.processor(images=list(images), return_tensors="pt")["pixel_values"].to(clip.device)
        tokens = clip.processor(text=prompts, return_tensors="pt", padding=True, truncation=True,
                                max_length=MAX_TEXT_TOKENS)
        with torch.no_grad():
            image = embedding(clip.model.get_image_features(pixel_values=pixels)).float()
            text = embedding(clip.model.get_text_features(input_ids=tokens["input_ids"].to(clip.device),
                                                          attention_mask=tokens["attention_mask"].to(clip.device))).float()
            image = image / image.norm(dim=-1, keepdim=True)
            text = text / text.norm(dim=-1, keepdim=True)
            scores = clip.model.logit_scale.exp().float() * (image * text).sum(-1)
        return scores.cpu().numpy().astype(np.float64)
