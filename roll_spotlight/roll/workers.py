"""ROLL workers for the DiT roles. This module imports ROLL; reach it through roll_spotlight.roll.

Each worker is a ROLL ``Worker`` (one Ray actor per rank, created by a ROLL ``Cluster``) whose
``@register`` methods the cluster proxies: `DiTTrainerWorker` for the ``actor_train`` role,
`DiTRolloutWorker` for ``actor_infer``, `DiTRewardWorker` for ``reward``. Workers build their own
strategy in ``initialize()`` by a name in the ``roll_spotlight.strategies`` group: the role's
default (recipes need not say), or ``<role>.strategy_args.strategy_config.strategy``, or, when the
opt-in ``strategy_literal`` patch lets ROLL parse it, ``strategy_args.strategy_name``
(``actor_infer`` takes no ``strategy_args``: ROLL asserts vLLM/SGLang there).

Dispatch modes: rollouts and rewards are ``ALL_TO_ALL``: the backend hands each rank its own
contiguous share (`roll_spotlight.roll.cluster_backend.split_even`), so a batch need not divide the world
size (ROLL's ``DP_MP_COMPUTE`` asserts it does); in pull mode every rollout rank ``drain`` s the
shared queue instead. Weights travel through the run's weight store, never through the driver.

The trainer is data-parallel over its cluster's ranks: ``train`` is ``ALL_TO_ALL`` (rank r gets
the r-th contiguous shard of the outputs and prompts, and the rewards and group ids of the whole
batch), the ranks all-reduce gradients over a torch.distributed group that ``initialize`` sets up
at ROLL's master address and port (gloo on CPU, nccl on GPU), and rank 0 alone publishes weights,
validates and writes checkpoints. With one rank no process group is created.

Queue training (``spot.training_phase``, one actor_train rank): the pipeline calls
``use_queue_training`` on both clusters; the trainer rank then submits each update's micro-batches
to the run's queue and pulls them with everyone else, and every actor_infer ``drain`` also computes
the micro-batches it pulls (the driver restarts the drains while the update trains).
"""
from __future__ import annotations

import logging

import numpy as np
from roll.distributed.executor.worker import Worker
from roll.distributed.scheduler.decorator import Dispatch, register

from roll_spotlight import plugins

CPU_CACHE_WARNING = "does not have 'empty_cache' attribute"


class OnceFilter(logging.Filter):
    """Lets the first record whose message contains ``fragment`` through with ``note`` appended
    (none with ``show_first`` False) and drops (and counts) the later ones."""

    def __init__(self, fragment: str, note: str, show_first: bool = True) -> None:
        super().__init__()
        self.fragment, self.note, self.show_first, self.count = fragment, note, show_first, 0

    def filter(self, record: logging.LogRecord) -> bool:
        if self.fragment not in record.getMessage():
            return True
        self.count += 1
        if self.count > 1 or not self.show_first:
            return False
        record.msg, record.args = record.getMessage() + self.note, ()
        return True


def quiet_cpu_cache_warning(rank: int = 0) -> None:
    """Show ROLL's CPU ``empty_cache`` warning once, from each role's rank 0, instead of after
    every call of every rank.

    ROLL's ``@register`` wrapper calls ``clear_memory()`` after each worker call, which asks
    ``current_platform.empty_cache``; the CPU platform has none, so ROLL's ``Platform.__getattr__``
    logs the warning each time (about 2,000 times in an emulated run) and returns None, which the
    wrapper's ``except`` ignores: on CPU the call does nothing either way.
    """
    from roll.platforms import platform

    if not any(isinstance(f, OnceFilter) for f in platform.logger.filters):
        note = " (ROLL asks after every worker call; a no-op on CPU: shown once per role by roll_spotlight)"
        platform.logger.addFilter(OnceFilter(CPU_CACHE_WARNING, note, show_first=rank == 0))


class _QuietWorker(Worker):
    """A ROLL worker that shows ROLL's CPU cache warning once per role (`quiet_cpu_cache_warning`)."""

    def __init__(self, worker_config) -> None:
        super().__init__(worker_config)
        quiet_cpu_cache_warning(self.rank)


class _DiTWorker(_QuietWorker):
    """Shared start-up: the run config and the strategy chosen by name, built from the run's
    source (`worker.policy_source`: the policy every rank loads, or emulated GPUs)."""

    default_strategy: str = ""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config, source=None, store=None) -> None:
        super().initialize(pipeline_config)
        strategy_cls = plugins.resolve("strategies", self._strategy_name())
        self.strategy = strategy_cls.build(pipeline_config.to_run_config(), source, store)

    def _strategy_name(self) -> str:
        args = self.worker_config.strategy_args
        if args is None:
            return self.default_strategy
        if args.strategy_name in plugins.known_names("strategies"):
            return args.strategy_name
        return (args.strategy_config or {}).get("strategy", self.default_strategy)


