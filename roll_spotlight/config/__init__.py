"""The run configuration: one typed dataclass per section, and the strict YAML loader that fills them.

`run` holds the sections of a run (`RunConfig` and its parts); `strict` maps YAML onto dataclasses,
rejecting unknown keys and wrong types with errors that name the key and the file. Neither imports
torch, so configs are validated before anything heavy starts.
"""
from roll_spotlight.config.run import (
    ExplorationConfig,
    GRPOConfig,
    PretrainConfig,
    RewardConfig,
    RunConfig,
    SamplingConfig,
    SpotConfig,
    TaskConfig,
)
from roll_spotlight.config.strict import ConfigError, from_dict, load_config, load_yaml, to_dict

__all__ = ["ConfigError", "ExplorationConfig", "GRPOConfig", "PretrainConfig", "RewardConfig", "RunConfig",
           "SamplingConfig", "SpotConfig", "TaskConfig", "from_dict", "load_config", "load_yaml", "to_dict"]
