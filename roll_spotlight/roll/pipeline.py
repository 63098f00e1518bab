"""`SpotlightPipeline`: a ROLL ``BasePipeline`` running Spotlight's Flow-GRPO iterations.

This module imports ROLL; reach it through ``roll_spotlight.roll.SpotlightPipeline``.

Resources. The on-demand roles (``actor_train``, ``actor_infer``, ``reward``: ROLL's role names)
are ROLL ``Cluster`` s placed by ROLL's ``ResourceManager``; the spot workers live in the runtime's elastic pool on Ray, beside them, because
ROLL clusters are created once and never grow, shrink or replace a worker. With ``dispatch.mode:
pull`` both pull from one request queue; the trainer publishes each weight version to a weight
store that the actor_infer ranks and the spot workers fetch from (`roll_spotlight.roll.cluster_backend`). The two never compete for a
GPU: spot nodes advertise their GPUs only as the custom resource ``spot.resource`` (``spot_gpu``,
see deploy/kuberay), so ROLL, which counts Ray's ``GPU`` resource, sees on-demand GPUs only.

`plan_resources` is the overridable resource-manager factory input. ROLL's ``BaseConfig``
overwrites ``num_gpus_per_node`` with the driver's device count, which on a CPU driver (a laptop,
CI, a KubeRay head without GPUs) is wrong: a CPU-only recipe gets ``ResourceManager(0, 1)``, and a
GPU recipe counts GPUs on the Ray nodes instead of on the driver.
"""
from __future__ import annotations

import logging
from pathlib import Path

import ray
from roll.distributed.executor.cluster import Cluster
from roll.pipeline.base_pipeline import BasePipeline

from roll_spotlight import plugins
from roll_spotlight.config.strict import ConfigError
from roll_spotlight.roll.spotlight_config import SpotlightConfig
from roll_spotlight.roll.environment import check_environment
from roll_spotlight.config.run import SPOT_RESOURCE

logger = logging.getLogger(__name__)

STATIC_ROLES = ("actor_train", "actor_infer", "reward")


