"""`SpotlightConfig`: a ROLL ``BaseConfig`` with DiT roles and the typed Spotlight sections.

This module imports ROLL at the top; reach it through ``roll_spotlight.roll.SpotlightConfig``.

Fitting ROLL's ``BaseConfig`` (v0.3.0):

- Its ``__post_init__`` asserts ``response_length or sequence_length``: token lengths of an LLM
  rollout. A diffusion rollout has none (its "length" is the number of image tokens, fixed by the
  resolution), so ``sequence_length`` defaults to the dummy `DUMMY_SEQUENCE_LENGTH`; no code of
  ours reads it.
- It asserts that a role named ``actor_infer`` uses vLLM or SGLang, so the DiT rollout role is
  ``rollout``; the roles are ``trainer``, ``rollout``, ``explorer``, ``reward``.
- ROLL's launchers call dacite without a config: nested dataclasses are not strict and lists do
  not become tuples. The Spotlight sections are therefore declared as mappings for dacite and parsed
  in ``__post_init__`` by our strict loader into their dataclasses (unknown keys are errors).
- ``track_with`` defaults to ``stdout``: ROLL's default, tensorboard, is not installed by ROLL.
- The trainer is data-parallel over ``trainer.world_size`` ranks (`roll_spotlight.roll.workers`);
  every rank needs at least one sample of each iteration's batch, so more ranks than
  ``rollout_batch_size * train.group_size`` fail here, at parse time, with the fix in the message.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from roll.configs.base_config import BaseConfig
from roll.configs.worker_config import WorkerConfig

from roll_spotlight.config.strict import ConfigError
from roll_spotlight.roll.sections import (
    COMPONENT_KEYS,
    ROLE_NAMES,
    RUN_KEYS,
    SECTION_KEYS,
    SpotlightSections,
    parse_sections,
    run_config,
)
from roll_spotlight.config.run import RunConfig

DUMMY_SEQUENCE_LENGTH = 1
PIPELINE_CLS = "roll_spotlight.roll.pipeline.SpotlightPipeline"
DEFAULT_WORKERS = {"trainer": "dit_trainer", "rollout": "dit_rollout", "explorer": "dit_explorer",
                   "reward": "dit_reward"}
Section = Union[Dict[str, Any], Any]  # a mapping from YAML, the parsed dataclass after __post_init__


@dataclass
class SpotlightConfig(BaseConfig):
    """A ROLL pipeline config for Spotlight's Flow-GRPO (roles, DiT sections, Spotlight sections)."""

    pipeline_cls: str = field(default=PIPELINE_CLS, metadata={"help": "read by ROLL's agentic launcher"})
    sequence_length: Optional[int] = field(
        default=DUMMY_SEQUENCE_LENGTH,
        metadata={"help": "dummy: BaseConfig asserts a token length; a diffusion rollout has none"})
    track_with: str = field(default="stdout", metadata={"help": "ROLL tracker: stdout, tensorboard, wandb, ..."})
    patches: List[str] = field(default_factory=list,
                               metadata={"help": "roll_spotlight.patches applied by the launcher (LEDGER.md)"})

    trainer: WorkerConfig = field(default_factory=WorkerConfig, metadata={"help": "on-demand Flow-GRPO trainer"})
    rollout: WorkerConfig = field(default_factory=WorkerConfig, metadata={"help": "on-demand DiT rollout"})
    explorer: WorkerConfig = field(default_factory=WorkerConfig,
                                   metadata={"help": "spot exploration workers (elastic pool)"})
    reward: WorkerConfig = field(default_factory=WorkerConfig, metadata={"help": "reward scoring workers"})

    model: Section = field(default_factory=dict, metadata={"help": "roll_spotlight ModelConfig"})
    pretrain: Section = field(default_factory=dict, metadata={"help": "PretrainConfig (tiny base model)"})
    task: Section = field(default_factory=dict, metadata={"help": "TaskConfig (prompt source)"})
    sampling: Section = field(default_factory=dict, metadata={"help": "SamplingConfig (rollout schedule)"})
    train: Section = field(default_factory=dict, metadata={"help": "GRPOConfig (Flow-GRPO knobs)"})
    reward_fn: Section = field(default_factory=dict, metadata={"help": "RewardConfig (what `reward` computes)"})
    exploration: Section = field(default_factory=dict,
                                 metadata={"help": "ExplorationConfig (the standalone host's section)"})
    spot: Section = field(default_factory=dict, metadata={"help": "SpotConfig (spot pool, traces)"})
    elastic: Section = field(default_factory=dict, metadata={"help": "ElasticConfig (elastic SP)"})
    dispatch: Section = field(default_factory=dict, metadata={"help": "DispatchConfig (request scheduling)"})

    def __post_init__(self) -> None:
        sections = parse_sections({f: getattr(self, f) for f in SECTION_KEYS}, source=self.exp_name)
        for name in SECTION_KEYS:
            setattr(self, name, getattr(sections, name))
        super().__post_init__()
        for role in ROLE_NAMES:
            self._prepare_role(role)

    def _prepare_role(self, role: str) -> None:
        worker = getattr(self, role)
        worker.name = role
        if worker.worker_cls is None:
            worker.worker_cls = DEFAULT_WORKERS[role]
        if role == "explorer":
            return  # sized by the elastic spot pool, not by world_size
        if not isinstance(worker.world_size, int) or worker.world_size < 1:
            raise ConfigError(f"{role}.world_size must be >= 1 (or set {role}.device_mapping), "
                              f"got {worker.world_size!r}")
        sp = self.elastic.sp_degree
        if role == "rollout" and worker.world_size % sp:
            raise ConfigError(f"rollout.world_size={worker.world_size} must be a multiple of elastic.sp_degree={sp}: "
                              "consecutive rollout ranks form SP groups (set rollout.device_mapping)")
        samples = self.rollout_batch_size * self.train.group_size
        if role == "trainer" and worker.world_size > samples:
            raise ConfigError(f"trainer.world_size={worker.world_size} exceeds the {samples} samples of an "
                              f"iteration (rollout_batch_size={self.rollout_batch_size} x train.group_size="
                              f"{self.train.group_size}): a data-parallel trainer rank needs at least one; "
                              "use fewer trainer ranks (device_mapping) or a larger batch")

    @property
    def sections(self) -> SpotlightSections:
        return SpotlightSections(**{name: getattr(self, name) for name in SECTION_KEYS})

    def to_run_config(self) -> RunConfig:
        """Our single-process RunConfig with the same run keys and DiT sections."""
        return run_config({key: getattr(self, key) for key in RUN_KEYS}, self.sections)

    @property
    def components(self) -> dict[str, Any]:
        """The Spotlight component sections (the keys a vanilla twin switches off)."""
        return {key: getattr(self, key) for key in COMPONENT_KEYS}


