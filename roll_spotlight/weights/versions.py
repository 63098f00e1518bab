"""Which weight versions are held, and what handle each is held by (pure bookkeeping).

Exploration runs one iteration stale (docs/design.md section 3): while the trainer publishes
theta_{t+1}, explore requests still fetch theta_t. So the store keeps the newest ``keep`` versions
(2 by default) and evicts older ones; ``publish`` hands evicted handles back to the caller, who
frees them (for Ray ObjectRefs, dropping the last reference frees the object).
"""
from __future__ import annotations

from typing import Generic, TypeVar

H = TypeVar("H")


class WeightVersions(Generic[H]):
    """Versions are integers published in strictly increasing order."""

    def __init__(self, keep: int = 2) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"WeightVersions.keep must be an int >= 1, got {keep!r}")
        self.keep = keep
        self._handles: dict[int, H] = {}

    def publish(self, version: int, handle: H) -> list[tuple[int, H]]:
        """Hold ``handle`` as ``version``; returns the (version, handle) pairs evicted."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"weight version must be an int >= 0, got {version!r}")
        latest = self.latest_version
        if latest is not None and version <= latest:
            raise ValueError(f"weight version {version} is not newer than the latest, {latest}")
        self._handles[version] = handle
        stale = sorted(self._handles)[: -self.keep]
        return [(v, self._handles.pop(v)) for v in stale]

    def get(self, version: int) -> H:
        try:
            return self._handles[version]
        except KeyError:
            raise KeyError(
                f"weight version {version} is not held; available versions: {list(self.versions)}"
            ) from None

    @property
    def latest_version(self) -> int | None:
        """The newest version, or None before the first publish."""
        return max(self._handles, default=None)

    @property
    def versions(self) -> tuple[int, ...]:
        return tuple(sorted(self._handles))

    def __contains__(self, version: object) -> bool:
        return version in self._handles

    def __len__(self) -> int:
        return len(self._handles)
