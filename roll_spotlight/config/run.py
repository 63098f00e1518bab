"""Typed configuration of a Flow-GRPO run on one process (the core loop).

Top-level key names follow ROLL's conventions (`exp_name`, `seed`, `max_steps`, `eval_steps`,
`save_steps`, `output_dir`, `rollout_batch_size`, `track_with`) so a ROLL user finds them where
they expect. Each section is a dataclass that validates itself; `roll_spotlight.config.strict`
maps YAML onto it strictly (unknown keys and wrong types are errors naming the key).

This module imports no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from roll_spotlight.models.config import ModelConfig
from roll_spotlight.models.lora import LoraConfig
from roll_spotlight.tasks.shapes.spec import TAGS

TRACKERS = ("jsonl", "tensorboard", "none")


def _require(cond: bool, key: str, value, rule: str) -> None:
    if not cond:
        raise ValueError(f"{key} {rule}, got {value!r}")


def _require_tags(key: str, tags) -> None:
    if tags is not None:
        _require(len(tags) > 0 and all(t in TAGS for t in tags), key, tags,
                 f"must be null or a non-empty list of tags from {list(TAGS)}")


@dataclass
class TaskConfig:
    """The prompt source: `shapes`, the embedded GenEval-like tiny task, or `prompts` from files.

    `shapes`: `train_prompts` generated prompts (seeded by `prompt_seed`, restricted to `tags`),
    `val_prompts` validation prompts. `layout` is how the renderer places the objects of the scenes
    the base is pretrained on (`tasks.shapes.render.layout`): "free" anywhere, "slots" in a few
    canonical slots; the detector and so every reward accept either, whatever the model draws.

    `prompts`: the lines of `train_file` and `test_file`, one prompt per line (`.txt`) or GenEval's
    metadata (`.jsonl`; `format` overrides the suffix); validation uses the first `val_prompts`
    prompts of the test file. Files are read and checked at start-up.
    """

    name: Literal["shapes", "prompts"] = "shapes"
    train_prompts: int = 2048
    val_prompts: int = 256
    tags: tuple[str, ...] | None = None
    prompt_seed: int = 1234
    layout: Literal["free", "slots"] = "free"
    train_file: str | None = None
    test_file: str | None = None
    format: Literal["txt", "geneval"] | None = None

    def __post_init__(self) -> None:
        _require(self.train_prompts >= 1, "task.train_prompts", self.train_prompts, "must be >= 1")
        _require(self.val_prompts >= 1, "task.val_prompts", self.val_prompts, "must be >= 1")
        _require_tags("task.tags", self.tags)
        if self.name == "prompts":
            for key in ("train_file", "test_file"):
                _require(bool(getattr(self, key)), f"task.{key}", getattr(self, key),
                         "must name a prompt file with task.name=prompts")
        else:
            for key in ("train_file", "test_file", "format"):
                _require(getattr(self, key) is None, f"task.{key}", getattr(self, key),
                         "applies to task.name=prompts only")


@dataclass
class RewardConfig:
    """One reward by registry name, or a weighted sum (`weights`: name -> weight).

    On Ray, `world_size` reward actors score batches of `batch_size` images; with `overlap` each
    batch is sent as soon as its rollouts complete, so a slow reward model scores while the rest of
    the iteration still rolls out instead of after it.
    """

    name: str = "shapes"
    kwargs: dict = field(default_factory=dict)
    weights: dict | None = None
    fallback: float = 0.0
    world_size: int = 1
    batch_size: int = 16
    overlap: bool = True

    def __post_init__(self) -> None:
        _require(bool(self.name) or bool(self.weights), "reward.name", self.name, "must be set")
        _require(self.world_size >= 1, "reward.world_size", self.world_size, "must be >= 1")
        _require(self.batch_size >= 1, "reward.batch_size", self.batch_size, "must be >= 1")
        for key, weight in (self.weights or {}).items():
            _require(isinstance(weight, (int, float)), f"reward.weights.{key}", weight, "must be a number")


@dataclass
class SamplingConfig:
    """How rollouts are sampled. `sde_window` noised steps start inside `window_range` (both ends
    included): flow_grpo's `sde_window_range` (a, b), which holds the whole window, is [a, b - sde_window]."""

    num_steps: int = 10
    noise_level: float = 0.7
    kind: Literal["sde", "cps", "cps_gaussian"] = "sde"
    sde_window: int = 3
    window_range: tuple[int, int] = (0, 5)
    eval_num_steps: int = 10
    # true CFG (Qwen-Image's true_cfg_scale): a second forward on the negative prompt; 1 = off.
    # None: the preset's default (4.0 for qwen_image, as flow_grpo; 1.0 for tiny)
    guidance_scale: float | None = None
    negative_prompt: str | None = " "

    def __post_init__(self) -> None:
        if self.guidance_scale is not None:
            from roll_spotlight.models.guidance import check_guidance

            check_guidance(self.guidance_scale, self.negative_prompt)
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
    """Flow-GRPO optimisation knobs (docs/design.md section 4)."""

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
    ema_decay: float = 0.0      # > 0: validate (and deliver) a moving average of the weights
    # LoRA adapters (models.lora): `use_lora` None = the preset's default (on for qwen_image, whose
    # ~20B parameters cannot be fully fine-tuned per replica; off for tiny); `lora` None = the
    # preset's values (flow_grpo's rank 64, alpha 128 on Qwen-Image's attention and MLPs)
    use_lora: bool | None = None
    lora: LoraConfig | None = None
    # "fsdp": shard the trainer's transformer over its data-parallel ranks (torch FSDP2)
    sharding: Literal["replicate", "fsdp"] = "replicate"

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
        _require(0 <= self.ema_decay < 1, "train.ema_decay", self.ema_decay, "must be in [0, 1) (0 = off)")
        _require(self.sharding == "replicate" or self.ema_decay == 0, "train.sharding", self.sharding,
                 "must be 'replicate' with train.ema_decay > 0 (fsdp keeps no weight average)")


