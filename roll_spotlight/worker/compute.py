"""A worker's compute on a real policy: rollouts of leases and gradient sums of micro-batches.

`ModelCompute` is what the worker loop (`worker.loop`) runs on a model, for every host:
it holds one weight version at a time (fetched from the run's weight store the first time a
lease names it, or set by a peer's copy), rolls leases out with the `RolloutEngine` and computes
training micro-batches with the trainer's own loss code (`training.grpo.GRPOLoss`), so a worker
computes exactly what the trainer would.

An SP group (`worker.sp_group`) trains data-parallel (`group_sum`): lease i runs on rank
i % size in round i // size, a collective stop check after each round, and the ranks' sums are
reduced onto the leader, which reports one sum for the leases that finished. A member killed
without notice breaks the group; the regroup requeues its leases and the partial sums die with it.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

import torch

from roll_spotlight.dispatch.requests import MicroBatch
from roll_spotlight.worker.engine import RolloutEngine
from roll_spotlight.training.micro_batches import LOSS_TOTALS, GradientSum, TrainWork, compute_sum, reduce_flat


class ModelCompute:
    """`worker_loop.Compute` on ``policy``: weights of one version at a time from ``store``
    (None: the version it holds is the only one, e.g. the trainer's own), rollouts and
    micro-batches, and a newcomer's weight copy from a peer (the elastic pool's). ``lock``
    guards a version change against a peer copy in another thread."""

    def __init__(self, policy, store=None, *, version: int | None = None, commit_every: int = 0,
                 max_batch: int = 1) -> None:
        self.engine = RolloutEngine(policy, max_batch=max_batch, commit_every=commit_every)
        self.store, self.version = store, version
        self.lock = threading.Lock()
        self.shared = False  # the parameters are read-only views of a peer's object (elastic.transfer)
        self.published = None  # (version, [ObjectRef]) a newcomer can adopt (worker.actor)
        self.counters = {"weight_fetches": 0, "peer_weight_copies": 0}
        self._loss = None
        self._params: dict[str, torch.nn.Parameter] = {}

    @property
    def policy(self):
        return self.engine.policy

    def hold_version(self, version: int) -> None:
        if version == self.version:
            return
        if self.store is None:
            raise ValueError(f"weight version {version} requested but this worker has no weight store "
                             f"(it holds version {self.version})")
        with self.lock:
            self.own_weights()
            self.policy.load_published_state(self.store.fetch(version))
            self.engine.invalidate()
            self.version, self.published = version, None
            self.counters["weight_fetches"] += 1

    def own_weights(self) -> None:
        """Before writing weights in place: views of a peer's read-only object become private."""
        if self.shared:
            from roll_spotlight.elastic.transfer import own_weights

            own_weights(self.policy)
            self.shared = False

    # ---- a newcomer's weights from a peer (elastic.transfer) ----
    def publish_weights(self) -> tuple[int | None, list]:
        """This worker's weight version and a boxed reference to its published state in the
        node's object store (put once per version): what a newcomer adopts."""
        import ray

        from roll_spotlight.elastic.transfer import published_arrays

        with self.lock:
            if self.published is None or self.published[0] != self.version:
                self.published = (self.version, [ray.put(published_arrays(self.policy))])
            return self.published

    def adopt_weights(self, published: tuple[int, list]) -> float:
        """Take a peer's `publish_weights()`: on CPU the parameters become views of the object
        (zero copy; the node holds one copy for every worker that adopted it), on a GPU they are
        copied to the device. Returns the seconds spent."""
        import ray

        from roll_spotlight.elastic.transfer import load_numpy_state, share_published

        start = time.perf_counter()
        version, (ref,) = published
        state = ray.get(ref)
        with self.lock:
            if self.policy.device.type == "cpu":
                share_published(self.policy, state)
                self.shared = True
                self._adopted(version, published)  # a later newcomer can adopt the same object
            else:
                self.own_weights()
                load_numpy_state(self.policy, state)
                self._adopted(version)
        return time.perf_counter() - start

    def send_weights(self, rendezvous, prefix: str, timeout_s: float) -> int | None:
        """The peer's side of a device-to-device copy (GPU): rank 0 of a two-member group
        ``prefix``; returns the version sent."""
        self._broadcast_weights(rendezvous, prefix, 0, timeout_s)
        return self.version

    def receive_weights(self, rendezvous, prefix: str, version: int, timeout_s: float) -> float:
        """The newcomer's side of :meth:`send_weights` (rank 1); returns the seconds spent."""
        start = time.perf_counter()
        self._broadcast_weights(rendezvous, prefix, 1, timeout_s)
        self._adopted(version)
        return time.perf_counter() - start

    def _broadcast_weights(self, rendezvous, prefix: str, rank: int, timeout_s: float) -> None:
        from roll_spotlight.elastic.comm import make_process_group
        from roll_spotlight.elastic.transfer import broadcast_state

        backend = "nccl" if self.policy.device.type == "cuda" else "gloo"
        store = rendezvous.connect(timeout_s)
        group = make_process_group(store, prefix, rank, 2, backend=backend, timeout_s=timeout_s,
                                   loopback=rendezvous.loopback)
        with self.lock:
            if rank == 1:
                self.own_weights()
            state = self.policy.state_dict()
            broadcast_state({k: state[k] for k in self.policy.published_state()}, group, 0)

    def _adopted(self, version: int | None, published=None) -> None:
        """The weights of ``version`` came from a peer (``published``: the object they are views of)."""
        self.engine.invalidate()
        self.version, self.published = version, published
        self.counters["peer_weight_copies"] += 1

    @property
    def max_batch(self) -> int:
        return self.engine.max_batch

    def denoise_batch(self, leases, at_boundary, on_checkpoint=None, *, decode: bool = True):
        return self.engine.denoise_batch(leases, at_boundary, on_checkpoint, decode=decode)

    def gradient_sum(self, work: TrainWork, micro_batches: Sequence[MicroBatch], worker: str,
                     should_stop: Callable[[], bool], group=None) -> tuple[int, GradientSum | None]:
        loss, params = self._loss_for(work)
        if group is None:
            gradient = compute_sum(loss, params, work, micro_batches, worker, should_stop=should_stop)
            return len(gradient.indices), gradient
        return group_sum(loss, params, work, micro_batches, group, worker, should_stop)

    def _loss_for(self, work: TrainWork):
        """The loss of the update's settings on this policy, and the parameters it trains."""
        from roll_spotlight.training.grpo import GRPOLoss, trainable_parameters

        if self._loss is None or self._loss.cfg != work.cfg:
            self._loss = GRPOLoss(self.policy, work.cfg)
            self._params = trained_parameters(self.policy, trainable_parameters(self.policy, work.cfg.trainable))
        return self._loss, self._params

    def join_group(self, membership):
        """Become one rank of an SP rollout group (blocks until every member joined)."""
        from roll_spotlight.worker.sp_group import SPRolloutGroup

        return SPRolloutGroup(self.policy, membership)

    def warm_up(self) -> None:
        """One two-step rollout of the empty prompt, discarded: a process's first forward pass
        costs about half a step more than later ones (allocator and kernel set-up)."""
        from roll_spotlight.dispatch import RequestKind, RequestSpec, Schedule
        from roll_spotlight.dispatch.requests import Lease, Request
        from roll_spotlight.worker.loop import roll_out

        spec = RequestSpec(0, "", 0, Schedule(num_steps=2, noise_level=0.7), 0, RequestKind.ROLLOUT, 0)
        roll_out(self.engine, [Lease(0, Request.from_spec(0, spec), "warm-up", float("inf"), None, 1)])
        self.engine.invalidate()  # the warm-up's prompt encoding is not kept


