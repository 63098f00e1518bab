"""Validation on fixed (prompt, seed) pairs, with paired statistics between two policies."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from roll_spotlight.rewards.reward import as_uint8_images
from roll_spotlight.training.prompt_pools import ValidationSet
from roll_spotlight.training.sampling import eval_spec, generate_in_chunks


SAMPLE_PAIRS = 8  # validation pairs whose images a run keeps (the report's base-vs-final grid)


@dataclass(frozen=True)
class Evaluation:
    """Per-pair validation outcome. `rewards[i]` belongs to pair i of the validation set.

    `samples` are the uint8 (n, H, W, 3) images of the first `SAMPLE_PAIRS` pairs, the same prompts
    and seeds at every validation, so the base and the final policy can be shown side by side.
    """

    rewards: np.ndarray
    strict: np.ndarray
    samples: np.ndarray | None = None
    # (n, 2) per pair: the background's mean intensity and patch-grid texture, what the reward
    # cannot see (`tasks.shapes.artefacts`); None for tasks without a black background
    background: np.ndarray | None = None

    @property
    def mean(self) -> float:
        return float(self.rewards.mean())

    @property
    def stderr(self) -> float:
        return float(self.rewards.std(ddof=1) / math.sqrt(len(self.rewards))) if len(self.rewards) > 1 else 0.0

    @property
    def strict_accuracy(self) -> float:
        return float(self.strict.mean())

    def summary(self) -> dict:
        out = {"val_reward": self.mean, "val_reward_se": self.stderr, "val_strict": self.strict_accuracy}
        # a measure no image defines (no clean background anywhere) is left out, never NaN
        for key, col in zip(("val_bg_level", "val_bg_grid"), () if self.background is None else self.background.T):
            if np.isfinite(col).any():
                out[key] = float(np.nanmean(col))
        return out


def evaluate(policy, val: ValidationSet, reward_fn, sampling_cfg, strict_fn=None, artefact_fn=None) -> Evaluation:
    """Generate every validation pair with the ODE sampler and score it (`score_validation`)."""
    was_training = policy.training
    policy.eval()
    try:
        images = generate_in_chunks(policy, list(val.texts), list(val.seeds), eval_spec(sampling_cfg))
    finally:
        policy.train(was_training)
    return score_validation(images, val, reward_fn, strict_fn, artefact_fn)


def validation_specs(val: ValidationSet, sampling_cfg, weight_version: int) -> list:
    """The validation pairs as ODE rollout requests of ``weight_version`` (an empty SDE window, as
    `eval_spec`), so that a backend's rollout engine and workers generate them like any rollout."""
    from roll_spotlight.dispatch.requests import RequestKind, RequestSpec, Schedule

    schedule = Schedule(sampling_cfg.eval_num_steps, sampling_cfg.noise_level, "sde", 0, 0)
    return [RequestSpec(prompt_id=i, prompt=text, seed=seed, schedule=schedule, weight_version=weight_version,
                        kind=RequestKind.ROLLOUT, iteration=weight_version)
            for i, (text, seed) in enumerate(zip(val.texts, val.seeds))]


def score_validation(images: np.ndarray, val: ValidationSet, reward_fn, strict_fn=None, artefact_fn=None) -> Evaluation:
    """Score the validation pairs' images (uint8, in pair order), wherever they were generated.

    `strict_fn` (the task's detector as a reward) supplies strict accuracy when the training reward
    is something else: a reward that rises while strict accuracy falls is being gamed.
    `artefact_fn(uint8 images) -> (level, grid)` measures what the reward cannot see
    (`tasks.shapes.artefacts.background_artefacts` on the shapes task).
    """
    out = reward_fn(images, list(val.texts))
    strict_out = strict_fn(images, list(val.texts)) if strict_fn is not None else out
    strict = strict_out.info.get("strict")
    strict = np.asarray(strict, dtype=np.float64) if strict is not None else np.full(len(images), np.nan)
    background = None
    if artefact_fn is not None:
        background = np.stack(artefact_fn(as_uint8_images(images)), axis=1)
    samples = as_uint8_images(images[:SAMPLE_PAIRS])
    return Evaluation(np.asarray(out.rewards, dtype=np.float64), strict, samples, background)


def save_samples(path, ev: Evaluation, val: ValidationSet) -> None:
    """The evaluation's sample images with their prompts, seeds and rewards, as one .npz."""
    from pathlib import Path

    if ev.samples is None:
        return
    n = len(ev.samples)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, images=ev.samples, prompts=np.asarray(val.texts[:n]),
                        seeds=np.asarray(val.seeds[:n]), rewards=ev.rewards[:n])


def paired_gain(before: Evaluation, after: Evaluation) -> dict:
    """Mean paired difference (after - before), its standard error and z."""
    diff = after.rewards - before.rewards
    se = float(diff.std(ddof=1) / math.sqrt(len(diff))) if len(diff) > 1 else float("nan")
    gain = float(diff.mean())
    z = gain / se if se > 0 else (0.0 if gain == 0 else math.copysign(math.inf, gain))
    return {"gain": gain, "gain_se": se, "z": z,
            "strict_change": after.strict_accuracy - before.strict_accuracy}
