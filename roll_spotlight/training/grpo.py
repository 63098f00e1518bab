"""The Flow-GRPO update of a DiT policy from a batch of scored trajectories.

One `FlowGRPOTrainer.step` = one optimiser step per inner epoch over the whole batch (gradients
accumulated over micro-batches and noised steps). Probes on CPU found several Adam steps per
iteration at lr >= 1e-4 degrade validation quickly (docs/learning.md), hence the default.

Data parallelism. A `GradientSync` is the trainer's one hook into other ranks; the default
(`GradientSync`) is one rank holding the whole batch and does nothing. `AllReduceGradients` runs
the same step on `world_size` ranks of a torch.distributed group, each holding a contiguous shard
of the batch (rank order), equal to the one-rank step up to float summation order:

- every rank gets the rewards and group ids of the *whole* batch (a few floats), so advantages,
  the zero-std filter and the normaliser ``kept samples x noised steps`` are the global ones, and
  a group split across ranks is still one group;
- each rank back-propagates its shard's terms of the global mean, so the *sum* of the ranks'
  gradients (one all-reduce, between backward and clipping) is the one-rank gradient; clipping,
  the optimiser step and the loss metrics then see global values and the replicas stay equal.

torch.distributed is imported only by `AllReduceGradients`, when one is built.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from roll_spotlight.flow_grpo import group_advantages, policy_loss, recompute_log_probs
from roll_spotlight.flow_grpo.advantages import baselined_advantages
from roll_spotlight.config.run import GRPOConfig
from roll_spotlight.dispatch.requests import plan_micro_batches
from roll_spotlight.training.micro_batches import (LOSS_TOTALS, Contributions, GradientSource, UpdatePlan, combine,
                                                   reduce_flat)


@dataclass
class ScoredBatch:
    """Trajectories of one iteration with their prompts, group ids and rewards (sample order)."""

    trajectory: object
    prompts: list[str]
    group_ids: np.ndarray
    rewards: np.ndarray
    noise_level: float
    kind: str
    # (N, 2) per-sample (mean, std) advantage baselines, e.g. the explored pool's
    # (`exploration.baseline: pool`; NaN: the group's own statistics), or (N, 3) with a weight that
    # scales the sample's advantage (`exploration.unbiased`); None: each group's own statistics
    baselines: np.ndarray | None = None

    def __len__(self) -> int:
        """Samples in the whole batch (`rewards`); `trajectory` and `prompts` may hold a shard."""
        return len(self.rewards)

    @property
    def rows(self) -> int:
        """Samples held here (all of them, or a data-parallel rank's shard)."""
        return len(self.prompts)


def trainable_parameters(policy, which: str) -> list[torch.nn.Parameter]:
    if which == "all":
        params = list(policy.trainable_parameters())
    elif which == "transformer":
        params = list(policy.transformer.parameters())
    elif which == "prompt_encoder":
        params = list(policy.prompt_encoder.parameters())
    else:
        raise ValueError(f"train.trainable must be all, transformer or prompt_encoder, got {which!r}")
    return [p for p in params if p.requires_grad]


class GradientSync:
    """One rank with the whole batch: no other rank to agree with (the default hook)."""

    world_size = 1

    def shard_offset(self, rows: int, total: int) -> int:
        """Index in the whole batch of this rank's first sample."""
        if rows != total:
            raise ValueError(f"a single-rank trainer needs the whole batch, got {rows} of {total} samples "
                             "(train a shard with AllReduceGradients)")
        return 0

    def replicate(self, module: torch.nn.Module) -> None:
        """Make this rank's copy of `module` rank 0's (parameters and buffers)."""

    def reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Called between backward and gradient clipping; sums the ranks' gradients in place."""

    def micro_batches(self, count: int) -> int:
        """Micro-batches this rank runs when it has `count` of its own: more when every rank must run
        as many forwards and backwards (FSDP, `sharding.ShardedGradients`); the rest are padding."""
        return count

    def reduce_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        return totals


class AllReduceGradients(GradientSync):
    """Data parallelism over a torch.distributed process group (gloo on CPU, nccl on GPU).

    Shards are contiguous and in rank order; their sizes may differ (one may be empty) and are
    exchanged once per step. Gradients travel as one flat buffer per step (one all-reduce);
    a parameter that got no gradient on any rank keeps ``grad=None``, as on one rank, so AdamW
    skips it in both cases. Every rank must call `FlowGRPOTrainer.step` for every batch.
    """

    def __init__(self, group=None) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ValueError("AllReduceGradients needs torch.distributed.init_process_group first")
        self.dist, self.group = dist, group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.root = 0 if group is None else dist.get_global_rank(group, 0)  # rank 0 of the group

    def _device(self) -> torch.device:
        backend = str(self.dist.get_backend(self.group))
        return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def shard_offset(self, rows: int, total: int) -> int:
        sizes = torch.zeros(self.world_size, dtype=torch.int64, device=self._device())
        sizes[self.rank] = rows
        self.dist.all_reduce(sizes, group=self.group)
        if int(sizes.sum()) != total:
            raise ValueError(f"the ranks' shards hold {sizes.tolist()} samples, {int(sizes.sum())} in all, "
                             f"but the batch has {total} rewards")
        return int(sizes[:self.rank].sum())

    @torch.no_grad()
    def replicate(self, module: torch.nn.Module) -> None:
        for tensor in module.state_dict().values():
            self.dist.broadcast(tensor, src=self.root, group=self.group)

    def reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        grads = reduce_flat([p.grad for p in params], params,
                            lambda flat: self.dist.all_reduce(flat, group=self.group), self._device())
        for p, g in zip(params, grads):
            p.grad = None if g is None else g.to(p.device)

    def reduce_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        values = torch.tensor(list(totals.values()), dtype=torch.float64, device=self._device())
        self.dist.all_reduce(values, group=self.group)
        return dict(zip(totals, values.tolist()))


class GRPOLoss:
    """The loss of one micro-batch and its backward pass: the trainer's, and every worker's that
    computes micro-batches of an update for it (`training.micro_batches`).

    The KL reference is `reference` (a frozen copy), else this policy with its LoRA adapters
    disabled.
    """

    def __init__(self, policy, cfg: GRPOConfig, reference=None):
        self.policy, self.cfg, self.reference = policy, cfg, reference

    def _reference(self):
        """Context giving the KL reference policy (the copy, or this policy with adapters disabled)."""
        if self.reference is not None:
            return contextlib.nullcontext(self.reference)
        return self.policy.adapters_disabled()

    def backward(self, batch: ScoredBatch, adv: torch.Tensor, norm: int, mb) -> dict[str, float]:
        """Back-propagate micro-batch `mb` (a `dispatch.MicroBatch`: rows held here, one step)
        weighted by its share of the mean over `norm` kept rows x steps; its weighted loss terms."""
        idx = np.asarray(mb.rows)
        out = self.micro_loss(batch, adv, idx, mb.step)
        weight = len(idx) / norm  # this chunk's share of the mean over all kept samples and steps
        (out.loss * weight).backward()
        return {name: float(getattr(out, name).detach()) * weight for name in LOSS_TOTALS}

    def micro_loss(self, batch: ScoredBatch, adv: torch.Tensor, idx: np.ndarray, k: int):
        """Loss of rows `idx` (of the rows held here) at step k; `adv` is aligned with those rows."""
        sub = batch.trajectory.select(torch.as_tensor(idx))
        prompts = [batch.prompts[i] for i in idx]
        cond = self.policy.encode_prompts(prompts)
        new = recompute_log_probs(lambda x, s: self.policy.velocity(x, s, cond), sub, k,
                                  noise_level=batch.noise_level, kind=batch.kind)
        ref_mean = None
        if self.cfg.kl_beta > 0:
            with torch.no_grad(), self._reference() as reference:
                ref_cond = reference.encode_prompts(prompts)
                ref = recompute_log_probs(lambda x, s: reference.velocity(x, s, ref_cond), sub, k,
                                          noise_level=batch.noise_level, kind=batch.kind)
            ref_mean = ref.mean
        return policy_loss(new.log_prob, sub.log_probs[:, k], adv[torch.as_tensor(idx)],
                           clip_range=self.cfg.clip_range, kl_beta=self.cfg.kl_beta,
                           mean=new.mean, ref_mean=ref_mean, std=new.kl_std)


@dataclass(frozen=True)
class UpdateResult:
    """One update's metrics, and who computed its micro-batches when a `GradientSource` did
    (None: all of them here)."""

    metrics: dict
    contributions: Contributions | None = None


class FlowGRPOTrainer:
    """Owns the optimiser and the frozen reference copy of a policy.

    `sync` is the data-parallel hook (`GradientSync`: one rank; `AllReduceGradients`: a group).
    An update's micro-batches run here unless `step` is given a `GradientSource` (queue training:
    other workers compute them too and the source returns their sums).
    """

    def __init__(self, policy, cfg: GRPOConfig, sync: GradientSync | None = None):
        self.policy = policy
        self.cfg = cfg
        self.sync = sync or GradientSync()
        self.params = trainable_parameters(policy, cfg.trainable)
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        # the KL reference: the policy with its LoRA adapters disabled, else a frozen copy
        copy_reference = cfg.kl_beta > 0 and getattr(policy, "lora", None) is None
        self.loss = GRPOLoss(policy, cfg, self._frozen_copy(policy) if copy_reference else None)

    @property
    def reference(self):
        """The frozen KL reference copy, or None (adapters disabled, or no KL)."""
        return self.loss.reference

    @reference.setter
    def reference(self, module) -> None:
        self.loss.reference = module

    @staticmethod
    def _frozen_copy(policy):
        ref = copy.deepcopy(policy).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def advantages(self, batch: ScoredBatch):
        """Group-relative advantages, against the batch's baselines when given, times its weights."""
        rewards, ids = torch.as_tensor(batch.rewards, dtype=torch.float32), torch.as_tensor(batch.group_ids)
        if batch.baselines is None:
            return group_advantages(rewards, ids, std_mode=self.cfg.std_mode, clip=self.cfg.adv_clip)
        base = torch.as_tensor(batch.baselines)
        adv = baselined_advantages(rewards, ids, base[:, :2], std_mode=self.cfg.std_mode, clip=self.cfg.adv_clip)
        if base.shape[1] == 3:  # Horvitz-Thompson weights of a screened or sampled batch
            adv = dataclasses.replace(adv, values=adv.values * base[:, 2].to(torch.float32))
        return adv

    def _plan(self, batch: ScoredBatch):
        """(advantages of this rank's rows, its kept rows, global kept x steps count, noised steps, metrics);
        the rows and steps are empty when there is nothing to train on."""
        adv = self.advantages(batch)
        keep = np.flatnonzero(~adv.zero_std_mask.numpy()) if self.cfg.drop_zero_std else np.arange(len(batch))
        metrics = {"zero_std_ratio": float(adv.zero_std_ratio), "trained_samples": int(len(keep))}
        steps = np.flatnonzero(batch.trajectory.noised.numpy()).tolist()
        if len(keep) == 0 or not steps:
            return None, None, 0, [], metrics
        offset = self.sync.shard_offset(batch.rows, len(batch))
        local = keep[(keep >= offset) & (keep < offset + batch.rows)] - offset  # this rank's kept rows
        return adv.values[offset:offset + batch.rows], local, len(keep) * len(steps), steps, metrics

    def step(self, batch: ScoredBatch, source: GradientSource | None = None) -> UpdateResult:
        """One update: an optimiser step per inner epoch. `source` computes the micro-batches'
        gradient sums elsewhere (one trainer rank only); None: every one here, in plan order."""
        if source is not None and self.sync.world_size != 1:
            raise ValueError("queue training runs on one trainer rank (the others are workers that pull)")
        adv, local, norm, steps, metrics = self._plan(batch)
        if not steps:
            return UpdateResult(metrics | {"skipped": 1.0})
        contributions = None
        for _ in range(self.cfg.inner_epochs):
            totals, contributions = self._accumulate(batch, adv, local, norm, steps, source)
            metrics |= self._apply(totals)
        return UpdateResult(metrics, contributions)

    def gradient(self, batch: ScoredBatch) -> dict[str, torch.Tensor]:
        """The loss gradient one update would clip and apply, by parameter name (after the
        data-parallel reduction; before clipping). Weights and optimiser state are left as they are;
        empty when the batch has nothing to train on (every group zero-std)."""
        adv, local, norm, steps, _ = self._plan(batch)
        if not steps:
            return {}
        self._accumulate(batch, adv, local, norm, steps)
        trained = {id(p) for p in self.params}
        grads = {name: p.grad.detach().clone() for name, p in self.policy.named_parameters()
                 if id(p) in trained and p.grad is not None}
        self.optimizer.zero_grad(set_to_none=True)
        return grads

    def _accumulate(self, batch: ScoredBatch, adv: torch.Tensor, local: np.ndarray, norm: int,
                    steps: list[int], source: GradientSource | None = None) -> tuple[dict, Contributions | None]:
        """Fresh gradients of the loss mean over kept samples and noised steps, reduced across
        ranks: (loss totals, who computed the micro-batches when `source` did)."""
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        plan = plan_micro_batches(local, steps, self.cfg.micro_batch_size)
        if source is not None:
            return self._from_source(source, UpdatePlan(batch, adv, norm, tuple(plan), self.cfg))
        chunks = len(plan) // len(steps)
        # FSDP: ranks run as many micro-steps; agreed before any of them, as the count is a collective too
        padding = self.sync.micro_batches(chunks) - chunks
        totals = dict.fromkeys(LOSS_TOTALS, 0.0)
        for mb in plan:
            for name, value in self.loss.backward(batch, adv, norm, mb).items():
                totals[name] += value
        for _ in range(padding):  # zero-weight micro-steps, so that every rank runs the same collectives
            for k in steps:
                (self.loss.micro_loss(batch, adv, np.arange(1), k).loss * 0.0).backward()
        self.sync.reduce_gradients(self.params)
        return totals, None

    def _from_source(self, source: GradientSource, plan: UpdatePlan) -> tuple[dict, Contributions]:
        """The update's gradient from the source's sums, into this trainer's own parameters."""
        out = source(plan)
        grads, totals = combine(out.sums, [mb.index for mb in plan.micro_batches], self.policy.device)
        trained = {id(p) for p in self.params}
        for name, p in self.policy.named_parameters():
            if id(p) in trained:
                p.grad = grads.get(name)
        return totals, out.contributions

    def _apply(self, totals: dict) -> dict:
        """Clip and take one optimiser step on the accumulated gradients; the step's metrics."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.optimizer.step()
        return self.sync.reduce_metrics(totals) | {"grad_norm": float(grad_norm)}

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
