"""The long-lived Ray actor that *owns* the published weights.

Ownership matters in Ray: an object lives only as long as the process that created it (its
owner). If the trainer worker that published theta_t ``ray.put`` the weights itself, its death or
restart would make every later fetch of theta_t fail, mid-exploration. So the publisher sends the
packed state dict to this actor, which ``ray.put``s it and so becomes the owner; the actor lives as
long as the job (start it from the driver, ``num_cpus=0``). The driver could own the objects just
as well, but then every publish would route the weights through the driver process; the actor can
be placed next to the trainer instead.

Cost: Ray removed ``ray.put(_owner=...)`` in 2.56, so ownership cannot be handed over without a
copy. Publishing writes the weights twice into the trainer node's object store (the call argument,
freed when the call returns, and the actor's own copy). That is one extra memcpy per iteration.

This module imports no torch: the actor handles only :class:`NumpyStateDict` values.
"""
from __future__ import annotations

import logging

import ray

from roll_spotlight.weights.versions import WeightVersions

logger = logging.getLogger(__name__)


class WeightStoreServer:
    """The actor's body: versions -> ObjectRefs it owns, newest ``keep`` only."""

    def __init__(self, keep: int = 2) -> None:
        self._versions: WeightVersions[ray.ObjectRef] = WeightVersions(keep)

    def publish(self, version: int, packed: object) -> list[int]:
        """Own a copy of ``packed`` as ``version``; returns the evicted versions (whose objects are
        freed once no fetcher still holds them)."""
        evicted = self._versions.publish(version, ray.put(packed))
        logger.info("published weight version %d; evicted %s", version, [v for v, _ in evicted])
        return [v for v, _ in evicted]

    def lookup(self, version: int) -> tuple[list[ray.ObjectRef] | None, tuple[int, ...]]:
        """([ref], versions) if held, else (None, versions). The ref travels inside a list so Ray
        passes the reference itself instead of resolving it."""
        ref = [self._versions.get(version)] if version in self._versions else None
        return ref, self._versions.versions

    def versions(self) -> tuple[int, ...]:
        return self._versions.versions

    def latest_version(self) -> int | None:
        return self._versions.latest_version


WeightStoreActor = ray.remote(num_cpus=0)(WeightStoreServer)
