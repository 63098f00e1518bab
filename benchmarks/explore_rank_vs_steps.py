"""Cheap exploration: how well do stale, few-step rewards rank the fresh full-step ones?

    python benchmarks/explore_rank_vs_steps.py --config configs/tiny_shapes.yaml --threads 1 \
        --out benchmarks/results/explore_rank_vs_steps.json

Spotlight explores the seeds of iteration t+1 with the weights of t (stale) and regenerates the
chosen ones with the weights of t+1 (fresh) under the rollouts' schedule (10 SDE steps, a 3-step
noise window). Exploration's budget is spot GPU-seconds, about proportional to denoising steps, so a
cheaper explorer affords a larger pool. Here, on the configs' cached base:

- stale policy: the base; fresh policy: the base after `--updates` Flow-GRPO updates, each on one
  iteration's batch (what a run does between exploring and regenerating);
- N prompts x M seeds, rewards of the fresh policy with the rollouts' schedule (the reference), and
  of the stale policy with each explore schedule (`runtime.exploration_round.explore_schedule`: SDE with
  the window rescaled, or ODE) at 2, 4, 6 and the full steps;
- per schedule: Spearman of stale against fresh rewards within each prompt (averaged over prompts
  where both sides vary), and what selection keeps: the fresh reward std of the group_size seeds
  the stale rewards pick (max variance) against a random group's (exact expectation) and the
  oracle's (picked by the fresh rewards themselves); wall time; relative cost steps/full; and the
  pool each affords in the budget of `--budget` full-cost seeds per prompt.

Measured on this machine's CPU; batched generation (the run's workers roll out one request at a
time: the last bits differ, the statistics do not).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import numpy as np


def _spec(schedule):
    from roll_spotlight.training.sampling import RolloutSpec

    window = None if schedule.kind == "ode" else schedule.window
    if window is not None and window == (0, schedule.num_steps):
        window = None
    return RolloutSpec(schedule.num_steps, schedule.noise_level, schedule.kind, window)


def _rewards(policy, reward, prompts, seeds, schedule, chunk: int = 64) -> tuple[np.ndarray, float]:
    from roll_spotlight.training.sampling import generate, to_uint8_images

    t0 = time.monotonic()
    spec, out = _spec(schedule), []
    for lo in range(0, len(prompts), chunk):
        traj = generate(policy, prompts[lo:lo + chunk], seeds[lo:lo + chunk], spec, keep_latents=False)
        out.append(np.asarray(reward(to_uint8_images(policy, traj.final), prompts[lo:lo + chunk]).rewards, float))
    return np.concatenate(out), time.monotonic() - t0


def fresh_policy(cfg, base, updates: int, first_iteration: int):
    """The base after `updates` Flow-GRPO updates, each on one iteration's batch (as a run does)."""
    from roll_spotlight.rewards.configured import configured_reward
    from roll_spotlight.runtime.coordinator import iteration_specs
    from roll_spotlight.training.grpo import FlowGRPOTrainer, ScoredBatch
    from roll_spotlight.training.prompt_pools import train_pool
    from roll_spotlight.training.sampling import generate, to_uint8_images, train_spec

    policy = copy.deepcopy(base)
    trainer, pool, reward = FlowGRPOTrainer(policy, cfg.train), train_pool(cfg.task), configured_reward(cfg.reward)
    g, rows = cfg.train.group_size, []
    for u in range(updates):
        specs = iteration_specs(cfg, pool, first_iteration + u, weight_version=u)
        prompts, seeds = [s.prompt for s in specs], [s.seed for s in specs]
        policy.eval()
        traj = generate(policy, prompts, seeds, train_spec(cfg.sampling, specs[0].schedule.window))
        rewards = np.asarray(reward(to_uint8_images(policy, traj.final), prompts).rewards, dtype=float)
        metrics = trainer.step(ScoredBatch(traj, prompts, np.repeat(np.arange(len(specs) // g), g), rewards,
                                           cfg.sampling.noise_level, cfg.sampling.kind)).metrics
        rows.append({"iteration": first_iteration + u, "reward_mean": float(rewards.mean()),
                     **{k: float(v) for k, v in metrics.items()}})
    policy.eval()
    return policy, rows


def selection_contrast(explore: np.ndarray, fresh: np.ndarray, k: int) -> dict:
    """Fresh reward std of the k seeds the explore rewards pick, per prompt, against random and oracle."""
    from roll_spotlight.exploration import random_subset_variance, select_max_variance

    picked = [float(np.std(f[select_max_variance(e, k)])) for e, f in zip(explore, fresh)]
    oracle = [float(np.std(f[select_max_variance(f, k)])) for f in fresh]
    random = [math.sqrt(random_subset_variance(f, k)) for f in fresh]
    p, o, r = (float(np.mean(x)) for x in (picked, oracle, random))
    return {"selected_fresh_std": p, "random_fresh_std": r, "oracle_fresh_std": o,
            "contrast_kept": (p - r) / (o - r) if o > r else math.nan}


def per_prompt_spearman(explore: np.ndarray, fresh: np.ndarray) -> dict:
    from roll_spotlight.exploration import spearman_rho

    rhos = np.array([spearman_rho(e, f) for e, f in zip(explore, fresh)])
    ok = rhos[~np.isnan(rhos)]
    return {"spearman": float(ok.mean()) if ok.size else math.nan,
            "spearman_se": float(ok.std(ddof=1) / math.sqrt(ok.size)) if ok.size > 1 else math.nan,
            "prompts_defined": int(ok.size), "per_prompt": [None if math.isnan(r) else float(r) for r in rhos]}


def run(config: str, overrides: list[str], prompts_n: int, seeds_m: int, steps: list[int], updates: int,
        budget: int) -> dict:
    import torch

    from roll_spotlight.config.run import ExplorationConfig, RunConfig
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.dispatch.requests import Schedule
    from roll_spotlight.rewards.configured import configured_reward
    from roll_spotlight.runtime.exploration_round import explore_schedule
    from roll_spotlight.training.pretrain import load_or_pretrain
    from roll_spotlight.training.prompt_pools import draw_seeds, train_pool
    from roll_spotlight.training.sampling import choose_window

    cfg = load_config(RunConfig, config, overrides)
    t_start = time.monotonic()
    base, meta = load_or_pretrain(cfg, progress=False)
    base.eval()
    torch.manual_seed(cfg.seed)
    fresh, train_rows = fresh_policy(cfg, base, updates, first_iteration=1)
    pool = train_pool(cfg.task)
    distinct = sorted(set(pool.texts))
    rng = np.random.default_rng([cfg.seed, 0xE5])
    chosen = [distinct[i] for i in rng.choice(len(distinct), size=min(prompts_n, len(distinct)), replace=False)]
    seeds = draw_seeds(len(chosen) * seeds_m, seed=cfg.seed, iteration=50_000)
    prompts = [p for p in chosen for _ in range(seeds_m)]
    reward = configured_reward(cfg.reward)
    s = cfg.sampling
    window = choose_window(s, seed=cfg.seed, iteration=1 + updates)
    lo, hi = window if window is not None else (0, s.num_steps)
    rollout = Schedule(s.num_steps, s.noise_level, s.kind, lo, hi)

    fresh_r, fresh_s = _rewards(fresh, reward, prompts, seeds, rollout)
    fresh_r = fresh_r.reshape(len(chosen), seeds_m)
    rows = []
    for kind in ("sde", "ode"):
        for n in steps:
            sched = explore_schedule(rollout, ExplorationConfig(num_steps=n, kind=kind))
            stale_r, wall = _rewards(base, reward, prompts, seeds, sched)
            stale_r = stale_r.reshape(len(chosen), seeds_m)
            cost = n / s.num_steps
            row = {"kind": kind, "num_steps": n, "window": list(sched.window) if kind == "sde" else None,
                   "relative_cost": cost, "wall_s": wall, "measured_relative_cost": wall / fresh_s,
                   "pool_in_budget": int(budget / cost), "stale_reward_mean": float(stale_r.mean()),
                   "all_equal_prompts": int(sum(r.max() == r.min() for r in stale_r)),
                   **per_prompt_spearman(stale_r, fresh_r),
                   **selection_contrast(stale_r, fresh_r, cfg.train.group_size)}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "per_prompt"}), flush=True)
    return {"kind": "measured", "config": config, "overrides": overrides, "policy": Path(meta["path"]).name,
            "reward": cfg.reward.name, "reward_kwargs": dict(cfg.reward.kwargs), "prompts": chosen,
            "seeds_per_prompt": seeds_m, "group_size": cfg.train.group_size, "updates": updates,
            "fresh_updates": train_rows, "fresh_schedule": {"num_steps": s.num_steps, "kind": s.kind,
                                                            "window": [lo, hi]},
            "fresh_reward_mean": float(fresh_r.mean()), "fresh_wall_s": fresh_s,
            "fresh_all_equal_prompts": int(sum(r.max() == r.min() for r in fresh_r)),
            "budget_full_cost_seeds": budget, "threads": torch.get_num_threads(),
            "wall_s": time.monotonic() - t_start, "rows": rows}


