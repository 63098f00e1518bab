"""Sharded data-parallel training (`train.sharding: fsdp`): torch FSDP2 `fully_shard` on the policy.

With `train.sharding: replicate` (the default) every trainer rank holds a whole replica and
`grpo.AllReduceGradients` sums the gradients once per step. A 20B transformer does not fit as a
replica (weights, gradients and AdamW states, ~16 bytes a parameter), so with `fsdp` each rank
keeps 1/world of every parameter, gradient and optimiser state instead:

- the plan (`sharding_plan`): one FSDP unit per transformer block, then the transformer itself (its
  embeddings, norms and output projection), then every other child of the policy that trains (the
  tiny model's prompt encoder). Frozen children (Qwen-Image's VAE and text encoder) stay whole on
  every rank: they never get gradients, and sharding them would put an all-gather in every prompt
  encoding. With LoRA the frozen base is sharded with its block; only the adapters get gradients;
- mixed precision: a bf16 model computes in bf16 and reduces gradients in float32. With LoRA the
  float32 adapters keep computing in float32 (no parameter cast), exactly as the rollout workers'
  unsharded copies do, so the first importance ratio stays 1;
- gradients are summed (not averaged) across ranks as they are produced in backward, because each
  rank back-propagates its shard's terms of the *global* mean (see `grpo`), so `ShardedGradients.
  reduce_gradients` has nothing left to do; the loss metrics are still all-reduced;
- every FSDP forward and backward is a collective, so every rank must run as many micro-steps:
  ranks with fewer kept rows pad with zero-weight micro-steps (`ShardedGradients.micro_batches`);
- activation checkpointing (`model.gradient_checkpointing`) composes: diffusers checkpoints each
  block call, and the recompute re-gathers that block's parameters in backward.

Weight versions and checkpoints need whole tensors: `full_published_state` gathers them (only the
adapters with LoRA) and must be called on every rank. torch.distributed is imported lazily; the
plan itself needs none (tests check it on CPU in one process).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from roll_spotlight.training.grpo import AllReduceGradients, FlowGRPOTrainer, trainable_parameters

SHARDING_MODES = ("replicate", "fsdp")


@dataclass(frozen=True)
class ShardingPlan:
    """Which modules become FSDP units (in `fully_shard` order: blocks first) and which stay whole."""

    units: tuple[str, ...]
    replicated: tuple[str, ...]
    param_dtype: torch.dtype | None
    reduce_dtype: torch.dtype | None

    def mixed_precision(self):
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype)


def _trains(module: torch.nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def sharding_plan(policy: torch.nn.Module) -> ShardingPlan:
    """The FSDP units of a `DiTPolicy` (see the module docstring). ValueError when a parameter
    that trains would belong to no unit (a parameter registered on the policy itself)."""
    transformer = getattr(policy, "transformer", None)
    blocks = getattr(transformer, "transformer_blocks", None)
    if transformer is None or blocks is None or len(blocks) == 0:
        raise ValueError(f"train.sharding=fsdp needs a policy whose transformer has transformer_blocks; "
                         f"{type(policy).__name__} has none")
    units = [f"transformer.transformer_blocks.{i}" for i in range(len(blocks))] + ["transformer"]
    replicated = []
    for name, child in policy.named_children():
        if name == "transformer" or not any(True for _ in child.parameters()):
            continue
        (units if _trains(child) else replicated).append(name)
    loose = [n for n, p in policy.named_parameters(recurse=False) if p.requires_grad]
    if loose:
        raise ValueError(f"train.sharding=fsdp: parameters {loose} of {type(policy).__name__} train but belong "
                         "to no submodule, so no FSDP unit would reduce their gradients")
    dtype = next(transformer.parameters()).dtype
    low = dtype in (torch.bfloat16, torch.float16)
    lora = getattr(policy, "lora", None) is not None
    # bf16 compute, fp32 reduction; with LoRA no parameter cast: the adapters are float32 on purpose
    return ShardingPlan(units=tuple(units), replicated=tuple(replicated),
                        param_dtype=dtype if low and not lora else None,
                        reduce_dtype=torch.float32 if low or lora else None)


def shard_policy(policy: torch.nn.Module, mesh) -> ShardingPlan:
    """Apply `sharding_plan(policy)` in place with `fully_shard` on `mesh` (a 1-D DeviceMesh).
    Every rank must hold the same weights first (`AllReduceGradients.replicate`): each keeps its
    slice of its own copy. Gradients are summed across ranks, not averaged."""
    from torch.distributed.fsdp import fully_shard

    plan = sharding_plan(policy)
    modules = dict(policy.named_modules())
    for name in plan.units:
        fully_shard(modules[name], mesh=mesh, mp_policy=plan.mixed_precision())
    for name in plan.units:
        unit = modules[name]
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM
    return plan


def is_sharded(module: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def full_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with every DTensor gathered whole (a collective: call on every rank, same keys)."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach() for k, v in state.items()}


def full_published_state(policy) -> dict[str, torch.Tensor]:
    """`policy.published_state()` with whole tensors: the adapters only with LoRA (a collective)."""
    return full_tensors(policy.published_state())


class ShardedGradients(AllReduceGradients):
    """The trainer hook for an FSDP2-sharded policy on a process group (gloo on CPU, nccl on GPU).

    FSDP sums the gradients in backward, so `reduce_gradients` does nothing; shards, offsets and
    metrics are exchanged as in `AllReduceGradients`. Build it with `shard_trainer`.
    """

    def mesh(self):
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh.from_group(self.group or self.dist.group.WORLD, self._device().type)

    def shard_offset(self, rows: int, total: int) -> int:
        sizes = torch.zeros(self.world_size, dtype=torch.int64, device=self._device())
        sizes[self.rank] = rows
        self.dist.all_reduce(sizes, group=self.group)
        if int(sizes.min()) < 1:  # every rank sees the same sizes, so all of them raise
            raise ValueError(f"train.sharding=fsdp needs every trainer rank to hold a sample, got shards of "
                             f"{sizes.tolist()} samples (a padding micro-step reuses one of the rank's rows)")
        return super().shard_offset(rows, total)

    def micro_batches(self, count: int) -> int:
        counts = torch.tensor([count], dtype=torch.int64, device=self._device())
        self.dist.all_reduce(counts, op=self.dist.ReduceOp.MAX, group=self.group)
        return int(counts.item())

    def reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Nothing: FSDP reduce-scattered (summed) every gradient during backward."""