@dataclass
class PretrainConfig:
    """Flow-matching pretraining of the tiny base model (cached by a hash of this + the model)."""

    steps: int = 600
    batch_size: int = 32
    learning_rate: float = 1e-3
    warmup_steps: int = 50
    seed: int = 0
    eval_samples: int = 128
    ema_decay: float = 0.995   # the saved base is this moving average of the weights; 0 saves the last step
    # where the training sigmas come from: "logit_normal" (sigmoid of a standard normal, as in SD3) or
    # "schedule" (u uniform in (0, 1] through the sampler's resolution shift: the sigmas sampling visits)
    sigma_sampling: Literal["logit_normal", "schedule"] = "logit_normal"
    # x_0-predicting models: the x_0 error is weighted 1 / max(sigma, loss_min_sigma)^2 (the velocity
    # loss); a larger floor moves weight from the near-clean steps to the ones that set layout and shape
    loss_min_sigma: float = 0.05
    # the tags whose scenes the base is pretrained on; null: the task's (`task.tags`). A base of the
    # whole world (every tag) fine-tuned by RL on a few tags is the usual foundation-model setting.
    tags: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _require(self.steps >= 1, "pretrain.steps", self.steps, "must be >= 1")
        _require(self.batch_size >= 1, "pretrain.batch_size", self.batch_size, "must be >= 1")
        _require(self.learning_rate > 0, "pretrain.learning_rate", self.learning_rate, "must be > 0")
        _require(self.warmup_steps >= 0, "pretrain.warmup_steps", self.warmup_steps, "must be >= 0")
        _require(0 <= self.ema_decay < 1, "pretrain.ema_decay", self.ema_decay, "must be in [0, 1)")
        _require(0 < self.loss_min_sigma <= 1, "pretrain.loss_min_sigma", self.loss_min_sigma, "must be in (0, 1]")
        _require_tags("pretrain.tags", self.tags)