def table(result: dict) -> str:
    lines = ["| explore schedule | relative cost | pool in budget | Spearman (mean +- se, prompts) | "
             "fresh std of stale pick / random / oracle | contrast kept | wall s |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['kind'].upper()} {r['num_steps']} steps | {r['relative_cost']:.1f} | "
                     f"{r['pool_in_budget']} | {r['spearman']:.3f} +- {r['spearman_se']:.3f} ({r['prompts_defined']}) | "
                     f"{r['selected_fresh_std']:.3f} / {r['random_fresh_std']:.3f} / {r['oracle_fresh_std']:.3f} | "
                     f"{r['contrast_kept']:.2f} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny_shapes.yaml")
    p.add_argument("-o", "--override", action="append", default=[], help="key=value, as in spotlight train")
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--seeds", type=int, default=32)
    p.add_argument("--steps", type=int, nargs="+", default=[2, 4, 6, 10])
    p.add_argument("--updates", type=int, default=1)
    p.add_argument("--budget", type=int, default=32, help="full-cost explored seeds per prompt")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="benchmarks/results/explore_rank_vs_steps.json")
    args = p.parse_args(argv)
    from roll_spotlight.startup import set_threads

    set_threads(args.threads)
    result = run(args.config, args.override, args.prompts, args.seeds, args.steps, args.updates, args.budget)
    result["command"] = "python benchmarks/explore_rank_vs_steps.py " + " ".join(argv or __import__("sys").argv[1:])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
