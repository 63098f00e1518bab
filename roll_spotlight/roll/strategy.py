"""Diffusers strategies: what a ROLL worker runs for a DiT role, built by the worker itself.

ROLL picks a worker's strategy in ``create_strategy``, a closed if/elif over a ``Literal`` of LLM
back-ends (vLLM, SGLang, Megatron, FSDP2). Our workers build their strategy in ``initialize()``
instead, by a name in the ``roll_spotlight.strategies`` group (``strategy_config.strategy``), so
``strategy_args.strategy_name`` stays one of ROLL's literals (patches/LEDGER.md has the opt-in
patch that lets it name ours). These classes need torch and diffusers but not ROLL: they wrap the
runtime's host-independent parts, so a ROLL worker computes exactly what the in-process backend
computes.

- `DiffusersRolloutStrategy`: runs rollout requests one by one on the runtime's
  ``ModelCompute`` (batch size 1: a rollout is a pure function of weights, prompt, seed and
  schedule on every worker), either a static share of a batch (through a rank-local queue) or
  pulled from the run's shared request queue by the runtime's worker loop (``drain``).
- `DiffusersTrainStrategy`: the runtime's ``TrainerCore`` (Flow-GRPO update, validation, state).
"""
from __future__ import annotations

from pathlib import Path

from roll_spotlight.config.run import RunConfig
from roll_spotlight.worker.policy_source import worker_compute


class DiffusersRolloutStrategy:
    """Rollouts of request specs, each with the weights of its own ``weight_version``.

    Weights come from the run's weight store (`roll_spotlight.weights.WeightStore`), where the
    trainer publishes every version: a rank loads a version the first time a request asks for it,
    so stale exploration (version t while t+1 trains) and fresh rollouts need no push from the
    driver. Version 0, the base, is fetched too: with LoRA each process draws its own random
    adapters (B = 0 makes them roll out alike, but a micro-batch's gradient depends on them), and
    the trainer's are the ones its updates apply to. `compute` is the rank's
    `worker.loop.Compute`: the policy (`worker.compute.ModelCompute`) or emulated GPUs.
    """

    def __init__(self, cfg: RunConfig, compute) -> None:
        from roll_spotlight.dispatch.queue import QueueConfig, RequestQueue

        self.cfg, self.compute = cfg, compute
        self.queue = RequestQueue(QueueConfig())
        self.sp_group = None
        self.sink = None  # queue training: a `worker.actor.InboxSink`

    def use_queue_training(self, inbox) -> None:
        """Compute the micro-batches of updates this rank pulls (`runtime.queue_training`)."""
        from roll_spotlight.worker.actor import InboxSink

        self.sink = InboxSink(inbox)

    def join_sp(self, membership) -> None:
        """Become one rank of an SP rollout group (`worker.sp_group`); blocks until all joined.
        The group's ranks are then given the same requests: every rank denoises each image with
        its share of the tokens, and only the leader (rank 0) decodes and returns results."""
        if self.sp_group is not None:
            self.sp_group.close()
        self.sp_group = self.compute.join_group(membership)

    @property
    def leader(self) -> bool:
        return self.sp_group is None or self.sp_group.leader

    @property
    def weight_version(self) -> int | None:
        return self.compute.version

    @classmethod
    def build(cls, cfg: RunConfig, source, store) -> "DiffusersRolloutStrategy":
        """From the run's source (`worker.policy_source`: the policy to load, or an `Emulation`)."""
        return cls(cfg, worker_compute(source, store, max_batch=cfg.sampling.max_batch))

    def rollouts(self, specs: list) -> list:
        """Outputs (runtime ``RolloutOutput``) in the order of `specs` (a static share of a batch).
        Every rank of an SP group must be given the same `specs`; its followers return Nones."""
        from roll_spotlight.runtime.local import drain_local

        return drain_local(self.queue, specs, self._roll_out, self.compute.max_batch)

    def drain(self, client) -> int:
        """The worker loop (`worker.loop`) over the shared queue (a ``QueueClient``) until
        a pull leases nothing; returns how many requests ran here. An on-demand rank is never
        stopped early; in an SP group the leader pulls and the others' ``client`` is not used."""
        from roll_spotlight.worker.loop import WorkerLoop

        loop = WorkerLoop(client, self.compute, sink=self.sink)
        counters = loop.serve(idle=lambda: True, group=self.sp_group)
        return counters["completed"] + counters["micro_batches"] if self.leader else 0

    def _roll_out(self, leases):
        """On-demand ROLL ranks are never asked to stop: leases run to the end."""
        from roll_spotlight.worker.loop import roll_out

        self.compute.hold_version(leases[0].request.weight_version)
        return roll_out(self.compute, leases, decode=self.leader)