@dataclass
class ExplorationConfig:
    """Seed exploration (docs/design.md section 3).

    mode: "off" (vanilla Flow-GRPO: group_size random seeds per prompt); "fresh" (explore the prompts
    of iteration t with the current weights on the critical path, train on the max-variance subset);
    "stale" (Spotlight: while iteration t trains, explore the prompts of t+1 with the weights of t,
    then regenerate the selected seeds with fresh weights at t+1).
    `seeds_per_prompt` is the exploration budget, in explored seeds per prompt on average; the
    planner decides how to spend it. Below `rank_threshold` (Spearman, stale vs fresh rewards of the
    same seeds) the run falls back to `fallback` seeds and says so. `screen_seeds` > 0 makes the
    planner's first looks at a prompt that small until its rewards differ or
    `min_seeds_before_abandon` equal ones abandon it (`PlannerConfig.screen_seeds`); 0, the default
    here, is what the tiny-task convergence studies ran: prompts are not replaced in this runtime, so
    the screening gain measured by `spotlight bench planner` (with replacement) does not carry over.

    `selection`: which `group_size` of a prompt's explored seeds are trained on: "max_variance" (the
    subset of largest reward variance) or "top_bottom" (the top ceil(k/2) and bottom floor(k/2)
    explored rewards, Sol-RL style). `baseline`: what a selected group's advantages are normalised
    by: "selected" (the group's own fresh mean and std) or "pool" (the mean and std of the stale
    rewards of every explored seed of that prompt: the selected group is not a random sample of the
    prompt's seeds, the pool nearly is). `num_steps` (null: `sampling.num_steps`) and `kind` ("sde":
    the rollouts' own sampler, its SDE window rescaled to `num_steps`; "ode": no noise) make explore
    requests cheaper than rollouts; a cheaper schedule's outputs are never trained on.

    `adaptive` (on by default: no studied setting beat vanilla beyond noise, so a run must notice
    when exploring buys nothing; docs/learning.md): the run measures what each round bought (the
    selected groups' stale reward std over a random subset's of the same pools, the share of
    all-equal groups removed, the stale-vs-fresh Spearman) over the last `adaptive_window` rounds,
    and halves the budget, down to no exploration, while neither the gain reaches
    `adaptive_min_gain` nor the removed share `adaptive_min_equal_removed`, or the Spearman is
    below `adaptive_min_spearman`; once stopped, a full-budget probe round every
    `adaptive_probe_every` iterations (0: never) can restore it
    (`roll_spotlight.exploration.adaptive`).
    """

    mode: Literal["off", "fresh", "stale"] = "off"
    planner: Literal["bandit", "uniform"] = "bandit"
    seeds_per_prompt: int = 16
    seeds_per_pull: int = 4
    min_seeds_before_abandon: int = 4
    screen_seeds: int = 0
    rank_threshold: float = 0.0
    fallback: Literal["random", "fresh"] = "random"
    selection: Literal["max_variance", "top_bottom"] = "max_variance"
    baseline: Literal["selected", "pool"] = "selected"
    num_steps: int | None = None
    kind: Literal["sde", "ode"] = "sde"
    adaptive: bool = True
    adaptive_min_gain: float = 1.05
    adaptive_min_equal_removed: float = 0.05
    adaptive_min_spearman: float = 0.3
    adaptive_window: int = 3
    adaptive_probe_every: int = 5

    def __post_init__(self) -> None:
        _require(self.seeds_per_prompt >= 1, "exploration.seeds_per_prompt", self.seeds_per_prompt, "must be >= 1")
        _require(self.selection in ("max_variance", "top_bottom"), "exploration.selection", self.selection,
                 "must be 'max_variance' or 'top_bottom'")
        _require(self.baseline in ("selected", "pool"), "exploration.baseline", self.baseline,
                 "must be 'selected' or 'pool'")
        _require(self.num_steps is None or (not isinstance(self.num_steps, bool) and self.num_steps >= 1),
                 "exploration.num_steps", self.num_steps, "must be null (sampling.num_steps) or an integer >= 1")
        _require(self.kind in ("sde", "ode"), "exploration.kind", self.kind, "must be 'sde' or 'ode'")
        _require(isinstance(self.adaptive, bool), "exploration.adaptive", self.adaptive, "must be true or false")
        _require(self.adaptive_min_gain > 0, "exploration.adaptive_min_gain", self.adaptive_min_gain,
                 "must be > 0 (a ratio of standard deviations)")
        _require(0 <= self.adaptive_min_equal_removed <= 1, "exploration.adaptive_min_equal_removed",
                 self.adaptive_min_equal_removed, "must be in [0, 1]")
        _require(-1.0 <= self.adaptive_min_spearman <= 1.0, "exploration.adaptive_min_spearman",
                 self.adaptive_min_spearman, "must be in [-1, 1]")
        _require(self.adaptive_window >= 1, "exploration.adaptive_window", self.adaptive_window, "must be >= 1")
        _require(self.adaptive_probe_every >= 0, "exploration.adaptive_probe_every", self.adaptive_probe_every,
                 "must be >= 0 (0 = never probe once stopped)")
        _require(self.seeds_per_pull >= 1, "exploration.seeds_per_pull", self.seeds_per_pull, "must be >= 1")
        _require(self.min_seeds_before_abandon >= 2, "exploration.min_seeds_before_abandon",
                 self.min_seeds_before_abandon, "must be >= 2")
        _require(self.screen_seeds >= 0, "exploration.screen_seeds", self.screen_seeds, "must be >= 0")
        _require(-1.0 <= self.rank_threshold <= 1.0, "exploration.rank_threshold", self.rank_threshold,
                 "must be in [-1, 1]")


