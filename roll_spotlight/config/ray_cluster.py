"""How a host uses Ray: `RayClusterConfig`, what the Ray backend starts (`spotlight train --ray`,
the tests, and the trace harnesses of benchmarks/)."""
from __future__ import annotations

from dataclasses import dataclass, field

from roll_spotlight.checks import require, require_each, require_int, require_number
from roll_spotlight.config.elastic import ElasticConfig

SP_TIMEOUT_S = 60.0  # an SP member's silence that fails its group here, where models load in seconds


@dataclass
class RayClusterConfig:
    """How the standalone host uses Ray. Counts are simulated GPUs (custom resources).

    `trainer_threads`: the trainer's torch threads; None: every CPU of the cluster config unless
    stale exploration runs beside training (then `threads_per_actor`). Without it the rollout
    workers idle while the trainer steps, so one thread would leave the other cores unused.
    `spot_pool_slots`: extra spot_gpu units for the elastic spot pool's workers. `elastic`: the
    rollout SP groups (one image per worker at ``sp_degree`` 1), with `SP_TIMEOUT_S`.
    """

    address: str | None = None
    num_cpus: int = 2
    ondemand_workers: int = 2
    spot_workers: int = 0
    threads_per_actor: int = 1
    trainer_threads: int | None = None
    poll_s: float = 0.01
    spot_pool_slots: int = 0
    elastic: ElasticConfig = field(default_factory=lambda: ElasticConfig(group_timeout_s=SP_TIMEOUT_S))

    def __post_init__(self) -> None:
        require(self.ondemand_workers + self.spot_workers >= 1, "runtime.ondemand_workers + runtime.spot_workers",
                self.ondemand_workers + self.spot_workers, "must be >= 1")
        degree = self.elastic.sp_degree
        require(not (self.ondemand_workers % degree or self.spot_workers % degree),
                "elastic.sp_degree", degree, f"must divide runtime.ondemand_workers={self.ondemand_workers} "
                f"and runtime.spot_workers={self.spot_workers}")
        require_each(self, "runtime", ("num_cpus", "threads_per_actor"), require_int)
        require_int("runtime.trainer_threads", self.trainer_threads, optional=True)
        require_number("runtime.poll_s", self.poll_s)

    def trainer_threads_for(self, exploration_mode: str) -> int:
        if self.trainer_threads is not None:
            return self.trainer_threads
        return self.threads_per_actor if exploration_mode == "stale" else max(self.threads_per_actor, self.num_cpus)
