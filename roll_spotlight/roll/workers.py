"""ROLL workers for the DiT roles. This module imports ROLL; reach it through roll_spotlight.roll.

Each worker is a ROLL ``Worker`` (one Ray actor per rank, created by a ROLL ``Cluster``) whose
``@register`` methods the cluster proxies. Workers build their own strategy in ``initialize()``
by a name in the ``roll_spotlight.strategies`` group, read from
``<role>.strategy_args.strategy_config.strategy`` (default per role) or, when the opt-in
``strategy_literal`` patch lets ROLL parse it, from ``strategy_args.strategy_name``.

Dispatch modes: rollouts and rewards are ``ALL_TO_ALL``: the backend hands each rank its own
contiguous share (`roll_spotlight.roll.loop.split_even`), so a batch need not divide the world
size (ROLL's ``DP_MP_COMPUTE`` asserts it does); in pull mode every rollout rank ``drain`` s the
shared queue instead. The trainer is ``ONE_TO_ALL`` (one rank, see `SpotlightConfig`), which lets
the backend start an update without waiting for it. Weights travel through the run's weight
store, never through the driver.
"""
from __future__ import annotations

import numpy as np
from roll.distributed.executor.worker import Worker
from roll.distributed.scheduler.decorator import Dispatch, register

from roll_spotlight import plugins


class _DiTWorker(Worker):
    """Shared start-up: the run config and the strategy chosen by name."""

    default_strategy: str = ""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config, base_path: str | None = None, store=None) -> None:
        super().initialize(pipeline_config)
        strategy_cls = plugins.resolve("strategies", self._strategy_name())
        self.strategy = strategy_cls.build(pipeline_config.to_run_config(), base_path, store)

    def _strategy_name(self) -> str:
        args = self.worker_config.strategy_args
        if args is None:
            return self.default_strategy
        if args.strategy_name in plugins.known_names("strategies"):
            return args.strategy_name
        return (args.strategy_config or {}).get("strategy", self.default_strategy)


class DiTTrainerWorker(_DiTWorker):
    """The on-demand Flow-GRPO trainer (one rank); publishes every weight version to the store."""

    default_strategy = "diffusers_train"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def train(self, outputs: list, prompts: list, group_ids: np.ndarray, rewards: np.ndarray) -> tuple[dict, int]:
        """Metrics of one update and the weight version it published."""
        return self.strategy.train(outputs, prompts, group_ids, rewards), self.strategy.weight_version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_ONE)
    def evaluate(self):
        return self.strategy.evaluate()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_ONE)
    def save_checkpoint(self, path: str) -> None:
        self.strategy.save(path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_ONE)
    def load_checkpoint(self, path: str) -> int:
        self.strategy.load(path)
        return self.strategy.weight_version


class DiTRolloutWorker(_DiTWorker):
    """On-demand rollouts, each request with the weights of its own version (from the store)."""

    default_strategy = "diffusers_rollout"

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def rollouts(self, specs: list) -> list:
        return self.strategy.rollouts(specs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def drain(self, queue) -> int:
        """Pull from the run's queue actor until nothing is pending; returns how many ran here."""
        from roll_spotlight.dispatch.actor import QueueClient

        return self.strategy.drain(QueueClient(queue, self.worker_name or f"{self.cluster_name}-{self.rank}"))


class DiTExplorerWorker(DiTRolloutWorker):
    """Seed exploration with one-iteration-stale weights.

    The same rollout as `DiTRolloutWorker`. The ROLL host's spot explorers are the runtime's pull
    workers, started by the elastic spot pool (ROLL clusters cannot grow or lose ranks); this class
    is the ``explorer`` role's ROLL worker for a recipe that runs exploration on a static cluster.
    """


class DiTRewardWorker(Worker):
    """Scores decoded images with the run's reward (`reward_fn`); a failing reward gives its fallback."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config, base_path: str | None = None, store=None) -> None:
        from roll_spotlight.training.loop import build_reward_fn

        super().initialize(pipeline_config)
        self.reward_fn = build_reward_fn(pipeline_config.to_run_config())

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def score(self, images: list, prompts: list) -> list:
        """Per-sample (reward, fallback flag) pairs, in input order (this rank's share)."""
        if not images:
            return []
        out = self.reward_fn(np.stack(images), list(prompts))
        fallback = out.info.get("reward_fallback", np.zeros(len(images)))
        return [(float(r), float(f)) for r, f in zip(out.rewards, fallback)]
