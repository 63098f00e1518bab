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


def get_baseline(name: str) -> BaselineSpec:
    """Resolve a baseline by name; the error lists the known names."""
    try:
        return BASELINES[name]
    except KeyError:
        raise ValueError(f"unknown baseline {name!r}; known baselines: {sorted(BASELINES)}") from None
