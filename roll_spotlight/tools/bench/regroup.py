"""Warm regroup vs cold restart of an SP group, measured on real processes (Ray actors, gloo).

What is measured, side by side in one run, medians over ``repeats``:

- **warm**: a degree-2 group of persistent workers loses one member (killed). Timed from the
  controller dropping the dead member to the end of one denoising step: a standby newcomer on the
  same node takes the weights of the surviving peer from the Ray object store, mapped from shared
  memory and used in place (the peer published them once per weight version, off the critical
  path; that publish is timed apart as ``publish_s``), the survivors and the newcomer build a
  fresh gloo group under a new generation prefix (file-store rendezvous), and the group runs one
  step of the rollout. The standby is a started process with its
  imports done and random weights, as on a node whose worker is kept alive, registered with the
  controller beforehand (``ElasticController.standby``: identity, device and its object-store
  connection prepared off the recovery path).
- **cold**: the group restarts from nothing: two new actor processes, ``import`` of torch and
  diffusers, ``from_pretrained`` of the weights from disk, group formation, one step. Ray may
  hand an idle pre-started Python worker to an actor, which saves the ``import ray`` part only.

The model is a real ``QwenImageTransformer2DModel`` with Qwen-Image's head_dim 128, rope axes and
text width, 8 heads and as many layers as ``model_mb`` asks (2 layers = 316 MB fp32). One step runs
on a tiny 4x4 token grid with 16 text tokens so compute does not drown the regroup cost on a CPU.
``sp_max_abs_diff`` compares the degree-2 step with the same step on one process (SP=1).

Both paths end with the same denoising step, which on these CPUs itself takes about 0.09 s
(each rank reads all 316 MB of weights for 32 tokens, memory-bound): work an uninterrupted rollout
does as well, not recovery. Each repeat, warm and cold, therefore runs that step once more on the
group it has just formed (``steady_step_s``), and the figures are the **time lost** to the
failure: end of the first step after recovery minus that steady step. So every cost recovery adds
is counted, including what the first step after a regroup or a cold start costs beyond a steady
one (lazy allocation, first touch of the mapped weights), and the shared compute is not.
``warm_regroup_median_s`` and ``cold_restart_median_s`` are the medians of those and ``speedup``
their ratio. ``warm_total_median_s`` / ``cold_total_median_s`` / ``speedup_including_step`` keep the
figures with the step in (capped near 55x here by the step alone).
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from roll_spotlight.elastic.model_spec import QwenModelSpec
from roll_spotlight.elastic.rollout import RolloutRequest, SPRolloutState, denoise, start_state
from roll_spotlight.loopback import set_loopback_env

log = logging.getLogger(__name__)

__all__ = ["main", "run_regroup_bench"]

def _request(spec: QwenModelSpec, num_steps: int = 2) -> RolloutRequest:
    rng = np.random.default_rng(0)
    embeds = rng.standard_normal((16, spec.joint_attention_dim)).astype(np.float32)
    return RolloutRequest("bench", seed=11, prompt_embeds=embeds, prompt_mask=np.ones(16), grid=(4, 4),
                          channels=spec.in_channels, num_steps=num_steps)


def _one_step_state(request: RolloutRequest) -> SPRolloutState:
    """A committed state one step before the end, so resuming runs exactly one step."""
    return replace(start_state(request), step=request.num_steps - 1)


def _controller(spec: QwenModelSpec):
    from roll_spotlight.elastic.controller import ControllerConfig, ElasticController

    return ElasticController(ControllerConfig(num_heads=spec.num_attention_heads, preferred_degree=2))


def _worker(spec: QwenModelSpec, gpu: int, **kwargs: Any):
    from roll_spotlight.elastic.workers import WorkerConfig, spawn_worker

    return spawn_worker(WorkerConfig(gpu=gpu, model=spec, node="bench-node", **kwargs))


def _publish_all(controller) -> float:
    import ray

    start = time.perf_counter()
    ray.get([controller.handles[m].publish_weights.remote() for m in controller.active()])
    return time.perf_counter() - start


def _steady_step_s(controller, request: RolloutRequest) -> float:
    """The same one-step resume once more on the group just formed: the step's own cost."""
    start = time.perf_counter()
    controller.run_rollout(request, state=_one_step_state(request))
    return time.perf_counter() - start


def _warm_once(controller, spec: QwenModelSpec, gpu: int, request: RolloutRequest) -> dict[str, float]:
    """Kill one member; time newcomer weights + regroup + one step, then that step once more."""
    import ray

    standby = _worker(replace(spec, init_seed=1000 + gpu), gpu)
    controller.standby([standby])  # started, imported and known to the controller: outside the timing
    victim = controller.active()[-1]
    ray.kill(controller.handles[victim])
    start = time.perf_counter()
    controller.remove([victim])
    controller.admit([standby])
    admitted = time.perf_counter()
    result = controller.run_rollout(request, state=_one_step_state(request))
    end = time.perf_counter()
    regroup_s = controller.last_regroup.seconds
    steady_s = _steady_step_s(controller, request)
    return {"total_s": end - start, "regroup_s": regroup_s, "transfer_s": admitted - start - regroup_s,
            "step_s": end - admitted, "steady_step_s": steady_s, "lost_s": end - start - steady_s,
            "latent": result.state.latent}


