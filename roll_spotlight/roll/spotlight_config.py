"""`SpotlightConfig`: a ROLL ``BaseConfig`` with ROLL's roles and the typed Spotlight sections.

This module imports ROLL at the top; reach it through ``roll_spotlight.roll.SpotlightConfig``.

Fitting ROLL's ``BaseConfig`` (v0.3.0), so that a recipe reads like a ROLL recipe:

- The roles have ROLL's names: ``actor_train`` (the Flow-GRPO trainer), ``actor_infer`` (the DiT
  rollout), ``reward``; ``pretrain`` is the model path, as in ROLL's ``PPOConfig``. ROLL's
  ``BaseConfig`` asserts that ``actor_infer.strategy_args``, when set, names vLLM or SGLang; the
  recipes leave it unset and each role's worker class and strategy default in code
  (`roll_spotlight.roll.sections.ROLE_DEFAULTS`). Setting it is refused with that explanation
  before ROLL's bare assertion can fire.
- ``BaseConfig.__post_init__`` asserts ``response_length or sequence_length``: token lengths of an
  LLM rollout. A diffusion rollout has none (its "length" is the number of image tokens, fixed by
  the resolution), so ``sequence_length`` defaults to the dummy `DUMMY_SEQUENCE_LENGTH`; no code of
  ours reads it and recipes do not show it.
- ROLL's launchers call dacite without a config: nested dataclasses are not strict and lists do
  not become tuples. The Spotlight sections are therefore declared as mappings for dacite and parsed
  in ``__post_init__`` by our strict loader into their dataclasses (unknown keys are errors), and
  `from_mapping` rejects earlier role names before dacite can drop them.
- ``track_with`` defaults to ``stdout``: ROLL's default, tensorboard, is not installed by ROLL.
- The trainer is data-parallel over ``actor_train.world_size`` ranks (`roll_spotlight.roll.workers`);
  every rank needs at least one sample of each iteration's batch, so more ranks than
  ``rollout_batch_size * train.group_size`` fail here, at parse time, with the fix in the message.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from roll.configs.base_config import BaseConfig
from roll.configs.worker_config import WorkerConfig

from roll_spotlight.config.strict import ConfigError
from roll_spotlight.roll.sections import (
    COMPONENT_KEYS,
    ROLE_DEFAULTS,
    ROLE_NAMES,
    RUN_KEYS,
    SECTION_KEYS,
    SpotlightSections,
    check_recipe_keys,
    check_top_level_keys,
    one_rank_spot_training,
    parse_sections,
    recipe_key,
    run_config,
)
from roll_spotlight.config.run import RunConfig

DUMMY_SEQUENCE_LENGTH = 1
PIPELINE_CLS = "roll_spotlight.roll.pipeline.SpotlightPipeline"
Section = Union[Dict[str, Any], Any]  # a mapping from YAML, the parsed dataclass after __post_init__


def _section(help: str) -> Any:
    """A Spotlight section as ROLL's dacite sees it: a mapping, parsed in ``__post_init__``."""
    return field(default_factory=dict, metadata={"help": help})


