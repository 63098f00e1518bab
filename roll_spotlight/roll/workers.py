"""ROLL workers for the DiT roles. This module imports ROLL; reach it through roll_spotlight.roll.

Each worker is a ROLL ``Worker`` (one Ray actor per rank, created by a ROLL ``Cluster``) whose
``@register`` methods the cluster proxies. Workers build their own strategy in ``initialize()``
by a name in the ``roll_spotlight.strategies`` group, read from
``<role>.strategy_args.strategy_config.strategy`` (default per role) or, when the opt-in
``strategy_literal`` patch lets ROLL parse it, from ``strategy_args.strategy_name``.

Dispatch modes: rollouts and rewards are data-parallel (``DP_MP_COMPUTE``: list arguments are
chunked by rank in order and the list results concatenated in rank order, so request order is
kept); the trainer runs on one rank (``ONE_TO_ALL_ONE`` returns rank 0's result); weights go to
every rollout rank (``ONE_TO_ALL``).
"""
from __future__ import annotations

import numpy as np
from roll.distributed.executor.worker import Worker
from roll.distributed.scheduler.decorator import Dispatch, register

from roll_spotlight import plugins


class _DiTWorker(Worker):
    """Shared start-up: the run config and the strategy chosen by name."""

    default_strategy: str = ""

    def _strategy_name(self) -> str:
        args = self.worker_config.strategy_args
        if args is None:
            return self.default_strategy
        if args.strategy_name in plugins.known_names("strategies"):
            return args.strategy_name
        return (args.strategy_config or {}).get("strategy", self.default_strategy)

    def _build_strategy(self, base_path: str | None):
        strategy_cls = plugins.resolve("strategies", self._strategy_name())
        return strategy_cls.build(self.pipeline_config.to_run_config(), base_path)


class DiTTrainerWorker(_DiTWorker):
    """The on-demand Flow-GRPO trainer (one rank)."""

    default_strategy = "diffusers_train"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config, base_path: str | None = None) -> None:
        super().initialize(pipeline_config)
        self.strategy = self._build_strategy(base_path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_ONE)
    def train(self, outputs: list, prompts: list, group_ids: np.ndarray, rewards: np.ndarray) -> dict:
        return self.strategy.train(outputs, prompts, group_ids, rewards)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_ONE)
    def get_weights(self) -> tuple[dict, int]:
        return self.strategy.weights()

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
    """On-demand rollouts with the current weights."""

    default_strategy = "diffusers_rollout"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config, base_path: str | None = None) -> None:
        super().initialize(pipeline_config)
        self.strategy = self._build_strategy(base_path)

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def rollouts(self, specs: list) -> list:
        return self.strategy.rollouts(specs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_weights(self, state_dict: dict, version: int) -> int:
        self.strategy.load_weights(state_dict, version)
        return self.strategy.weight_version


class DiTExplorerWorker(DiTRolloutWorker):
    """Seed exploration with one-iteration-stale weights, for the elastic spot pool.

    The same rollout as `DiTRolloutWorker`; what differs is where it runs (spot GPUs, outside
    ROLL's static clusters) and which weights it holds (those of the previous iteration).
    """


class DiTRewardWorker(Worker):
    """Scores decoded images with the run's reward (`reward_fn`); a failing reward gives its fallback."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config, base_path: str | None = None) -> None:
        from roll_spotlight.training.loop import build_reward_fn

        super().initialize(pipeline_config)
        self.reward_fn = build_reward_fn(pipeline_config.to_run_config())

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def score(self, images: list, prompts: list) -> list:
        """Per-sample (reward, fallback flag) pairs, in input order."""
        out = self.reward_fn(np.stack(images), list(prompts))
        fallback = out.info.get("reward_fallback", np.zeros(len(images)))
        return [(float(r), float(f)) for r, f in zip(out.rewards, fallback)]
