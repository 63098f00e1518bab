"""Exponential moving averages of weights, one rule for pretraining (`pretrain.ema_decay`, the
saved base) and RL (`train.ema_decay`, what validation sees)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch


@torch.no_grad()
def lerp_average(averaged: Iterable[torch.Tensor], live: Iterable[torch.Tensor], decay: float, step: int) -> None:
    """averaged <- d * averaged + (1 - d) * live with d = min(decay, (1 + step) / (10 + step)), the
    usual warm-up of the decay, so early steps are not dominated by the starting weights."""
    d = min(decay, (1 + step) / (10 + step))
    for avg, p in zip(averaged, live):
        avg.lerp_(p.detach(), 1.0 - d)


class WeightAverage:
    """Moving average of a policy's trainable parameters over training steps (`lerp_average`).
    Flow-GRPO evaluates such an average: single policy-gradient steps carry much noise, which the
    average cancels while it keeps their common drift."""

    def __init__(self, policy, decay: float) -> None:
        if not 0 < decay < 1:
            raise ValueError(f"train.ema_decay must be in (0, 1) for a weight average, got {decay!r}")
        self.decay, self.updates = decay, 0
        self.params = {name: p.detach().clone() for name, p in policy.named_parameters() if p.requires_grad}

    def update(self, policy) -> None:
        live = dict(policy.named_parameters())
        lerp_average(self.params.values(), [live[name] for name in self.params], self.decay, self.updates)
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
