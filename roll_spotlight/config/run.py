"""Typed configuration of a Flow-GRPO run on one process (the core loop).

Top-level key names follow ROLL's conventions (`exp_name`, `seed`, `max_steps`, `eval_steps`,
`save_steps`, `output_dir`, `rollout_batch_size`, `track_with`) so a ROLL user finds them where
they expect. Each section is a dataclass that validates itself; `roll_spotlight.config.strict`
maps YAML onto it strictly (unknown keys and wrong types are errors naming the key).

This module imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from roll_spotlight.checks import (require, require_choice, require_each, require_int, require_literals,
                                   require_number)
from roll_spotlight.dispatch.queue import QueueConfig
from roll_spotlight.models.model_config import ModelConfig
from roll_spotlight.models.lora import LoraConfig
from roll_spotlight.tasks.shapes.spec import TAGS

TRACKERS = ("jsonl", "tensorboard", "none")


def _require_tags(key: str, tags) -> None:
    require(tags is None or (len(tags) > 0 and all(t in TAGS for t in tags)), key, tags,
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
        require_each(self, "task", ("train_prompts", "val_prompts"), require_int)
        _require_tags("task.tags", self.tags)
        files = self.name == "prompts"
        for key in ("train_file", "test_file", "format"):
            value = getattr(self, key)
            if files and key != "format":
                require(bool(value), f"task.{key}", value, "must name a prompt file with task.name=prompts")
            elif not files:
                require(value is None, f"task.{key}", value, "applies to task.name=prompts only")


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
        require(bool(self.name) or bool(self.weights), "reward.name", self.name, "must be set")
        require_each(self, "reward", ("world_size", "batch_size"), require_int)
        for key, weight in (self.weights or {}).items():
            require(isinstance(weight, (int, float)) and not isinstance(weight, bool), f"reward.weights.{key}",
                    weight, "must be a number")


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
    # rollouts of one shape a worker denoises in one forward per step (1: each request alone)
    max_batch: int = 1

    def __post_init__(self) -> None:
        if self.guidance_scale is not None:
            from roll_spotlight.models.guidance import check_guidance

            check_guidance(self.guidance_scale, self.negative_prompt)
        require_each(self, "sampling", ("num_steps", "eval_num_steps"), require_int, ">= 2")
        require_int("sampling.max_batch", self.max_batch)
        require_number("sampling.noise_level", self.noise_level)
        require_int("sampling.sde_window", self.sde_window, f"[0, {self.num_steps}]",
                    why=f"(sampling.num_steps={self.num_steps})")
        lo, hi = self.window_range
        require(0 <= lo <= hi <= self.num_steps - max(self.sde_window, 1), "sampling.window_range",
                self.window_range, "must satisfy 0 <= lo <= hi <= num_steps - sde_window")


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
    # every on-demand rollout worker also computes micro-batches of each update (through the queue,
    # `runtime.queue_training`): each GPU that rolls out trains too, as ROLL's colocated actor_train
    # and actor_infer do; otherwise the trainer alone, unless spot workers train (spot.training_phase)
    colocated: bool = False

    def __post_init__(self) -> None:
        require_int("train.group_size", self.group_size, ">= 2", why="(advantages are relative within a group)")
        require_each(self, "train", ("learning_rate", "clip_range", "adv_clip", "max_grad_norm"), require_number)
        require_number("train.kl_beta", self.kl_beta, ">= 0")
        require_each(self, "train", ("micro_batch_size", "inner_epochs"), require_int)
        require_number("train.ema_decay", self.ema_decay, "[0, 1)", why="(0 = off)")
        require(self.sharding == "replicate" or self.ema_decay == 0, "train.sharding", self.sharding,
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
        require_each(self, "pretrain", ("steps", "batch_size"), require_int)
        require_int("pretrain.warmup_steps", self.warmup_steps, ">= 0")
        require_number("pretrain.learning_rate", self.learning_rate)
        require_number("pretrain.ema_decay", self.ema_decay, "[0, 1)")
        require_number("pretrain.loss_min_sigma", self.loss_min_sigma, "(0, 1]")
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
    the screening gain measured by `python -m benchmarks.planner_bench` (with replacement) does not carry over.

    `selection`: which `group_size` of a prompt's explored seeds are trained on: "max_variance" (the
    subset of largest reward variance) or "top_bottom" (the top ceil(k/2) and bottom floor(k/2)
    explored rewards, Sol-RL style). `baseline`: what a selected group's advantages are normalised
    by: "selected" (the group's own fresh mean and std) or "pool" (the mean and std of the stale
    rewards of every explored seed of that prompt: the selected group is not a random sample of the
    prompt's seeds, the pool nearly is). `num_steps` (null: `sampling.num_steps`) and `kind` ("sde":
    the rollouts' own sampler, its SDE window rescaled to `num_steps`; "ode": no noise) make explore
    requests cheaper than rollouts; a cheaper schedule's outputs are never trained on.

    `target`: what exploration chooses: "seeds" (above), or "prompts" (`exploration.screen`): of
    `prompt_candidates` x `rollout_batch_size` drawn prompts, spot GPUs explore `prompt_screen_seeds`
    seeds each, and the batch keeps those least likely to give an all-equal group (reward history
    decayed by `prompt_decay` per iteration; each keeps `prompt_floor` of a uniform draw's chance).
    `unbiased` weights each sample by 1 / its inclusion probability (Horvitz-Thompson); with target
    seeds it needs `selection: pps`, `baseline: pool` and `planner: uniform`.

    `adaptive` (on by default: no studied setting beat vanilla beyond noise, so a run must notice
    when exploring buys nothing; docs/learning.md): the run measures what each round bought (the
    selected groups' stale reward std over a random subset's of the same pools, the share of
    all-equal groups removed, the stale-vs-fresh Spearman) over the last `adaptive_window` rounds,
    and halves the budget, down to no exploration, while neither the gain reaches
    `adaptive_min_gain` nor the removed share `adaptive_min_equal_removed`, or the Spearman is
    below `adaptive_min_spearman`; once stopped, a full-budget probe round every
    `adaptive_probe_every` iterations (0: never) can restore it
    (`roll_spotlight.exploration.adaptive`). It also picks the target (`adaptive.TargetSwitch`) from
    the all-equal share against `adaptive_screen_above` and the screen's value against
    `adaptive_min_screen_value`.
    """

    mode: Literal["off", "fresh", "stale"] = "off"
    planner: Literal["bandit", "uniform"] = "bandit"
    seeds_per_prompt: int = 16
    seeds_per_pull: int = 4
    min_seeds_before_abandon: int = 4
    screen_seeds: int = 0
    rank_threshold: float = 0.0
    fallback: Literal["random", "fresh"] = "random"
    selection: Literal["max_variance", "top_bottom", "pps"] = "max_variance"
    baseline: Literal["selected", "pool"] = "selected"
    num_steps: int | None = None
    kind: Literal["sde", "ode"] = "sde"
    target: Literal["seeds", "prompts"] = "seeds"
    unbiased: bool = False
    prompt_candidates: int = 2
    prompt_screen_seeds: int = 4
    prompt_floor: float = 0.1
    prompt_decay: float = 0.7
    adaptive: bool = True
    adaptive_min_gain: float = 1.05
    adaptive_min_equal_removed: float = 0.05
    adaptive_min_spearman: float = 0.3
    adaptive_window: int = 3
    adaptive_probe_every: int = 5
    adaptive_screen_above: float = 0.3
    adaptive_min_screen_value: float = 0.05

    def __post_init__(self) -> None:
        key = "exploration"
        require_each(self, key, ("seeds_per_prompt", "seeds_per_pull", "adaptive_window"), require_int)
        require_int("exploration.num_steps", self.num_steps, optional=True, why="(null: sampling.num_steps)")
        require_int("exploration.min_seeds_before_abandon", self.min_seeds_before_abandon, ">= 2")
        require_each(self, key, ("screen_seeds", "adaptive_probe_every"), require_int, ">= 0", why="(0: off)")
        require_literals(self, key)
        for name in ("adaptive", "unbiased"):
            require(isinstance(getattr(self, name), bool), f"{key}.{name}", getattr(self, name), "must be true or false")
        require_int("exploration.prompt_candidates", self.prompt_candidates, ">= 2", why="(x rollout_batch_size)")
        require_int("exploration.prompt_screen_seeds", self.prompt_screen_seeds, ">= 0", why="(0: history only)")
        require_each(self, key, ("prompt_floor", "prompt_decay"), require_number, "(0, 1]")
        if self.unbiased and self.target == "seeds":
            chosen = (self.selection, self.baseline, self.planner)
            require(chosen == ("pps", "pool", "uniform"), "exploration.unbiased", self.unbiased,
                    f"with target seeds needs selection pps, baseline pool and planner uniform, not {chosen}")
        require_number("exploration.adaptive_min_gain", self.adaptive_min_gain, why="(a ratio of standard deviations)")
        require_each(self, key, ("adaptive_min_equal_removed", "adaptive_screen_above", "adaptive_min_screen_value"),
                     require_number, "[0, 1]")
        require_each(self, key, ("adaptive_min_spearman", "rank_threshold"), require_number, "[-1, 1]")


