"""The systems the simulator compares, declared as data.

Each baseline is a :class:`BaselineSpec`: which GPUs roll out, where exploration runs, where the
update is trained, what a preemption costs. The simulated system reads the spec; there is no
per-baseline code path.

=================  ==========  ===================  ================  ===================
baseline           spot GPUs   exploration          on a notice       SP group recovery
=================  ==========  ===================  ================  ===================
vanilla            none        none                 -                 -
explore_critical   none        on the critical      -                 -
                               path: roll out
                               group + extra seeds
                               per prompt, train
                               on the max-variance
                               group
naive_spot         roll out    none                 ignored: work     cold: new processes,
                                                    restarts from     NCCL init, weights
                                                    scratch           from storage; SP degree
                                                                      fixed, so survivors of
                                                                      a broken group wait for
                                                                      a replacement GPU
spotlight          roll out    spot GPUs explore    commit in-flight  warm: persistent
                   + explore   the next prompts     state at a step   workers, weights
                               while the trainer    boundary          copied from a peer;
                                                                      elastic SP: survivors
                                                                      re-form groups of any
                                                                      valid degree
                               trains (weights one
                               iteration stale)
spotlight_train    roll out    none: spot GPUs      commit in-flight  warm, as spotlight
                   + train     train micro-batches  state; training:
                               instead               finish the micro-
                                                    batch in hand,
                                                    report the sum,
                                                    hand back the rest
=================  ==========  ===================  ================  ===================

Beside them, ``MANAGED_JOBS`` (``sim.managed_job``): vanilla's whole job on spot GPUs only, the way
SkyPilot's managed jobs run it: checkpoints every iteration, a preemption kills the job, which waits
for capacity, relaunches cold and redoes the work since its last checkpoint. It is not an iteration
of this simulator's cluster (no on-demand trainer), so it has its own simulation.

Training (``Training``): ``ONDEMAND`` is Flow-GRPO's FSDP update on the on-demand GPUs only
(``CostModel.train_s``); ``QUEUE`` splits the update into TRAIN micro-batch requests that every
on-demand and spot worker pulls from the same queue, each reporting one gradient sum per lease
batch. ``spotlight_train`` computes vanilla's update (same samples, same gradient up to
float summation order), so it takes vanilla's measured iterations to target.

All use the same pull-based ``RequestQueue`` (a static split would only make naive_spot look
worse for a reason unrelated to preemptions).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Exploration(enum.Enum):
    NONE = "none"
    CRITICAL = "critical"   # roll out extra candidate seeds with the current weights, train on a subset
    OFF_PATH = "off_path"   # explore on spot GPUs while the trainer trains (stale weights)


class Recovery(enum.Enum):
    COLD = "cold"
    WARM = "warm"


class Training(enum.Enum):
    ONDEMAND = "ondemand"   # FSDP on the on-demand GPUs (CostModel.train_s)
    QUEUE = "queue"         # micro-batches through the queue, pulled by on-demand and spot workers


@dataclass(frozen=True)
class BaselineSpec:
    name: str
    uses_spot: bool
    spot_rollout: bool
    exploration: Exploration
    commit_on_notice: bool
    recovery: Recovery
    training: Training = Training.ONDEMAND

    def __post_init__(self) -> None:
        if self.spot_rollout and not self.uses_spot:
            raise ValueError(f"baseline {self.name!r}: spot_rollout needs uses_spot")
        if self.exploration is Exploration.OFF_PATH and not self.uses_spot:
            raise ValueError(f"baseline {self.name!r}: off-path exploration needs spot GPUs")
        if self.training is Training.QUEUE and self.exploration is Exploration.OFF_PATH:
            raise ValueError(f"baseline {self.name!r}: spot GPUs either train or explore during the training "
                             "phase; the simulator does not split them")


BASELINES: dict[str, BaselineSpec] = {
    "vanilla": BaselineSpec("vanilla", False, False, Exploration.NONE, False, Recovery.COLD),
    "explore_critical": BaselineSpec("explore_critical", False, False, Exploration.CRITICAL, False,
                                     Recovery.COLD),
    "naive_spot": BaselineSpec("naive_spot", True, True, Exploration.NONE, False, Recovery.COLD),
    "spotlight": BaselineSpec("spotlight", True, True, Exploration.OFF_PATH, True, Recovery.WARM),
    "spotlight_train": BaselineSpec("spotlight_train", True, True, Exploration.NONE, True, Recovery.WARM,
                                    Training.QUEUE),
}


@dataclass(frozen=True)
class ManagedJobSpec:
    """A managed spot job: ``checkpoint_every`` iterations between checkpoints (SkyPilot leaves the
    period to the job; every iteration is this baseline's best case, the recipes save every 30)."""

    name: str
    checkpoint_every: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.checkpoint_every, bool) or not isinstance(self.checkpoint_every, int) \
                or self.checkpoint_every < 1:
            raise ValueError(f"ManagedJobSpec.checkpoint_every must be an integer >= 1, got {self.checkpoint_every!r}")


MANAGED_JOBS: dict[str, ManagedJobSpec] = {"managed_spot": ManagedJobSpec("managed_spot", checkpoint_every=1)}
SYSTEMS = (*BASELINES, *MANAGED_JOBS)   # every name a simulation accepts


def get_baseline(name: str) -> BaselineSpec:
    """Resolve a baseline by name; the error lists the known names."""
    try:
        return BASELINES[name]
    except KeyError:
        raise ValueError(f"unknown baseline {name!r}; known baselines: {sorted(SYSTEMS)}") from None
