"""The run configuration: one typed dataclass per section, and the strict YAML loader that fills them.

`run` holds the sections of a run (`RunConfig` and its parts); `ray_cluster` how a host uses Ray;
`elastic` the rollout SP groups of either host;
`strict` maps YAML onto dataclasses, rejecting unknown keys and wrong types with errors that name
the key and the file (the value checks every config class runs are the leaf `roll_spotlight.checks`).
None of them imports torch, so configs are validated before anything heavy starts. The `run` names
are reached lazily, so loading `strict` alone stays light.
"""
from __future__ import annotations

from roll_spotlight.config.strict import ConfigError, from_dict, load_config, load_yaml, to_dict
from roll_spotlight.lazy import lazy_exports

_RUN = ("DispatchConfig", "ExplorationConfig", "GRPOConfig", "PretrainConfig", "RewardConfig", "RunConfig",
        "SamplingConfig", "SpotConfig", "TaskConfig")

__all__ = ["ConfigError", "from_dict", "load_config", "load_yaml", "to_dict", *_RUN]
__getattr__ = lazy_exports(__name__, dict.fromkeys(_RUN, "roll_spotlight.config.run"))
