"""Strict mapping of YAML (OmegaConf/Hydra) onto typed dataclasses.

ROLL parses its YAML with dacite in non-strict mode, which silently drops unknown keys. A typo in a
spot or exploration key would then run a different experiment than the one written down, so the
standalone host is strict: every key must be a field, every value must have the field's type, and
each component's ``__post_init__`` checks impossible values with `roll_spotlight.checks`, so every
error has one shape: the dotted key, the rule and the value given; `from_dict` adds the file when
known.

Only the standard library and `roll_spotlight.checks` (a leaf) are imported here; OmegaConf is
imported when a file is loaded.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from roll_spotlight.checks import join_key

T = TypeVar("T")


class ConfigError(ValueError):
    """A user-facing configuration error; the message names the key (and file)."""


def from_dict(cls: type[T], data: Any, *, key: str = "", source: str | None = None) -> T:
    """Build dataclass ``cls`` from plain data, rejecting unknown keys and wrong types."""
    where = f" in {source}" if source else ""
    if not isinstance(data, dict):
        raise ConfigError(f"{key or '<root>'}{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        bad = join_key(key, str(unknown[0]))
        raise ConfigError(f"unknown key '{bad}'{where}; known keys here: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {
        name: _convert(hints[name], value, join_key(key, name), source)
        for name, value in data.items()
    }
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        prefix = f"{key}: " if key else ""
        raise ConfigError(f"{prefix}{exc}{where}") from exc


def load_yaml(path: str | Path, overrides: list[str] | None = None) -> dict:
    """Load a YAML file (with optional ``a.b=c`` overrides) into plain resolved data."""
    from omegaconf import OmegaConf

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        cfg = OmegaConf.load(path)
        if overrides:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
        data = OmegaConf.to_container(cfg, resolve=True)
    except ConfigError:
        raise
    except Exception as exc:  # OmegaConf/YAML errors carry the line; keep them, add the file
        raise ConfigError(f"cannot parse {path}: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return data


def load_config(cls: type[T], path: str | Path, overrides: list[str] | None = None) -> T:
    """Load and validate a YAML file into ``cls``; errors name the key and the file."""
    return from_dict(cls, load_yaml(path, overrides), source=str(path))


def to_dict(obj: Any) -> Any:
    """Plain-data form of a config (tuples become lists) for saving next to a run."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def _convert(tp: Any, value: Any, key: str, source: str | None) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return _convert_union(tp, value, key, source)
    if origin is Literal:
        if isinstance(value, bool) and ("off" if not value else "on") in get_args(tp):
            value = "off" if not value else "on"  # YAML 1.1 reads an unquoted off / on as a boolean
        if value not in get_args(tp):
            raise ConfigError(f"{key}: {value!r} is not one of {list(get_args(tp))}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key=key, source=source)
    if origin in (list, tuple):
        return _convert_sequence(tp, value, key, source)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    return _convert_scalar(tp, value, key)


def _convert_union(tp: Any, value: Any, key: str, source: str | None) -> Any:
    args = get_args(tp)
    if value is None:
        if type(None) in args:
            return None
        raise ConfigError(f"{key}: must not be null")
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _convert(arg, value, key, source)
        except ConfigError as exc:
            errors.append(str(exc))
    raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} matches none of {args}")


def _convert_sequence(tp: Any, value: Any, key: str, source: str | None) -> Any:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}: expected a list, got {value!r}")
    args = get_args(tp)
    if get_origin(tp) is tuple and args and args[-1] is not Ellipsis:
        if len(args) != len(value):
            raise ConfigError(f"{key}: expected {len(args)} items, got {len(value)}")
        return tuple(_convert(a, v, f"{key}[{i}]", source) for i, (a, v) in enumerate(zip(args, value)))
    item = args[0] if args else Any
    items = [_convert(item, v, f"{key}[{i}]", source) for i, v in enumerate(value)]
    return tuple(items) if get_origin(tp) is tuple else items


def _convert_scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float) and isinstance(value, bool):
        raise ConfigError(f"{key}: expected {tp.__name__}, got bool {value!r}")
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{key}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value