TRAINING_PHASES = ("train", "explore", "auto")


@dataclass
class SpotConfig:
    """Spot rollout workers that come and go as a spot market says (Ray runtime only).

    With `enabled`, the Ray backend runs up to `max_workers` spot nodes of `gpus_per_node` rollout
    workers each (one per GPU) beside the on-demand workers, all pulling from one queue. With SP
    rollout groups (degree > 1) the spot workers are elastic SP members: groups span nodes as the
    planner places them and re-form from the survivors after a preemption (`elastic.groups`). A market replays `trace` (null: the synthetic market
    whose parameters come from the shipped traces, `roll_spotlight.spot.synthetic`, seeded by `seed`)
    from `start_s` trace seconds on, `compression` times faster than real time (the `--speedup` of
    `spotlight replay`). A worker told of a preemption, `notice_s` wall seconds ahead (null: the
    provider's notice / compression, at least 2 s), finishes its denoising step and commits it to the
    queue; another worker resumes it, bit for bit. `commit_every` > 0 also checkpoints every k steps,
    bounding what a kill without notice loses. Prices (USD per GPU-hour) default to the trace's GPU
    (`gpu_type` overrides it); `ondemand_usd_per_gpu_hour` / `spot_usd_per_gpu_hour` override the
    table. `zones` restricts a multi-zone trace. `count_model` says how a count trace (the number of
    a group's instances alive over time) preempts the pool's nodes: "instances" (each spot node is one
    of the group's alive instances: a drop of k among n preempts each node with probability k/n,
    seeded by `seed`; a rise starts replacements) or "capacity" (the count is a capacity: only the
    nodes above it are preempted, chosen by `victims`, so a pool smaller than the group sees no
    preemption while the count stays above it).

    `source` says where spot nodes come from: "market" (the replay above, on the cluster's
    `spot_gpu` resource) or "cluster" (a real cluster: every Ray node that declares the `spot_gpu`
    resource gets one worker pinned to it, and a preemption drain is the notice; `gpu_type` then
    names the GPUs for the cost ledger, and the market keys `trace`, `compression`, `start_s`,
    `victims`, `count_model`, `zones` do not apply).

    `training_phase` says what spot GPUs do while an update trains: "train" (they pull the
    update's micro-batches beside the trainer, `runtime.queue_training`; exploration gets what is
    left), "explore" (they explore the next prompts; training stays on the trainer) or "auto"
    (each iteration, whichever the run's measurements value more, `exploration.placement`). Null
    (the default, from the evidence in docs/learning.md: spot training shortens every update,
    exploration has cut no iterations on any task measured) trains wherever the run can, and
    explores where it cannot (LoRA off, several inner epochs, a sharded trainer).
    """

    enabled: bool = False
    source: Literal["market", "cluster"] = "market"
    trace: str | None = None
    max_workers: int = 2
    gpus_per_node: int = 1
    compression: float = 30.0
    start_s: float = 0.0
    notice_s: float | None = None
    commit_every: int = 0
    victims: Literal["newest_first", "seeded_random"] = "newest_first"
    count_model: Literal["instances", "capacity"] = "instances"
    zones: tuple[str, ...] | None = None
    seed: int = 0
    gpu_type: str | None = None
    ondemand_usd_per_gpu_hour: float | None = None
    spot_usd_per_gpu_hour: float | None = None
    training_phase: Literal["train", "explore", "auto"] | None = None

    def __post_init__(self) -> None:
        _require(self.training_phase is None or self.training_phase in TRAINING_PHASES, "spot.training_phase",
                 self.training_phase, f"must be null or one of {list(TRAINING_PHASES)}")
        _require(self.max_workers >= 1, "spot.max_workers", self.max_workers, "must be >= 1")
        _require(isinstance(self.gpus_per_node, int) and self.gpus_per_node >= 1, "spot.gpus_per_node",
                 self.gpus_per_node, "must be an integer >= 1")
        _require(math.isfinite(self.compression) and self.compression > 0, "spot.compression", self.compression,
                 "must be a finite number > 0")
        _require(math.isfinite(self.start_s) and self.start_s >= 0, "spot.start_s", self.start_s,
                 "must be a finite number >= 0")
        _require(self.notice_s is None or (math.isfinite(self.notice_s) and self.notice_s > 0), "spot.notice_s",
                 self.notice_s, "must be null or a finite number > 0")
        _require(self.commit_every >= 0, "spot.commit_every", self.commit_every, "must be >= 0 (0 = only on notice)")
        _require(self.victims in ("newest_first", "seeded_random"), "spot.victims", self.victims,
                 "must be 'newest_first' or 'seeded_random'")
        _require(self.count_model in ("instances", "capacity"), "spot.count_model", self.count_model,
                 "must be 'instances' or 'capacity'")
        _require(self.zones is None or len(self.zones) > 0, "spot.zones", self.zones, "must be null (all) or non-empty")
        _require(self.trace is None or bool(self.trace), "spot.trace", self.trace, "must be null or a path")
        _require(self.source in ("market", "cluster"), "spot.source", self.source, "must be 'market' or 'cluster'")
        if self.source == "cluster":
            _require(self.trace is None, "spot.trace", self.trace,
                     "must be null with spot.source=cluster (the cluster's own spot nodes are followed)")
            _require(self.gpu_type is not None, "spot.gpu_type", self.gpu_type,
                     "must name the GPUs with spot.source=cluster (prices for the cost ledger)")
        for key in ("ondemand_usd_per_gpu_hour", "spot_usd_per_gpu_hour"):
            value = getattr(self, key)
            _require(value is None or (math.isfinite(value) and value >= 0), f"spot.{key}", value,
                     "must be null or a finite number >= 0")


