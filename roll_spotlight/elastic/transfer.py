"""Weights for a newcomer worker: from a peer on the same node, else a remote peer, else storage.

Why this order: a same-node peer is the cheapest source (shared memory through the Ray object
store on CPU, a device-to-device NCCL broadcast on GPU), a remote peer costs one network copy, and
storage (in the live runtime, the weight store every worker can fetch a version from) is the
fallback that always exists. :func:`choose_source` is the pure policy; the rest are torch helpers
that `worker.actor.RolloutWorker` (peer and newcomer) and `elastic.groups` (the driver) call.

Mechanisms, chosen by :func:`choose_method`:

- ``OBJECT_STORE`` (CPU): the peer ``ray.put``s its state dict as numpy arrays once per weight
  version; a newcomer on the same node maps it from shared memory and adopts the arrays as its
  parameters without copying them (:func:`share_numpy_state`), so every worker of a node that
  took that version reads one copy of the weights.
- ``COLLECTIVE`` (CUDA available): peer and newcomer join a two-member NCCL group under a fresh
  generation prefix and the peer broadcasts every tensor device to device.
- ``FILE``: ``load_file`` of the safetensors checkpoint.
"""
from __future__ import annotations

import enum
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from roll_spotlight.elastic.comm import broadcast_

log = logging.getLogger(__name__)

__all__ = [
    "TransferMethod",
    "TransferPlan",
    "TransferSource",
    "broadcast_state",
    "broadcast_weights",
    "choose_method",
    "choose_source",
    "load_numpy_state",
    "load_weights_file",
    "numpy_state",
    "own_weights",
    "published_arrays",
    "save_weights_file",
    "share_numpy_state",
    "share_published",
    "weights_checksum",
]


class TransferSource(enum.Enum):
    SAME_NODE_PEER = "same_node_peer"
    REMOTE_PEER = "remote_peer"
    STORAGE = "storage"


class TransferMethod(enum.Enum):
    OBJECT_STORE = "object_store"
    COLLECTIVE = "collective"
    FILE = "file"


@dataclass(frozen=True)
class TransferPlan:
    """Where a newcomer's weights come from: a source kind and, for peers, the peer's key."""

    source: TransferSource
    peer: str | None

    def __post_init__(self) -> None:
        assert (self.peer is None) == (self.source is TransferSource.STORAGE), self


def choose_source(newcomer_node: str, peers: Mapping[str, str], storage_available: bool) -> TransferPlan:
    """Pick the cheapest source. ``peers`` maps each live peer holding current weights to its node
    id; ties break on the smallest peer key so the choice is deterministic."""
    same = sorted(p for p, node in peers.items() if node == newcomer_node)
    if same:
        return TransferPlan(TransferSource.SAME_NODE_PEER, same[0])
    if peers:
        return TransferPlan(TransferSource.REMOTE_PEER, sorted(peers)[0])
    if storage_available:
        return TransferPlan(TransferSource.STORAGE, None)
    raise ValueError(f"no source of weights for a newcomer on node {newcomer_node!r}: no peers, no storage")


def choose_method(plan: TransferPlan, cuda_available: bool) -> TransferMethod:
    if plan.source is TransferSource.STORAGE:
        return TransferMethod.FILE
    return TransferMethod.COLLECTIVE if cuda_available else TransferMethod.OBJECT_STORE


def numpy_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The state dict as CPU numpy arrays (what a peer ``ray.put``s for newcomers)."""
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def _check_keys(own: Mapping[str, torch.Tensor], state: Mapping[str, np.ndarray]) -> None:
    if set(own) != set(state):
        raise ValueError(f"state keys differ: missing {sorted(set(own) - set(state))[:3]}, "
                         f"unexpected {sorted(set(state) - set(own))[:3]}")


def _tensor_views(state: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Tensors over the arrays of ``state``, no copy. Arrays mapped from the object store are
    read-only; callers only read these tensors, so torch's warning about that is moot."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return {key: torch.from_numpy(np.asarray(array)) for key, array in state.items()}


@torch.no_grad()
def load_numpy_state(model: torch.nn.Module, state: Mapping[str, np.ndarray]) -> None:
    """Copy arrays (possibly read-only shared memory) into the model's own tensors."""
    own = model.state_dict()
    _check_keys(own, state)
    views = _tensor_views(state)
    for key, tensor in own.items():
        tensor.copy_(views[key])


