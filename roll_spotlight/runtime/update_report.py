"""What a backend reports of one update: typed, for the decisions the loop takes from it.

`Backend.finish_train` returns an `UpdateReport`: the metrics to log, and (queue training) the
`TrainingSplit` of who computed the update's micro-batches, which `spot.training_phase: auto`
weighs against exploration (`exploration.spot_share`). Metrics are for logging only: no decision
reads them back.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from roll_spotlight.training.micro_batches import Contributions

TRAINER = "trainer"  # the trainer's name in the queue (queue training)


@dataclass(frozen=True)
class TrainingSplit:
    """An update's micro-batches by kind of worker, and the training time the spot workers saved,
    measured: their micro-batches at the on-demand participants' measured rate."""

    micro_batches_spot: int
    micro_batches_ondemand: int
    micro_batches_trainer: int
    workers: int
    spot_workers: int
    spot_saved_s: float
    refused: int
    wall_s: float

    def metrics(self) -> dict[str, float]:
        return {"train/micro_batches": float(self.micro_batches_spot + self.micro_batches_ondemand),
                "train/micro_batches_spot": float(self.micro_batches_spot),
                "train/micro_batches_ondemand": float(self.micro_batches_ondemand),
                "train/micro_batches_trainer": float(self.micro_batches_trainer),
                "train/workers": float(self.workers), "train/spot_workers": float(self.spot_workers),
                "train/spot_saved_s": self.spot_saved_s, "train/reports_refused": float(self.refused),
                "train/queue_phase_s": self.wall_s}


def split_training(contributions: Contributions, is_spot: Callable[[str], bool]) -> TrainingSplit:
    """Split ``contributions`` by kind of worker (``is_spot``: the spot pool's names)."""
    by_worker = contributions.by_worker
    spot = {w for w in by_worker if is_spot(w)}
    mb_spot = sum(n for w, (n, _) in by_worker.items() if w in spot)
    mb_od = sum(n for w, (n, _) in by_worker.items() if w not in spot)
    od_rate = sum(n / s for w, (n, s) in by_worker.items() if w not in spot and s > 0)
    return TrainingSplit(mb_spot, mb_od, by_worker.get(TRAINER, (0, 0.0))[0], len(by_worker), len(spot),
                         mb_spot / od_rate if od_rate > 0 else 0.0, contributions.refused, contributions.wall_s)


@dataclass(frozen=True)
class UpdateReport:
    """One update as a backend reports it: ``metrics`` to log, ``split`` with queue training."""

    metrics: dict = field(default_factory=dict)
    split: TrainingSplit | None = None


def update_report(result, is_spot: Callable[[str], bool], extra: dict | None = None) -> UpdateReport:
    """The report of an update's `training.grpo.UpdateResult`: its metrics, the split of who
    computed its micro-batches (queue training) and the host's ``extra`` metrics."""
    split = None if result.contributions is None else split_training(result.contributions, is_spot)
    metrics = result.metrics | (split.metrics() if split is not None else {}) | (extra or {})
    return UpdateReport(metrics, split)