class SpotlightPipeline(BasePipeline):
    """ROLL pipeline: static on-demand clusters + the elastic spot pool, one iteration loop."""

    def __init__(self, pipeline_config) -> None:
        from roll_spotlight.weights import WeightStore

        if not isinstance(pipeline_config, SpotlightConfig):
            raise ConfigError(f"SpotlightPipeline needs a SpotlightConfig, got {type(pipeline_config).__name__}: "
                              "start it with python -m roll_spotlight.launch --config_path DIR --config_name NAME "
                              "(ROLL's own start scripts parse recipes into their own config classes)")
        cfg = pipeline_config
        check_environment()
        cfg.check_startup()  # the launcher did too, before ROLL's init(); here for pipelines started otherwise
        plugins.resolve("schedulers", cfg.dispatch.scheduler)  # fails now, naming the known schedulers
        if summary := cfg.elastic.rollout_summary():
            logger.info(summary)
        if fallback := cfg.spot_training_summary():
            logger.warning(fallback)
        self.emulation = self.emulate_gpus(cfg) if cfg.emulate else None
        cfg.num_gpus_per_node, cfg.num_nodes = self.plan_resources(cfg)
        super().__init__(cfg)
        self.run_config = cfg.to_run_config()
        self.run_dir = Path(cfg.output_dir) / cfg.exp_name
        self.clusters = {role: self.make_cluster(role) for role in STATIC_ROLES}
        self.actor_train, self.actor_infer, self.reward = (self.clusters[r] for r in STATIC_ROLES)
        self.base_path = self.prepare_base_policy()
        self.store = WeightStore.create(keep=2)  # version t for exploration while t+1 trains
        for role, cluster in self.clusters.items():
            cluster.initialize(pipeline_config=cfg, source=self.worker_source(role), store=self.store, blocking=True)
        self.sp_rendezvous = self.form_sp_groups()
        self.inbox = None  # queue training's gradient inbox (make_dispatch)
        self.dispatch = self.make_dispatch()
        if self.emulation is not None:
            from roll_spotlight.startup import write_emulation

            write_emulation(self.run_config, cfg.placement(), self.emulation, self.run_dir, self.ondemand_gpus)

    def emulate_gpus(self, cfg: SpotlightConfig):
        """Emulated GPUs (``emulate``, the launcher's ``--emulate GPU --time-scale S``): every role
        keeps its world size as CPU-only workers whose compute waits its modelled duration, and
        the spot pool follows the raylets that replay the recipe's trace (`startup.emulated_spot`;
        the launcher starts them). Returns the `worker.emulated.Emulation` the workers run. It
        edits the pipeline's config in place, as `plan_resources` does (ROLL's pipelines own theirs),
        after `check_startup` checked the recipe as written."""
        from roll_spotlight.startup import emulated_spot, emulation_for

        for role in STATIC_ROLES:
            getattr(cfg, role).device_mapping = None
        if cfg.spot.enabled:
            cfg.spot = emulated_spot(cfg.spot)
        return emulation_for(cfg.to_run_config(), cfg.emulate["gpu"], float(cfg.emulate.get("time_scale", 1.0)))

    @property
    def ondemand_gpus(self) -> int:
        """The on-demand GPUs billed: the actor_train and actor_infer ranks'."""
        return sum(getattr(self.pipeline_config, role).world_size for role in ("actor_train", "actor_infer"))

    def worker_source(self, role: str = "actor_infer"):
        """What a role's workers start from (`worker.policy_source`): the policy, or emulated GPUs
        (the trainer's a GPU of its own, as ROLL places actor_train)."""
        from roll_spotlight.worker.policy_source import policy_setup, policy_source

        if self.emulation is not None:
            return self.emulation.as_role("trainer") if role == "actor_train" else self.emulation
        return policy_source(self.run_config.model, self.base_path, policy_setup(self.run_config))

    def form_sp_groups(self):
        """With ``elastic.sp_degree`` > 1, the actor_infer ranks join SP groups of consecutive ranks
        (`worker.sp_group`); returns the rendezvous host they met at (kept for the run), or None."""
        from roll_spotlight.elastic.rendezvous import group_memberships
        from roll_spotlight.worker.sp_group import open_rendezvous

        sp = self.pipeline_config.elastic.sp_degree
        if sp == 1:
            return None
        host = open_rendezvous(all_local=sum(1 for node in ray.nodes() if node["Alive"]) == 1)
        timeout = self.pipeline_config.elastic.group_timeout_s
        memberships = [m for first in range(0, self.actor_infer.world_size, sp)
                       for m in group_memberships(host.address, f"actor_infer-{first}", sp, timeout)]
        self.actor_infer.join_sp_group(memberships, blocking=True)
        return host

    def plan_resources(self, cfg: SpotlightConfig) -> tuple[int, int]:
        """(num_gpus_per_node, num_nodes) for ROLL's ResourceManager. Override for custom clusters."""
        devices = [d for role in STATIC_ROLES for d in (getattr(cfg, role).device_mapping or [])]
        if not devices:
            return 0, 1
        per_node = max(int(node["Resources"].get("GPU", 0)) for node in ray.nodes() if node["Alive"])
        if per_node < 1:
            raise ValueError(f"device_mapping uses GPUs {sorted(set(devices))} but no Ray node has a GPU")
        return per_node, (max(devices) + per_node) // per_node

    def make_cluster(self, role: str) -> Cluster:
        worker_config = getattr(self.pipeline_config, role)
        worker_cls = plugins.resolve("workers", worker_config.worker_cls)
        return Cluster(name=role, worker_cls=worker_cls, resource_manager=self.resource_manager,
                       worker_config=worker_config)

    def make_dispatch(self):
        """``dispatch.mode``: the actor_infer ranks' static shares, or the shared queue (+ spot pool,
        + queue training when spot workers train: `start_queue_training`)."""
        from roll_spotlight.roll.cluster_backend import PullDispatch, StaticDispatch

        cfg = self.pipeline_config
        if cfg.dispatch.mode == "static":
            return StaticDispatch(self.actor_infer, cfg.elastic.sp_degree)
        from roll_spotlight.dispatch.queue_actor import create_queue_actor

        queue = create_queue_actor(cfg.dispatch.queue_config())
        self.inbox = self.start_queue_training(queue) if self.run_config.queue_trains() else None
        early = cfg.spot.enabled and self.emulation is None  # emulated: `start_spot`, once the fleet is up
        return PullDispatch(self.actor_infer, queue, self.make_spot_pool(queue) if early else None)

    def start_spot(self) -> None:
        """Emulated GPUs: start the spot pool now. The launcher calls this once the emulated spot
        fleet joined (after ROLL placed the on-demand workers on the head), `run` otherwise."""
        if self.emulation is not None and self.pipeline_config.spot.enabled and self.dispatch.spot is None:
            self.dispatch.spot = self.make_spot_pool(self.dispatch.queue)

    def start_queue_training(self, queue):
        """`spot.training_phase` train/auto (`runtime.queue_training`): each update's micro-batches
        become TRAIN requests in `queue`, pulled by the actor_train rank (which adds the sums and
        steps), the actor_infer ranks (idle on-demand GPUs while it trains) and the spot workers;
        the sums go to a gradient inbox. Returns the inbox."""
        from roll_spotlight.runtime.queue_training import create_inbox

        inbox = create_inbox(queue)
        self.actor_train.use_queue_training(queue, inbox, blocking=True)
        self.actor_infer.use_queue_training(inbox, blocking=True)
        return inbox

    def make_spot_pool(self, queue):
        """The elastic pool of spot workers pulling from `queue` (spot_pool.training_pool), started now.

        Override to supply another market, clock or worker arguments (tests do; pass the
        pipeline's ``inbox``). The pool's workers
        are the runtime's pull workers: they load the tiny base from its checkpoint file, or the real
        model from ``model.path`` on their own node (``worker.policy_source.load_policy``), take each weight
        version from the weight store, and ask Ray for one unit of ``spot_gpu`` each (plus one GPU
        when ``model.device`` is CUDA); with queue training they compute micro-batches too (``inbox``).
        """
        from roll_spotlight.spot_pool.training_pool import spot_elastic, start_training_pool

        cfg = self.pipeline_config
        self._check_spot(cfg)
        source, shape, bill_scale = self.worker_source(), None, 1.0
        if self.emulation is not None:  # spot workers on spot nodes; the run's GPU-seconds are modelled ones
            source = self.emulation.as_role("spot", cfg.spot.gpus_per_node)
            shape, bill_scale = self.emulation.sp_shape(), self.emulation.time_scale
        elastic = spot_elastic(self.run_config.model, cfg.elastic.sp_degree, cfg.elastic.group_timeout_s, source,
                               min_degree=cfg.elastic.min_sp_degree, shape=shape)
        return start_training_pool(cfg.spot, source, queue, self.store, ondemand_gpus=self.ondemand_gpus,
                                   elastic=elastic, inbox=self.inbox if self.run_config.spot_trains() else None,
                                   bill_scale=bill_scale, max_batch=self.run_config.sampling.max_batch)

    def _check_spot(self, cfg: SpotlightConfig) -> None:
        if cfg.spot.source == "market" and ray.cluster_resources().get(SPOT_RESOURCE, 0.0) < 1:
            raise ValueError(f"spot.enabled needs the Ray resource {SPOT_RESOURCE!r}, which this cluster lacks "
                             "(spot nodes declare it; see deploy/kuberay)")

    def prepare_base_policy(self) -> str | None:
        """Pretrain (or load from cache) the tiny base once, here, so workers only load it."""
        if self.run_config.model.preset != "tiny" or self.emulation is not None:
            return None
        from roll_spotlight.training.pretrain import load_or_pretrain

        _, meta = load_or_pretrain(self.run_config, progress=False)
        return meta["path"]

    def run(self):
        """The shared iteration loop (runtime Coordinator) on this pipeline's clusters; its RunResult."""
        from roll_spotlight.roll.cluster_backend import drive

        self.start_spot()
        return drive(self)
