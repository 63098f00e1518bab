"""The live cluster's options: how a host uses Ray, and the runs of the runtime under a spot trace.

`RayClusterConfig` is what the Ray backend starts (`spotlight train --ray`, the tests, and the
trace tools through `TraceRunConfig.ray_cluster`). `TraceRunConfig` is the one set of options of
`spotlight replay`, `soak` and `cluster-soak` (`roll_spotlight.tools`): the trace and its market,
the spot nodes, the request load and its check. Each tool keeps its own defaults (a
`TraceRunConfig` of its own) and names every option by its flag in errors.
"""
from __future__ import annotations

from dataclasses import dataclass

from roll_spotlight.checks import require, require_choice, require_each, require_int, require_number
from roll_spotlight.spot.market import COUNT_MODELS, VICTIM_RULES
from roll_spotlight.spot.notices import PROVIDERS


@dataclass
class RayClusterConfig:
    """How the standalone host uses Ray. Counts are simulated GPUs (custom resources).

    `trainer_threads`: the trainer's torch threads; None: every CPU of the cluster config unless
    stale exploration runs beside training (then `threads_per_actor`). Without it the rollout
    workers idle while the trainer steps, so one thread would leave the other cores unused.
    `spot_pool_slots`: extra spot_gpu units for the elastic spot pool's workers. `sp_degree`:
    rollout workers per SP group (worker.sp_group; 1: one image per worker); `sp_min_degree`: the
    smallest group the spot workers' survivors re-form (None: any valid degree; `sp_degree`: a
    fixed degree, survivors wait for a newcomer); `sp_timeout_s`: how long an SP group's
    collectives wait for a silent member.
    """

    address: str | None = None
    num_cpus: int = 2
    ondemand_workers: int = 2
    spot_workers: int = 0
    threads_per_actor: int = 1
    trainer_threads: int | None = None
    poll_s: float = 0.01
    spot_pool_slots: int = 0
    sp_degree: int = 1
    sp_min_degree: int | None = None
    sp_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        require(self.ondemand_workers + self.spot_workers >= 1, "runtime.ondemand_workers + runtime.spot_workers",
                self.ondemand_workers + self.spot_workers, "must be >= 1")
        require_int("runtime.sp_degree", self.sp_degree)
        require(not (self.ondemand_workers % self.sp_degree or self.spot_workers % self.sp_degree),
                "runtime.sp_degree", self.sp_degree, f"must divide runtime.ondemand_workers={self.ondemand_workers} "
                f"and runtime.spot_workers={self.spot_workers}")
        require_each(self, "runtime", ("num_cpus", "threads_per_actor"), require_int)
        require_int("runtime.trainer_threads", self.trainer_threads, optional=True)
        require_int("runtime.sp_min_degree", self.sp_min_degree, optional=True)
        require_each(self, "runtime", ("poll_s", "sp_timeout_s"), require_number)

    def trainer_threads_for(self, exploration_mode: str) -> int:
        if self.trainer_threads is not None:
            return self.trainer_threads
        return self.threads_per_actor if exploration_mode == "stale" else max(self.threads_per_actor, self.num_cpus)


# the fields whose flag is not "--" + the name with dashes
FLAGS = {"duration_s": "--duration", "drain_timeout_s": "--drain-timeout"}


def flag(name: str) -> str:
    """The command-line option of a `TraceRunConfig` field, as errors name it."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


@dataclass(frozen=True)
class TraceRunConfig:
    """A run of the live runtime under a spot trace (`spotlight replay`, `soak`, `cluster-soak`).

    The market replays `trace` (None: the synthetic one) from `start_s` trace seconds (or "auto":
    the busiest window) `speedup` times faster than real time, on at most `nodes` spot nodes of
    `gpus_per_node` workers in elastic SP groups of `sp_degree`; count traces preempt them as
    `count_model` and `victims` say. A notice comes `notice_s` wall seconds ahead (None: the
    provider's notice / speedup, with a floor each tool sets), or never with `no_notice`;
    `commit_every` > 0 also checkpoints every k steps. A driver keeps `backlog` requests of
    `num_steps` denoising steps pending per serving worker for `duration_s` wall seconds, then
    waits up to `drain_timeout_s`; leases last `lease_s`; the driver polls every `poll_s`.
    `address` joins a running Ray cluster. Soak: `sample_s` is its memory sampling period.
    Cluster-soak: `provider` is the notice bridge's (None: the trace's), `keep_logs` keeps every
    raylet's log.
    """

    trace: str | None = None
    speedup: float = 30.0
    duration_s: float = 120.0
    start_s: float | str = 0.0
    zones: tuple[str, ...] | None = None
    victims: str = "newest_first"
    count_model: str = "instances"
    nodes: int = 4
    gpus_per_node: int = 1
    sp_degree: int = 1
    provider: str | None = None
    no_notice: bool = False
    notice_s: float | None = None
    commit_every: int = 0
    num_steps: int = 12
    noise_level: float = 0.7
    backlog: int = 2
    drain_timeout_s: float = 180.0
    lease_s: float = 60.0
    poll_s: float = 0.02
    seed: int = 0
    address: str | None = None
    sample_s: float = 0.5
    keep_logs: bool = False

    def __post_init__(self) -> None:
        for name in ("speedup", "duration_s", "drain_timeout_s", "lease_s", "poll_s", "noise_level", "sample_s"):
            require_number(flag(name), getattr(self, name))
        require_number("--notice-s", self.notice_s, optional=True)
        require(self.start_s == "auto" or (isinstance(self.start_s, (int, float)) and self.start_s >= 0),
                "--start-s", self.start_s, "must be trace seconds >= 0 or 'auto'")
        for name in ("nodes", "gpus_per_node", "sp_degree", "num_steps", "backlog"):
            require_int(flag(name), getattr(self, name))
        require_int("--commit-every", self.commit_every, ">= 0", why="(0: only on notice)")
        require_choice("--victims", self.victims, VICTIM_RULES)
        require_choice("--count-model", self.count_model, COUNT_MODELS)
        require_choice("--provider", self.provider, PROVIDERS, optional=True)
        require(self.zones is None or len(self.zones) > 0, "--zones", self.zones, "must name a zone (omit: all)")

    def ray_cluster(self) -> RayClusterConfig:
        """The Ray cluster a tool starts (or joins at `address`): one on-demand worker and
        `spot_gpu` units for twice the fleet's GPUs."""
        return RayClusterConfig(address=self.address, num_cpus=2, ondemand_workers=1,
                                spot_workers=2 * self.nodes * self.gpus_per_node)
