"""The Spotlight part of a ROLL recipe, typed and validated without ROLL.

A ROLL recipe for Spotlight has three kinds of keys:

- ROLL's own top-level keys (``exp_name``, ``seed``, ``max_steps``, ``num_gpus_per_node``, ...),
  read by ROLL's ``BaseConfig``, with ROLL's meaning: ``pretrain`` is the model path (the local
  diffusers directory of a real model; it fills ``model.path``);
- ROLL's roles, under ROLL's names: ``actor_train`` (the Flow-GRPO trainer), ``actor_infer`` (the
  DiT rollout), ``reward`` (reward scoring), each a ROLL ``WorkerConfig``. ``actor_infer`` takes no
  ``strategy_args``: ROLL's ``BaseConfig`` asserts that a set ``actor_infer.strategy_args`` names
  vLLM or SGLang, so the DiT rollout strategy is chosen in code (`ROLE_DEFAULTS`). The spot
  workers are not a ROLL role: they live in the runtime's elastic pool (ROLL clusters never grow);
- the sections of our run config (``model``, ``task``, ``sampling``, ``train``, ``exploration``,
  ``spot``, ``dispatch``: `roll_spotlight.config.run`'s classes, so every key means what it means
  in the standalone ``spotlight train`` YAML). Two are renamed where ROLL already uses the name:
  the tiny base's pretraining section is ``base_pretrain`` (``pretrain`` is ROLL's model path) and
  the reward section is ``reward_fn`` (``reward`` is ROLL's role). One section is the ROLL host's
  own: ``elastic`` (`ElasticConfig`, the SP degree of ``actor_infer``'s rollout groups; the
  standalone host takes it from ``--sp-degree``). `run_config` maps a recipe onto `RunConfig`.

The sections are parsed by our strict loader (`roll_spotlight.config.strict.from_dict`), never by
dacite: ROLL's dacite call drops unknown keys silently, so a typo such as ``spot.max_wrokers`` would
quietly run another experiment. For the same reason `check_recipe_keys` rejects the role and
section names of earlier recipes (``trainer``, ``rollout``, ``explorer``, a ``pretrain`` mapping)
instead of letting dacite drop them, and `check_top_level_keys` any other top-level key that the
config class lacks (a typo such as ``+pipline.foo=1``). `SpotlightConfig` (which needs ROLL) stores
the sections as these dataclasses; `validate_recipe` checks the same of a recipe file when ROLL is
not installed, except the top-level keys (their list is ROLL's `BaseConfig`).

The component switches (``exploration.mode``, ``spot.enabled``, ``dispatch.mode``) are the only
keys a vanilla twin of a recipe changes; ``elastic.sp_degree`` is the same in both.
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import field
from typing import Any, Iterable, Mapping

from roll_spotlight.config.elastic import ElasticConfig
from roll_spotlight.config.run import RunConfig
from roll_spotlight.config.strict import ConfigError, from_dict

ROLE_NAMES = ("actor_train", "actor_infer", "reward")
# What each role runs when the recipe does not say: (worker class, strategy in roll_spotlight.strategies)
ROLE_DEFAULTS = {
    "actor_train": ("roll_spotlight.roll.workers.DiTTrainerWorker", "diffusers_train"),
    "actor_infer": ("roll_spotlight.roll.workers.DiTRolloutWorker", "diffusers_rollout"),
    "reward": ("roll_spotlight.roll.workers.DiTRewardWorker", None),
}
# Names of earlier recipes -> what a recipe says now (dacite would drop them without a word)
RENAMED = {"trainer": "actor_train", "rollout": "actor_infer",
           "explorer": "nothing: spot workers come from the `spot` section's elastic pool, not a ROLL role"}
ROLL_INFER_STRATEGIES = ("vllm", "sglang")  # what ROLL's BaseConfig asserts for actor_infer.strategy_args
COMPONENT_KEYS = ("exploration", "spot", "elastic", "dispatch")
ROLL_TRACKERS_WE_MIRROR = {"tensorboard": "tensorboard"}  # any other ROLL tracker: we write jsonl


# RunConfig's names -> a recipe's, where ROLL already uses the name (`run_config` maps them back)
RUN_TO_RECIPE = {"model.path": "pretrain", "pretrain": "base_pretrain", "reward": "reward_fn"}
# RunConfig's top-level keys (ROLL's too) and its sections (a dataclass each), under RunConfig's names
RUN_KEYS = tuple(f.name for f in dataclasses.fields(RunConfig) if f.default_factory is dataclasses.MISSING)
RUN_SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(RunConfig) if f.name not in RUN_KEYS}


def _check_elastic_fits(self) -> None:
    """SpotlightSections' check across sections: ``elastic.sp_degree`` fits the model and the spot nodes."""
    from roll_spotlight.worker.sp_group import check_sp_degree, check_spot_placement

    check_sp_degree(self.model, self.elastic.sp_degree, key="elastic.sp_degree")  # Ulysses splits heads, tokens
    if self.spot.enabled and self.elastic.sp_degree > 1:
        check_spot_placement(self.spot.gpus_per_node, self.elastic.sp_degree, self.spot.max_workers,
                             degree_key="elastic.sp_degree")