@dataclass
class SpotlightConfig(BaseConfig):
    """A ROLL pipeline config for Spotlight's Flow-GRPO (roles, DiT sections, Spotlight sections)."""

    pipeline_cls: str = field(default=PIPELINE_CLS, metadata={"help": "pipeline class the launcher starts"})
    sequence_length: Optional[int] = field(
        default=DUMMY_SEQUENCE_LENGTH,
        metadata={"help": "dummy: BaseConfig asserts a token length; a diffusion rollout has none"})
    track_with: str = field(default="stdout", metadata={"help": "ROLL tracker: stdout, tensorboard, wandb, ..."})
    patches: List[str] = field(default_factory=list,
                               metadata={"help": "roll_spotlight.patches applied by the launcher (LEDGER.md)"})
    pretrain: Optional[str] = field(
        default=None, metadata={"help": "model path, as in ROLL: a local diffusers directory (fills model.path)"})
    recipe_file: Optional[str] = field(
        default=None, metadata={"help": "the recipe's file, named in errors (set by from_mapping's source)"})
    emulate: Optional[Dict[str, Any]] = field(
        default=None, metadata={"help": "emulated GPUs {gpu, time_scale}: set by the launcher's --emulate GPU "
                                        "--time-scale S (worker.emulated)"})

    actor_train: WorkerConfig = field(default_factory=WorkerConfig, metadata={"help": "Flow-GRPO trainer"})
    actor_infer: WorkerConfig = field(default_factory=WorkerConfig,
                                      metadata={"help": "on-demand DiT rollout (no strategy_args: ROLL asserts vLLM)"})
    reward: WorkerConfig = field(default_factory=WorkerConfig, metadata={"help": "reward scoring workers"})

    model: Section = _section("ModelConfig (which DiT)")
    base_pretrain: Section = _section("PretrainConfig: how the tiny base is pretrained")
    task: Section = _section("TaskConfig (prompt source)")
    sampling: Section = _section("SamplingConfig (rollout schedule)")
    train: Section = _section("GRPOConfig (Flow-GRPO knobs)")
    reward_fn: Section = _section("RewardConfig (what `reward` computes)")
    exploration: Section = _section("ExplorationConfig")
    spot: Section = _section("SpotConfig (spot pool, traces)")
    elastic: Section = _section("ElasticConfig (elastic SP; the ROLL host's own section)")
    dispatch: Section = _section("DispatchConfig (request scheduling)")

    def __post_init__(self) -> None:
        check_recipe_keys({"actor_infer": {"strategy_args": self.actor_infer.strategy_args}}, source=self.source)
        data = {f: getattr(self, f) for f in SECTION_KEYS} | {"pretrain": self.pretrain}
        sections = parse_sections(data, source=self.source)
        for name in SECTION_KEYS:
            setattr(self, name, getattr(sections, name))
        try:  # RunConfig fills the preset-dependent defaults into the sections, and checks across them
            self.to_run_config()
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(f"{exc} in {self.source}") from exc
        try:
            super().__post_init__()
        except (AssertionError, ValueError) as exc:  # ROLL asserts on user input
            raise ConfigError(f"ROLL's BaseConfig rejects {self.source}: {exc or type(exc).__name__}") from exc
        for role in ROLE_NAMES:
            self._prepare_role(role)

    @property
    def source(self) -> str:
        """What errors call this recipe: its file when known, else its exp_name."""
        return self.recipe_file or self.exp_name

    def check_startup(self) -> None:
        """`spotlight train --check`'s start-up checks (`roll_spotlight.startup.check_startup`) on this
        recipe, before any ROLL cluster starts: model, prompt and reward-model paths exist, the
        reward builds, the trace parses. Errors name the recipe's keys and file."""
        from roll_spotlight.startup import check_startup

        try:
            check_startup(self.to_run_config(), self.placement(), key=recipe_key)
        except (ValueError, OSError) as exc:
            raise ConfigError(f"{self.source}: {exc}") from exc

    def placement(self):
        """How the start-up checks see this recipe's workers (`startup.WorkerPlacement`): on Ray,
        the actor_train and actor_infer ranks, and the emulated GPUs when ``emulate`` is set, where
        every role's rank is a ROLL worker process on this machine."""
        from roll_spotlight.startup import HostWorkers, WorkerPlacement

        if not self.emulate:
            return WorkerPlacement()
        from roll_spotlight.spot_pool.emulated_nodes import ROLL_WORKER_MB

        ranks = self._trainer_ranks - 1 + self.actor_infer.world_size  # the placement counts one trainer
        processes = HostWorkers(sum(getattr(self, role).world_size for role in ROLE_NAMES), ROLL_WORKER_MB,
                                "ROLL workers")
        return WorkerPlacement(ray=True, workers=ranks, sp_degree=self.elastic.sp_degree,
                               emulate=self.emulate.get("gpu"), time_scale=float(self.emulate.get("time_scale", 1.0)),
                               host_workers=processes)

    def _prepare_role(self, role: str) -> None:
        worker = getattr(self, role)
        worker.name = role
        if worker.worker_cls is None:
            worker.worker_cls = ROLE_DEFAULTS[role][0]
        if not isinstance(worker.world_size, int) or worker.world_size < 1:
            raise ConfigError(f"{role}.world_size must be >= 1 (or set {role}.device_mapping), "
                              f"got {worker.world_size!r} in {self.source}")
        sp = self.elastic.sp_degree
        if role == "actor_infer" and worker.world_size % sp:
            raise ConfigError(f"actor_infer.world_size={worker.world_size} must be a multiple of "
                              f"elastic.sp_degree={sp}: consecutive actor_infer ranks form SP groups "
                              f"(set actor_infer.device_mapping) in {self.source}")
        samples = self.rollout_batch_size * self.train.group_size
        if role == "actor_train" and worker.world_size > samples:
            raise ConfigError(f"actor_train.world_size={worker.world_size} exceeds the {samples} samples of an "
                              f"iteration (rollout_batch_size={self.rollout_batch_size} x train.group_size="
                              f"{self.train.group_size}): a data-parallel trainer rank needs at least one; "
                              f"use fewer actor_train ranks (device_mapping) or a larger batch in {self.source}")

    @property
    def sections(self) -> SpotlightSections:
        return SpotlightSections(**{name: getattr(self, name) for name in SECTION_KEYS})

    def to_run_config(self) -> RunConfig:
        """Our single-process RunConfig with the same run keys and DiT sections (and the spot
        training phase this trainer's ranks allow: `sections.one_rank_spot_training`)."""
        return run_config({key: getattr(self, key) for key in RUN_KEYS}, self.sections, self._trainer_ranks)

    def spot_training_summary(self) -> str | None:
        """Why spot workers will not train although ``spot.training_phase`` (auto or the default)
        would let them (None when they do, or were not asked to), logged at start-up."""
        cfg = run_config({key: getattr(self, key) for key in RUN_KEYS}, self.sections)
        return one_rank_spot_training(cfg, self._trainer_ranks)[1]

    @property
    def _trainer_ranks(self) -> int:
        """actor_train's ranks (a bad value is reported by `_prepare_role`, naming the key)."""
        ranks = self.actor_train.world_size
        return ranks if isinstance(ranks, int) and ranks >= 1 else 1

    @property
    def components(self) -> dict[str, Any]:
        """The Spotlight component sections (the keys a vanilla twin switches off)."""
        return {key: getattr(self, key) for key in COMPONENT_KEYS}