class DiffusersTrainStrategy:
    """One Flow-GRPO update per iteration on rollout outputs; owns optimiser and validation.

    With a weight store it publishes every weight version (the base as version 0) for the rollout
    ranks and the spot workers to fetch. With a `sync` (`roll_spotlight.training.grpo.
    AllReduceGradients`) it is one rank of a data-parallel trainer: it starts from rank 0's weights
    (broadcast, so a randomly initialised adapter agrees too), trains on its shard of each batch,
    and only the rank given the store publishes. With ``train.sharding: fsdp`` the ranks shard the
    policy with FSDP2 (`roll_spotlight.training.sharding`): publishing, `weights_digest`, `save`,
    `load` and `evaluate` are then collectives that every rank must call. `core` is a
    `runtime.trainer_core.TrainerCore`, or its emulated twin (`worker.emulated`).
    """

    def __init__(self, core, store=None, sync=None) -> None:
        self.core = core
        self.sharded = sync is not None and core.cfg.train.sharding == "fsdp"
        if self.sharded:
            from roll_spotlight.training.sharding import ShardedGradients, shard_trainer

            shard_trainer(self.core.trainer, ShardedGradients(sync.group))  # from rank 0's weights
        elif sync is not None:
            sync.replicate(core.policy)
            self.core.trainer.sync = sync
        self.store = store
        self.queue = None  # queue training (use_queue_training)
        self.publish()

    @classmethod
    def build(cls, cfg: RunConfig, source, store=None, sync=None) -> "DiffusersTrainStrategy":
        """From the run's source (`worker.policy_source`: the policy to load, or an `Emulation`)."""
        from roll_spotlight.runtime.trainer_core import build_trainer_core

        return cls(build_trainer_core(cfg, source), store, sync)

    @property
    def weight_version(self) -> int:
        return self.core.weight_version

    def use_queue_training(self, queue, inbox) -> None:
        """Train every update through `queue` (`runtime.queue_training.QueueTraining`): this
        rank pulls its micro-batches with the actor_infer ranks and spot workers, adds every
        accepted sum, clips, steps and publishes as before."""
        self.queue = self.core.queue_training(queue, inbox)

    def publish(self) -> None:
        if self.sharded:  # every rank gathers the whole tensors (adapters only with LoRA)
            from roll_spotlight.training.sharding import full_published_state

            state = full_published_state(self.core.policy)
        if self.store is not None:
            self.store.publish(self.core.weight_version,
                               state if self.sharded else self.core.policy.published_state())

    def train(self, outputs: list, prompts: list[str], group_ids, rewards, baselines=None):
        """One update (a `training.grpo.UpdateResult`). `outputs`/`prompts`: this rank's shard (all
        of them on one rank); `rewards`, `group_ids` and `baselines` (per-sample advantage
        baselines, `exploration.baseline: pool`, or None): the batch."""
        ranks = self.core.trainer.sync.world_size
        if len(rewards) < ranks:  # checked on every rank alike, before any collective, so none hangs
            raise ValueError(f"{ranks} trainer ranks but {len(rewards)} samples in the batch; every rank needs one")
        result = self.core.train(outputs, prompts, group_ids, rewards, baselines, queue=self.queue)
        self.publish()
        return result

    def evaluate(self):
        return self.core.evaluate()

    def weights_digest(self) -> str:
        import hashlib

        import torch

        digest = hashlib.sha256()
        state = self.core.policy.state_dict()
        if self.sharded:
            from roll_spotlight.training.sharding import full_tensors

            state = full_tensors(state)
        for name, tensor in sorted(state.items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    def save(self, path: str) -> None:
        if self.sharded:
            from roll_spotlight.training.sharding import save_sharded

            return save_sharded(self.core, Path(path))
        self.core.save(Path(path))

    def load(self, path: str) -> None:
        if self.sharded:
            from roll_spotlight.training.sharding import load_sharded

            load_sharded(self.core, Path(path))
        else:
            self.core.load(Path(path))
        self.publish()
