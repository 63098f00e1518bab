"""The run configuration: one typed dataclass per section, and the strict YAML loader that fills them.

`run` holds the sections of a run (`RunConfig` and its parts); `cluster` the live cluster's options
(the Ray backend's and the trace tools'); `strict` maps YAML onto dataclasses, rejecting unknown
keys and wrong types with errors that name the key and the file, and holds the validation helpers
every config class uses. None of them imports torch, so configs are validated before anything
heavy starts. The `run` names are reached lazily: the config classes of the core packages import
`strict`, and `run` imports those packages.
"""
from __future__ import annotations

import importlib
from typing import Any

from roll_spotlight.config.strict import ConfigError, from_dict, load_config, load_yaml, to_dict

_RUN = ("DispatchConfig", "ExplorationConfig", "GRPOConfig", "PretrainConfig", "RewardConfig", "RunConfig",
        "SamplingConfig", "SpotConfig", "TaskConfig")

__all__ = ["ConfigError", "from_dict", "load_config", "load_yaml", "to_dict", *_RUN]


def __getattr__(name: str) -> Any:
    if name not in _RUN:
        raise AttributeError(f"module 'roll_spotlight.config' has no attribute {name!r}")
    return getattr(importlib.import_module("roll_spotlight.config.run"), name)
