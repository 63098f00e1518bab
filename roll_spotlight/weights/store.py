"""Client view of the weight store: publish a torch state dict, fetch it as torch tensors.

Fetching on the node that holds the object maps the shared-memory object store: nothing is read
from disk and the arrays are not copied (unless Ray spilled the object to disk because the store
was full). The returned tensors are therefore read-only views; copy them into a model with
``model.load_state_dict(store.fetch(version))``, or pass ``copy=True`` for writable tensors.
A fetch from another node transfers the object once to that node's store.
"""
from __future__ import annotations

from collections.abc import Mapping

import ray
import torch

from roll_spotlight.weights.codec import numpy_to_state_dict, state_dict_to_numpy
from roll_spotlight.weights.store_actor import WeightStoreActor


class WeightStore:
    """Picklable (it holds only the actor handle), so it can be handed to every worker."""

    def __init__(self, actor: ray.actor.ActorHandle) -> None:
        self.actor = actor

    @classmethod
    def create(cls, keep: int = 2, *, name: str | None = None) -> WeightStore:
        """Start the owning :class:`WeightStoreActor` (see its module for why an actor owns)."""
        from roll_spotlight.driver_node import on_driver_node

        options = ({} if name is None else {"name": name}) | on_driver_node()  # never on a spot node
        return cls(WeightStoreActor.options(**options).remote(keep))

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> list[int]:
        """Store ``state_dict`` as ``version``; returns the versions evicted to make room."""
        return ray.get(self.actor.publish.remote(version, state_dict_to_numpy(state_dict)))

    def fetch(self, version: int, *, copy: bool = False) -> dict[str, torch.Tensor]:
        """The tensors of ``version`` (read-only views unless ``copy``); KeyError naming the held
        versions if ``version`` was never published or was evicted."""
        ref, held = ray.get(self.actor.lookup.remote(version))
        if ref is None:
            raise KeyError(f"weight version {version} is not held; available versions: {list(held)}")
        return numpy_to_state_dict(ray.get(ref[0]), copy=copy)

    @property
    def latest_version(self) -> int | None:
        """The newest held version (one actor call), or None before the first publish."""
        return ray.get(self.actor.latest_version.remote())

    @property
    def versions(self) -> tuple[int, ...]:
        """The held versions, oldest first (one actor call)."""
        return ray.get(self.actor.versions.remote())