def shard_trainer(trainer: FlowGRPOTrainer, sync: ShardedGradients) -> ShardingPlan:
    """Shard `trainer`'s policy (and its frozen reference copy, when KL is on without LoRA) in
    place, starting from rank 0's weights, and rebuild its optimiser on the shards; from then on
    `trainer.sync` is `sync`. The trainer must not have stepped yet (its optimiser has no state)."""
    if trainer.optimizer.state:
        raise ValueError("shard_trainer: the trainer has already stepped; shard it before training")
    if getattr(trainer.cfg, "ema_decay", 0.0) > 0:
        raise ValueError("train.sharding=fsdp does not support train.ema_decay > 0 (the average would be a "
                         "second sharded copy); set train.ema_decay=0 or train.sharding=replicate")
    mesh = sync.mesh()
    sync.replicate(trainer.policy)
    plan = shard_policy(trainer.policy, mesh)
    if trainer.reference is not None:
        sync.replicate(trainer.reference)
        shard_policy(trainer.reference, mesh)
    defaults = trainer.optimizer.defaults
    trainer.params = trainable_parameters(trainer.policy, trainer.cfg.trainable)
    trainer.optimizer = type(trainer.optimizer)(trainer.params, lr=defaults["lr"],
                                                weight_decay=defaults["weight_decay"])
    trainer.sync = sync
    return plan


def save_sharded(core, path: Path) -> None:
    """Write a `TrainerCore` checkpoint of a sharded policy: whole model state and the optimiser
    state keyed by parameter name (torch.distributed.checkpoint's full state dicts). A collective:
    every rank calls it, rank 0 writes."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model, optim = get_state_dict(core.policy, core.trainer.optimizer, options=options)
    if core.trainer.sync.rank == 0:
        tmp = Path(path).with_suffix(".tmp")
        torch.save({"policy": model, "trainer": {"optimizer": optim}, "weight_version": core.weight_version,
                    "sharding": "fsdp"}, tmp)
        tmp.replace(path)


def load_sharded(core, path: Path) -> None:
    """Load a `save_sharded` checkpoint into a sharded `TrainerCore` (every rank reads the file)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state = torch.load(path, weights_only=True, map_location="cpu")
    if state.get("sharding") != "fsdp":
        raise ValueError(f"{path} was written by a train.sharding=replicate run; resume it with the same setting")
    expected = set(core.policy.state_dict())
    if set(state["policy"]) != expected:
        raise KeyError(f"{path} does not fit this policy: unknown keys {sorted(set(state['policy']) - expected)[:5]}, "
                       f"missing keys {sorted(expected - set(state['policy']))[:5]}")
    # not strict: a parameter that never got a gradient (the last block's unused text output) has no AdamW state
    set_state_dict(core.policy, core.trainer.optimizer, model_state_dict=state["policy"],
                   optim_state_dict=state["trainer"]["optimizer"],
                   options=StateDictOptions(full_state_dict=True, strict=False))
    core.weight_version = int(state["weight_version"])
