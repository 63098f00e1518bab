"""The published GPU measurements the cost model is calibrated against, and the simulator beside them.

    python -m benchmarks.sim_reference   # both rows, the calibrated train_mfu and the waterfall, as JSON

verl-omni's performance reference (``costmodel.SOURCE_VERL_OMNI_PERF``) publishes two Flow-GRPO runs
on Qwen-Image OCR of the same shape: 32 prompts x 16 images at 512x512, 10 denoising steps, SDE
window 2 (2 trained steps), ``ppo_micro_batch_size_per_gpu`` 16, actor, rollout and the Qwen3-VL-8B
reward colocated on 4 GPUs, parameter and optimizer offload, old log-probs recomputed before the
update (``bypass_mode`` False, the default): one more forward per trained step and CFG branch. They
differ in what each run did (:class:`PublishedRun`, from each script at the commit that published
its row):

========================  ======================================  =========================================
                          ``run_qwen_image_ocr_lora.sh``          ``run_qwen_image_ocr.sh``
========================  ======================================  =========================================
published step            420 s (2026-04-23)                      250 s (2026-05-14)
GPUs                      4 x H800                                4 x H200
trained weights           LoRA r=64 (0.42B)                       all 20.4B ("full")
true CFG                  4.0: 2 forwards per step                1.0: 1 forward per step ("non-CFG")
actor SP                  1                                       2 (Ulysses)
actor parameters          bf16 (``model_dtype``)                  fp32 (the FSDP default)
rollout engine            serial (no batching yet)                serial (no batching yet)
========================  ======================================  =========================================

Both rows predate verl-omni's rollout batching (step-wise 2026-06-15, request-level for Qwen-Image
2026-07-24), so both run the simulator's serial mode. The rollout curve is fitted to that recipe's
generation times (``benchmarks.batching_fit``: 226.4 s serial), the reward phase is 60 s in both
(420 s - the 360 s of the same LoRA run with its reward on a fifth GPU), and the terms a run adds around the
update are computed from bytes (:func:`between_phases_s`): the actor's parameters loaded from host
memory before the old-log-prob and the update phases and offloaded after each, the optimizer
states loaded before the update and offloaded after, the new weights synced into the rollout
engine (the adapters; all weights for full fine-tuning). One unknown is left, ``train_mfu``: the
LoRA row calibrates it (:func:`calibrate_train_mfu`), the full row is then a prediction
(:func:`both_rows`), and :func:`waterfall` moves the LoRA row onto the full one term by term.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from roll_spotlight.sim.baselines import get_baseline
from roll_spotlight.sim.costmodel import SOURCE_VERL_OMNI_PERF, VERL_OMNI, CostModel
from roll_spotlight.sim.spotfeed import fake_feed
from roll_spotlight.sim.system import ClusterSimulation, SimConfig
from roll_spotlight.sim.workload import Workload

TOLERANCE = 0.15   # each simulated row must land within this fraction of its published step time
# Assumption: host <-> GPU copies of offloaded tensors (PCIe Gen5 x16: 64 GB/s peak, pinned copies
# about half of it), the same on H800 and H200 hosts.
HOST_LINK_GB_S = 25.0
ADAM_STATE_BYTES = 8   # m and v in fp32 per trainable parameter (the optimizer states offloaded)
SCRIPTS = "examples/flowgrpo_trainer"   # the scripts' folder at the commits that published the rows


@dataclass(frozen=True)
class PublishedRun:
    """A published step time of vanilla Flow-GRPO on ``gpus`` x ``gpu`` for ``workload``, and what
    that run's step does beyond the simulator's vanilla: ``extra_forwards`` per trained step and CFG
    branch before the update, a ``reward_phase_s`` on the same GPUs after generation, the update of
    every weight (``full_update``: the backward computes weight gradients, +1 forward; the optimizer
    states and the synced weights are the whole model's) or of ``trainable_params`` adapters, Ulysses
    SP of degree ``actor_sp`` in the actor, its parameters held in ``param_bytes`` per parameter."""

    name: str
    source: str
    gpu: str
    gpus: int
    workload: Workload
    step_s: float
    reward_phase_s: float
    extra_forwards: float
    full_update: bool
    trainable_params: float
    actor_sp: int
    param_bytes: int


_SHAPE = dict(resolution=512, num_steps=10, trained_steps=2, group_size=16, prompts_per_iteration=32,
              micro_batch_images=16, params_b=20.0, num_layers=60, hidden_dim=3072, num_heads=24)

VERL_OMNI_LORA = PublishedRun(
    name="verl-omni Flow-GRPO LoRA, Qwen-Image OCR, 4 x H800 (run_qwen_image_ocr_lora.sh)",
    source=f"{SOURCE_VERL_OMNI_PERF}; settings: verl-project/verl-omni@1cf9aa941fa618123dd2855a0faafb9ca48d3a58 "
           f"{SCRIPTS}/run_qwen_image_ocr_lora.sh and verl_omni/trainer/config (the row's commit)",
    gpu="h800", gpus=4, workload=Workload(cfg_forwards=2, **_SHAPE),
    step_s=420.0, reward_phase_s=420.0 - 360.0, extra_forwards=1.0,
    full_update=False, trainable_params=424_673_280, actor_sp=1, param_bytes=2)

VERL_OMNI_FULL = PublishedRun(
    name="verl-omni Flow-GRPO full fine-tuning, non-CFG, Qwen-Image OCR, 4 x H200 (run_qwen_image_ocr.sh)",
    source=f"{VERL_OMNI} docs/algo/performance.md, FlowGRPO non-CFG full model on Qwen-Image OCR: 4 x H200, "
           "32 prompts x 16 images, 250 s per step; settings: verl-project/verl-omni@"
           f"c415a59167cda298647122ddf6ede60ae7e86f63 {SCRIPTS}/run_qwen_image_ocr.sh (the row's commit: "
           "true_cfg_scale 1.0, ACTOR_SP 2, 512x512, param and optimizer offload)",
    gpu="h200", gpus=4, workload=Workload(cfg_forwards=1, **_SHAPE),
    step_s=250.0, reward_phase_s=420.0 - 360.0, extra_forwards=1.0,
    full_update=True, trainable_params=20.43e9, actor_sp=2, param_bytes=4)

PUBLISHED_RUNS = (VERL_OMNI_LORA, VERL_OMNI_FULL)


def between_phases_s(run: PublishedRun, cost: CostModel) -> dict[str, float]:
    """Seconds ``run`` spends around its update besides compute (per GPU, all its GPUs at once):
    parameters in and out of host memory for the old-log-prob and the update phases, optimizer
    states in and out for the update, and the weight sync into the rollout engine."""
    params = cost.params_b * 1e9
    host = HOST_LINK_GB_S * 1e9 * run.gpus   # every GPU copies its own FSDP shard
    synced = cost.model_bytes() if run.full_update else 0.0   # the adapters are local_weight_sync_s
    return {"param_offload_s": 2 * 2 * params * run.param_bytes / host,
            "optimizer_offload_s": 2 * run.trainable_params * ADAM_STATE_BYTES / host,
            "weight_sync_s": cost.local_weight_sync_s + cost.nvlink_s(synced)}


def reference_model(run: PublishedRun = VERL_OMNI_LORA, base: CostModel | None = None) -> CostModel:
    """``base`` (default the calibrated constants) shaped as ``run``: its workload and GPU, its old-
    log-prob recompute (and weight gradients for a full update), its actor SP's efficiency, its
    colocated reward phase spread over its images on one reward worker, and the seconds around
    its update (:func:`between_phases_s`) in the weight-sync phase."""
    model = run.workload.cost_model(run.gpu, base)
    images = run.workload.prompts_per_iteration * run.workload.group_size
    multiplier = model.train_flops_multiplier + run.extra_forwards + (1.0 if run.full_update else 0.0)
    return model.with_overrides({"train_flops_multiplier": multiplier,
                                 "train_mfu": model.train_mfu * model.sp_efficiency(run.actor_sp),
                                 f"reward_s_{model.reward}": run.reward_phase_s / images, "reward_workers": 1,
                                 "local_weight_sync_s": sum(between_phases_s(run, model).values())},
                                source=f"published run: {run.name}")


def simulated_step_s(run: PublishedRun = VERL_OMNI_LORA, base: CostModel | None = None,
                     iterations: int = 2) -> dict:
    """The simulator's vanilla for ``run`` (:func:`reference_model` of ``base``), serial rollouts
    as that run's engine, SIMULATED, beside the published step time: ``{"published_s",
    "simulated_s", "ratio", "gap", "within_tolerance", "phases_s", "between_phases_s"}`` (the
    sync phase holds the seconds between phases)."""
    cost = reference_model(run, base)
    config = SimConfig(resolution=run.workload.resolution, ondemand=run.gpus, spot=0, iterations=iterations,
                       reward_colocated=True, serial_rollout=True)
    result = ClusterSimulation(get_baseline("vanilla"), config, cost, fake_feed([])).simulate()
    ratio = result.time_per_iteration_s / run.step_s
    return {"kind": "simulated", "run": run.name, "source": run.source, "published_s": run.step_s,
            "simulated_s": result.time_per_iteration_s, "ratio": ratio, "gap": ratio - 1.0,
            "within_tolerance": abs(ratio - 1.0) <= TOLERANCE,
            "phases_s": result.phases_per_iteration["wall_s"],
            "between_phases_s": between_phases_s(run, run.workload.cost_model(run.gpu, base))}


def both_rows(base: CostModel | None = None) -> list[dict]:
    """Each published run beside the simulator's vanilla of it (``base``: default the calibrated
    constants; the LoRA row calibrated ``train_mfu``, the full row is predicted)."""
    return [simulated_step_s(run, base) for run in PUBLISHED_RUNS]


def calibrate_train_mfu(run: PublishedRun = VERL_OMNI_LORA, base: CostModel | None = None) -> float:
    """The ``train_mfu`` with which the simulated vanilla of ``run`` takes its published step time
    (the rollout curve as ``base`` has it)."""
    base = base or CostModel()

    def step_s(mfu: float) -> float:
        return simulated_step_s(run, base.with_overrides({"train_mfu": mfu}, source="calibration probe"))["simulated_s"]

    t1, t2 = step_s(0.5), step_s(1.0)          # t = A / mfu + B
    a = (t1 - t2) / (1 / 0.5 - 1 / 1.0)
    b = t2 - a
    if not run.step_s > b:
        raise ValueError(f"{run.name}: the phases besides training take {b:.0f} s >= the published {run.step_s:.0f} s")
    return a / (run.step_s - b)


def waterfall(base: CostModel | None = None) -> list[dict]:
    """The LoRA row moved onto the full one a term at a time (SIMULATED): the GPU, CFG off, the
    full update (weight gradients, fp32 parameters and the whole model's optimizer states and
    weights moved), the actor's SP. ``[{"term", "simulated_s", "delta_s"}]``, first row the LoRA run."""
    lora, full = VERL_OMNI_LORA, VERL_OMNI_FULL
    steps = [("LoRA row as published (4 x H800, CFG, LoRA)", lora),
             ("GPU: H200 instead of H800", dataclasses.replace(lora, gpu=full.gpu)),
             ("CFG off: one forward per step", dataclasses.replace(lora, gpu=full.gpu, workload=full.workload)),
             ("full update: weight gradients, fp32 parameters, 20.4B optimizer states and weights moved",
              dataclasses.replace(full, actor_sp=lora.actor_sp)),
             ("actor Ulysses SP 2", full)]
    rows, previous = [], None
    for term, run in steps:
        simulated = simulated_step_s(run, base)["simulated_s"]
        rows.append({"term": term, "simulated_s": simulated,
                     "delta_s": 0.0 if previous is None else simulated - previous})
        previous = simulated
    return rows


def main(argv=None) -> int:
    print(json.dumps({"kind": "simulated", "rows": both_rows(), "calibrated_train_mfu": calibrate_train_mfu(),
                      "waterfall": waterfall()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
