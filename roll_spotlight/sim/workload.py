"""A run's shape as the cost model sees it, and the durations an emulated worker waits instead of computing.

:class:`Workload` is what a recipe fixes (resolution, denoising steps, CFG forwards, trained steps,
batch shape, transformer shape); ``cost_model(gpu)`` puts it into a :class:`CostModel` on one GPU
type. :class:`WorkerDurations` answers, for that workload, how long each compute phase and each
transfer of a worker takes: a denoising step of an SP group, a training micro-batch, a reward call,
loading the base weights, a weight publish or fetch, a gradient report, a peer weight copy. Pure:
no Ray, no runtime; a backend builds the workload from its RunConfig.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from roll_spotlight.sim.costmodel import CostModel

# Workload field -> the cost-model constants it sets (explorations use the rollout schedule).
_COST_KEYS = {"num_steps": ("sampling_steps", "explore_steps"), "cfg_forwards": ("cfg_forwards",),
              "trained_steps": ("trained_steps",), "group_size": ("group_size",),
              "prompts_per_iteration": ("prompts_per_iteration",),
              "micro_batch_images": ("train_micro_batch_images",), "params_b": ("params_b",),
              "num_layers": ("num_layers",), "hidden_dim": ("hidden_dim",), "num_heads": ("num_heads",),
              "text_tokens": ("text_tokens",)}


def cfg_forwards(guidance_scale: float | None) -> int:
    """Transformer forwards per denoising step: 2 with true CFG (guidance scale > 1), else 1."""
    return 2 if guidance_scale is not None and guidance_scale > 1.0 else 1


@dataclass(frozen=True)
class Workload:
    """One Flow-GRPO run's shape: images of ``resolution``^2 pixels, ``num_steps`` denoising steps of
    ``cfg_forwards`` forwards, ``trained_steps`` of them trained, ``prompts_per_iteration`` x
    ``group_size`` images per iteration, ``micro_batch_images`` per training micro-batch, on a
    transformer of ``params_b`` billion parameters (``num_layers`` x ``hidden_dim``, ``num_heads``)
    with ``text_tokens`` prompt tokens."""

    resolution: int
    num_steps: int
    cfg_forwards: int
    trained_steps: int
    group_size: int
    prompts_per_iteration: int
    micro_batch_images: int
    params_b: float
    num_layers: int
    hidden_dim: int
    num_heads: int
    text_tokens: int = 128

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"Workload.{f.name} must be a number > 0, got {value!r}")
            if f.name != "params_b" and not isinstance(value, int):
                raise ValueError(f"Workload.{f.name} must be an integer, got {value!r}")
        if self.cfg_forwards not in (1, 2):
            raise ValueError(f"Workload.cfg_forwards must be 1 or 2, got {self.cfg_forwards}")
        if self.trained_steps > self.num_steps:
            raise ValueError(f"Workload.trained_steps={self.trained_steps} exceeds num_steps={self.num_steps}")

    @classmethod
    def of(cls, cost: CostModel, resolution: int) -> Workload:
        """The workload a cost model describes at ``resolution`` (the defaults: Flow-GRPO's Qwen-Image)."""
        values = {name: cost.values[keys[0]] for name, keys in _COST_KEYS.items()}
        return cls(resolution=resolution, **values)

    def cost_model(self, gpu: str = "h100", base: CostModel | None = None) -> CostModel:
        """``base`` (default the calibrated constants) with this shape, on GPU ``gpu``."""
        overrides = {key: getattr(self, name) for name, keys in _COST_KEYS.items() for key in keys}
        return (base or CostModel()).with_overrides(overrides, source="workload").with_gpu(gpu)

    def durations(self, gpu: str = "h100", base: CostModel | None = None) -> WorkerDurations:
        return WorkerDurations(self, self.cost_model(gpu, base))


@dataclass(frozen=True)
class WorkerDurations:
    """Seconds each phase of a worker takes for ``workload`` under ``cost`` (simulated, not measured)."""

    workload: Workload
    cost: CostModel

    # ---- compute
    def denoise_step_s(self, degree: int = 1, cross_node: bool = False, batch: int = 1, *,
                       serial: bool = False) -> float:
        """One denoising step of ``batch`` images on an SP group of ``degree`` GPUs (``CostModel.step_s``)."""
        return self.cost.step_s(self.workload.resolution, degree, cross_node, batch, serial)

    def train_micro_batch_s(self, images: int | None = None) -> float:
        """A training micro-batch of ``images`` samples (default the workload's) at one trained step."""
        return self.cost.train_micro_batch_s(self.workload.resolution, images)

    def reward_s(self, images: int) -> float:
        """One reward call scoring ``images`` images on one reward worker."""
        return images * self.cost.reward_s()

    def optimizer_step_s(self) -> float:
        """The trainer's clip and optimizer step after the last gradient sum."""
        return self.cost.optimizer_step_s

    def weight_load_s(self) -> float:
        """The frozen base weights read from storage (a worker's start)."""
        return self.cost.weight_load_storage_s()

    # ---- transfers of a given size
    def publish_s(self, nbytes: float) -> float:
        """A weight version of ``nbytes`` from the trainer to a worker on another node (a fetch
        over the network takes the same)."""
        return self.cost.network_s(nbytes)

    def gradient_report_s(self, nbytes: float, over_network: bool, degree: int = 1) -> float:
        """A gradient sum of ``nbytes`` reaching the trainer (see ``CostModel.gradient_report_s``)."""
        return self.cost.gradient_report_s(over_network, degree, nbytes)

    def peer_copy_s(self, nbytes: float) -> float:
        """Weights of ``nbytes`` copied from a peer GPU on the same node over NVLink."""
        return self.cost.nvlink_s(nbytes)