def _cold_once(spec: QwenModelSpec, pretrained: str, request: RolloutRequest) -> dict[str, float]:
    """Fresh processes: spawn, import, from_pretrained, group init, one step; then that step once more."""
    import ray

    start = time.perf_counter()
    controller = _controller(spec)
    workers = [_worker(spec, gpu, pretrained_dir=pretrained) for gpu in range(2)]
    controller.add_workers(workers)
    result = controller.run_rollout(request, state=_one_step_state(request))
    total = time.perf_counter() - start
    steady_s = _steady_step_s(controller, request)
    for worker in workers:
        ray.kill(worker)
    controller.close()
    return {"total_s": total, "steady_step_s": steady_s, "lost_s": total - steady_s,
            "latent": result.state.latent}


def _median(samples: list[dict[str, Any]], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def run_regroup_bench(repeats: int = 5, model_mb: float = 256.0) -> dict[str, Any]:
    """Measure warm regroup and cold restart; see the module docstring for what each includes."""
    if repeats < 1 or model_mb <= 0:
        raise ValueError(f"repeats={repeats} must be >= 1 and model_mb={model_mb} > 0")
    import ray

    set_loopback_env()
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        return _bench(repeats, QwenModelSpec.sized(model_mb))
    finally:
        if started_ray:
            ray.shutdown()


def _bench(repeats: int, spec: QwenModelSpec) -> dict[str, Any]:
    import ray

    request = _request(spec)
    with tempfile.TemporaryDirectory(prefix="spotlight-regroup-") as pretrained:
        controller = _controller(spec)
        pool = [_worker(spec, gpu) for gpu in range(2)]
        controller.add_workers(pool)
        ray.get(pool[0].save_pretrained.remote(pretrained))
        controller.regroup()
        publish_s = _publish_all(controller)
        warm = []
        for i in range(repeats):
            warm.append(_warm_once(controller, spec, 2 + i, request))
            _publish_all(controller)  # steady state: peers hold the current version
        for member in controller.active():
            ray.kill(controller.handles[member])
        controller.close()
        cold = [_cold_once(spec, pretrained, request) for _ in range(repeats)]
        reference = denoise(QwenModelSpec.load(pretrained), request, _one_step_state(request), request.num_steps)
    return _summary(spec, request, warm, cold, reference, publish_s)


def _summary(spec, request, warm, cold, reference, publish_s) -> dict[str, Any]:
    warm_lost_s, cold_lost_s = _median(warm, "lost_s"), _median(cold, "lost_s")
    warm_total_s, cold_total_s = _median(warm, "total_s"), _median(cold, "total_s")
    diffs = [float(np.abs(s["latent"] - reference.latent).max()) for s in warm + cold]
    return {
        "warm_regroup_median_s": warm_lost_s,
        "cold_restart_median_s": cold_lost_s,
        "speedup": cold_lost_s / warm_lost_s if warm_lost_s > 0 else None,
        "sp_max_abs_diff": max(diffs),
        "definition": "time lost to the failure: end of the first denoising step after recovery minus the "
                      "same step run once more on the recovered group (steady_step_s), median over repeats",
        "warm_parts_median_s": {k: _median(warm, k) for k in ("transfer_s", "regroup_s", "step_s")},
        "steady_step_median_s": _median(warm, "steady_step_s"),
        "cold_steady_step_median_s": _median(cold, "steady_step_s"),
        "warm_total_median_s": warm_total_s,
        "cold_total_median_s": cold_total_s,
        "speedup_including_step": cold_total_s / warm_total_s,
        "publish_s": publish_s,
        "warm_samples_s": [s["lost_s"] for s in warm],
        "cold_samples_s": [s["lost_s"] for s in cold],
        "warm_total_samples_s": [s["total_s"] for s in warm],
        "cold_total_samples_s": [s["total_s"] for s in cold],
        "repeats": len(warm),
        "model_mb": spec.approx_mb,
        "model": f"QwenImageTransformer2DModel layers={spec.num_layers} heads={spec.num_attention_heads}"
                 f"x{spec.attention_head_dim} joint_dim={spec.joint_attention_dim} fp32",
        "sp_degree": 2,
        "step_tokens": {"image": request.grid[0] * request.grid[1], "text": len(request.prompt_mask)},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``spotlight bench regroup [--repeats N] [--model-mb MB] [--json]``."""
    parser = argparse.ArgumentParser(prog="spotlight bench regroup", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model-mb", type=float, default=256.0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = run_regroup_bench(repeats=args.repeats, model_mb=args.model_mb)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"time lost: warm regroup {result['warm_regroup_median_s']:.3f}s, cold restart "
              f"{result['cold_restart_median_s']:.2f}s, speedup {result['speedup']:.1f}x, "
              f"SP max abs diff {result['sp_max_abs_diff']:.2e} ({result['model']}, {result['model_mb']:.0f} MB); "
              f"with the first step included: warm {result['warm_total_median_s']:.3f}s, cold "
              f"{result['cold_total_median_s']:.2f}s, {result['speedup_including_step']:.1f}x")
    return 0
