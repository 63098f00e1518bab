"""Seconds of one transformer forward against its rows and image tokens, fitted to published points.

A forward on one GPU takes

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
model's constants are the fit's and that the curve reproduces every published ratio within
:data:`RATIO_TOLERANCE`.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

SOURCE_SGLANG = ("sgl-project/sglang PR #22183 (comment 2026-04-10, 'Batch Size Benchmark: Image Generation "
                 "Models on H200'): Qwen-Image-2512, 50 steps, guidance 4.0, torch.compile, no offload")
SOURCE_VERL_OMNI_BATCHING = ("verl-project/verl-omni@a1139bafffb5b9711f0a6b6edff8ecaa60bfff30 "
                             "docs/start/rollout_batching.md, 'Expected performance': Qwen-Image LoRA, 32x16, "
                             "512^2, serial (max_num_seqs=1) 226.4 s vs request-level (max_num_seqs=32) 107.9 s "
                             "generation per step")
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


def forward_s(flops, floor_s: float, rate: float, p: float):
    """Seconds of a forward of ``flops`` (scalar or array) on a GPU of this floor, rate and knee."""
    return (floor_s ** p + (np.asarray(flops, dtype=float) / rate) ** p) ** (1.0 / p)


@dataclass(frozen=True)
class Curve:
    """One serving stack's curve: ``floor_s`` (s), ``rate`` (FLOP/s at saturation), shape ``p``."""

    floor_s: float
    rate: float
    p: float

    def forward_s(self, flops: float) -> float:
        return float(forward_s(flops, self.floor_s, self.rate, self.p))


def fit_shape(row_flops: dict[int, float], points: tuple[StepPoint, ...] = SGLANG_H200,
              cfg_forwards: int = SGLANG_CFG_FORWARDS) -> Curve:
    """The curve (floor, rate and p) that best fits ``points`` in log time per step; ``row_flops``
    maps each resolution to the FLOPs of one row."""
    flops = np.array([pt.batch * row_flops[pt.resolution] for pt in points])
    measured = np.log([pt.step_s for pt in points])

    def loss(log_floor, log_rate, p):
        model = cfg_forwards * forward_s(flops, np.exp(log_floor)[..., None], np.exp(log_rate)[..., None],
                                         p[..., None])
        return ((np.log(model) - measured) ** 2).sum(axis=-1)

    log_floor, log_rate, p = _zoom_minimum(loss, [(math.log(1e-3), math.log(1.0)),
                                                  (math.log(1e13), math.log(1e16)), (1.0, 10.0)])
    return Curve(math.exp(log_floor), math.exp(log_rate), p)


def fit_stack(run: GenerationRun, row_flops: float, p: float) -> Curve:
    """The floor and rate with which knee ``p`` gives ``run``'s serial and batched times exactly."""
    return fit_floor_rate(run.serial_forward_s(), run.batched_forward_s(), run.batch, row_flops, p, run.source)


def fit_floor_rate(t1: float, tb: float, rows: int, row_flops: float, p: float, what: str = "measurement") -> Curve:
    """The curve through a forward of one row in ``t1`` s and of ``rows`` rows in ``tb`` s, knee ``p``:
    t1^p = floor^p + w^p and tb^p = floor^p + (rows w)^p, w = row_flops / rate."""
    w = ((tb ** p - t1 ** p) / (rows ** p - 1.0)) ** (1.0 / p) if tb > t1 and rows > 1 else 0.0
    if not (w > 0 and t1 > w):
        raise ValueError(f"{what}: {t1:.4f} s for one row and {tb:.4f} s for {rows} admit no floor with p={p:.2f}")
    return Curve((t1 ** p - w ** p) ** (1.0 / p), row_flops / w, p)


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
