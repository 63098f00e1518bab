"""Typed configuration of a Flow-GRPO run on one process (the core loop).

Top-level key names follow ROLL's conventions (`exp_name`, `seed`, `max_steps`, `eval_steps`,
`save_steps`, `output_dir`, `rollout_batch_size`, `track_with`) so a ROLL user finds them where
they expect. Each section is a dataclass that validates itself; `roll_spotlight.configuration`
maps YAML onto it strictly (unknown keys and wrong types are errors naming the key).

This module imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from roll_spotlight.models.config import ModelConfig

TRACKERS = ("jsonl", "tensorboard", "none")


def _require(cond: bool, key: str, value, rule: str) -> None:
    if not cond:
        raise ValueError(f"{key} {rule}, got {value!r}")


@dataclass
class TaskConfig:
    """The prompt source. `shapes` is the embedded GenEval-like tiny task."""

    name: Literal["shapes"] = "shapes"
    train_prompts: int = 2048
    val_prompts: int = 256
    tags: tuple[str, ...] | None = None
    prompt_seed: int = 1234

    def __post_init__(self) -> None:
        _require(self.train_prompts >= 1, "task.train_prompts", self.train_prompts, "must be >= 1")
        _require(self.val_prompts >= 1, "task.val_prompts", self.val_prompts, "must be >= 1")


@dataclass
class RewardConfig:
    """One reward by registry name, or a weighted sum (`weights`: name -> weight)."""

    name: str = "shapes"
    kwargs: dict = field(default_factory=dict)
    weights: dict | None = None
    fallback: float = 0.0

    def __post_init__(self) -> None:
        _require(bool(self.name) or bool(self.weights), "reward.name", self.name, "must be set")
        for key, weight in (self.weights or {}).items():
            _require(isinstance(weight, (int, float)), f"reward.weights.{key}", weight, "must be a number")


@dataclass
class SamplingConfig:
    """How rollouts are sampled. `sde_window` noised steps start inside `window_range`."""

    num_steps: int = 10
    noise_level: float = 0.7
    kind: Literal["sde", "cps"] = "sde"
    sde_window: int = 3
    window_range: tuple[int, int] = (0, 5)
    eval_num_steps: int = 10

    def __post_init__(self) -> None:
        _require(self.num_steps >= 2, "sampling.num_steps", self.num_steps, "must be >= 2")
        _require(self.noise_level > 0, "sampling.noise_level", self.noise_level, "must be > 0")
        _require(0 <= self.sde_window <= self.num_steps, "sampling.sde_window", self.sde_window,
                 f"must be in [0, sampling.num_steps={self.num_steps}]")
        lo, hi = self.window_range
        _require(0 <= lo <= hi <= self.num_steps - max(self.sde_window, 1), "sampling.window_range",
                 self.window_range, "must satisfy 0 <= lo <= hi <= num_steps - sde_window")
        _require(self.eval_num_steps >= 2, "sampling.eval_num_steps", self.eval_num_steps, "must be >= 2")


@dataclass
class GRPOConfig:
    """Flow-GRPO optimisation knobs (DESIGN.md section 4)."""

    group_size: int = 8
    learning_rate: float = 3e-5
    weight_decay: float = 0.0
    clip_range: float = 1e-4
    kl_beta: float = 0.0
    adv_clip: float = 5.0
    std_mode: Literal["group", "global"] = "group"
    max_grad_norm: float = 1.0
    micro_batch_size: int = 32
    inner_epochs: int = 1
    trainable: Literal["all", "transformer", "prompt_encoder"] = "all"
    drop_zero_std: bool = True

    def __post_init__(self) -> None:
        _require(self.group_size >= 2, "train.group_size", self.group_size,
                 "must be >= 2 (advantages are relative within a group)")
        _require(self.learning_rate > 0, "train.learning_rate", self.learning_rate, "must be > 0")
        _require(self.clip_range > 0, "train.clip_range", self.clip_range, "must be > 0")
        _require(self.kl_beta >= 0, "train.kl_beta", self.kl_beta, "must be >= 0")
        _require(self.adv_clip > 0, "train.adv_clip", self.adv_clip, "must be > 0")
        _require(self.max_grad_norm > 0, "train.max_grad_norm", self.max_grad_norm, "must be > 0")
        _require(self.micro_batch_size >= 1, "train.micro_batch_size", self.micro_batch_size, "must be >= 1")
        _require(self.inner_epochs >= 1, "train.inner_epochs", self.inner_epochs, "must be >= 1")


@dataclass
class PretrainConfig:
    """Flow-matching pretraining of the tiny base model (cached by a hash of this + the model)."""

    steps: int = 600
    batch_size: int = 32
    learning_rate: float = 1e-3
    warmup_steps: int = 50
    seed: int = 0
    eval_samples: int = 128

    def __post_init__(self) -> None:
        _require(self.steps >= 1, "pretrain.steps", self.steps, "must be >= 1")
        _require(self.batch_size >= 1, "pretrain.batch_size", self.batch_size, "must be >= 1")
        _require(self.learning_rate > 0, "pretrain.learning_rate", self.learning_rate, "must be > 0")
        _require(self.warmup_steps >= 0, "pretrain.warmup_steps", self.warmup_steps, "must be >= 0")


@dataclass
class ExplorationConfig:
    """Seed exploration (DESIGN.md section 3).

    mode: "off" (vanilla Flow-GRPO: group_size random seeds per prompt); "fresh" (explore the prompts
    of iteration t with the current weights on the critical path, train on the max-variance subset);
    "stale" (Spotlight: while iteration t trains, explore the prompts of t+1 with the weights of t,
    then regenerate the selected seeds with fresh weights at t+1).
    `seeds_per_prompt` is the exploration budget, in explored seeds per prompt on average; the
    planner decides how to spend it. Below `rank_threshold` (Spearman, stale vs fresh rewards of the
    same seeds) the run falls back to `fallback` seeds and says so.
    """

    mode: Literal["off", "fresh", "stale"] = "off"
    planner: Literal["bandit", "uniform"] = "bandit"
    seeds_per_prompt: int = 16
    seeds_per_pull: int = 4
    min_seeds_before_abandon: int = 4
    rank_threshold: float = 0.0
    fallback: Literal["random", "fresh"] = "random"

    def __post_init__(self) -> None:
        _require(self.seeds_per_prompt >= 1, "exploration.seeds_per_prompt", self.seeds_per_prompt, "must be >= 1")
        _require(self.seeds_per_pull >= 1, "exploration.seeds_per_pull", self.seeds_per_pull, "must be >= 1")
        _require(self.min_seeds_before_abandon >= 2, "exploration.min_seeds_before_abandon",
                 self.min_seeds_before_abandon, "must be >= 2")
        _require(-1.0 <= self.rank_threshold <= 1.0, "exploration.rank_threshold", self.rank_threshold,
                 "must be in [-1, 1]")


@dataclass
class RunConfig:
    """A whole run: ROLL-style top-level keys plus one section per component."""

    exp_name: str = "tiny_shapes"
    seed: int = 0
    output_dir: str = "runs"
    max_steps: int = 60
    eval_steps: int = 10
    save_steps: int = 0
    rollout_batch_size: int = 16
    track_with: str = "jsonl"
    model: ModelConfig = field(default_factory=ModelConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    train: GRPOConfig = field(default_factory=GRPOConfig)
    exploration: ExplorationConfig = field(default_factory=ExplorationConfig)

    def __post_init__(self) -> None:
        _require(bool(self.exp_name), "exp_name", self.exp_name, "must be non-empty")
        _require(self.max_steps >= 0, "max_steps", self.max_steps, "must be >= 0")
        _require(self.eval_steps >= 0, "eval_steps", self.eval_steps, "must be >= 0 (0 = only at the end)")
        _require(self.save_steps >= 0, "save_steps", self.save_steps, "must be >= 0 (0 = never)")
        _require(self.rollout_batch_size >= 1, "rollout_batch_size", self.rollout_batch_size, "must be >= 1")
        _require(self.track_with in TRACKERS, "track_with", self.track_with, f"must be one of {TRACKERS}")
        if self.exploration.mode != "off":
            _require(self.exploration.seeds_per_prompt >= self.train.group_size, "exploration.seeds_per_prompt",
                     self.exploration.seeds_per_prompt, f"must be >= train.group_size={self.train.group_size}")
