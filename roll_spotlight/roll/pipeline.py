"""`SpotlightPipeline`: a ROLL ``BasePipeline`` running Spotlight's Flow-GRPO iterations.

This module imports ROLL; reach it through ``roll_spotlight.roll.SpotlightPipeline``.

Resources. The on-demand roles (trainer, rollout, reward) are ROLL ``Cluster`` s placed by ROLL's
``ResourceManager``; the spot explorers live in our elastic pool on Ray, beside them, because ROLL
clusters are created once and never grow, shrink or replace a worker. The two never compete for a
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
from roll_spotlight.roll.config import SpotlightConfig, coerce
from roll_spotlight.roll.environment import check_environment

logger = logging.getLogger(__name__)

STATIC_ROLES = ("trainer", "rollout", "reward")


class SpotlightPipeline(BasePipeline):
    """ROLL pipeline: static on-demand clusters + the elastic spot pool, one iteration loop."""

    def __init__(self, pipeline_config) -> None:
        cfg: SpotlightConfig = coerce(pipeline_config)
        check_environment()
        self._check_world_sizes(cfg)
        cfg.num_gpus_per_node, cfg.num_nodes = self.plan_resources(cfg)
        super().__init__(cfg)
        self.run_config = cfg.to_run_config()
        self.run_dir = Path(cfg.output_dir) / cfg.exp_name
        self.clusters = {role: self.make_cluster(role) for role in STATIC_ROLES}
        self.trainer, self.rollout, self.reward = (self.clusters[r] for r in STATIC_ROLES)
        self.spot_pool = self.make_spot_pool()
        base_path = self.prepare_base_policy()
        for cluster in self.clusters.values():
            cluster.initialize(pipeline_config=cfg, base_path=base_path, blocking=True)

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

    def make_spot_pool(self):
        """The elastic pool of spot explorers; None until the runtime's pool is wired in (see loop.drive)."""
        cfg = self.pipeline_config
        if cfg.spot.enabled or cfg.exploration.enabled or cfg.dispatch.mode == "pull":
            logger.warning("spot.enabled=%s exploration.enabled=%s dispatch.mode=%s: the ROLL host does not run "
                           "the spot pool, exploration or the pull queue yet; it trains on the static clusters",
                           cfg.spot.enabled, cfg.exploration.enabled, cfg.dispatch.mode)
        return None

    def prepare_base_policy(self) -> str | None:
        """Pretrain (or load from cache) the tiny base once, here, so workers only load it."""
        if self.run_config.model.preset != "tiny":
            return None
        from roll_spotlight.training.pretrain import load_or_pretrain

        _, meta = load_or_pretrain(self.run_config, progress=False)
        return meta["path"]

    def _check_world_sizes(self, cfg: SpotlightConfig) -> None:
        if cfg.trainer.world_size != 1:
            raise ValueError(f"trainer.world_size={cfg.trainer.world_size}: the ROLL host trains on one rank "
                             "until a data-parallel trainer strategy lands; use one trainer GPU")
        samples = cfg.rollout_batch_size * cfg.train.group_size
        for role in ("rollout", "reward"):
            world = getattr(cfg, role).world_size
            if samples % world:
                raise ValueError(f"{role}.world_size={world} must divide rollout_batch_size x train.group_size "
                                 f"= {samples} (ROLL chunks the batch evenly by rank)")

    def run(self):
        """The shared iteration loop (runtime Coordinator) on this pipeline's clusters; its RunResult."""
        from roll_spotlight.roll.loop import drive

        return drive(self)
