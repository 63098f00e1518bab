"""Persistent SP workers: long-lived processes that keep model weights in memory across regroups.

``SPWorker`` is a plain class (usable in-process in tests); :func:`spawn_worker` wraps it as a Ray
actor with ``num_cpus=0`` (plus ``num_gpus=1`` on GPU, or a custom resource), so many workers share
a small CPU allocation. The worker never decides anything: the controller tells it which group to
join (store address, generation prefix, rank, size), what to denoise, and where weights come from.

Rank and size live only in the process-group object the worker currently holds; a regroup replaces
that object (and re-installs Ulysses on the model with it), so nothing stale survives a regroup.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from roll_spotlight.elastic.comm import make_process_group
from roll_spotlight.elastic.model_spec import QwenModelSpec
from roll_spotlight.elastic.planner import Member
from roll_spotlight.elastic.rendezvous import Rendezvous
from roll_spotlight.elastic.rollout import RolloutRequest, SPRolloutState, denoise
from roll_spotlight.elastic.transfer import (
    broadcast_weights,
    load_numpy_state,
    load_weights_file,
    numpy_state,
    own_weights,
    save_weights_file,
    share_numpy_state,
    weights_checksum,
)
from roll_spotlight.elastic.ulysses import apply_ulysses, remove_ulysses

log = logging.getLogger(__name__)

__all__ = ["SPWorker", "WorkerConfig", "spawn_worker"]


@dataclass(frozen=True)
class WorkerConfig:
    """``node``: a node label (tests fake several nodes on one machine); None means Ray's node id.
    ``gpu``: the GPU index on that node (a plain id on CPU). ``threads``: torch intra-op threads.
    ``pretrained_dir``: load weights with ``from_pretrained`` (a cold start) instead of building
    ``model`` with its seeded random init."""

    gpu: int
    model: QwenModelSpec
    node: str | None = None
    threads: int = 1
    device: str = "auto"
    pretrained_dir: str | None = None

    def __post_init__(self) -> None:
        if self.gpu < 0 or self.threads < 1:
            raise ValueError(f"gpu={self.gpu} must be >= 0 and threads={self.threads} >= 1")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device={self.device!r} must be 'auto', 'cpu' or 'cuda'")


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")


def _node_id(label: str | None) -> str:
    if label is not None:
        return label
    import ray

    return ray.get_runtime_context().get_node_id()


class SPWorker:
    """One GPU's worker: model in memory, at most one SP group at a time."""

    def __init__(self, config: WorkerConfig) -> None:
        torch.set_num_threads(config.threads)
        self.config = config
        self.device = _resolve_device(config.device)
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        if config.pretrained_dir is not None:
            self.model = QwenModelSpec.load(config.pretrained_dir, self.device)
        else:
            self.model = config.model.build(self.device)
        self.group: dist.ProcessGroup | None = None
        self._stores: dict[Rendezvous, dist.Store] = {}
        self._published: Any = None
        self._shared_weights = False  # True while the weights are views of a peer's published object

    # identity and liveness
    def member(self) -> Member:
        return (_node_id(self.config.node), self.config.gpu)

    def ping(self) -> int:
        return os.getpid()

    def uses_cuda(self) -> bool:
        return self.device.type == "cuda"

    def prepare_standby(self) -> tuple[Member, bool]:
        """Get ready to receive weights later; returns ``(member, uses_cuda)``.

        Reads one object from the node's shared-memory store now: a process pays for mapping the
        store on its first read (about 60 ms measured on a 2-core machine), and a worker kept
        for recovery should pay that before a peer's weights are on the critical path."""
        import ray

        if ray.is_initialized():  # in a Ray actor (a plain in-process SPWorker has no store)
            ray.get(ray.put(np.zeros(1 << 18, dtype=np.uint8)))  # above Ray's inline limit: a store object
        return self.member(), self.uses_cuda()

    # groups
    def _store(self, rendezvous: Rendezvous, timeout_s: float) -> dist.Store:
        if rendezvous not in self._stores:
            self._stores[rendezvous] = rendezvous.connect(timeout_s)
        return self._stores[rendezvous]

    def join_group(self, rendezvous: Rendezvous, prefix: str, rank: int, size: int, timeout_s: float) -> float:
        """Build the group ``prefix`` (blocks until all ``size`` members joined) and install Ulysses
        over it; returns the seconds spent."""
        start = time.perf_counter()
        self.leave_group()
        store = self._store(rendezvous, timeout_s)
        self.group = make_process_group(store, prefix, rank, size, backend=self.backend, timeout_s=timeout_s,
                                        loopback=rendezvous.loopback)
        apply_ulysses(self.model, self.group)
        return time.perf_counter() - start

    def leave_group(self) -> None:
        """Drop the current group (possibly broken by a dead peer); the model runs unsharded."""
        remove_ulysses(self.model)
        self.group = None

    # rollouts
    def denoise(self, request: RolloutRequest, state: SPRolloutState, until_step: int) -> SPRolloutState:
        assert self.group is not None, "denoise before join_group"
        return denoise(self.model, request, state, until_step)

    # weights
    def publish_weights(self) -> list:
        """Put the state dict (numpy) into the Ray object store once and hand out its reference,
        wrapped in a list so Ray passes the reference instead of resolving it."""
        import ray

        if self._published is None:
            self._published = ray.put(numpy_state(self.model))
        return [self._published]

    def invalidate_published(self) -> None:
        """Call after a weight update so the next newcomer gets the new version."""
        self._published = None

    def load_weights_from_object(self, boxed_ref: list) -> float:
        """Take a same-node peer's published weights (see :meth:`adopt_weights`)."""
        import ray

        start = time.perf_counter()
        self.adopt_weights(ray.get(boxed_ref[0]))
        return time.perf_counter() - start

    def adopt_weights(self, state: dict) -> None:
        """On CPU, use the (shared-memory, read-only) arrays in place: no copy, and the object
        stays pinned while this worker holds it. On a GPU (``transfer_method: object_store``
        forced), copy them into the device tensors."""
        if self.device.type != "cpu":
            self._before_weight_change()
            load_numpy_state(self.model, state)
            return
        self._published = None  # the peer owns that object; this worker publishes its own when asked
        share_numpy_state(self.model, state)  # replaces views, writes nothing: no private copy first
        self._shared_weights = True

    def _before_weight_change(self) -> None:
        """Before new weights arrive: the published object no longer matches, and shared weights
        (read-only memory of the object store) become private copies that may be written."""
        self._published = None
        if self._shared_weights:
            own_weights(self.model)
            self._shared_weights = False

    def save_weights(self, path: str) -> str:
        return str(save_weights_file(self.model, Path(path)))

    def save_pretrained(self, path: str) -> str:
        self.model.save_pretrained(path)
        return path

    def load_weights_from_file(self, path: str) -> float:
        start = time.perf_counter()
        self._before_weight_change()
        load_weights_file(self.model, Path(path))
        return time.perf_counter() - start

    def broadcast_weights(self, rendezvous: Rendezvous, prefix: str, rank: int, timeout_s: float) -> float:
        """Two-member transfer group: rank 0 (the peer) sends, rank 1 (the newcomer) receives."""
        start = time.perf_counter()
        if rank != 0:
            self._before_weight_change()
        store = self._store(rendezvous, timeout_s)
        group = make_process_group(store, prefix, rank, 2, backend=self.backend, timeout_s=timeout_s,
                                   loopback=rendezvous.loopback)
        broadcast_weights(self.model, group, src=0)
        return time.perf_counter() - start

    def checksum(self) -> float:
        return weights_checksum(self.model)


@lru_cache(maxsize=1)
def _actor_class():
    import ray

    return ray.remote(SPWorker)


def spawn_worker(config: WorkerConfig, *, num_gpus: float = 0.0, resources: dict[str, float] | None = None,
                 name: str | None = None):
    """Start one ``SPWorker`` Ray actor (``num_cpus=0``: workers wait on collectives, they do
    not need a CPU slot each)."""
    actor = _actor_class().options(num_cpus=0, num_gpus=num_gpus, resources=resources or {},
                                         name=name, max_restarts=0, max_concurrency=1)
    return actor.remote(config)