@torch.no_grad()
def share_numpy_state(model: torch.nn.Module, state: Mapping[str, np.ndarray], *, subset: bool = False) -> None:
    """Make the model's parameters and buffers *views* of ``state`` (no copy).

    Meant for read-only shared memory (a Ray object mapped from the node's store): the model
    then only reads them, and the object stays pinned while the views exist. Anything that
    would write the weights in place must call :func:`own_weights` first. CPU models only.
    ``subset``: ``state`` names some of the model's entries (a policy's published ones), not all.
    """
    own = model.state_dict(keep_vars=True)  # the parameters and persistent buffers themselves
    if subset:
        _check_keys({k: own[k] for k in state if k in own}, state)
        own = {k: own[k] for k in state}
    else:
        _check_keys(own, state)
    views = _tensor_views(state)
    for key, tensor in own.items():
        if tensor.device.type != "cpu":
            raise ValueError(f"share_numpy_state needs a CPU model; {key} is on {tensor.device}")
        view = views[key]
        if view.shape != tensor.shape or view.dtype != tensor.dtype:
            raise ValueError(f"{key}: got {view.dtype} {tuple(view.shape)}, "
                             f"the model has {tensor.dtype} {tuple(tensor.shape)}")
    for key, tensor in own.items():  # all checked first: a mismatch leaves the model untouched
        tensor.data = views[key]


@torch.no_grad()
def own_weights(model: torch.nn.Module) -> None:
    """Give the model private, writable copies of tensors that :func:`share_numpy_state` shared."""
    for tensor in model.state_dict(keep_vars=True).values():
        tensor.data = tensor.data.clone()


def save_weights_file(model: torch.nn.Module, path: Path) -> Path:
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path))
    return path


@torch.no_grad()
def load_weights_file(model: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import load_file

    device = next(model.parameters()).device
    model.load_state_dict(load_file(str(path), device=str(device)), strict=True)


@torch.no_grad()
def broadcast_weights(model: torch.nn.Module, group, src: int) -> None:
    """Broadcast every state tensor from group rank ``src`` (the peer) to the others, in place."""
    broadcast_state(model.state_dict(), group, src)


@torch.no_grad()
def broadcast_state(state: Mapping[str, torch.Tensor], group, src: int) -> None:
    """Broadcast the tensors of ``state`` (sorted by key, so every rank sends the same sequence)
    from group rank ``src``, in place: device to device over NCCL on GPUs."""
    for key in sorted(state):
        broadcast_(state[key], src, group)


def published_arrays(policy) -> dict[str, np.ndarray]:
    """A policy's published state (`DiTPolicy.published_state`: what a weight version holds) as
    CPU numpy arrays: what a peer ``ray.put``s once per version for newcomers."""
    return {k: v.detach().cpu().numpy() for k, v in policy.published_state().items()}


@torch.no_grad()
def share_published(policy, state: Mapping[str, np.ndarray]) -> None:
    """Adopt a peer's :func:`published_arrays` in place (zero-copy views, see
    :func:`share_numpy_state`); the keys must be exactly the policy's published ones."""
    _check_keys(policy.published_state(), state)
    share_numpy_state(policy, state, subset=True)


def weights_checksum(model: torch.nn.Module) -> float:
    """Cheap fingerprint for tests and logs: sum of all state entries in float64."""
    return float(sum(v.detach().double().sum() for v in model.state_dict().values()))
