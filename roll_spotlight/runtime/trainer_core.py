"""The trainer's state and duties, independent of where it runs (in process or in a Ray actor).

Holds the policy, the optimiser (and reference, when KL is on), the validation set and the reward
used for validation. Rollout outputs arrive per request; they are stacked into one trajectory in
request-id order, so the update does not depend on which worker produced what.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch

from roll_spotlight.flow_grpo import sigma_schedule
from roll_spotlight.runtime.executor import stack_outputs
from roll_spotlight.training.config import RunConfig
from roll_spotlight.training.evaluate import Evaluation, evaluate
from roll_spotlight.training.grpo import FlowGRPOTrainer, ScoredBatch


class TrainerCore:
    def __init__(self, cfg: RunConfig, policy):
        from roll_spotlight.training.loop import build_reward_fn, strict_scorer
        from roll_spotlight.training.tasks import validation_set

        torch.manual_seed(cfg.seed)
        self.cfg, self.policy = cfg, policy
        self.trainer = FlowGRPOTrainer(policy, cfg.train)
        self.val = validation_set(cfg.task)
        self.reward_fn, self.strict_fn = build_reward_fn(cfg), strict_scorer()
        self.sigmas = sigma_schedule(cfg.sampling.num_steps, policy.image_seq_len)
        self.weight_version = 0
        self.ema = WeightAverage(policy, cfg.train.ema_decay) if cfg.train.ema_decay > 0 else None

    def train(self, outputs: list, prompts: list[str], group_ids: np.ndarray, rewards: np.ndarray) -> dict:
        s = self.cfg.sampling
        traj = stack_outputs(outputs, self.sigmas, s.noise_level, s.kind)
        metrics = self.trainer.step(ScoredBatch(traj, list(prompts), group_ids, rewards, s.noise_level, s.kind))
        self.weight_version += 1
        if self.ema is not None:
            self.ema.update(self.policy)
        return metrics

    def evaluate(self) -> Evaluation:
        """Validation of the policy, or of its weight average when `train.ema_decay` > 0 (rollouts
        always use the live weights; the average is what a run delivers)."""
        if self.ema is None:
            return evaluate(self.policy, self.val, self.reward_fn, self.cfg.sampling, self.strict_fn)
        with self.ema.swapped_into(self.policy):
            return evaluate(self.policy, self.val, self.reward_fn, self.cfg.sampling, self.strict_fn)

    def state_dict(self) -> dict:
        state = {"policy": self.policy.state_dict(), "trainer": self.trainer.state_dict(),
                 "weight_version": self.weight_version}
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.trainer.load_state_dict(state["trainer"])
        self.weight_version = int(state["weight_version"])
        if self.ema is not None:
            if "ema" not in state:
                raise KeyError("checkpoint has no weight average but train.ema_decay > 0")
            self.ema.load_state_dict(state["ema"])

    def save(self, path: Path) -> None:
        tmp = Path(path).with_suffix(".tmp")
        torch.save(self.state_dict(), tmp)
        tmp.replace(path)

    def load(self, path: Path) -> None:
        self.load_state_dict(torch.load(path, weights_only=True))


class WeightAverage:
    """Exponential moving average of the trainable parameters over training steps, decay
    min(decay, (1 + n) / (10 + n)) at update n (the usual warm-up, so the first steps are not
    dominated by the starting weights). Flow-GRPO evaluates such an average: single policy-gradient
    steps carry much noise, which the average cancels while it keeps their common drift."""

    def __init__(self, policy, decay: float) -> None:
        if not 0 < decay < 1:
            raise ValueError(f"train.ema_decay must be in (0, 1) for a weight average, got {decay!r}")
        self.decay, self.updates = decay, 0
        self.params = {name: p.detach().clone() for name, p in policy.named_parameters() if p.requires_grad}

    @torch.no_grad()
    def update(self, policy) -> None:
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for name, p in policy.named_parameters():
            if name in self.params:
                self.params[name].lerp_(p.detach(), 1.0 - d)
        self.updates += 1

    @contextlib.contextmanager
    def swapped_into(self, policy):
        """The average in `policy`'s parameters for the duration; the live weights come back after."""
        live = {name: p.detach().clone() for name, p in policy.named_parameters() if name in self.params}
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if name in self.params:
                    p.copy_(self.params[name])
        try:
            yield policy
        finally:
            with torch.no_grad():
                for name, p in policy.named_parameters():
                    if name in live:
                        p.copy_(live[name])

    def state_dict(self) -> dict:
        return {"updates": self.updates, "params": dict(self.params)}

    def load_state_dict(self, state: dict) -> None:
        if set(state["params"]) != set(self.params):
            raise KeyError("weight average does not match the policy's trainable parameters")
        self.updates = int(state["updates"])
        for name, value in state["params"].items():
            self.params[name].copy_(value)