def _section_field(name: str, cls: type) -> tuple[str, type, Any]:
    return RUN_TO_RECIPE.get(name, name), cls, field(default_factory=cls)


SpotlightSections = dataclasses.make_dataclass(
    "SpotlightSections",
    [_section_field(name, cls) for name, cls in RUN_SECTIONS.items()] + [_section_field("elastic", ElasticConfig)],
    namespace={"__module__": __name__, "__post_init__": _check_elastic_fits, "__doc__": (
        "Every section of a recipe that Spotlight owns, validated together: RunConfig's sections under a "
        "recipe's names (`RUN_TO_RECIPE`), then the ROLL host's own `elastic`. Built from RunConfig's "
        "fields, so a section added there is a recipe section too.")})
SECTION_KEYS = tuple(f.name for f in dataclasses.fields(SpotlightSections))


def parse_sections(data: Mapping[str, Any], *, source: str | None = None) -> SpotlightSections:
    """Strictly parse the Spotlight sections of a recipe mapping (other keys are ignored here).

    ROLL's top-level ``pretrain`` (the model path) fills ``model.path`` when that is not set.
    """
    values = {key: to_plain(data[key]) for key in SECTION_KEYS if key in data}
    values["model"] = _model_with_pretrain(values.get("model"), data.get("pretrain"), source)
    if values["model"] is None:
        del values["model"]
    return from_dict(SpotlightSections, values, source=source)


def _model_with_pretrain(model: Any, pretrain: Any, source: str | None) -> Any:
    where = f" in {source}" if source else ""
    if pretrain is None:
        if isinstance(model, Mapping) and model.get("preset") not in (None, "tiny") and not model.get("path"):
            raise ConfigError(f"pretrain{where} must name the model's local diffusers directory "
                              f"(model.preset is {model['preset']!r}), got nothing")
        return model
    if not isinstance(pretrain, str) or not pretrain:
        raise ConfigError(f"pretrain{where} is ROLL's model path (a directory), got {pretrain!r}; "
                          "the tiny base's pretraining section is called base_pretrain")
    model = dict(model or {})
    if model.get("preset", "tiny") == "tiny":
        raise ConfigError(f"pretrain={pretrain!r}{where} names a model directory, but model.preset is 'tiny', "
                          "which trains its own base (base_pretrain); drop pretrain or set model.preset: qwen_image")
    if model.get("path") not in (None, pretrain):
        raise ConfigError(f"pretrain={pretrain!r} and model.path={model['path']!r}{where} name different models; "
                          "set one (pretrain, as in ROLL)")
    model["path"] = pretrain
    return model


def check_recipe_keys(data: Mapping[str, Any], *, source: str | None = None) -> None:
    """Reject what ROLL's dacite would drop or assert on without saying why: earlier role names,
    ``strategy_args`` on ``actor_infer``. Runs on the plain recipe, before dacite."""
    where = f" in {source}" if source else ""
    for old, new in RENAMED.items():
        if old in data:
            raise ConfigError(f"role '{old}'{where}: roles take ROLL's names now; '{old}' is {new}")
    infer = data.get("actor_infer")
    if isinstance(infer, Mapping) and infer.get("strategy_args") is not None:
        raise ConfigError(f"actor_infer.strategy_args{where}: ROLL's BaseConfig asserts it names one of "
                          f"{list(ROLL_INFER_STRATEGIES)} (LLM engines); the DiT rollout picks its strategy "
                          f"({ROLE_DEFAULTS['actor_infer'][1]}) in code: remove strategy_args from actor_infer")


def check_top_level_keys(data: Mapping[str, Any], known: Iterable[str], *, source: str | None = None) -> None:
    """Reject a top-level key that is not in ``known`` (the config class's fields): ROLL's dacite
    would drop it without a word, so a typo (``+pipline.foo=1``) would run another experiment."""
    unknown = sorted(set(data) - set(known))
    if not unknown:
        return
    where = f" in {source}" if source else ""
    close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
    hint = f"did you mean '{close[0]}'?" if close else "see docs/roll.md, 'The keys'"
    raise ConfigError(f"unknown top-level key '{unknown[0]}'{where}: not a field of the pipeline's config "
                      f"(ROLL would drop it silently); {hint}")


