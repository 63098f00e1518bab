"""SP rollout groups: several rollout workers denoise one image together with Ulysses SP.

This is where sequence parallelism enters the iteration loop. ``size`` rollout workers (one GPU
each) join one process group and install Ulysses (`roll_spotlight.elastic.ulysses`) on their
policy's transformer; from then on the group serves the request queue as one worker:

    every tick, on every rank:
        stop?   = a rank was stopped or got a preemption notice    (all-reduce MAX)
        leases  = rank 0 pulls a batch (empty when nothing is pending)  (broadcast from rank 0)
        every rank denoises the same batch (worker.engine); at each step boundary
        stop?   = a rank got a notice                              (all-reduce MAX)
        refills = rank 0's leases for the free slots               (broadcast from rank 0)
        rank 0 completes the finished rows, or commits every row in flight

Only rank 0 (the leader) talks to the queue, under the group's name; the others learn each lease
from it. A notice to any member makes the whole group commit after the step in hand, because the
group cannot continue without that member; each committed state is one request's full latent at
a step boundary, so any worker or group of any degree resumes it, in any batch. The decisions are
collectives, so the ranks never disagree on where a batch stopped or what it holds.

Numerics: each rank runs the per-token ops on its rows and whole heads of attention, so an SP
trajectory equals the single-worker one; measured bit for bit on CPU at degrees 2 and 4
(`benchmarks/sp_rollout.py`), and the tests allow 1e-5 (fp32) because GPU kernels may pick other
reduction orders for other shapes.

Training micro-batches (queue training, `worker.compute.group_sum`): a TRAIN batch is not
one image, so the ranks train data-parallel instead, with Ulysses off for the batch
(`data_parallel`): the leader pulls one batch per rank and shares it, rank r computes leases r,
r+size, ... in rounds with a stop decision (all-reduce MAX) after each, and the ranks' gradient
sums are sum-reduced onto the leader, which reports one sum for the leases that finished.

Failure without notice: a member that dies breaks the collectives of the ranks it talks to at
once (its connections close), but gloo leaves a rank that raised with its own connections open,
so ranks blocked on that one would wait out ``timeout_s``. A rank whose worker loop fails
therefore drops its process group at once (`SPRolloutGroup.abandon`), and the failure runs
through the group in milliseconds; the regroup then hands the group's lease back to the queue.
"""
from __future__ import annotations

import json
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:  # torch, torch.distributed and diffusers load when a group forms, not with configs
    from roll_spotlight.elastic.rendezvous import RendezvousHost, SPMembership

__all__ = ["SPRolloutGroup", "check_sp_degree", "check_spot_placement", "open_rendezvous", "sp_shape"]


