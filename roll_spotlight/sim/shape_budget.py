"""Two derived quantities of one simulated cluster shape: the exploration budget and the fair-cost baseline.

Exploration budget (per iteration). Spotlight explores on the spot GPUs while the on-demand GPUs
train, so the budget is the spot GPU-seconds of one training phase divided by the GPU-seconds one
explored seed costs:

    seeds per iteration = spot x train_s(ondemand) / (rollout_s(explore_steps, SP degree d, batch B) / B x d)

Halving the on-demand GPUs doubles ``train_s`` and so doubles the budget (the paper's 4 reserved +
8 spot shape against 8 + 8). The explored seed is priced at ``explore_steps`` denoising steps; the
cheap-exploration study (``benchmarks/explore_rank_vs_steps.py``) found that only full-step SDE
rewards rank the fresh ones, so the cost model explores at the full rollout schedule. It is an
upper bound: joins, regroups and preemptions eat into it; the simulated Spotlight run reports the
seeds it actually explored (``explored_seeds_per_iteration``).

Fair-cost baseline (``vanilla_fair_cost``). Vanilla Flow-GRPO given the dollars Spotlight spends:
the most on-demand GPUs that Spotlight's simulated USD per hour rents (one per spot system
compared: naive spot, Spotlight and Spotlight with spot training each get their own,
``fair_cost_baseline``),

    N_fair = floor(Spotlight USD per iteration / Spotlight s per iteration x 3600 / on-demand USD per GPU-hour)

i.e. the on-demand GPUs the same USD per iteration buys for the length of one Spotlight iteration
(never fewer than the equal-on-demand vanilla's). With spot GPUs held all the time this is
``ondemand + floor(spot x spot price / on-demand price)``. As in Flow-GRPO, every one of those GPUs
rolls out and then trains (data-parallel), so the extra dollars buy vanilla both faster rollouts
and faster training; its iterations to target are vanilla's (same algorithm, same batch).
Pure: no simulation runs here.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from roll_spotlight.sim.costmodel import CostModel

FAIR_COST_BASELINE = "vanilla_fair_cost"
FAIR_COST_DEFINITION = (
    "vanilla Flow-GRPO on N_fair on-demand GPUs, N_fair = floor(the spot system's simulated USD per hour / "
    "on-demand USD per GPU-hour): the on-demand GPUs that the dollars the system spends per iteration rent for "
    "one of its iterations (at least the equal-on-demand count; each spot system gets its own); every GPU rolls "
    "out and trains, as in Flow-GRPO; iterations to target are vanilla's")
_EPS = 1e-9


def exploration_budget(cost: CostModel, resolution: int, ondemand: int, spot: int, batch: int | None = None,
                       serial: bool = False) -> dict[str, Any]:
    """Explored seeds (``batch`` at a time) one iteration's training phase affords on ``spot`` GPUs."""
    if ondemand < 1 or spot < 0:
        raise ValueError(f"exploration_budget: ondemand must be >= 1 and spot >= 0, got {ondemand}, {spot}")
    degree = cost.preferred_sp(resolution)
    steps = int(cost.explore_steps)
    batch = 1 if serial else (cost.max_batch(resolution) if batch is None else batch)
    train_s = cost.train_s(cost.images_per_iteration(), resolution, ondemand)
    seed_gpu_s = cost.rollout_s(resolution, degree, steps, batch=batch, serial=serial) / batch * degree
    spot_gpu_s = spot * train_s
    seeds = spot_gpu_s / seed_gpu_s
    per_prompt = seeds / cost.prompts_per_iteration
    return {"kind": "simulated", "ondemand_gpus": ondemand, "spot_gpus": spot, "train_s": train_s,
            "spot_gpu_s_during_training": spot_gpu_s, "explore_steps": steps,
            "sampling_steps": int(cost.sampling_steps), "full_step": steps >= int(cost.sampling_steps),
            "sp_degree": degree, "batch": batch, "serial": serial, "gpu_s_per_explored_seed": seed_gpu_s,
            "seeds_per_iteration": seeds, "seeds_per_prompt": per_prompt,
            "pool_over_group": per_prompt / cost.group_size, "group_size": int(cost.group_size),
            "prompts_per_iteration": int(cost.prompts_per_iteration)}


def fair_cost_baseline(system: str) -> str:
    """The name of the fair-cost vanilla of spot baseline ``system`` in a simulation result:
    ``vanilla_fair_cost`` for Spotlight (the reference), ``vanilla_fair_cost:<system>`` otherwise."""
    return FAIR_COST_BASELINE if system == "spotlight" else f"{FAIR_COST_BASELINE}:{system}"


def fair_cost_ondemand(spotlight: Mapping[str, Any], ondemand_usd_gpu_h: float, minimum: int) -> int:
    """N_fair (see the module docstring) from a simulated Spotlight result's USD and s per iteration."""
    if not ondemand_usd_gpu_h > 0:
        raise ValueError(f"fair_cost_ondemand: on-demand price must be > 0, got {ondemand_usd_gpu_h!r}")
    seconds = spotlight["time_per_iteration_s"]
    if not seconds > 0:
        raise ValueError(f"fair_cost_ondemand: Spotlight's time per iteration must be > 0, got {seconds!r}")
    usd_per_hour = spotlight["cost_per_iteration_usd"] / seconds * 3600.0
    return max(int(minimum), math.floor(usd_per_hour / ondemand_usd_gpu_h + _EPS))
