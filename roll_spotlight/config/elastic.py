"""`ElasticConfig`: the rollout SP groups of either host (a ROLL recipe's ``elastic`` section; the
standalone host's ``--sp-degree``, carried in `config.ray_cluster.RayClusterConfig`)."""
from __future__ import annotations

from dataclasses import dataclass

from roll_spotlight.checks import require, require_each, require_int, require_number


@dataclass
class ElasticConfig:
    """Elastic Ulysses sequence parallelism for rollouts (docs/design.md section 4).

    ``sp_degree`` is the rollout SP degree (1: no SP, e.g. at 512x512; 4 at 1280x1280 on
    Qwen-Image): consecutive rollout ranks form SP rollout groups of that many
    (`roll_spotlight.worker.sp_group`), so the rollout world size must be a multiple of it.
    The spot workers (``spot.gpus_per_node`` per node) are elastic SP members: `elastic.groups.
    ElasticGroups` forms groups of up to this degree across nodes and re-forms them from the
    survivors after a preemption; ``min_sp_degree`` is the smallest group that can run (the
    degree the model needs to fit in memory): survivors below it wait for a newcomer instead of
    re-forming smaller. ``group_timeout_s`` is how long a rollout SP group's collectives wait for
    a member (long enough for a member to load a new weight version while the others wait); a
    member silent for longer fails its group.
    """

    sp_degree: int = 1
    min_sp_degree: int = 1
    group_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        require_each(self, "elastic", ("sp_degree", "min_sp_degree"), require_int)
        require(self.min_sp_degree <= self.sp_degree and self.sp_degree % self.min_sp_degree == 0,
                "elastic.min_sp_degree", self.min_sp_degree, f"must divide elastic.sp_degree={self.sp_degree}")
        require_number("elastic.group_timeout_s", self.group_timeout_s)

    def rollout_summary(self) -> str | None:
        """How rollouts run under this section (None at SP 1), logged at start-up."""
        if self.sp_degree == 1:
            return None
        return (f"elastic.sp_degree={self.sp_degree}: rollouts run in SP groups of {self.sp_degree} "
                f"consecutive rollout ranks; spot workers (spot.gpus_per_node per node) form elastic SP groups "
                f"of up to {self.sp_degree} that re-form after a preemption")