def sp_shape(model_cfg, required: bool = True) -> tuple[int, int] | None:
    """(attention heads, image tokens per request) that Ulysses must divide: the tiny preset's from
    its config (`model.patch_size` pixels per token side), Qwen-Image's from its transformer's config.json under
    ``model.path`` (16x16 pixels per token: VAE 8, patch 2). A directory that is not there yet
    (a recipe read before its model is) gives None unless ``required``."""
    if model_cfg.preset == "tiny":
        return model_cfg.num_attention_heads, (model_cfg.image_size // model_cfg.patch_size) ** 2
    config = Path(model_cfg.path) / "transformer" / "config.json"
    if not config.is_file() and not required:
        return None
    try:
        heads = int(json.loads(config.read_text())["num_attention_heads"])
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"model.path: cannot read num_attention_heads from {config}: {err}") from err
    return heads, (model_cfg.image_size // 16) ** 2


def check_sp_degree(model_cfg, degree: int, key: str = "elastic.sp_degree") -> None:
    """Fail at start-up, naming ``key``, when Ulysses could not split the model ``degree`` ways:
    the degree must divide the head count and the image-token count (`sp_shape`; a real model
    whose directory is not there yet is checked when its groups form)."""
    if degree < 1:
        raise ValueError(f"{key}={degree} must be >= 1")
    shape = sp_shape(model_cfg, required=False) if degree > 1 else None
    if shape is None:
        return
    heads, tokens = shape
    if heads % degree or tokens % degree:
        where = (f"model.num_attention_heads={heads}" if model_cfg.preset == "tiny"
                 else f"the {heads} attention heads of model.path's transformer")
        raise ValueError(f"{key}={degree} must divide {where} and the image-token count {tokens} "
                         f"(model.image_size={model_cfg.image_size})")


def check_spot_placement(gpus_per_node: int, degree: int, max_nodes: int, degree_key: str = "elastic.sp_degree",
                         gpus_key: str = "spot.gpus_per_node", nodes_key: str = "spot.max_workers") -> None:
    """Fail at start-up, naming the keys, when SP groups of ``degree`` cannot tile spot nodes of
    ``gpus_per_node`` GPUs: a group fills whole nodes or a node holds whole groups, and the pool's
    ``max_nodes`` nodes hold at least one group."""
    if gpus_per_node < 1:
        raise ValueError(f"{gpus_key}={gpus_per_node} must be >= 1")
    if gpus_per_node % degree and degree % gpus_per_node:
        raise ValueError(f"{gpus_key}={gpus_per_node} does not fit {degree_key}={degree}: one must divide "
                         f"the other (a group spans whole nodes, or a node holds whole groups)")
    if gpus_per_node * max_nodes < degree:
        raise ValueError(f"{nodes_key}={max_nodes} nodes x {gpus_key}={gpus_per_node} GPUs cannot "
                         f"hold one SP group of {degree_key}={degree}")


def open_rendezvous(all_local: bool) -> "RendezvousHost":
    """Where SP groups meet (a Ray driver hosts it): a private file store when every member runs
    on this host, else a TCP store on this host's address."""
    import ray

    from roll_spotlight.elastic.rendezvous import RendezvousHost

    return RendezvousHost("127.0.0.1" if all_local else ray.util.get_node_ip_address())


class SPRolloutGroup:
    """A worker's side of its group: the process group, Ulysses on the policy, the two decisions.

    The constructor blocks until every member has joined. The head count of the policy's
    transformer and its image-token count must be divisible by ``size`` (checked by Ulysses).
    ``policy`` None: a group of emulated GPUs (`worker.emulated`), the collectives without a model."""

    def __init__(self, policy, membership: SPMembership) -> None:
        from roll_spotlight.elastic.comm import make_process_group

        self.membership = membership
        self.policy = policy
        self.device = policy.device if policy is not None else _cpu()
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        store = membership.rendezvous.connect(membership.timeout_s)
        self.group = make_process_group(store, membership.prefix, membership.rank, membership.size,
                                        backend=backend, timeout_s=membership.timeout_s,
                                        loopback=membership.rendezvous.loopback)
        self._store = store  # keep the store client alive as long as the group
        self._ulysses(True)

    def _ulysses(self, on: bool) -> None:
        """Shard the policy's attention over the group (Ulysses), or undo it; no policy: nothing."""
        if self.policy is None:
            return
        from roll_spotlight.elastic.ulysses import apply_ulysses, remove_ulysses

        if on:
            apply_ulysses(self.policy.transformer, self.group)
        else:
            remove_ulysses(self.policy.transformer)

    @property
    def rank(self) -> int:
        return self.membership.rank

    @property
    def size(self) -> int:
        return self.membership.size

    @property
    def leader(self) -> bool:
        return self.membership.rank == 0

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on at least one."""
        from roll_spotlight.elastic.comm import any_true

        return any_true(flag, self.group, self.device)

    def lead(self, pull: Callable[[], Any]) -> Any:
        """What the leader's ``pull()`` returns (a lease, or None), on every rank; only the leader
        calls ``pull``."""
        from roll_spotlight.elastic.comm import broadcast_object

        return broadcast_object(pull() if self.leader else None, 0, self.group, self.device)

    @contextmanager
    def data_parallel(self) -> Iterator[None]:
        """The policy unsharded for the block: the ranks train data-parallel, each on its own
        micro-batches (Ulysses shards one image, and its collectives carry no autograd)."""
        self._ulysses(False)
        try:
            yield
        finally:
            self._ulysses(True)

    def close(self) -> None:
        """Leave: the policy runs unsharded again (the process group is dropped with this object)."""
        self._ulysses(False)

    def abandon(self, err: BaseException) -> None:
        """After ``err`` ended this rank's worker loop: drop the process group now, so its connections
        close and the members blocked on this rank fail at once (see the module docstring).
        The frames of ``err``'s traceback hold the group too; their locals are cleared."""
        traceback.clear_frames(err.__traceback__)
        self._ulysses(False)  # Ulysses' hooks hold the group
        self.group = self._store = None



def _cpu():
    import torch

    return torch.device("cpu")