SPOT_RESOURCE, ONDEMAND_RESOURCE = "spot_gpu", "ondemand_gpu"  # the Ray resources of spot and on-demand GPUs


@dataclass
class SpotConfig:
    """Spot rollout workers that come and go as a spot market says (Ray runtime only).

    With `enabled`, the Ray backend runs up to `max_workers` spot nodes of `gpus_per_node` rollout
    workers each (one per GPU) beside the on-demand workers, all pulling from one queue. With SP
    rollout groups (degree > 1) the spot workers are elastic SP members: groups span nodes as the
    planner places them and re-form from the survivors after a preemption (`elastic.groups`). A market replays `trace` (null: the synthetic market
    whose parameters come from the shipped traces, `roll_spotlight.spot.synthetic`, seeded by `seed`)
    from `start_s` trace seconds on, `compression` times faster than real time (the `--speedup` of
    `python -m benchmarks.replay`). A worker told of a preemption, `notice_s` wall seconds ahead (null: the
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
    (each iteration, whichever the run's measurements value more, `exploration.spot_share`). Null
    (the default, from the evidence in docs/learning.md: spot training shortens every update,
    exploration has cut no iterations on any task measured) trains wherever the run can, and
    explores where it cannot (LoRA off, several inner epochs, a sharded trainer).
    `commit_on_notice` false ignores notices: a node's work is lost at its kill and restarts
    elsewhere from scratch (the naive-spot baseline Spotlight is compared with).

    Where spot GPUs live on a Ray cluster, for whoever deploys one (deploy/kuberay declares them):
    `resource` is the custom resource spot nodes carry and spot workers ask for, `ondemand_resource`
    the one of on-demand GPUs, `node_label` the Kubernetes label of spot nodes. The workers of both
    hosts ask for `spot_gpu` and `ondemand_gpu`, so those are the only values accepted so far.
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
    commit_on_notice: bool = True
    resource: str = SPOT_RESOURCE
    ondemand_resource: str = ONDEMAND_RESOURCE
    node_label: str = "spotlight.io/pool=spot"

    def __post_init__(self) -> None:
        require_literals(self, "spot")
        require_each(self, "spot", ("max_workers", "gpus_per_node"), require_int)
        require_int("spot.commit_every", self.commit_every, ">= 0", why="(0 = only on notice)")
        require_number("spot.compression", self.compression)
        require_number("spot.start_s", self.start_s, ">= 0")
        require_number("spot.notice_s", self.notice_s, optional=True)
        require_each(self, "spot", ("ondemand_usd_per_gpu_hour", "spot_usd_per_gpu_hour"), require_number, ">= 0",
                     optional=True)
        require(self.zones is None or len(self.zones) > 0, "spot.zones", self.zones, "must be null (all) or non-empty")
        require(self.trace is None or bool(self.trace), "spot.trace", self.trace, "must be null or a path")
        if self.source == "cluster":
            require(self.trace is None, "spot.trace", self.trace,
                    "must be null with spot.source=cluster (the cluster's own spot nodes are followed)")
            require(self.gpu_type is not None, "spot.gpu_type", self.gpu_type,
                    "must name the GPUs with spot.source=cluster (prices for the cost ledger)")
        require_choice("spot.resource", self.resource, (SPOT_RESOURCE,))
        require_choice("spot.ondemand_resource", self.ondemand_resource, (ONDEMAND_RESOURCE,))
        label_key, sep, label_value = self.node_label.partition("=")
        require(bool(sep and label_key and label_value), "spot.node_label", self.node_label,
                "must look like 'key=value'")

    @property
    def label(self) -> tuple[str, str]:
        """`node_label` as (key, value)."""
        key, _, value = self.node_label.partition("=")
        return key, value


@dataclass(frozen=True)
class DispatchConfig:
    """How rollout and exploration requests reach workers (`dispatch/`).

    `mode`: "pull" (a shared queue that on-demand and spot workers pull from, with leases and
    commit-on-notice) or "static" (each rollout rank gets a fixed share of the batch, as ROLL's
    clusters do: the ROLL host's vanilla baseline; `spotlight train` always pulls). `scheduler`
    names the queue in the ``roll_spotlight.schedulers`` group. `lease_s`, `max_attempts` and
    `pull_batch` are the queue's own keys (`dispatch.queue.QueueConfig`, which checks them).

    `pull_batch`: requests one pull leases. A worker runs its batch one request after another and
    reports it with its next pull, one queue call a batch instead of two a request: what lets one
    queue actor serve a cluster (benchmarks/queue_throughput.py). 1 (the default) is one request a
    pull. Keep it at most about `rollout_batch_size` / rollout workers: a worker holds the requests
    of its batch until it reaches them, so a larger batch leaves others idle at the end of a step
    (a notice or a stop hands the unstarted ones back).
    """

    mode: Literal["pull", "static"] = "pull"
    scheduler: str = "pull_queue"
    lease_s: float = QueueConfig.lease_s
    max_attempts: int = QueueConfig.max_attempts
    pull_batch: int = QueueConfig.pull_batch

    def __post_init__(self) -> None:
        require_literals(self, "dispatch")
        require(bool(self.scheduler), "dispatch.scheduler", self.scheduler, "must name a scheduler")
        self.queue_config()

    def queue_config(self) -> QueueConfig:
        return QueueConfig(lease_s=self.lease_s, max_attempts=self.max_attempts, pull_batch=self.pull_batch)


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
        require(bool(self.exp_name), "exp_name", self.exp_name, "must be non-empty")
        require_int("max_steps", self.max_steps, ">= 0")
        require_int("eval_steps", self.eval_steps, ">= 0", why="(0 = only at the end)")
        require_int("save_steps", self.save_steps, ">= 0", why="(0 = never)")
        require_int("rollout_batch_size", self.rollout_batch_size)
        require_choice("track_with", self.track_with, TRACKERS)
        self._resolve_preset_defaults()
        if self.task.name == "prompts":
            require(self.model.preset != "tiny", "task.name", self.task.name,
                    "needs a real text encoder (model.preset=qwen_image): the tiny model knows only the "
                    "shapes task's words")
            self._fill_geneval_metadata()
        if self.exploration.mode != "off":
            require(self.exploration.seeds_per_prompt >= self.train.group_size, "exploration.seeds_per_prompt",
                    self.exploration.seeds_per_prompt, f"must be >= train.group_size={self.train.group_size}")
        require(not self.spot.enabled or self.dispatch.mode == "pull", "dispatch.mode", self.dispatch.mode,
                "must be 'pull' with spot.enabled (spot workers pull from the queue)")
        blocker = spot_training_blocker(self)
        require(not (self.spot.enabled and self.spot.training_phase == "train" and blocker), "spot.training_phase",
                self.spot.training_phase, f"cannot be 'train': {blocker}")
        require(not (self.train.colocated and blocker), "train.colocated", self.train.colocated,
                f"cannot be true: {blocker}")

    def spot_trains(self) -> bool:
        """Do spot workers pull training micro-batches in this run (`spot.training_phase`; null:
        wherever it can)?"""
        return self.spot.enabled and self.spot.training_phase != "explore" and spot_training_blocker(self) is None

    def queue_trains(self) -> bool:
        """Do updates go through the queue (`runtime.queue_training`): spot workers train, or every
        on-demand rollout worker does (`train.colocated`)?"""
        return self.train.colocated or self.spot_trains()

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
            require(train.trainable in ("all", "transformer"), "train.trainable", train.trainable,
                    "must be 'all' or 'transformer' with LoRA on (the adapters are in the transformer)")
        if sampling.guidance_scale is None:
            sampling.guidance_scale = 4.0 if preset == "qwen_image" else 1.0
        check_guidance(sampling.guidance_scale, sampling.negative_prompt)