def from_mapping(data: dict, *, check_types: bool = True) -> SpotlightConfig:
    """dacite into SpotlightConfig as ROLL's launchers do (non-strict for ROLL's keys).

    ``check_types=False`` is needed only when the ``strategy_literal`` patch is not applied and a
    role names one of our strategies in ``strategy_args.strategy_name``.
    """
    import dacite

    return dacite.from_dict(data_class=SpotlightConfig, data=data,
                            config=dacite.Config(check_types=check_types))


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

    if config_path is None:
        assert GlobalHydra.instance().is_initialized(), "no Hydra search path to reuse"
        cfg = compose(config_name=config_name, overrides=list(overrides or []))
    else:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=os.path.abspath(config_path), version_base=None, job_name="spotlight"):
            cfg = compose(config_name=config_name, overrides=list(overrides or []))
    return OmegaConf.to_container(cfg, resolve=True)


def coerce(pipeline_config: Any) -> SpotlightConfig:
    """A SpotlightConfig for a pipeline built by another launcher (ROLL's agentic one).

    That launcher parses the recipe into its own config class, which drops our keys; the recipe is
    composed again from the same ``--config_path``/``--config_name`` command line.
    """
    if isinstance(pipeline_config, SpotlightConfig):
        return pipeline_config
    args = _launcher_args(sys.argv)
    if args is None:
        raise ConfigError(f"SpotlightPipeline needs a SpotlightConfig, got {type(pipeline_config).__name__}; "
                          "start it with python -m roll_spotlight.launch --config_path DIR --config_name NAME")
    from hydra.core.global_hydra import GlobalHydra

    config_path, config_name = args
    reuse = GlobalHydra.instance().is_initialized()
    return from_mapping(compose_mapping(None if reuse else config_path, config_name))


def _launcher_args(argv: list[str]) -> tuple[str, str] | None:
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config_path")
    parser.add_argument("--config_name")
    known, _ = parser.parse_known_args(argv[1:])
    if not (known.config_path and known.config_name):
        return None
    return known.config_path, known.config_name


__all__ = ["SpotlightConfig", "from_mapping", "to_mapping", "compose_mapping", "coerce", "DUMMY_SEQUENCE_LENGTH"]
