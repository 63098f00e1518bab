"""The micro-batches of one Flow-GRPO update, and the gradient sums workers report for them.

An update's gradient is a sum over micro-batches (some kept rows of the batch at one trained step,
each term weighted by its share of the mean over kept rows x trained steps).
`dispatch.requests.plan_micro_batches` fixes their order: chunk-major, step-minor, the order the
trainer has always accumulated in.
Where they run is a runner's choice:

- `LocalMicroBatches` (the default) runs every one here, in plan order;
- the runtime's queue runner (`runtime.queue_training`) makes each a TRAIN request that the
  trainer and other workers (spot workers included) pull; each runs its leases into one
  `GradientSum` and reports it, and the trainer adds the accepted sums (`combine`).

`TrainWork` is everything a remote worker needs to compute any micro-batch of an update: the whole
batch, its advantages and normaliser, the micro-batch plan and the loss settings. A worker at the
update's weight version computes exactly the terms the trainer would (same code: `GRPOLoss`).

Summation order: `combine` adds the sums in order of their first micro-batch index, so the result
depends on how the micro-batches were split among workers but not on when the reports arrived;
one sum covering every micro-batch in plan order is bit-identical to the local update.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from roll_spotlight.config.run import GRPOConfig
from roll_spotlight.dispatch.requests import MicroBatch, Schedule

LOSS_TOTALS = ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean")  # a micro-batch's weighted terms


@dataclass(frozen=True)
class TrainWork:
    """One update's work, for whoever computes its micro-batches (pickled to remote workers).

    `batch` is the whole `grpo.ScoredBatch`; `advantages` are its rows' advantages (N,);
    `norm` = kept samples x trained steps (each micro-batch's weight is len(rows) / norm).
    """

    weight_version: int
    batch: object
    advantages: torch.Tensor
    norm: int
    micro_batches: tuple[MicroBatch, ...]
    cfg: GRPOConfig
    schedule: Schedule

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


def compute_sum(loss, params: dict[str, torch.nn.Parameter], work: TrainWork,
                micro_batches: Sequence[MicroBatch | None], worker: str, *,
                should_stop: Callable[[], bool] = lambda: False) -> GradientSum:
    """Run `micro_batches` of `work` (in order) on `loss` (a `grpo.GRPOLoss` at the work's weight
    version) and return their sum; `should_stop()` is called after each entry, and a True ends
    the sum there (a notice: what finished is reported, the rest handed back). A None entry is a
    round this worker sits out (an SP group's ranks compute in rounds, `runtime.queue_training`):
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


class LocalMicroBatches:
    """Every micro-batch of the update on this rank, in plan order (the trainer's default)."""

    def run(self, trainer, batch, advantages: torch.Tensor, norm: int, plan: Sequence[MicroBatch]) -> dict[str, float]:
        totals = dict.fromkeys(LOSS_TOTALS, 0.0)
        for mb in plan:
            for name, value in trainer.loss.backward(batch, advantages, norm, mb).items():
                totals[name] += value
        return totals
