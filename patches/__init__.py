"""Opt-in runtime patches to ROLL where its extension surface is closed (see LEDGER.md).

Nothing here is applied on import. A recipe lists the patches it wants (top-level ``patches:``),
``python -m roll_spotlight.launch`` applies them before parsing, and tests revert them::

    from roll_spotlight.patches import apply_patches, revert_patches
    apply_patches(["strategy_literal"])
    ...
    revert_patches()

Every patch names the ROLL symbol it changes and the SHA-256 of that symbol's fingerprint (its
source, or the values it relies on) as recorded in LEDGER.md. `apply_patches` refuses to patch a
symbol whose fingerprint changed: the patch was written against other code and must be re-checked
(and the ledger updated) first. ROLL is imported only when a patch is applied or checked.
"""
from __future__ import annotations

import hashlib
import importlib
import logging
from dataclasses import dataclass
from typing import Callable, Iterable

logger = logging.getLogger(__name__)


class PatchTargetChanged(RuntimeError):
    """The patched ROLL symbol is not the one the patch (and its ledger entry) was written for."""


@dataclass(frozen=True)
class Patch:
    """One patch: `apply()` changes ROLL and returns the function that undoes exactly that change."""

    name: str
    target: str
    fingerprint_sha256: str
    fingerprint: Callable[[], str]
    apply: Callable[[], Callable[[], None]]

    def current_sha256(self) -> str:
        return hashlib.sha256(self.fingerprint().encode()).hexdigest()

    def check_target(self) -> None:
        found = self.current_sha256()
        if found != self.fingerprint_sha256:
            raise PatchTargetChanged(
                f"patch {self.name!r}: {self.target} changed (fingerprint sha256 {found[:16]}, ledger "
                f"{self.fingerprint_sha256[:16]}); re-check the patch against this ROLL and update patches/LEDGER.md")


def _registry() -> dict[str, Patch]:
    names = ("strategy_literal", "loud_safe_import")
    patches = [importlib.import_module(f"{__name__}.{name}").PATCH for name in names]
    return {patch.name: patch for patch in patches}


_APPLIED: dict[str, Callable[[], None]] = {}


def known_patches() -> list[str]:
    return sorted(_registry())


def get_patch(name: str) -> Patch:
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown patch {name!r}; known patches: {sorted(registry)}")
    return registry[name]


def apply_patches(names: Iterable[str]) -> list[str]:
    """Apply the named patches (idempotent); returns the names applied now. Unknown names and
    changed targets raise before anything is patched."""
    requested = [get_patch(name) for name in names]
    patches = [patch for patch in requested if patch.name not in _APPLIED]
    for patch in patches:
        patch.check_target()  # against unpatched ROLL: applied patches are skipped above
    applied = []
    for patch in patches:
        _APPLIED[patch.name] = patch.apply()
        applied.append(patch.name)
        logger.info("applied ROLL patch %s to %s (see patches/LEDGER.md)", patch.name, patch.target)
    return applied


def revert_patches() -> list[str]:
    """Undo every applied patch, newest first; returns the names reverted."""
    reverted = []
    while _APPLIED:
        name, undo = _APPLIED.popitem()
        undo()
        reverted.append(name)
    return reverted


def applied_patches() -> list[str]:
    return list(_APPLIED)
