"""Validation helpers for config dataclasses: one shape for every config error.

Each config class's ``__post_init__`` checks impossible values with these, so an error reads
``"<dotted key> <rule>, got <value>"`` wherever it comes from; the strict YAML loader
(`roll_spotlight.config.strict`) adds the file. A leaf module (standard library only), so the pure
cores' config classes use it without reaching into the `config` package, which imports them.
"""
from __future__ import annotations

import math
import re
import types
import typing
from typing import Any, Callable, Iterable, Literal, Union, get_args, get_origin


def require(cond: bool, key: str, value: Any, rule: str) -> None:
    """ValueError ``"<key> <rule>, got <value>"`` unless ``cond``: the one shape of a config error."""
    if not cond:
        raise ValueError(f"{key} {rule}, got {value!r}")


def require_int(key: str, value: Any, bound: str = ">= 1", *, optional: bool = False, why: str = "") -> None:
    """An integer (a bool is not one) within ``bound`` (`in_bound`); None too when ``optional``."""
    ok = isinstance(value, int) and not isinstance(value, bool) and in_bound(value, bound)
    require(ok or (optional and value is None), key, value, _rule("an integer", bound, optional, why))


def require_number(key: str, value: Any, bound: str = "> 0", *, optional: bool = False, why: str = "") -> None:
    """A finite number (int or float, not a bool) within ``bound``; None too when ``optional``."""
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and in_bound(value, bound))
    require(ok or (optional and value is None), key, value, _rule("a finite number", bound, optional, why))


def require_choice(key: str, value: Any, choices: Iterable[Any], *, optional: bool = False) -> None:
    """One of ``choices``; None too when ``optional``."""
    choices = list(choices)
    null = "null or " if optional else ""
    require(value in choices or (optional and value is None), key, value, f"must be {null}one of {choices}")


def require_literals(obj: Any, prefix: str) -> None:
    """Every field of dataclass ``obj`` typed ``Literal[...]`` (or ``Literal[...] | None``) holds one
    of its values: what `from_dict` checks of YAML, checked of a config built in Python too."""
    for name, tp in typing.get_type_hints(type(obj)).items():
        args = get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)
        literals = [a for a in args if get_origin(a) is Literal]
        if literals:
            require_choice(join_key(prefix, name), getattr(obj, name), get_args(literals[0]),
                           optional=type(None) in args)


def require_each(obj: Any, prefix: str, names: Iterable[str], check: Callable[..., None], *args, **kwargs) -> None:
    """``check(prefix.name, obj.name, *args, **kwargs)`` for each of ``names``."""
    for name in names:
        check(join_key(prefix, name), getattr(obj, name), *args, **kwargs)


_BOUND = re.compile(r"^(>=|>|<=|<)\s*(\S+)$")
_RANGE = re.compile(r"^([\[(])\s*([^,\s]+)\s*,\s*([^\])\s]+)\s*([\])])$")


def in_bound(value: float, bound: str) -> bool:
    """Is ``value`` within ``bound``: ``">= 1"``, ``"> 0"``, ``"<= 1024"`` or an interval such as
    ``"[0, 1)"`` (brackets include their end)? The bound is also the message's wording."""
    if match := _BOUND.match(bound):
        op, limit = match.group(1), float(match.group(2))
        return {">=": value >= limit, ">": value > limit, "<=": value <= limit, "<": value < limit}[op]
    match = _RANGE.match(bound)
    assert match, f"not a bound: {bound!r}"
    lo, lo_end, hi_end, hi = float(match.group(2)), match.group(1), match.group(4), float(match.group(3))
    return (value >= lo if lo_end == "[" else value > lo) and (value <= hi if hi_end == "]" else value < hi)


def _rule(what: str, bound: str, optional: bool, why: str) -> str:
    where = f"in {bound}" if bound[0] in "[(" else bound
    return f"must be {'null or ' if optional else ''}{what} {where}{f' {why}' if why else ''}"


def join_key(prefix: str, name: str) -> str:
    """The dotted key of ``name`` under ``prefix`` (``name`` alone at the top level)."""
    return f"{prefix}.{name}" if prefix else name
