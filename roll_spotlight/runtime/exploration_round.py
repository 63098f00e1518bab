"""One round of seed exploration for a batch of prompts, driven by the planner.

The planner spends a budget of explored seeds (`seeds_per_prompt` x prompts); each decision is one
pull (`seeds_per_pull` seeds of one prompt), issued lazily when the backend can take it, so an
interrupted round strands no planned work. Costs are counted in seeds (one unit per explored seed),
which makes the allocation, and hence a run, deterministic on the in-process backend; on Ray the
round also ends when the training step ends (exploration must stay off the critical path).

    prompts of t+1 --planner.next_pull--> explore requests (weight version t, kind EXPLORE)
          ^                                        |
          +----- observe(reward) <-- reward <------+      ... until budget or training ends
    selection: per prompt, group_size explored seeds (`exploration.selection`: max variance, or
               top k/2 + bottom k/2)

Explore requests follow `explore_schedule`: the rollouts' schedule unless `exploration.num_steps`
or `exploration.kind` make them cheaper. `pool_baseline` gives a prompt's stale pool statistics
(`exploration.baseline: pool`) and `contrast` what the selection bought over random subsets of the
pools (`exploration.adaptive`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from roll_spotlight.dispatch.requests import RequestKind, RequestSpec, Schedule
from roll_spotlight.exploration import BanditPlanner, PlannerConfig, RoundContrast, UniformPlanner, round_contrast
from roll_spotlight.exploration.select import pps_inclusion
from roll_spotlight.config.run import ExplorationConfig

PLANNERS = {"bandit": BanditPlanner, "uniform": UniformPlanner}


@dataclass(frozen=True)
class Explored:
    reward: float
    output: object  # RolloutOutput under the exploring weight version


def explore_schedule(schedule: Schedule, cfg: ExplorationConfig) -> Schedule:
    """The schedule of explore requests: `schedule` (the rollouts') itself by default; with
    `exploration.num_steps` its SDE window rescaled to that many steps (at least one noised step
    when it had one), with `exploration.kind: ode` no noise at all."""
    steps = schedule.num_steps if cfg.num_steps is None else int(cfg.num_steps)
    if cfg.kind == "ode":
        return Schedule(steps, schedule.noise_level, "ode", 0, 0)
    if steps == schedule.num_steps:
        return schedule
    if schedule.window_end is None and schedule.window_start == 0:
        return dataclasses.replace(schedule, num_steps=steps)
    lo, hi = schedule.window
    ratio = steps / schedule.num_steps
    start = min(steps - 1, int(round(lo * ratio)))
    end = min(steps, max(start + (1 if hi > lo else 0), int(round(hi * ratio))))
    return Schedule(steps, schedule.noise_level, schedule.kind, start, end)


class _Pools:
    """Statistics of a round's explored rewards (shared by live and resumed rounds)."""

    explored: dict

    def pool(self, slot: int) -> list[float]:
        return [e.reward for (s, _), e in sorted(self.explored.items()) if s == slot]

    def pool_baseline(self, slot: int) -> tuple[float, float]:
        """(mean, population std) of every explored stale reward of the prompt; NaNs when none."""
        rewards = self.pool(slot)
        return (float(np.mean(rewards)), float(np.std(rewards))) if rewards else (math.nan, math.nan)

    def seed_weight(self, slot: int, seed: int, group_size: int) -> float:
        """`exploration.unbiased`: k / (n pi) for a seed `select_pps` chose from a pool of n >= k
        (Horvitz-Thompson); 1.0 for a seed of a group that had no choice (n <= k, or a fresh seed)."""
        keys = sorted(k for k in self.explored if k[0] == slot)
        rewards = [self.explored[key].reward for key in keys]
        if len(rewards) <= group_size or (slot, seed) not in self.explored:
            return 1.0
        pi = pps_inclusion(rewards, group_size)[keys.index((slot, seed))]
        return group_size / (len(rewards) * float(pi))

    def contrast(self, group_size: int) -> RoundContrast:
        """What the selection bought over random subsets of each prompt's pool (`exploration.adaptive`)."""
        selection = self.selection()
        pools = {slot: self.pool(slot) for slot in selection}
        chosen = {slot: [self.explored[(slot, s)].reward for s in seeds if (slot, s) in self.explored]
                  for slot, seeds in selection.items()}
        return round_contrast(pools, chosen, group_size)


class ExplorationRound(_Pools):
    def __init__(self, cfg: ExplorationConfig, group_size: int, prompts: list[tuple[int, str]],
                 schedule: Schedule, weight_version: int, iteration: int, run_seed: int,
                 seeds_per_prompt: int | None = None):
        """`seeds_per_prompt` overrides the configured budget (the adaptive controller's)."""
        budget = float((cfg.seeds_per_prompt if seeds_per_prompt is None else seeds_per_prompt) * len(prompts))
        planner_cfg = PlannerConfig(group_size=group_size, seeds_per_pull=cfg.seeds_per_pull,
                                    min_seeds_before_abandon=cfg.min_seeds_before_abandon,
                                    screen_seeds=cfg.screen_seeds,
                                    replace_abandoned=False, predicted_train_s=budget, spot_workers=1,
                                    per_seed_s=1.0, cost_ewma=1.0, base_seed=_mix(run_seed, iteration),
                                    selection=cfg.selection)
        self.planner = PLANNERS[cfg.planner](planner_cfg, list(range(len(prompts))))
        self.prompts, self.group_size = prompts, group_size
        self.schedule = schedule if schedule is None else explore_schedule(schedule, cfg)
        self.weight_version, self.iteration = weight_version, iteration
        self.explored: dict[tuple[int, int], Explored] = {}

    def spec(self, slot: int, seed: int) -> RequestSpec:
        pid, text = self.prompts[slot]
        return RequestSpec(prompt_id=pid, prompt=text, seed=int(seed), schedule=self.schedule,
                           weight_version=self.weight_version, kind=RequestKind.EXPLORE, iteration=self.iteration)

    def explore(self, backend, keep_going: Callable[[], bool] = lambda: True) -> int:
        """Explore until the budget is spent or `keep_going()` is false; returns seeds explored."""
        explored = 0
        while keep_going() and (pull := self.planner.next_pull(0.0)) is not None:
            specs = [self.spec(pull.prompt_id, s) for s in pull.seeds]
            outputs = backend.explore(specs)
            rewards = backend.score(np.stack([o.image for o in outputs]), [s.prompt for s in specs]).rewards
            for seed, reward, out in zip(pull.seeds, rewards, outputs):
                self.planner.observe(pull.prompt_id, seed, float(reward), 1.0)
                self.explored[(pull.prompt_id, seed)] = Explored(float(reward), out)
            explored += len(specs)
        return explored

    def selection(self) -> dict[int, list[int]]:
        """Per prompt slot, the seeds to train on (max-variance subset of the explored seeds)."""
        return {int(slot): [int(s) for s in seeds] for slot, seeds in self.planner.selection(self.group_size).items()}

    def stale_rewards(self, slot: int, seeds: list[int]) -> list[float | None]:
        return [self.explored[(slot, s)].reward if (slot, s) in self.explored else None for s in seeds]


def _mix(seed: int, iteration: int) -> int:
    return (seed * 1_000_003 + iteration * 7919 + 0x51) % (2**31 - 1)


class ResumedRound(_Pools):
    """A finished round restored from a checkpoint: its selection and explored rewards only."""

    def __init__(self, state: dict):
        self._selection = {int(k): list(v) for k, v in state["selection"].items()}
        self.iteration = int(state.get("iteration", -1))  # -1: written before rounds recorded it
        self.explored = {tuple(int(x) for x in key.split(":")): Explored(r, None)
                         for key, r in state["rewards"].items()}

    def selection(self) -> dict[int, list[int]]:
        return self._selection


def round_state(rnd) -> dict:
    """Plain-data form of a finished round (what a checkpoint needs to resume exactly)."""
    return {"selection": {str(k): v for k, v in rnd.selection().items()}, "iteration": rnd.iteration,
            "rewards": {f"{slot}:{seed}": e.reward for (slot, seed), e in rnd.explored.items()}}