# What dacite fills from a recipe's top level: ROLL's BaseConfig keys, the roles, our sections and keys
TOP_LEVEL_KEYS = frozenset(f.name for f in dataclasses.fields(SpotlightConfig) if f.init)


def from_mapping(data: dict, *, source: str | None = None, check_types: bool = True) -> SpotlightConfig:
    """dacite into SpotlightConfig as ROLL's launchers do (non-strict for ROLL's keys), after
    rejecting the keys dacite would drop or ROLL would assert on without a reason
    (`roll_spotlight.roll.sections.check_recipe_keys`, and top-level keys that are no field:
    `check_top_level_keys`). `source`, the recipe's file, is named in
    every error (a `ConfigError`); without it, the recipe's exp_name is.

    ``check_types=False`` is needed only when the ``strategy_literal`` patch is not applied and a
    role names one of our strategies in ``strategy_args.strategy_name``.
    """
    import dacite

    if source is not None:
        data = {**data, "recipe_file": source}
    source = data.get("recipe_file") or data.get("exp_name")
    check_recipe_keys(data, source=source)
    check_top_level_keys(data, TOP_LEVEL_KEYS, source=source)
    try:
        return dacite.from_dict(data_class=SpotlightConfig, data=data, config=dacite.Config(check_types=check_types))
    except dacite.DaciteError as exc:  # ROLL's keys: a wrong type, a missing value
        raise ConfigError(f"{one_line(exc)} in {source}") from exc


def to_mapping(cfg: SpotlightConfig) -> dict:
    """Plain data that `from_mapping` parses back into an equivalent config (a round trip).

    ``dataclasses.asdict`` alone does not round-trip through ROLL's classes: several of ROLL's
    fields default to None but are typed non-optional (dacite rejects the None), and
    ``WorkerConfig.__post_init__`` evaluates ``device_mapping`` from a string. None values are
    dropped (their defaults come back) and device mappings are written as strings again.
    """
    return _plain_for_dacite(dataclasses.asdict(cfg))


def _plain_for_dacite(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _plain_for_dacite(v) for k, v in value.items() if v is not None}
        if isinstance(out.get("device_mapping"), list):
            out["device_mapping"] = repr(out["device_mapping"])
        return out
    if isinstance(value, (list, tuple)):
        return [_plain_for_dacite(v) for v in value]
    return value


def compose_mapping(config_path: str | None, config_name: str, overrides: list[str] | None = None) -> dict:
    """Hydra-compose a recipe as ROLL's start scripts do and return plain resolved data.

    ``config_path`` is a directory relative to the working directory. None reuses the Hydra search
    path a launcher already initialised (ROLL's scripts resolve theirs relative to the script).
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        if config_path is None:
            assert GlobalHydra.instance().is_initialized(), "no Hydra search path to reuse"
            cfg = compose(config_name=config_name, overrides=list(overrides or []))
        else:
            GlobalHydra.instance().clear()
            with initialize_config_dir(config_dir=os.path.abspath(config_path), version_base=None,
                                       job_name="spotlight"):
                cfg = compose(config_name=config_name, overrides=list(overrides or []))
        return OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as exc:  # no such file, a bad override or interpolation
        raise ConfigError(f"{recipe_path(config_path, config_name)}: {one_line(exc)}") from exc


def recipe_path(config_path: str | None, config_name: str) -> str:
    """The recipe file as the user named it (``--config_path`` + ``--config_name``)."""
    name = config_name if config_name.endswith(".yaml") else f"{config_name}.yaml"
    return os.path.join(config_path, name) if config_path is not None else name


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (Hydra's and OmegaConf's span several)."""
    return " ".join(str(exc).split())


__all__ = ["SpotlightConfig", "from_mapping", "to_mapping", "compose_mapping", "recipe_path", "DUMMY_SEQUENCE_LENGTH"]
