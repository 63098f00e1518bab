"""The Spotlight part of a ROLL recipe, typed and validated without ROLL.

A ROLL recipe for Spotlight has three kinds of keys:

- ROLL's own top-level keys (``exp_name``, ``seed``, ``max_steps``, ``num_gpus_per_node``, ...),
  read by ROLL's ``BaseConfig``;
- the DiT roles ``trainer``, ``rollout``, ``explorer``, ``reward`` (ROLL ``WorkerConfig`` s);
- the Spotlight sections below plus the DiT sections of our run config (``model``, ``pretrain``,
  ``task``, ``sampling``, ``train``, ``reward_fn``).

The sections are parsed by our strict loader (`roll_spotlight.configuration.from_dict`), never by
dacite: ROLL's dacite call drops unknown keys silently, so a typo such as ``spot.max_wrokers`` would
quietly run another experiment. `SpotlightConfig` (which needs ROLL) stores them as these dataclasses;
`validate_recipe` checks the same sections of a recipe file when ROLL is not installed.

The component switches (``exploration.enabled``, ``spot.enabled``, ``elastic.enabled``,
``dispatch.mode``) are the only keys a vanilla twin of a recipe changes.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from roll_spotlight.configuration import ConfigError, from_dict
from roll_spotlight.models.config import ModelConfig
from roll_spotlight.training.config import (
    GRPOConfig,
    PretrainConfig,
    RewardConfig,
    RunConfig,
    SamplingConfig,
    TaskConfig,
)

ROLE_NAMES = ("trainer", "rollout", "explorer", "reward")
COMPONENT_KEYS = ("exploration", "spot", "elastic", "dispatch")
ROLL_TRACKERS_WE_MIRROR = {"tensorboard": "tensorboard"}  # any other ROLL tracker: we write jsonl
PROVIDERS = ("aws", "gcp", "azure")


def _check(cond: bool, key: str, value: Any, rule: str) -> None:
    if not cond:
        raise ValueError(f"{key} {rule}, got {value!r}")


def _positive_int(key: str, value: Any, minimum: int = 1) -> None:
    _check(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
           key, value, f"must be an integer >= {minimum}")


@dataclass
class ExplorationConfig:
    """Seed exploration on idle spot GPUs with one-iteration-stale weights (DESIGN.md section 3).

    ``explore_num_steps`` < ``sampling.num_steps`` explores with a cheaper schedule (None: the same).
    ``rank_threshold``: below this stale-vs-fresh rank correlation the run falls back to
    ``rank_fallback`` seeds for the next iteration.
    """

    enabled: bool = True
    seeds_per_pull: int = 4
    min_seeds_before_abandon: int = 4
    max_seeds_per_prompt: int = 32
    abandon_zero_variance: bool = True
    explore_num_steps: int | None = None
    rank_threshold: float = 0.5
    rank_fallback: Literal["fresh", "random"] = "fresh"
    rank_min_pairs: int = 8

    def __post_init__(self) -> None:
        _positive_int("exploration.seeds_per_pull", self.seeds_per_pull)
        _positive_int("exploration.min_seeds_before_abandon", self.min_seeds_before_abandon, 2)
        _positive_int("exploration.max_seeds_per_prompt", self.max_seeds_per_prompt, 2)
        _positive_int("exploration.rank_min_pairs", self.rank_min_pairs, 2)
        if self.explore_num_steps is not None:
            _positive_int("exploration.explore_num_steps", self.explore_num_steps, 2)
        _check(-1.0 <= self.rank_threshold <= 1.0, "exploration.rank_threshold", self.rank_threshold,
               "must be in [-1, 1]")

    def planner_config(self, group_size: int, base_seed: int):
        """The core planner's config (exploration.planner.PlannerConfig) for a run."""
        from roll_spotlight.exploration.planner import PlannerConfig

        return PlannerConfig(group_size=group_size, seeds_per_pull=self.seeds_per_pull,
                             min_seeds_before_abandon=self.min_seeds_before_abandon,
                             abandon_zero_variance=self.abandon_zero_variance, base_seed=base_seed)

    def rank_monitor_config(self):
        from roll_spotlight.exploration.rank import RankMonitorConfig

        return RankMonitorConfig(self.rank_threshold, self.rank_fallback, self.rank_min_pairs)


