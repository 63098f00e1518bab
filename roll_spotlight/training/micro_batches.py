"""The micro-batches of one Flow-GRPO update, and the gradient sums workers report for them.

An update's gradient is a sum over micro-batches (some kept rows of the batch at one trained step,
each term weighted by its share of the mean over kept rows x trained steps).
`dispatch.requests.plan_micro_batches` fixes their order: chunk-major, step-minor, the order the
trainer has always accumulated in. The trainer runs them itself unless its update is given a
`GradientSource` (queue training, `runtime.queue_training`): then the trainer and other workers
(spot workers included) pull them from the request queue, each runs its leases into one
`GradientSum`, and the trainer adds the accepted sums (`combine`).

`TrainWork` is everything a remote worker needs to compute any micro-batch of an update: the whole
batch, its advantages and normaliser, the micro-batch plan and the loss settings. A worker at the
update's weight version computes exactly the terms the trainer would (same code: `GRPOLoss`).

Summation order: `combine` adds the sums in order of their first micro-batch index, so the result
depends on how the micro-batches were split among workers but not on when the reports arrived;
one sum covering every micro-batch in plan order is bit-identical to the local update.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from roll_spotlight.config.run import GRPOConfig
from roll_spotlight.dispatch.requests import MicroBatch, Schedule

LOSS_TOTALS = ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean")  # a micro-batch's weighted terms


@dataclass(frozen=True)
class UpdatePlan:
    """One update as the trainer plans it: the whole `grpo.ScoredBatch`, its rows' advantages (N,),
    ``norm`` = kept samples x trained steps (each micro-batch's weight is len(rows) / norm), the
    micro-batches in plan order and the loss settings."""

    batch: object
    advantages: torch.Tensor
    norm: int
    micro_batches: tuple[MicroBatch, ...]
    cfg: GRPOConfig


@dataclass(frozen=True)
class TrainWork:
    """One update's work, for whoever computes its micro-batches (pickled to remote workers):
    the plan, the weight version it trains from and the schedule its trajectories were sampled
    with (what its TRAIN requests carry)."""

    weight_version: int
    batch: object
    advantages: torch.Tensor
    norm: int
    micro_batches: tuple[MicroBatch, ...]
    cfg: GRPOConfig
    schedule: Schedule

    @classmethod
    def of(cls, plan: UpdatePlan, weight_version: int, schedule: Schedule) -> TrainWork:
        return cls(weight_version, plan.batch, plan.advantages, plan.norm, plan.micro_batches, plan.cfg, schedule)

    @property
    def iteration(self) -> int:
        """The coordinator's iteration this update belongs to (it trains weight version t-1)."""
        return self.weight_version + 1


@dataclass
class GradientSum:
    """A worker's sum over the micro-batches `indices` (in the order run): the gradient of each
    trained parameter by name (numpy, float32 for LoRA adapters), the weighted loss totals, and the
    seconds spent computing them (the training-time measure of `spot.training_phase: auto`)."""

    worker: str
    indices: tuple[int, ...]
    grads: dict[str, np.ndarray]
    totals: dict[str, float]
    seconds: float
    kinds: dict[str, str] = field(default_factory=dict)  # parameter name -> torch dtype name

    @property
    def first(self) -> int:
        return min(self.indices)


@dataclass(frozen=True)
class Contributions:
    """Who computed an update's micro-batches: (micro-batches, compute seconds) per worker, the
    reports the queue refused on the way (their micro-batches were computed again) and the
    phase's wall time. What the hosts split by kind of worker (`runtime.update_report`)."""

    by_worker: Mapping[str, tuple[int, float]]
    refused: int = 0
    wall_s: float = 0.0

    @classmethod
    def of(cls, sums: Sequence[GradientSum], refused: int, wall_s: float) -> Contributions:
        by_worker: dict[str, tuple[int, float]] = {}
        for s in sums:
            count, seconds = by_worker.get(s.worker, (0, 0.0))
            by_worker[s.worker] = (count + len(s.indices), seconds + s.seconds)
        return cls(by_worker, refused, wall_s)


@dataclass(frozen=True)
class UpdateSums:
    """What a `GradientSource` returns: the accepted sums (covering every micro-batch once) and
    who computed what."""

    sums: tuple[GradientSum, ...]
    contributions: Contributions


# The update's micro-batches computed elsewhere: the plan in, the accepted sums out.
GradientSource = Callable[[UpdatePlan], UpdateSums]


def compute_sum(loss, params: dict[str, torch.nn.Parameter], work: TrainWork,
                micro_batches: Sequence[MicroBatch | None], worker: str, *,
                should_stop: Callable[[], bool] = lambda: False) -> GradientSum:
    """Run `micro_batches` of `work` (in order) on `loss` (a `grpo.GRPOLoss` at the work's weight
    version) and return their sum; `should_stop()` is called after each entry, and a True ends
    the sum there (a notice: what finished is reported, the rest handed back). A None entry is a
    round this worker sits out (an SP group's ranks compute in rounds, `worker.compute`):
    nothing is computed but `should_stop()` is still called, so every rank asks equally often.
    The parameters' `.grad` are scratch space: zeroed before and after."""
    from roll_spotlight.weights.codec import state_dict_to_numpy

    start = time.perf_counter()
    for p in params.values():
        p.grad = None
    totals = dict.fromkeys(LOSS_TOTALS, 0.0)
    done: list[int] = []
    loss.policy.train()
    for i, mb in enumerate(micro_batches):
        if mb is not None:
            for name, value in loss.backward(work.batch, work.advantages, work.norm, mb).items():
                totals[name] += value
            done.append(mb.index)
        if should_stop() and i + 1 < len(micro_batches):
            break
    grads = {name: p.grad.detach() for name, p in params.items() if p.grad is not None}
    packed = state_dict_to_numpy({name: g.clone() if g.device.type == "cpu" else g for name, g in grads.items()})
    for p in params.values():
        p.grad = None
    return GradientSum(worker, tuple(done), packed.arrays, totals, time.perf_counter() - start, packed.dtypes)


def combine(sums: Sequence[GradientSum], expected: Sequence[int],
            device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The update's gradient by parameter name, and its loss totals, from sums covering each of
    `expected` micro-batch indices exactly once (AssertionError otherwise: the queue promised it).
    Added in order of each sum's first index; a parameter no sum has stays absent (no gradient)."""
    from roll_spotlight.weights.codec import numpy_to_state_dict
    from roll_spotlight.weights.packed import NumpyStateDict

    covered = sorted(i for s in sums for i in s.indices)
    assert covered == sorted(expected), f"gradient sums cover {covered}, the update has {sorted(expected)}"
    grads: dict[str, torch.Tensor] = {}
    totals = dict.fromkeys(LOSS_TOTALS, 0.0)
    for s in sorted(sums, key=lambda s: s.first):
        for name, g in numpy_to_state_dict(NumpyStateDict(s.grads, s.kinds)).items():
            g = g.to(device)
            grads[name] = g.clone() if name not in grads else grads[name].add_(g)
        for name in LOSS_TOTALS:
            totals[name] += s.totals[name]
    return grads, totals


def reduce_flat(grads: Sequence[torch.Tensor | None], like: Sequence[torch.Tensor],
                reduce: Callable[[torch.Tensor], None], device: torch.device) -> list[torch.Tensor | None]:
    """Sum gradients across ranks as one float32 buffer: ``grads[i]`` is this rank's gradient of
    a tensor shaped like ``like[i]`` (None: none here, counted as zeros), ``reduce`` sums a
    buffer in place across the ranks (an all-reduce, or a reduce onto one rank, whose result
    alone is meaningful). The buffer ends with a count per tensor of the ranks that had one, so a
    tensor no rank had stays None (an optimiser skips it, as it would on one rank). Every rank
    sends the same layout, so no rank has to know another's gradients first."""
    present = torch.tensor([g is not None for g in grads], dtype=torch.float32, device=device)
    flat = torch.cat([(g if g is not None else torch.zeros(p.shape, device=device)).reshape(-1).to(device, torch.float32)
                      for g, p in zip(grads, like)] + [present])
    reduce(flat)
    out: list[torch.Tensor | None] = []
    offset = 0
    for p, count in zip(like, flat[-len(like):].tolist() if len(like) else []):
        out.append(flat[offset:offset + p.numel()].view(p.shape).to(p.dtype) if count > 0 else None)
        offset += p.numel()
    return out
