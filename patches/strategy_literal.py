"""Patch ``strategy_literal``: let ROLL's config parser accept our strategy names.

ROLL types ``StrategyArguments.strategy_name`` as a closed ``Literal`` of its own back-ends, and
dacite type-checks it, so ``strategy_name: diffusers_train`` fails to parse. The patch widens the
Literal with the names in the ``roll_spotlight.strategies`` group. It changes parsing only: ROLL's
``create_strategy`` still knows none of them, which is fine because our workers build their own
strategy. See LEDGER.md.
"""
from __future__ import annotations

import typing

from roll_spotlight.patches import Patch

TARGET = "roll.configs.worker_config.StrategyArguments.strategy_name"


def _strategy_arguments():
    from roll.configs.worker_config import StrategyArguments

    return StrategyArguments


def fingerprint() -> str:
    """The Literal's values: the patch is valid as long as ROLL keeps a closed Literal of names."""
    return repr(typing.get_args(_strategy_arguments().__annotations__["strategy_name"]))


def _set_type(cls, new_type) -> None:
    import dacite.cache

    cls.__annotations__["strategy_name"] = new_type
    cls.__dataclass_fields__["strategy_name"].type = new_type
    dacite.cache.clear_cache()  # dacite caches type hints per class


def apply():
    from roll_spotlight import plugins

    cls = _strategy_arguments()
    original = cls.__annotations__["strategy_name"]
    known = typing.get_args(original)
    ours = tuple(name for name in plugins.known_names("strategies") if name not in known)
    _set_type(cls, typing.Literal[known + ours])
    return lambda: _set_type(cls, original)


PATCH = Patch(
    name="strategy_literal",
    target=TARGET,
    fingerprint_sha256="34e5ac1916576dd1e8e3e0d237630adc855cda48be5bd692e34ca18bbead6b2f",
    fingerprint=fingerprint,
    apply=apply,
)