@dataclass
class SpotConfig:
    """The spot pool: which Ray resources and node label mark spot GPUs, and the preemption source.

    On a real cluster (``trace: null``) preemptions come from the cloud; with ``trace`` set, a
    recorded trace (formats in ``traces/README.md``) is replayed against the pool, ``compression``
    times faster, with the provider's notice (or ``notice_s``).
    """

    enabled: bool = True
    resource: str = "spot_gpu"
    ondemand_resource: str = "ondemand_gpu"
    node_label: str = "spotlight.io/pool=spot"
    max_workers: int = 8
    gpus_per_worker: int = 1
    provider: Literal["aws", "gcp", "azure"] = "aws"
    trace: str | None = None
    notice_s: float | None = None
    compression: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("resource", "ondemand_resource"):
            _check(bool(getattr(self, key)), f"spot.{key}", getattr(self, key), "must be a Ray resource name")
        _check(self.resource != self.ondemand_resource, "spot.resource", self.resource,
               "must differ from spot.ondemand_resource")
        label_key, sep, label_value = self.node_label.partition("=")
        _check(bool(sep and label_key and label_value), "spot.node_label", self.node_label,
               "must look like 'key=value'")
        _positive_int("spot.max_workers", self.max_workers, 0)
        _positive_int("spot.gpus_per_worker", self.gpus_per_worker)
        if self.notice_s is not None:
            _check(self.notice_s >= 0, "spot.notice_s", self.notice_s, "must be >= 0")
        _check(math.isfinite(self.compression) and self.compression > 0, "spot.compression",
               self.compression, "must be a finite number > 0")

    @property
    def label(self) -> tuple[str, str]:
        key, _, value = self.node_label.partition("=")
        return key, value

    def market_config(self):
        """The core market's config (spot.market.MarketConfig) for replaying ``trace``."""
        from roll_spotlight.spot.market import MarketConfig

        return MarketConfig(notice_s=self.notice_s, seed=self.seed, compression=self.compression)


@dataclass
class ElasticConfig:
    """Elastic Ulysses sequence parallelism for rollouts (DESIGN.md section 4).

    ``sp_degree`` is the preferred degree (1: no SP, e.g. at 512x512; 4 at 1280x1280 on Qwen-Image);
    with ``enabled`` false groups are fixed and a preemption stops the group until it is replaced.
    """

    enabled: bool = True
    sp_degree: int = 1
    prefer_intra_node: bool = True
    regroup_timeout_s: float = 30.0
    pg_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        _positive_int("elastic.sp_degree", self.sp_degree)
        for key in ("regroup_timeout_s", "pg_timeout_s"):
            value = getattr(self, key)
            _check(math.isfinite(value) and value > 0, f"elastic.{key}", value, "must be a finite number > 0")


@dataclass
class DispatchConfig:
    """How rollout and exploration requests reach workers.

    ``pull``: a shared queue (``scheduler``, a name in the ``roll_spotlight.schedulers`` group) that
    workers pull from, with leases and commit-on-notice. ``static``: each worker gets a fixed share
    of the batch, as ROLL's clusters do (the vanilla baseline).
    """

    mode: Literal["pull", "static"] = "pull"
    scheduler: str = "pull_queue"
    lease_s: float = 30.0
    max_attempts: int = 3
    commit_on_notice: bool = True

    def __post_init__(self) -> None:
        _check(bool(self.scheduler), "dispatch.scheduler", self.scheduler, "must name a scheduler")
        _check(math.isfinite(self.lease_s) and self.lease_s > 0, "dispatch.lease_s", self.lease_s,
               "must be a finite number > 0")
        _positive_int("dispatch.max_attempts", self.max_attempts)

    def queue_config(self):
        from roll_spotlight.dispatch.queue import QueueConfig

        return QueueConfig(lease_s=self.lease_s, max_attempts=self.max_attempts)


