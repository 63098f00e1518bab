"""The rollout curve's constants, fitted to published points (PUBLISHED in, SIMULATED out).

    python -m benchmarks.batching_fit   # the fit and every published ratio beside it, as JSON

The cost model (``roll_spotlight.sim.costmodel.forward_time_s``) times a forward on one GPU as

    forward_s = (floor_s ** p + (flops / rate) ** p) ** (1 / p)

``flops`` is the work of all its rows (``CostModel.forward_flops`` per row: each token through its
stream, joint attention quadratic in image + text tokens), ``rate`` the GPU's peak times the MFU a
saturated forward reaches, ``floor_s`` the least a forward takes however little it computes (launches
and per-layer fixed costs), ``p`` how sharp the knee between the two is. One 512x512 image is below
the knee on an H100-class GPU, so batching pays; one 1024x1024 image is above it, so it does not.

Published points (PUBLISHED, sources in :data:`SGLANG_H200` and :data:`VERL_OMNI_GEN`):

- SGLang, Qwen-Image on one H200, time per denoising step at batch 1, 2, 3, 4, 8, 16 (512x512) and
  1, 2, 3 (1024x1024), true CFG 4.0. Assumption: a step is two forwards of ``batch`` rows (SGLang
  runs the CFG branches one after the other on one GPU). They fix the shape ``p`` (and SGLang's own
  floor and rate, :func:`fit_shape`).
- verl-omni, Flow-GRPO LoRA on Qwen-Image, 32 prompts x 16 images at 512x512, 10 steps, CFG 4.0 on
  4 GPUs (128 images each): generation 226.4 s serial and 107.9 s with request-level batching of up
  to 32 requests. With SGLang's ``p`` these two times give that stack's floor and rate exactly
  (:func:`fit_stack`); the cost model uses them (the stack its calibration run used).

The fit is pure numpy (a zooming grid search); ``tests/test_sim_batching.py`` checks that the cost
model's constants (``batch_knee_p``, ``rollout_floor_s``, ``rollout_mfu``) are the fit's and that the
curve reproduces every published ratio within :data:`RATIO_TOLERANCE`.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass

import numpy as np

from roll_spotlight.sim.costmodel import (SOURCE_VERL_OMNI_BATCHING, CostModel, fit_floor_rate,
                                          forward_time_s)
RATIO_TOLERANCE = 0.10   # every published throughput ratio is reproduced within this fraction
SGLANG_TEXT_TOKENS = 32  # assumption: SGLang's one-sentence prompt after Qwen-Image's template
SGLANG_CFG_FORWARDS = 2  # assumption: the two CFG branches one after the other (see the module docstring)


@dataclass(frozen=True)
class StepPoint:
    """A published time per denoising step of ``batch`` images at ``resolution`` (seconds)."""

    resolution: int
    batch: int
    step_s: float


# Time per step (s) per batch, as published (the ratios quoted in issue 54 are 2.77x at 4, 3.21x at 16
# and 1.02x at 1024 batch 2: batch x t(1) / t(batch)).
SGLANG_H200 = (StepPoint(512, 1, 0.167), StepPoint(512, 2, 0.183), StepPoint(512, 3, 0.186),
               StepPoint(512, 4, 0.240), StepPoint(512, 8, 0.425), StepPoint(512, 16, 0.832),
               StepPoint(1024, 1, 0.243), StepPoint(1024, 2, 0.474), StepPoint(1024, 3, 0.711))


@dataclass(frozen=True)
class GenerationRun:
    """A published generation phase: ``images_per_gpu`` images of ``steps`` steps, ``cfg_forwards``
    forwards each, run serially (one row per forward) in ``serial_s`` and in batches of up to
    ``batch`` rows in ``batched_s``."""

    source: str
    gpu: str
    resolution: int
    images_per_gpu: int
    steps: int
    cfg_forwards: int
    batch: int
    serial_s: float
    batched_s: float

    def serial_forward_s(self) -> float:
        return self.serial_s / (self.images_per_gpu * self.steps * self.cfg_forwards)

    def batched_forward_s(self) -> float:
        forwards = math.ceil(self.images_per_gpu / self.batch) * self.steps * self.cfg_forwards
        return self.batched_s / forwards


# Assumption: the run's GPUs are the 4 x H800 of verl-omni's performance reference for this recipe.
VERL_OMNI_GEN = GenerationRun(SOURCE_VERL_OMNI_BATCHING, "h800", 512, images_per_gpu=32 * 16 // 4, steps=10,
                              cfg_forwards=2, batch=32, serial_s=226.4, batched_s=107.9)


@dataclass(frozen=True)
class Curve:
    """One serving stack's curve: ``floor_s`` (s), ``rate`` (FLOP/s at saturation), shape ``p``."""

    floor_s: float
    rate: float
    p: float

    def forward_s(self, flops: float) -> float:
        return float(forward_time_s(flops, self.floor_s, self.rate, self.p))


