"""The one resolver for pluggable names: pipelines, workers, strategies, schedulers, rewards.

A YAML value naming a component may be

- a short built-in name (``dit_trainer``), registered here in code so it works without pip metadata;
- a name registered at run time with `register` (tests, notebooks);
- an entry-point name of the group (a third-party package's ``setup.py``), read once, lazily;
- a dotted path, ``pkg.mod.Class`` (ROLL's style) or ``pkg.mod:Class`` (entry-point style).

Why our own: ROLL resolves dotted paths with ``safe_import_class``, which logs and returns None on a
typo, so a run fails much later with ``'NoneType' object is not callable`` inside a Ray actor. Here a
name that does not resolve is a ValueError at start-up that lists the known names, and an import
that fails says which module could not be imported and why.

Resolution order: run-time registrations, built-ins, entry points, dotted path. Only the standard
library is imported at module load; targets are imported when resolved.
"""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
from types import MappingProxyType
from typing import Any, Mapping

logger = logging.getLogger(__name__)

PREFIX = "roll_spotlight."
GROUPS = (
    "roll_spotlight.pipelines",
    "roll_spotlight.workers",
    "roll_spotlight.strategies",
    "roll_spotlight.schedulers",
    "roll_spotlight.rewards",
)

# Targets under roll_spotlight.roll.{pipeline,workers} import ROLL; the others do not. This table is
# the plugin list's one home: setup.py reads it (with ast) to declare the package's entry points.
BUILTINS: Mapping[str, Mapping[str, str]] = MappingProxyType({
    "roll_spotlight.pipelines": {
        "spotlight": "roll_spotlight.roll.pipeline:SpotlightPipeline",
    },
    "roll_spotlight.workers": {
        "dit_trainer": "roll_spotlight.roll.workers:DiTTrainerWorker",
        "dit_rollout": "roll_spotlight.roll.workers:DiTRolloutWorker",
        "dit_reward": "roll_spotlight.roll.workers:DiTRewardWorker",
    },
    "roll_spotlight.strategies": {
        "diffusers_train": "roll_spotlight.roll.strategy:DiffusersTrainStrategy",
        "diffusers_rollout": "roll_spotlight.roll.strategy:DiffusersRolloutStrategy",
    },
    "roll_spotlight.schedulers": {
        "pull_queue": "roll_spotlight.dispatch.queue:RequestQueue",
    },
    "roll_spotlight.rewards": {
        "shapes": "roll_spotlight.rewards.shapes_reward:ShapesReward",
        "ocr": "roll_spotlight.rewards.ocr:OcrReward",
        "geneval": "roll_spotlight.rewards.geneval:GenevalReward",
        "pickscore": "roll_spotlight.rewards.pickscore:PickScoreReward",
        "jpeg_compressibility": "roll_spotlight.rewards.jpeg:JpegCompressibility",
        "brightness": "roll_spotlight.rewards.jpeg:MeanBrightness",
        "weighted": "roll_spotlight.rewards.reward:WeightedReward",
        "safe": "roll_spotlight.rewards.reward:SafeReward",
    },
})
_REGISTERED: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}


def group_name(group: str) -> str:
    """The full group name; accepts the short form (``workers``). ValueError for an unknown group."""
    full = group if group.startswith(PREFIX) else PREFIX + group
    if full not in GROUPS:
        raise ValueError(f"unknown plugin group {group!r}; known groups: {list(GROUPS)}")
    return full


def register(group: str, name: str, obj: Any) -> Any:
    """Register `obj` under `name` in `group` (for code that cannot ship entry points).

    Re-registering the same object is a no-op; another object under a taken name is a ValueError.
    """
    full = group_name(group)
    if not isinstance(name, str) or not name or ":" in name or "." in name:
        raise ValueError(f"plugin name {name!r} must be a non-empty string without '.' or ':'")
    existing = _REGISTERED[full].get(name)
    if existing is not None and existing is not obj:
        raise ValueError(f"{full}: name {name!r} is already registered to {existing!r}")
    _REGISTERED[full][name] = obj
    return obj


def unregister(group: str, name: str) -> None:
    _REGISTERED[group_name(group)].pop(name, None)


def builtins(group: str) -> dict[str, str]:
    """Built-in names of `group` -> ``module:attr`` targets."""
    return dict(BUILTINS.get(group_name(group), {}))


@functools.lru_cache(maxsize=None)
def _entry_points(full: str) -> Mapping[str, importlib.metadata.EntryPoint]:
    return MappingProxyType({ep.name: ep for ep in importlib.metadata.entry_points(group=full)})


def known_names(group: str) -> list[str]:
    full = group_name(group)
    return sorted(set(_REGISTERED[full]) | set(builtins(full)) | set(_entry_points(full)))


def resolve(group: str, name_or_path: str) -> Any:
    """The object behind a name of `group` (see the module docstring for the order)."""
    full = group_name(group)
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ValueError(f"{full}: expected a name or dotted path, got {name_or_path!r}")
    if name_or_path in _REGISTERED[full]:
        return _REGISTERED[full][name_or_path]
    table = builtins(full)
    if name_or_path in table:
        return load_dotted(table[name_or_path], what=f"{full} {name_or_path!r}")
    entry_points = _entry_points(full)
    if name_or_path in entry_points:
        ep = entry_points[name_or_path]
        logger.info("loading %s %r from entry point %s", full, name_or_path, ep.value)
        return load_dotted(ep.value, what=f"{full} entry point {name_or_path!r}")
    if "." in name_or_path or ":" in name_or_path:
        return load_dotted(name_or_path, what=full)
    raise ValueError(f"unknown {full} name {name_or_path!r}; known names: {known_names(full)} "
                     "(or a dotted path 'pkg.module.Class' / 'pkg.module:Class')")


def load_dotted(path: str, *, what: str = "object") -> Any:
    """Import ``pkg.mod:Attr.sub`` or ``pkg.mod.Attr``; ValueError naming the path and the cause."""
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
        candidates = [(module_name, attr_path.split("."))] if module_name and attr_path else []
    else:
        parts = path.split(".")
        candidates = [(".".join(parts[:i]), parts[i:]) for i in range(len(parts) - 1, 0, -1)]
    if not candidates:
        raise ValueError(f"{what}: {path!r} is not a dotted path 'pkg.module.Class' or 'pkg.module:Class'")
    missing = None
    for module_name, attrs in candidates:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:  # not a module: a shorter prefix may be (pkg.mod.Class.Inner)
                missing = err
                continue
            raise ValueError(f"{what}: cannot import module {module_name!r} for {path!r}: {err}") from err
        except ImportError as err:
            raise ValueError(f"{what}: cannot import module {module_name!r} for {path!r}: {err}") from err
        return _get_attrs(module, attrs, path, what)
    raise ValueError(f"{what}: cannot resolve {path!r}: {missing}") from missing


def _get_attrs(obj: Any, attrs: list[str], path: str, what: str) -> Any:
    for attr in attrs:
        try:
            obj = getattr(obj, attr)
        except AttributeError as err:
            raise ValueError(f"{what}: {path!r} does not resolve: {err}") from err
    return obj
