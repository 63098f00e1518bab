"""The iteration loop behind ``SpotlightPipeline.run()``: the runtime's Coordinator on ROLL clusters.

There is one iteration loop, ``roll_spotlight.runtime.coordinator.Coordinator``, shared by every
host; it drives exploration (stale or fresh, with the rank-correlation fallback), checkpoints and
validation. This module supplies its backend for ROLL, `RollClusterBackend`:

    Coordinator --rollouts/explore--> RolloutDispatch --+-- static: each actor_infer rank runs its share
                                                        +-- pull:   QueueActor <-- actor_infer ranks drain
                                                                               <-- spot workers pull
                                                                                   (elastic pool, polled)
                --score--> reward cluster (each rank its share)
                --start_train/training/finish_train--> actor_train cluster --publish v--> WeightStore
                                                            actor_infer ranks, spot workers fetch v
                (trainer rank r trains shard r of the batch; gradients all-reduced; rank 0 publishes)

The trainer's update runs without blocking the driver, so stale exploration (the prompts of t+1
explored with the weights of t) proceeds while it trains, through the same dispatch.
With queue training (``spot.training_phase``, `runtime.queue_training`) the trainer rank submits
the update's micro-batches to the same queue; while the driver waits for the update it ticks the
dispatch, which keeps the actor_infer ranks draining (they compute micro-batches too), and the
update's report says who trained what (`runtime.update_report.update_report`, as the Ray backend's).
`drive` is the single switch point between the pipeline and the loop.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
import ray

from roll_spotlight.runtime.coordinator import Coordinator, rollouts_then_scores
from roll_spotlight.runtime.update_report import UpdateReport, update_report
from roll_spotlight.timeline import Timeline

logger = logging.getLogger(__name__)
POLL_S = 0.02  # how often the driver ticks while it waits for an update


def drive(pipeline):
    """Run the pipeline's iterations with the shared Coordinator; returns its RunResult."""
    backend = RollClusterBackend(pipeline)
    try:
        return Coordinator(pipeline.run_config, backend, pipeline.run_dir, progress=False).train()
    finally:
        backend.close()


def split_even(items: Sequence, parts: int) -> list[list]:
    """`items` in `parts` contiguous chunks whose sizes differ by at most one (some may be empty)."""
    assert parts >= 1, parts
    size, extra = divmod(len(items), parts)
    bounds = np.cumsum([0] + [size + (i < extra) for i in range(parts)])
    return [list(items[bounds[i]:bounds[i + 1]]) for i in range(parts)]


def concat(chunks: list[list]) -> list:
    return [item for chunk in chunks for item in chunk]


class RolloutDispatch(Protocol):
    """How rollout and explore requests reach workers (``dispatch.mode``)."""

    def rollouts(self, specs: list) -> list: ...  # RolloutOutput in the order of specs
    def tick(self) -> None: ...  # called while the driver waits (spot pool events)
    def place_spot(self, share: float) -> int: ...  # queue training: spot workers exploring first
    def is_spot(self, worker: str) -> bool: ...  # queue training: a name in the queue, a spot worker's?
    def metrics(self) -> dict: ...
    def close(self) -> None: ...