def fit_shape(row_flops: dict[int, float], points: tuple[StepPoint, ...] = SGLANG_H200,
              cfg_forwards: int = SGLANG_CFG_FORWARDS) -> Curve:
    """The curve (floor, rate and p) that best fits ``points`` in log time per step; ``row_flops``
    maps each resolution to the FLOPs of one row."""
    flops = np.array([pt.batch * row_flops[pt.resolution] for pt in points])
    measured = np.log([pt.step_s for pt in points])

    def loss(log_floor, log_rate, p):
        model = cfg_forwards * forward_time_s(flops, np.exp(log_floor)[..., None], np.exp(log_rate)[..., None],
                                              p[..., None])
        return ((np.log(model) - measured) ** 2).sum(axis=-1)

    log_floor, log_rate, p = _zoom_minimum(loss, [(math.log(1e-3), math.log(1.0)),
                                                  (math.log(1e13), math.log(1e16)), (1.0, 10.0)])
    return Curve(math.exp(log_floor), math.exp(log_rate), p)


def fit_stack(run: GenerationRun, row_flops: float, p: float) -> Curve:
    """The floor and rate with which knee ``p`` gives ``run``'s serial and batched times exactly."""
    found = fit_floor_rate(run.serial_forward_s(), run.batched_forward_s(), run.batch, row_flops, p)
    if found is None:
        raise ValueError(f"{run.source}: {run.serial_forward_s():.4f} s for one row and "
                         f"{run.batched_forward_s():.4f} s for {run.batch} admit no floor with p={p:.2f}")
    return Curve(*found, p)


def _zoom_minimum(loss, bounds: list[tuple[float, float]], points: int = 41, levels: int = 14) -> tuple:
    """Grid search on ``bounds``, then on a grid half as wide around the best point, ``levels`` times."""
    best = None
    for _ in range(levels):
        axes = [np.linspace(lo, hi, points) for lo, hi in bounds]
        values = loss(*np.meshgrid(*axes, indexing="ij"))
        index = np.unravel_index(np.argmin(values), values.shape)
        best = tuple(float(axis[i]) for axis, i in zip(axes, index))
        bounds = [(b - (hi - lo) / 4, b + (hi - lo) / 4) for (lo, hi), b in zip(bounds, best)]
    return best


def throughput_ratio(curve: Curve, row_flops: float, batch: int) -> float:
    """Images per second at ``batch`` over batch 1 when every forward holds ``batch`` rows."""
    return batch * curve.forward_s(row_flops) / curve.forward_s(batch * row_flops)


def reproduction(shape: Curve, stack: Curve, row_flops: dict[int, float], stack_row_flops: float) -> list[dict]:
    """Every published ratio beside the fitted curve's (the SGLang points on SGLang's fitted curve,
    verl-omni's on its stack's; ``row_flops`` per resolution with SGLang's prompt, ``stack_row_flops``
    one 512x512 row with the cost model's): ``[{"source", "resolution", "batch", "published", "fitted",
    "error"}]``."""
    rows = []
    for res, group in itertools.groupby(SGLANG_H200, key=lambda pt: pt.resolution):
        group = list(group)
        base = next(pt for pt in group if pt.batch == 1)
        for pt in group:
            if pt.batch > 1:
                published = pt.batch * base.step_s / pt.step_s
                rows.append(_row("SGLang H200", res, pt.batch, published,
                                 throughput_ratio(shape, row_flops[res], pt.batch)))
    run, flops = VERL_OMNI_GEN, stack_row_flops
    fitted = (run.images_per_gpu * stack.forward_s(flops)
              / (math.ceil(run.images_per_gpu / run.batch) * stack.forward_s(run.batch * flops)))
    rows.append(_row("verl-omni (generation phase)", run.resolution, run.batch, run.serial_s / run.batched_s, fitted))
    return rows


def _row(source: str, resolution: int, batch: int, published: float, fitted: float) -> dict:
    return {"source": source, "resolution": resolution, "batch": batch, "published": published,
            "fitted": fitted, "error": fitted / published - 1.0}


def fit(cost: CostModel | None = None) -> dict:
    """The knee (SGLang's points), the cost model's stack (verl-omni's two times) and every published
    ratio beside the fitted curve's, as the cost model's FLOP counter sees each row."""
    cost = cost or CostModel()
    sglang = cost.with_overrides({"text_tokens": SGLANG_TEXT_TOKENS})
    row_flops = {res: sglang.forward_flops(res) for res in (512, 1024)}
    shape = fit_shape(row_flops)
    stack = fit_stack(VERL_OMNI_GEN, cost.forward_flops(512), shape.p)
    peak = cost.gpu_peak_tflops * 1e12
    return {"kind": "published vs fitted", "knee_p": shape.p,
            "sglang_h200": {"floor_s": shape.floor_s, "mfu": shape.rate / peak},
            "verl_omni_h800": {"floor_s": stack.floor_s, "mfu": stack.rate / peak},
            "ratios": reproduction(shape, stack, row_flops, cost.forward_flops(512))}


def main(argv=None) -> int:
    print(json.dumps(fit(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
