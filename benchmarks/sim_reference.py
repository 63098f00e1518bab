"""The published GPU measurement the cost model is calibrated against, and the simulator beside it.

    python -m benchmarks.sim_reference   # the check and the calibrated train_mfu, as JSON (SIMULATED)

verl-omni's performance reference (``costmodel.SOURCE_VERL_OMNI_PERF``): Flow-GRPO with LoRA on
Qwen-Image OCR, ``examples/flowgrpo_trainer/qwen_image/run_qwen_image_ocr_lora.sh`` on 4 x H800,
420 s per step. Its settings, from the script and ``verl_omni/trainer/config/diffusion/rollout/
diffusion_rollout.yaml`` (same commit): 32 prompts x 16 images (``data.train_batch_size``,
``rollout.n``), 512x512 and 10 denoising steps (the rollout defaults), true CFG 4.0 (2 forwards per
step), ``sde_window_size`` 2 (2 trained steps), ``ppo_micro_batch_size_per_gpu`` 16, LoRA rank 64,
parameter and optimizer offload, actor, rollout and reward colocated on the same 4 GPUs. The
simulator expresses that run as its vanilla on 4 on-demand H800 of one node, no spot, with what
the reference's step does beyond this project's:

- before the update it recomputes the old log-probs (``algorithm.rollout_correction.bypass_mode``
  False, the default): one more forward per trained step and CFG branch, so
  ``train_flops_multiplier`` 3 + 1;
- its reward (Qwen3-VL-8B judging OCR) runs on the same GPUs after generation: 60 s per step, the
  difference between the published 420 s and the 360 s of the same run with the reward on a
  dedicated fifth GPU (``run_qwen_image_ocr_lora_async_reward.sh``), where it hides behind
  generation. The simulator scores colocated (``SimConfig.reward_colocated``) at 60 s / 512 images.

Its rollouts are serial: the run predates verl-omni's rollout batching (performance row of
2026-04-23; step-wise batching 2026-06-15, request-level batching for Qwen-Image 2026-07-24, whose
doc measures this recipe's generation at 226.4 s serial and 107.9 s batched). The rollout curve is
fitted to those two times (``sim.batching``), so the simulator's serial vanilla generates in
226.4 s; the published step time then calibrates the one unknown left, ``train_mfu``
(:func:`calibrate_train_mfu`): with no spot GPUs the simulated iteration is ``A / train_mfu + B``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from roll_spotlight.sim.baselines import get_baseline
from roll_spotlight.sim.costmodel import SOURCE_VERL_OMNI_PERF, VERL_OMNI, CostModel
from roll_spotlight.sim.spotfeed import fake_feed
from roll_spotlight.sim.system import ClusterSimulation, SimConfig
from roll_spotlight.sim.workload import Workload

TOLERANCE = 0.15   # the simulated vanilla must land within this fraction of the published step time


@dataclass(frozen=True)
class PublishedRun:
    """A published step time of vanilla Flow-GRPO on ``gpus`` x ``gpu`` for ``workload``, and what
    that run's step does beyond the simulator's vanilla (``extra_forwards`` per trained step and CFG
    branch before the update; a ``reward_phase_s`` on the same GPUs after generation)."""

    name: str
    source: str
    gpu: str
    gpus: int
    workload: Workload
    step_s: float
    reward_phase_s: float
    extra_forwards: float


VERL_OMNI_LORA = PublishedRun(
    name="verl-omni Flow-GRPO LoRA, Qwen-Image OCR, 4 x H800 (run_qwen_image_ocr_lora.sh)",
    source=f"{SOURCE_VERL_OMNI_PERF}; settings: {VERL_OMNI} "
           "examples/flowgrpo_trainer/qwen_image/run_qwen_image_ocr_lora.sh and "
           "verl_omni/trainer/config/diffusion/rollout/diffusion_rollout.yaml",
    gpu="h800", gpus=4,
    workload=Workload(resolution=512, num_steps=10, cfg_forwards=2, trained_steps=2, group_size=16,
                      prompts_per_iteration=32, micro_batch_images=16, params_b=20.0, num_layers=60,
                      hidden_dim=3072, num_heads=24),
    step_s=420.0, reward_phase_s=420.0 - 360.0, extra_forwards=1.0)


def reference_model(run: PublishedRun = VERL_OMNI_LORA, base: CostModel | None = None) -> CostModel:
    """``base`` (default the calibrated constants) shaped as ``run``: its workload and GPU, its old-log-
    prob recompute and its colocated reward phase spread over its images on one reward worker."""
    model = run.workload.cost_model(run.gpu, base)
    images = run.workload.prompts_per_iteration * run.workload.group_size
    return model.with_overrides({"train_flops_multiplier": model.train_flops_multiplier + run.extra_forwards,
                                 f"reward_s_{model.reward}": run.reward_phase_s / images, "reward_workers": 1},
                                source=f"published run: {run.name}")


def simulated_step_s(run: PublishedRun = VERL_OMNI_LORA, cost: CostModel | None = None,
                     iterations: int = 2) -> dict:
    """The simulator's vanilla for ``run`` (``cost`` default :func:`reference_model`), SIMULATED, beside
    the published step time: ``{"published_s", "simulated_s", "ratio", "within_tolerance", "phases_s"}``."""
    cost = cost or reference_model(run)
    config = SimConfig(resolution=run.workload.resolution, ondemand=run.gpus, spot=0, iterations=iterations,
                       reward_colocated=True, serial_rollout=True)   # as that run's engine
    result = ClusterSimulation(get_baseline("vanilla"), config, cost, fake_feed([])).simulate()
    ratio = result.time_per_iteration_s / run.step_s
    return {"kind": "simulated", "run": run.name, "source": run.source, "published_s": run.step_s,
            "simulated_s": result.time_per_iteration_s, "ratio": ratio,
            "within_tolerance": abs(ratio - 1.0) <= TOLERANCE,
            "phases_s": result.phases_per_iteration["wall_s"]}


def calibrate_train_mfu(run: PublishedRun = VERL_OMNI_LORA, base: CostModel | None = None) -> float:
    """The ``train_mfu`` with which the simulated vanilla of ``run`` takes its published step time
    (the rollout curve as ``base`` has it)."""
    model = reference_model(run, base)

    def step_s(mfu: float) -> float:
        probe = model.with_overrides({"train_mfu": mfu}, source="calibration probe")
        return simulated_step_s(run, probe)["simulated_s"]

    t1, t2 = step_s(0.5), step_s(1.0)          # t = A / mfu + B
    a = (t1 - t2) / (1 / 0.5 - 1 / 1.0)
    b = t2 - a
    if not run.step_s > b:
        raise ValueError(f"{run.name}: the phases besides training take {b:.0f} s >= the published {run.step_s:.0f} s")
    return a / (run.step_s - b)


def main(argv=None) -> int:
    print(json.dumps({"check": simulated_step_s(), "calibrated_train_mfu": calibrate_train_mfu()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