class DiTTrainerWorker(_DiTWorker):
    """The on-demand Flow-GRPO trainer, data-parallel over the cluster's ranks; rank 0 publishes."""

    default_strategy = "diffusers_train"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config, source=None, store=None) -> None:
        Worker.initialize(self, pipeline_config)
        cfg = pipeline_config.to_run_config()
        strategy_cls = plugins.resolve("strategies", self._strategy_name())
        sync = self._gradient_sync(cfg.model.device) if self.world_size > 1 else None
        self.strategy = strategy_cls.build(cfg, source, store if self.rank == 0 else None, sync=sync)

    def _gradient_sync(self, device: str):
        """Join the trainer ranks' process group at ROLL's master address; the all-reduce hook."""
        import torch
        import torch.distributed as dist

        from roll_spotlight.training.grpo import AllReduceGradients

        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(0)  # ROLL makes this rank's GPU the only visible one
        dist.init_process_group(backend, init_method=f"tcp://{self.master_addr}:{self.master_port}",
                                rank=self.rank, world_size=self.world_size)
        return AllReduceGradients()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def use_queue_training(self, queue, inbox) -> None:
        """Train every update through the run's queue (`runtime.queue_training`; one rank only)."""
        self.strategy.use_queue_training(queue, inbox)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def train(self, outputs: list, prompts: list, group_ids: np.ndarray, rewards: np.ndarray,
              baselines: np.ndarray | None = None) -> tuple:
        """One update on this rank's shard (outputs, prompts) of the batch (group_ids, rewards,
        baselines): its `UpdateResult` (global metrics, equal on every rank) and the weight
        version it made."""
        return self.strategy.train(outputs, prompts, group_ids, rewards, baselines), self.strategy.weight_version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_ONE)
    def evaluate(self):
        """Rank 0 validates (the replicas hold the same weights); other ranks return None. With
        train.sharding: fsdp every rank takes part (the forward gathers shards), rank 0 reports."""
        result = self.strategy.evaluate() if self.rank == 0 or self.strategy.sharded else None
        return result if self.rank == 0 else None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_ONE)
    def save_checkpoint(self, path: str) -> None:
        if self.rank == 0 or self.strategy.sharded:  # sharded: every rank gathers, rank 0 writes
            self.strategy.save(path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_ONE)
    def load_checkpoint(self, path: str) -> int:
        """Every rank loads the same file (a path all trainer nodes can read)."""
        self.strategy.load(path)
        return self.strategy.weight_version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights_digest(self) -> str:
        """A hash of this rank's weights: data-parallel replicas must agree bit for bit."""
        return self.strategy.weights_digest()


class DiTRolloutWorker(_DiTWorker):
    """On-demand rollouts, each request with the weights of its own version (from the store)."""

    default_strategy = "diffusers_rollout"

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def rollouts(self, specs: list) -> list:
        return self.strategy.rollouts(specs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join_sp_group(self, memberships: list) -> None:
        """Join this rank's SP rollout group: ``memberships[rank]`` (`worker.sp_group`)."""
        self.strategy.join_sp(memberships[self.rank])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def use_queue_training(self, inbox) -> None:
        """Compute micro-batches of updates too (queue training): a drain then also pulls them."""
        self.strategy.use_queue_training(inbox)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def drain(self, queue) -> int:
        """Pull from the run's queue actor until nothing is pending; returns how many requests
        (rollouts, or micro-batches of an update) ran here."""
        from roll_spotlight.dispatch.queue_actor import QueueClient

        return self.strategy.drain(QueueClient(queue, self.worker_name or f"{self.cluster_name}-{self.rank}"))


class DiTRewardWorker(_QuietWorker):
    """Scores decoded images with the run's reward (`reward_fn`); a failing reward gives its fallback.
    With emulated GPUs (the source an `Emulation`) it scores stand-ins in the reward model's time."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config, source=None, store=None) -> None:
        from roll_spotlight.worker.policy_source import is_emulation

        super().initialize(pipeline_config)
        if is_emulation(source):
            from roll_spotlight.runtime.emulated_trainer import EmulatedReward

            self.reward_fn = EmulatedReward.servers(source, self.world_size)
        else:
            from roll_spotlight.rewards.configured import configured_reward

            self.reward_fn = configured_reward(pipeline_config.to_run_config().reward)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def score(self, images: list, prompts: list) -> list:
        """Per-sample (reward, fallback flag) pairs, in input order (this rank's share)."""
        if not images:
            return []
        out = self.reward_fn(np.stack(images), list(prompts))
        fallback = out.info.get("reward_fallback", np.zeros(len(images)))
        return [(float(r), float(f)) for r, f in zip(out.rewards, fallback)]