@dataclass
class DispatchConfig:
    """How the Ray runtime's rollout workers lease requests from the queue (`dispatch/`).

    `pull_batch`: requests one pull leases (`QueueConfig.pull_batch`). A worker runs its batch
    one request after another and reports it with its next pull, one queue call a batch instead of
    two a request: what lets one queue actor serve a cluster (benchmarks/queue_throughput.py). 1
    (the default) is one request a pull. Keep it at most about `rollout_batch_size` / rollout
    workers: a worker holds the requests of its batch until it reaches them, so a larger batch
    leaves others idle at the end of a step (a notice or a stop hands the unstarted ones back).
    """

    pull_batch: int = 1

    def __post_init__(self) -> None:
        _require(isinstance(self.pull_batch, int) and not isinstance(self.pull_batch, bool)
                 and self.pull_batch >= 1, "dispatch.pull_batch", self.pull_batch, "must be an integer >= 1")


def spot_training_blocker(cfg: "RunConfig") -> str | None:
    """Why this run's updates cannot be trained by spot workers (None: they can)."""
    train = cfg.train
    if train.lora is None:
        return ("train.use_lora is off, and full fine-tuning trains on the on-demand trainer only (every spot worker "
                "would send the whole model's gradient); set train.use_lora: true")
    if train.inner_epochs != 1:
        return (f"train.inner_epochs={train.inner_epochs}: spot workers compute one epoch's micro-batches from the "
                "published weight version (set train.inner_epochs: 1)")
    if train.sharding != "replicate":
        return (f"train.sharding={train.sharding}: sharded trainer ranks run collectives per micro-step; "
                "spot training needs train.sharding: replicate")
    return None


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
    spot: SpotConfig = field(default_factory=SpotConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)

    def __post_init__(self) -> None:
        _require(bool(self.exp_name), "exp_name", self.exp_name, "must be non-empty")
        _require(self.max_steps >= 0, "max_steps", self.max_steps, "must be >= 0")
        _require(self.eval_steps >= 0, "eval_steps", self.eval_steps, "must be >= 0 (0 = only at the end)")
        _require(self.save_steps >= 0, "save_steps", self.save_steps, "must be >= 0 (0 = never)")
        _require(self.rollout_batch_size >= 1, "rollout_batch_size", self.rollout_batch_size, "must be >= 1")
        _require(self.track_with in TRACKERS, "track_with", self.track_with, f"must be one of {TRACKERS}")
        self._resolve_preset_defaults()
        if self.task.name == "prompts":
            _require(self.model.preset != "tiny", "task.name", self.task.name,
                     "needs a real text encoder (model.preset=qwen_image): the tiny model knows only the "
                     "shapes task's words")
            self._fill_geneval_metadata()
        if self.exploration.mode != "off":
            _require(self.exploration.seeds_per_prompt >= self.train.group_size, "exploration.seeds_per_prompt",
                     self.exploration.seeds_per_prompt, f"must be >= train.group_size={self.train.group_size}")
        blocker = spot_training_blocker(self)
        _require(not (self.spot.enabled and self.spot.training_phase == "train" and blocker), "spot.training_phase",
                 self.spot.training_phase, f"cannot be 'train': {blocker}")

    def spot_trains(self) -> bool:
        """Do spot workers pull training micro-batches in this run (`spot.training_phase`; null:
        wherever it can)?"""
        return self.spot.enabled and self.spot.training_phase != "explore" and spot_training_blocker(self) is None

    def _fill_geneval_metadata(self) -> None:
        """A `geneval` reward on GenEval prompt files reads each prompt's metadata from those files
        unless `reward.kwargs.metadata_file` names others."""
        geneval = self.task.format == "geneval" or str(self.task.train_file).endswith(".jsonl")
        if self.reward.name == "geneval" and geneval and "metadata_file" not in self.reward.kwargs:
            self.reward.kwargs["metadata_file"] = [self.task.train_file, self.task.test_file]

    def _resolve_preset_defaults(self) -> None:
        """LoRA and guidance left unset take the model preset's defaults (see GRPOConfig and
        SamplingConfig); after this, `train.lora` is None exactly when LoRA is off."""
        from roll_spotlight.models.guidance import check_guidance

        preset, train, sampling = self.model.preset, self.train, self.sampling
        if train.use_lora is None:
            train.use_lora = preset == "qwen_image" or train.lora is not None
        train.lora = (train.lora or LoraConfig.for_preset(preset)) if train.use_lora else None
        if train.lora is not None:
            _require(train.trainable in ("all", "transformer"), "train.trainable", train.trainable,
                     "must be 'all' or 'transformer' with LoRA on (the adapters are in the transformer)")
        if sampling.guidance_scale is None:
            sampling.guidance_scale = 4.0 if preset == "qwen_image" else 1.0
        check_guidance(sampling.guidance_scale, sampling.negative_prompt)