@dataclass
class SpotlightSections:
    """Every section of a recipe that Spotlight owns, validated together."""

    model: ModelConfig = field(default_factory=ModelConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    train: GRPOConfig = field(default_factory=GRPOConfig)
    reward_fn: RewardConfig = field(default_factory=RewardConfig)
    exploration: ExplorationConfig = field(default_factory=ExplorationConfig)
    spot: SpotConfig = field(default_factory=SpotConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)

    def __post_init__(self) -> None:
        if self.model.preset == "tiny" and self.model.num_attention_heads % self.elastic.sp_degree:
            raise ValueError(f"elastic.sp_degree={self.elastic.sp_degree} must divide "
                             f"model.num_attention_heads={self.model.num_attention_heads} (Ulysses splits heads)")
        if self.exploration.explore_num_steps is not None:
            _check(self.exploration.explore_num_steps <= self.sampling.num_steps,
                   "exploration.explore_num_steps", self.exploration.explore_num_steps,
                   f"must be <= sampling.num_steps={self.sampling.num_steps}")
        _check(self.exploration.max_seeds_per_prompt >= self.train.group_size,
               "exploration.max_seeds_per_prompt", self.exploration.max_seeds_per_prompt,
               f"must be >= train.group_size={self.train.group_size} (the selected seeds come from them)")


SECTION_KEYS = tuple(f.name for f in dataclasses.fields(SpotlightSections))
RUN_KEYS = ("exp_name", "seed", "output_dir", "max_steps", "eval_steps", "save_steps",
            "rollout_batch_size", "track_with")


def parse_sections(data: Mapping[str, Any], *, source: str | None = None) -> SpotlightSections:
    """Strictly parse the Spotlight sections of a recipe mapping (other keys are ignored here)."""
    values = {key: to_plain(data[key]) for key in SECTION_KEYS if key in data}
    return from_dict(SpotlightSections, values, source=source)


def to_plain(value: Any) -> Any:
    """Dataclass instances (already parsed sections) back to plain data; other values unchanged."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        from roll_spotlight.configuration import to_dict

        return to_dict(value)
    return value


def run_config(top: Mapping[str, Any], sections: SpotlightSections) -> RunConfig:
    """Our RunConfig from ROLL-style top-level values and the parsed sections.

    ROLL trackers other than tensorboard (stdout, wandb, swanlab) are ROLL's to write; our own
    metrics file is then jsonl, so every run has a machine-readable curve in its run directory.
    """
    values = {key: top[key] for key in RUN_KEYS if key in top}
    if "track_with" in values:
        values["track_with"] = ROLL_TRACKERS_WE_MIRROR.get(values["track_with"], "jsonl")
    return RunConfig(**values, model=sections.model, pretrain=sections.pretrain, task=sections.task,
                     reward=sections.reward_fn, sampling=sections.sampling, train=sections.train)


def validate_recipe(data: Mapping[str, Any], *, source: str | None = None) -> tuple[SpotlightSections, RunConfig]:
    """What can be checked of a ROLL recipe without ROLL: sections, roles, names, the run config."""
    sections = parse_sections(data, source=source)
    where = f" in {source}" if source else ""
    for role in ROLE_NAMES:
        if not isinstance(data.get(role), Mapping):
            raise ConfigError(f"role '{role}' is missing{where}; a Spotlight recipe defines {list(ROLE_NAMES)}")
    if "actor_infer" in data:
        raise ConfigError(f"'actor_infer'{where}: ROLL asserts it is a vLLM/SGLang role; "
                          "the DiT rollout role is 'rollout'")
    try:
        cfg = run_config(data, sections)
    except ValueError as exc:
        raise ConfigError(f"{exc}{where}") from exc
    return sections, cfg
