"""The Flow-GRPO update of a DiT policy from a batch of scored trajectories.

One `FlowGRPOTrainer.step` = one optimiser step per inner epoch over the whole batch (gradients
accumulated over micro-batches and noised steps). Probes on CPU found several Adam steps per
iteration at lr >= 1e-4 degrade validation quickly (DESIGN.md section 5b), hence the default.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from roll_spotlight.flow_grpo import group_advantages, policy_loss, recompute_log_probs
from roll_spotlight.training.config import GRPOConfig


@dataclass
class ScoredBatch:
    """Trajectories of one iteration with their prompts, group ids and rewards (sample order)."""

    trajectory: object
    prompts: list[str]
    group_ids: np.ndarray
    rewards: np.ndarray
    noise_level: float
    kind: str

    def __len__(self) -> int:
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


class FlowGRPOTrainer:
    """Owns the optimiser and the frozen reference copy of a policy."""

    def __init__(self, policy, cfg: GRPOConfig):
        self.policy = policy
        self.cfg = cfg
        self.params = trainable_parameters(policy, cfg.trainable)
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        self.reference = self._frozen_copy(policy) if cfg.kl_beta > 0 else None

    @staticmethod
    def _frozen_copy(policy):
        ref = copy.deepcopy(policy).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def advantages(self, batch: ScoredBatch):
        return group_advantages(torch.as_tensor(batch.rewards, dtype=torch.float32),
                                torch.as_tensor(batch.group_ids), std_mode=self.cfg.std_mode,
                                clip=self.cfg.adv_clip)

    def step(self, batch: ScoredBatch) -> dict:
        adv = self.advantages(batch)
        keep = np.flatnonzero(~adv.zero_std_mask.numpy()) if self.cfg.drop_zero_std else np.arange(len(batch))
        metrics = {"zero_std_ratio": float(adv.zero_std_ratio), "trained_samples": int(len(keep))}
        steps = np.flatnonzero(batch.trajectory.noised.numpy()).tolist()
        if len(keep) == 0 or not steps:
            return metrics | {"skipped": 1.0}
        for _ in range(self.cfg.inner_epochs):
            metrics |= self._epoch(batch, adv.values, keep, steps)
        return metrics

    def _epoch(self, batch: ScoredBatch, adv: torch.Tensor, keep: np.ndarray, steps: list[int]) -> dict:
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        chunks = [keep[i:i + self.cfg.micro_batch_size] for i in range(0, len(keep), self.cfg.micro_batch_size)]
        totals = {"loss": 0.0, "policy_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "ratio_mean": 0.0}
        for idx in chunks:
            for k in steps:
                out = self._micro_loss(batch, adv, idx, k)
                weight = len(idx) / (len(keep) * len(steps))  # mean over kept samples and steps
                (out.loss * weight).backward()
                for name in totals:
                    totals[name] += float(getattr(out, name).detach()) * weight
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.optimizer.step()
        return totals | {"grad_norm": float(grad_norm)}

    def _micro_loss(self, batch: ScoredBatch, adv: torch.Tensor, idx: np.ndarray, k: int):
        sub = batch.trajectory.select(torch.as_tensor(idx))
        prompts = [batch.prompts[i] for i in idx]
        cond = self.policy.encode_prompts(prompts)
        new = recompute_log_probs(lambda x, s: self.policy.velocity(x, s, cond), sub, k,
                                  noise_level=batch.noise_level, kind=batch.kind)
        ref_mean = None
        if self.reference is not None:
            with torch.no_grad():
                ref_cond = self.reference.encode_prompts(prompts)
                ref = recompute_log_probs(lambda x, s: self.reference.velocity(x, s, ref_cond), sub, k,
                                          noise_level=batch.noise_level, kind=batch.kind)
            ref_mean = ref.mean
        return policy_loss(new.log_prob, sub.log_probs[:, k], adv[torch.as_tensor(idx)],
                           clip_range=self.cfg.clip_range, kl_beta=self.cfg.kl_beta,
                           mean=new.mean, ref_mean=ref_mean, std=new.std)

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