class StaticDispatch:
    """Each rollout rank runs a fixed contiguous share of the batch (ROLL's way; the vanilla baseline).
    With ``sp_degree`` > 1 the shares are per SP group (ranks ``g*sp .. g*sp+sp-1``): every rank
    of a group gets its group's share, and the group's first rank returns the outputs."""

    def __init__(self, rollout, sp_degree: int = 1) -> None:
        self.rollout, self.sp_degree = rollout, sp_degree

    def rollouts(self, specs: list) -> list:
        world, sp = self.rollout.world_size, self.sp_degree
        shares = split_even(specs, world // sp)
        outputs = self.rollout.rollouts([shares[rank // sp] for rank in range(world)])
        return concat(outputs[::sp])

    def tick(self) -> None:
        pass

    def place_spot(self, share: float) -> int:
        return 0

    def is_spot(self, worker: str) -> bool:
        return False

    def metrics(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class PullDispatch:
    """Requests go to the run's queue actor; on-demand rollout ranks drain it, spot workers pull.

    A drain returns when the queue has nothing pending, but requests leased to spot workers may
    come back (a preemption commits or requeues them), and with queue training the trainer rank
    submits an update's micro-batches while the driver waits for it: so every `tick` (the driver
    ticks while it collects requests and while an update trains) restarts the ranks' drains once
    they all returned and requests are pending. Results are collected in request-id order, so the
    outputs do not depend on who ran them.
    """

    def __init__(self, rollout, queue, spot=None, poll_s: float = 0.02) -> None:
        self.rollout, self.queue, self.spot, self.poll_s = rollout, queue, spot, poll_s
        self._drains: list = []  # the rollout ranks' drain() calls in flight

    def rollouts(self, specs: list) -> list:
        from roll_spotlight.runtime.collect import collect

        completions = collect(self.queue, specs, tick=self.tick, poll_s=self.poll_s,
                              on_completion=self.spot.record if self.spot is not None else lambda completion: None)
        return [c.output for c in completions]

    def _keep_draining(self) -> None:
        """Restart the rollout ranks' drains once they all returned and requests are pending again."""
        drains = self._drains
        if drains and len(ray.wait(drains, num_returns=len(drains), timeout=0)[0]) < len(drains):
            return
        self._drains = []
        ray.get(drains)  # surfaces a rank's error
        failed = ray.get(self.queue.failed.remote())
        if failed:
            raise RuntimeError(f"{len(failed)} request(s) failed for good (dispatch.max_attempts): {failed[0]}")
        pending, _ = ray.get(self.queue.counts.remote())
        if pending:
            self._drains = self.rollout.drain(self.queue, blocking=False)

    def tick(self) -> None:
        if self.spot is not None:
            self.spot.poll()
        self._keep_draining()

    def is_spot(self, worker: str) -> bool:
        return self.spot is not None and self.spot.is_spot(worker)

    def place_spot(self, share: float) -> int:
        return 0 if self.spot is None else self.spot.place(self.queue, share)

    def metrics(self) -> dict:
        if self.spot is None:
            return {}
        self.spot.poll()
        return self.spot.metrics(ray.get(self.queue.stats.remote()))

    def close(self) -> None:
        ray.get(self._drains)  # they end once nothing is pending
        if self.spot is not None:
            cost = self.spot.close()
            logger.info("spot pool closed: %s; cost %.4f USD vs %.4f USD all on demand",
                        self.spot.pool.stats, cost.total_usd, cost.ondemand_usd)


class RollClusterBackend:
    """The Coordinator's Backend over the pipeline's ROLL clusters and its rollout dispatch."""

    def __init__(self, pipeline) -> None:
        self.trainer, self.reward = pipeline.actor_train, pipeline.reward
        self.dispatch: RolloutDispatch = pipeline.dispatch
        self.tracker = pipeline.tracker
        self.weight_version = 0
        self._timeline = Timeline("roll", time.monotonic)

    def rollouts(self, specs: list, phase: str = "rollout") -> list:
        with self._timeline.phase(phase):
            return self.dispatch.rollouts(list(specs))

    rollouts_scored = rollouts_then_scores  # no overlap on ROLL's clusters

    def place_spot(self, share: float) -> int:
        return self.dispatch.place_spot(share)

    def explore(self, specs: list) -> list:
        """Explore requests carry the stale version; the weight store still holds it."""
        return self.rollouts(specs, phase="explore")

    def score(self, images: np.ndarray, prompts: list[str]):
        from roll_spotlight.rewards import RewardOutput

        world = self.reward.world_size
        with self._timeline.phase("reward"):
            pairs = concat(self.reward.score(split_even(list(images), world), split_even(list(prompts), world)))
        rewards, fallback = (np.asarray(col, dtype=np.float64) for col in zip(*pairs))
        return RewardOutput(rewards, {"reward_fallback": fallback})

    def start_train(self, outputs: list, prompts: list[str], group_ids: np.ndarray, rewards: np.ndarray,
                    baselines: np.ndarray | None = None):
        """Start one update on the trainer cluster without waiting: (refs, start time).

        Each rank gets its contiguous shard of outputs and prompts (rank order) and the rewards, group
        ids and advantage baselines (`exploration.baseline: pool`; None: each group's own statistics)
        of the whole batch, so advantages and the loss normaliser are the global ones.
        """
        world = self.trainer.world_size
        refs = self.trainer.train(split_even(outputs, world), split_even(list(prompts), world),
                                  [group_ids] * world, [rewards] * world, [baselines] * world, blocking=False)
        return refs, time.monotonic()

    def training(self, handle) -> bool:
        refs, _ = handle
        self.dispatch.tick()
        return len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) < len(refs)

    def finish_train(self, handle) -> UpdateReport:
        """Wait for the update, ticking the dispatch (with queue training the actor_infer ranks'
        drains compute micro-batches meanwhile), then its report with who trained what."""
        refs, t0 = handle
        while self.training(handle):
            time.sleep(POLL_S)
        result, self.weight_version = ray.get(refs)[0]  # every rank reports the same (global) metrics
        self._timeline.add("train", t0)
        report = update_report(result, self.dispatch.is_spot, self.dispatch.metrics())
        self.tracker.log(values={k: v for k, v in report.metrics.items() if isinstance(v, (int, float))},
                         step=self.weight_version)
        return report

    def evaluate(self):
        with self._timeline.phase("validate"):
            return self.trainer.evaluate()

    def save_checkpoint(self, path: Path) -> None:
        self.trainer.save_checkpoint(str(path))

    def load_checkpoint(self, path: Path) -> None:
        self.weight_version = self.trainer.load_checkpoint(str(path))

    def timeline(self) -> list[dict]:
        return list(self._timeline.events)

    def close(self) -> None:
        self.dispatch.close()