def trained_parameters(policy, trained) -> dict:
    """The policy's parameters that train (`trained`, a list of them), by name."""
    ids = {id(p) for p in trained}
    return {name: p for name, p in policy.named_parameters() if id(p) in ids}


def group_sum(loss, params: dict, work: TrainWork, micro_batches: Sequence[MicroBatch], group, worker: str,
              should_stop: Callable[[], bool]) -> tuple[int, GradientSum | None]:
    """An SP group's sum over `micro_batches`, data-parallel (what the simulator's update model
    assumes): entry i runs on rank i % degree in round i // degree, each rank into its own
    `compute_sum`; after every round the ranks' `should_stop()` are combined (any), so a notice to
    any member ends the sum after the round in hand on every rank. The ranks' sums are then
    sum-reduced onto the leader. Returns how many finished (always a prefix) and, on the leader,
    one GradientSum covering exactly those (None on the other ranks). A member that dies makes
    the others' collectives raise: the group breaks and the regroup requeues its leases."""
    degree, rank = group.size, group.rank
    rounds = -(-len(micro_batches) // degree)
    mine = [micro_batches[i] if (i := k * degree + rank) < len(micro_batches) else None for k in range(rounds)]
    done = 0

    def stop() -> bool:
        nonlocal done
        done += 1
        return group.any(should_stop())

    start = time.perf_counter()
    with group.data_parallel():
        own = compute_sum(loss, params, work, mine, worker, should_stop=stop)
    finished = min(len(micro_batches), done * degree)
    reduced = reduce_to_leader(own, params, group)
    if reduced is None:
        return finished, None
    packed, totals = reduced
    indices = tuple(mb.index for mb in micro_batches[:finished])
    return finished, GradientSum(worker, indices, packed.arrays, totals, time.perf_counter() - start, packed.dtypes)


def reduce_to_leader(own: GradientSum, params: dict, group):
    """Every rank's `own` sum added onto the group's leader (`reduce_flat`, then the loss totals
    in float64): on the leader (packed gradients, loss totals), None elsewhere."""
    from roll_spotlight.elastic.comm import sum_to
    from roll_spotlight.weights.codec import numpy_to_state_dict, state_dict_to_numpy
    from roll_spotlight.weights.packed import NumpyStateDict

    names, device = sorted(params), group.device
    grads = numpy_to_state_dict(NumpyStateDict(own.grads, own.kinds))
    summed = reduce_flat([grads.get(n) for n in names], [params[n] for n in names],
                         lambda flat: sum_to(flat, 0, group.group), device)
    totals = torch.tensor([own.totals[k] for k in LOSS_TOTALS], dtype=torch.float64, device=device)
    sum_to(totals, 0, group.group)
    if not group.leader:
        return None
    out = {name: g for name, g in zip(names, summed) if g is not None}
    return state_dict_to_numpy(out), dict(zip(LOSS_TOTALS, totals.tolist()))