def to_plain(value: Any) -> Any:
    """Dataclass instances (already parsed sections) back to plain data; other values unchanged."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        from roll_spotlight.config.strict import to_dict

        return to_dict(value)
    return value


def recipe_key(run_key: str) -> str:
    """The recipe's name of a RunConfig key (``model.path`` -> ``pretrain``, ``reward.kwargs.x`` ->
    ``reward_fn.kwargs.x``), so that start-up checks written for RunConfig name what a recipe says."""
    for old, new in RUN_TO_RECIPE.items():
        if run_key == old or run_key.startswith(old + "."):
            return new + run_key[len(old):]
    return run_key


def run_config(top: Mapping[str, Any], sections: SpotlightSections, trainer_ranks: int = 1) -> RunConfig:
    """Our RunConfig from ROLL-style top-level values and the parsed sections, with the spot
    training phase a trainer of ``trainer_ranks`` ranks can run (`one_rank_spot_training`).

    ROLL trackers other than tensorboard (stdout, wandb, swanlab) are ROLL's to write; our own
    metrics file is then jsonl, so every run has a machine-readable curve in its run directory.
    """
    values = {key: top[key] for key in RUN_KEYS if key in top}
    if "track_with" in values:
        values["track_with"] = ROLL_TRACKERS_WE_MIRROR.get(values["track_with"], "jsonl")
    cfg = RunConfig(**values, **{name: getattr(sections, RUN_TO_RECIPE.get(name, name)) for name in RUN_SECTIONS})
    return one_rank_spot_training(cfg, trainer_ranks)[0]


def one_rank_spot_training(cfg: RunConfig, trainer_ranks: int) -> tuple[RunConfig, str | None]:
    """Spot training runs through one trainer rank (`runtime.queue_training`: the rank owns the
    optimiser and adds every sum; the other workers pull micro-batches), so with more
    ``actor_train`` ranks ``spot.training_phase: train`` is an error naming both keys, and
    ``auto`` or the default become ``explore``. Returns the config in force and, when it fell
    back, why (logged at start-up)."""
    if trainer_ranks > 1 and cfg.train.colocated:
        raise ValueError(f"train.colocated needs actor_train.world_size=1, got {trainer_ranks} ranks: the workers' "
                         "gradient sums are added by one trainer rank")
    if trainer_ranks == 1 or not cfg.spot_trains():
        return cfg, None
    if cfg.spot.training_phase == "train":
        raise ValueError(f"spot.training_phase=train needs actor_train.world_size=1, got {trainer_ranks} ranks: "
                         "spot workers' gradient sums are added by one trainer rank; use one actor_train rank "
                         "(device_mapping) or spot.training_phase: explore")
    phase = cfg.spot.training_phase or "null (the default)"
    reason = (f"spot.training_phase={phase}: spot workers explore during training and do not train, because "
              f"actor_train.world_size={trainer_ranks} (spot training adds the workers' gradient sums on one "
              f"trainer rank; set actor_train.world_size: 1 to let them train)")
    return dataclasses.replace(cfg, spot=dataclasses.replace(cfg.spot, training_phase="explore")), reason


def validate_recipe(data: Mapping[str, Any], *, source: str | None = None) -> tuple[SpotlightSections, RunConfig]:
    """What can be checked of a ROLL recipe without ROLL: roles, names, sections, the run config."""
    check_recipe_keys(data, source=source)
    sections = parse_sections(data, source=source)
    where = f" in {source}" if source else ""
    for role in ROLE_NAMES:
        if not isinstance(data.get(role), Mapping):
            raise ConfigError(f"role '{role}' is missing{where}; a Spotlight recipe defines {list(ROLE_NAMES)}")
    try:
        cfg = run_config(data, sections, recipe_trainer_ranks(data))
    except ValueError as exc:
        raise ConfigError(f"{exc}{where}") from exc
    return sections, cfg


def recipe_trainer_ranks(data: Mapping[str, Any]) -> int:
    """``actor_train``'s ranks as a recipe gives them without ROLL: ``world_size``, or the length of
    a ``device_mapping`` list (a string such as ``list(range(0,4))`` is ROLL's to evaluate: 1 here,
    and `SpotlightConfig` checks the real count)."""
    role = data.get("actor_train") if isinstance(data.get("actor_train"), Mapping) else {}
    if isinstance(role.get("device_mapping"), list):
        return len(role["device_mapping"]) // role.get("num_gpus_per_worker", 1)
    return role["world_size"] if isinstance(role.get("world_size"), int) else 1
