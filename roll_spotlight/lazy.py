"""Lazy package exports: a package names what its heavy modules export without importing them.

A package's ``__init__`` sets ``__getattr__ = lazy_exports(__name__, {name: module})``; the module is
imported on the first access of one of its names (PEP 562), so importing a package stays cheap
and a core package can name its Ray-side classes without importing Ray.
"""
from __future__ import annotations

import importlib
from typing import Callable, Mapping


def lazy_exports(package: str, names: Mapping[str, str],
                 before: Callable[[], None] | None = None) -> Callable[[str], object]:
    """A module ``__getattr__`` resolving each of ``names`` from its module; ``before`` runs first
    (e.g. a check that says what to install)."""

    def __getattr__(name: str) -> object:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if before is not None:
            before()
        return getattr(importlib.import_module(module), name)

    return __getattr__
