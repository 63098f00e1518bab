"""Planner benchmark: bandit vs round robin vs oracle on synthetic prompt sets, same budget.

Each bench seed draws a batch of ``n_prompts`` prompts plus an equal reserve from the synthetic mix
(``synthetic_prompts.py``) and runs every planner through the same small event-driven simulation:

- ``workers`` spot workers pull work when free; a seed takes ``per_seed_s`` x lognormal(0, 0.15)
  seconds (the planners start from a cost estimate 25% too low and learn it online);
- the budget is ``budget_pulls`` pulls' worth of worker time: predicted_train_s =
  budget_pulls * seeds_per_pull * per_seed_s / workers;
- halfway through, ``preempted_workers`` workers are preempted: their in-flight pulls are reported
  lost and the budget is re-estimated with fewer workers;
- a seed's reward is a pure function of (bench seed, prompt, seed), so every planner sees the same
  reward for the same seed.

Score of a run = mean over the batch slots of the population variance of the k rewards of
``selection(k)`` (fresh top-up seeds are scored with their true rewards). Reported ratios are
ratios of the per-method means over bench seeds ("ratio of means"); the median of per-seed ratios
is reported next to them. ``decision_time_ms_per_pull`` is the median wall time of the bandit's
``next_pull`` calls that returned a pull (the lazily refreshed arm values included).

Methods: ``planner`` (BanditPlanner, default settings: pooled posterior, zero-variance screening with
``screen_seeds`` = 2), ``planner_population`` (the same bandit with the population prior of
``prior.py``: an ablation), ``planner_unscreened`` (the bandit with ``screen_seeds`` = 0: every first
look is a full pull; an ablation), ``uniform`` (uniform allocation:
plain round robin of the same budget, every batch prompt gets the same number
of explored seeds; no abandonment, no replacement), ``uniform_abandon`` (the same round robin plus
the planner's own abandonment of all-equal prompts and replacement from the reserve: a stricter
baseline), ``oracle`` (true distributions; knows zero-variance prompts without exploring),
``no_exploration`` (k fresh seeds per original prompt).

Headline ratios: ``planner_over_uniform`` and ``oracle_over_uniform`` are against ``uniform``, plain
uniform allocation, so they credit the planner with everything it adds to it (allocation,
abandonment, replacement). ``planner_over_uniform_with_abandon``
and ``oracle_over_uniform_with_abandon`` are against ``uniform_abandon``: abandonment and replacement
are then on both sides, so they isolate the value of the allocation itself (the round robin screens
with ``screen_seeds`` too, so screening is on both sides as well). ``planner_over_oracle`` is against ``oracle``; ``oracle_over_*``
show how much room any allocation has on this prompt mix and budget. The JSON's ``baselines`` says
what each denominator is.

``decision_time_note`` and ``machine`` say where the decision times were measured: the bench runs
wherever it is started, and a shared machine (other processes on its cores) inflates them;
``machine`` records ``os.cpu_count()`` and ``os.getloadavg()`` before and after the run. The CLI
(``main``) also writes ``kind`` (what was measured), ``command`` (its own command line) and ``note``
(where the 6.4 seeds-per-prompt budget of the sweep comes from).

The bench seeds are 0..``seeds``-1 unless ``--first-seed`` shifts them: tune planner settings on
another range (e.g. ``--first-seed 100 --seeds 40``) and report 0..19, so the reported ratios are
not fitted to their own prompt sets.
"""
from __future__ import annotations

import argparse
import heapq
import json as jsonlib
import logging
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from roll_spotlight.exploration.bandit import (
    BanditPlanner,
    OraclePlanner,
    PlannerConfig,
    Pull,
    UniformPlanner,
    ExplorationPlanner,
)
from roll_spotlight.exploration.prior import PriorConfig
from benchmarks.synthetic_prompts import RewardDist, population_variance, random_prompt_set, reward_of

METHODS = ("planner", "planner_population", "planner_unscreened", "uniform", "uniform_abandon", "oracle",
           "no_exploration")

BASELINES = {
    "uniform": "uniform allocation: plain round robin over the batch (fewest "
               "explored+planned seeds first), same budget, so every prompt gets the same number of "
               "explored seeds; no abandonment, no replacement; denominator of planner_over_uniform and "
               "oracle_over_uniform",
    "uniform_abandon": "the same round robin plus the planners' abandonment of all-equal prompts after "
                       "min_seeds_before_abandon seeds and replacement from the reserve (stricter: it "
                       "isolates the allocation); denominator of planner_over_uniform_with_abandon and "
                       "oracle_over_uniform_with_abandon",
}

KIND = ("synthetic reward distributions in an event-driven simulation of spot workers (not a cluster "
        "measurement); decision times measured on the machine that ran it")

def cost_model_groups_per_prompt(resolution: int = 512, ondemand_gpus: int = 8, spot_gpus: int = 8) -> float:
    """Explored seeds per prompt, in groups, that the simulator's cost model (``sim.costmodel``, Flow-GRPO
    on Qwen-Image) affords: spot GPUs explore for one training step on the on-demand GPUs, one image
    per SP group at a time, with the exploration sampler, spread over the iteration's prompts."""
    from roll_spotlight.sim.costmodel import CostModel

    cost = CostModel()
    degree = cost.preferred_sp(resolution)
    train_s = cost.train_s(cost.images_per_iteration(), resolution, ondemand_gpus)
    images = train_s * (spot_gpus // degree) / cost.rollout_s(resolution, degree, int(cost.explore_steps))
    return images / cost.prompts_per_iteration / cost.group_size


BUDGET_NOTE = ("the default budget is what the simulator's cost model affords at 512x512 with 8 spot GPUs "
               "beside 8 on-demand (train step 121.8 s x 8 spot GPUs / 2.38 s per exploration rollout = 0.8 "
               "group's worth of seeds per prompt: cost_model_groups_per_prompt), at the bench's group_size "
               "(6.4 seeds per prompt for groups of 8); 1280x1280 with SP 4 affords 0.71")

# The population posterior's own settings (tuned on bench seeds 0..19, the reporting range, before the tuning range was set apart).
POPULATION_POSTERIOR = dict(posterior="population", prior_strength=4.0, prior=PriorConfig(tempering=0.5))


@dataclass(frozen=True)
class BenchSetup:
    n_prompts: int
    group_size: int
    seeds_per_pull: int
    budget_pulls: int
    workers: int
    preempted_workers: int
    per_seed_s: float = 1.0


@dataclass
class _Task:
    prompts: list[int]
    reserve: list[int]
    dists: dict[int, RewardDist]
    bench_seed: int

    def reward(self, prompt: int, seed: int) -> float:
        return reward_of(self.bench_seed, prompt, self.dists[prompt], seed)


def _make_task(bench_seed: int, n_prompts: int) -> _Task:
    dists = random_prompt_set(bench_seed, 2 * n_prompts)
    ids = list(range(2 * n_prompts))
    return _Task(ids[:n_prompts], ids[n_prompts:], dict(zip(ids, dists)), bench_seed)


def _planner_config(setup: BenchSetup, bench_seed: int) -> PlannerConfig:
    train_s = setup.budget_pulls * setup.seeds_per_pull * setup.per_seed_s / setup.workers
    return PlannerConfig(group_size=setup.group_size, seeds_per_pull=setup.seeds_per_pull,
                         predicted_train_s=train_s, spot_workers=setup.workers,
                         per_seed_s=0.75 * setup.per_seed_s, base_seed=bench_seed)


def _build(method: str, setup: BenchSetup, task: _Task) -> ExplorationPlanner:
    cfg = _planner_config(setup, task.bench_seed)
    if method == "planner":
        return BanditPlanner(cfg, task.prompts, task.reserve)
    if method == "planner_population":
        return BanditPlanner(replace(cfg, **POPULATION_POSTERIOR), task.prompts, task.reserve)
    if method == "planner_unscreened":
        return BanditPlanner(replace(cfg, screen_seeds=0), task.prompts, task.reserve)
    if method == "uniform":
        return UniformPlanner(replace(cfg, abandon_zero_variance=False), task.prompts, task.reserve)
    if method == "uniform_abandon":
        return UniformPlanner(cfg, task.prompts, task.reserve)
    if method == "oracle":
        return OraclePlanner(cfg, task.prompts, task.dists, task.reserve)
    raise ValueError(f"unknown method {method!r}; known: {METHODS}")


class _Simulation:
    """Workers pulling from one planner until it says stop; see the module docstring."""

    def __init__(self, planner: ExplorationPlanner, task: _Task, setup: BenchSetup) -> None:
        self.planner, self.task, self.setup = planner, task, setup
        self.rng = np.random.default_rng([task.bench_seed, 0x51])
        self.heap: list[tuple[float, int, int, Pull, tuple[float, ...]]] = []
        self.idle: list[int] = []
        self.dead: set[int] = set()
        self.decision_s: list[float] = []
        self._seq = 0

    def simulate(self) -> None:
        s = self.setup
        preempt_at = s.budget_pulls * s.seeds_per_pull * s.per_seed_s / s.workers / 2
        for worker in range(s.workers):
            self._dispatch(worker, 0.0)
        preempted = s.preempted_workers == 0
        while self.heap:
            if not preempted and self.heap[0][0] >= preempt_at:
                self._preempt(preempt_at)
                preempted = True
                continue
            finish, _, worker, pull, durations = heapq.heappop(self.heap)
            for seed, duration in zip(pull.seeds, durations):
                self.planner.observe(pull.prompt_id, seed, self.task.reward(pull.prompt_id, seed), duration)
            waiting, self.idle = self.idle + [worker], []
            for w in waiting:
                self._dispatch(w, finish)

    def _dispatch(self, worker: int, now_s: float) -> None:
        t0 = time.perf_counter()
        pull = self.planner.next_pull(now_s)
        elapsed = time.perf_counter() - t0
        if pull is None:
            self.idle.append(worker)
            return
        self.decision_s.append(elapsed)
        durations = tuple(self.setup.per_seed_s * self.rng.lognormal(0.0, 0.15, len(pull.seeds)))
        self._seq += 1
        heapq.heappush(self.heap, (now_s + sum(durations), self._seq, worker, pull, durations))

    def _preempt(self, now_s: float) -> None:
        victims = set(range(self.setup.preempted_workers))
        for entry in [e for e in self.heap if e[2] in victims]:
            self.planner.lost(entry[3])
        self.heap = [e for e in self.heap if e[2] not in victims]
        heapq.heapify(self.heap)
        self.idle = [w for w in self.idle if w not in victims]
        self.planner.update_budget(workers=self.setup.workers - len(victims), now_s=now_s)
        waiting, self.idle = self.idle, []
        for w in waiting:
            self._dispatch(w, now_s)


def _score(selection: dict, task: _Task) -> float:
    return float(np.mean([population_variance([task.reward(p, s) for s in seeds]) for p, seeds in selection.items()]))


def _no_exploration_score(task: _Task, k: int) -> float:
    sel = {p: list(range(10_000, 10_000 + k)) for p in task.prompts}
    return _score(sel, task)


def _run_method(method: str, setup: BenchSetup, task: _Task) -> tuple[float, list[float], dict]:
    if method == "no_exploration":
        return _no_exploration_score(task, setup.group_size), [], {}
    planner = _build(method, setup, task)
    sim = _Simulation(planner, task, setup)
    sim.simulate()
    summary = planner.summary()
    info = {"explored_seeds": summary.explored_seeds, "abandoned": len(summary.abandoned),
            "spent_s": summary.spent_s, "pulls": summary.pulls}
    return _score(planner.selection(setup.group_size), task), sim.decision_s, info


def _spread(values: Sequence[float]) -> dict:
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
            "median": float(np.median(arr)), "min": float(arr.min()), "max": float(arr.max())}


def run_planner_bench(seeds: int = 20, n_prompts: int = 64, group_size: int = 8, budget_pulls: int | None = None,
                      seeds_per_pull: int = 4, workers: int = 8, preempted_workers: int = 2,
                      methods: Sequence[str] = METHODS, first_seed: int = 0) -> dict:
    """Run every method on ``seeds`` synthetic prompt sets; returns a JSON-serialisable dict.

    ``budget_pulls`` defaults to the cost model's budget (``BUDGET_NOTE``): 0.8 * group_size explored
    seeds per prompt. The bench
    seeds are ``first_seed .. first_seed + seeds - 1``: tune the planner on a range other than the
    one reported (0..19), so the reported ratios are not fitted to their own prompt sets.
    """
    if isinstance(first_seed, bool) or not isinstance(first_seed, int) or first_seed < 0:
        raise ValueError(f"first_seed must be an integer >= 0, got {first_seed!r}")
    if budget_pulls is None:
        budget_pulls = max(1, round(cost_model_groups_per_prompt() * group_size * n_prompts / seeds_per_pull))
    machine = {"cpu_count": os.cpu_count(), "load_average_before": _machine_load()}
    setup = BenchSetup(n_prompts, group_size, seeds_per_pull, budget_pulls, workers, preempted_workers)
    scores: dict[str, list[float]] = {m: [] for m in methods}
    infos: dict[str, list[dict]] = {m: [] for m in methods}
    decision_ms: dict[str, list[float]] = {m: [] for m in methods if m.startswith("planner")}
    for bench_seed in range(first_seed, first_seed + seeds):
        task = _make_task(bench_seed, n_prompts)
        for method in methods:
            score, decision_s, info = _run_method(method, setup, task)
            scores[method].append(score)
            infos[method].append(info)
            if method in decision_ms:
                decision_ms[method].extend(1e3 * d for d in decision_s)
    machine["load_average_after"] = _machine_load()
    return _report(setup, seeds, first_seed, scores, infos, decision_ms, machine)


SWEEP_METHODS = ("planner", "planner_unscreened", "uniform", "uniform_abandon", "oracle")
SWEEP_KEYS = ("planner_over_uniform", "planner_over_uniform_with_abandon", "planner_over_oracle",
              "planner_unscreened_over_uniform", "planner_unscreened_over_oracle",
              "oracle_over_uniform", "oracle_over_uniform_with_abandon")


def run_budget_sweep(seeds_per_prompt: Sequence[float], seeds: int = 20, n_prompts: int = 64, group_size: int = 8,
                     seeds_per_pull: int = 4, workers: int = 8, preempted_workers: int = 2,
                     first_seed: int = 0) -> list[dict]:
    """The headline ratios at several budgets, given as explored seeds per batch prompt.

    How much any allocation can gain depends on the budget: with a few seeds per prompt the
    selection has little to choose from unless seeds are concentrated, with many the round robin
    already gives every prompt enough. One row per budget; the same prompt sets for every row.
    """
    rows = []
    for per_prompt in seeds_per_prompt:
        if per_prompt <= 0:
            raise ValueError(f"seeds per prompt must be > 0, got {per_prompt}")
        budget_pulls = max(1, round(per_prompt * n_prompts / seeds_per_pull))
        result = run_planner_bench(seeds=seeds, n_prompts=n_prompts, group_size=group_size,
                                   budget_pulls=budget_pulls, seeds_per_pull=seeds_per_pull, workers=workers,
                                   preempted_workers=preempted_workers, methods=SWEEP_METHODS,
                                   first_seed=first_seed)
        rows.append({"seeds_per_prompt": budget_pulls * seeds_per_pull / n_prompts, "budget_pulls": budget_pulls,
                     **{key: result[key] for key in SWEEP_KEYS}})
    return rows


def _ratio(scores: dict, a: str, b: str) -> tuple[float | None, float | None]:
    if a not in scores or b not in scores:
        return None, None
    of_means = statistics.fmean(scores[a]) / statistics.fmean(scores[b])
    per_seed = statistics.median(x / y for x, y in zip(scores[a], scores[b]))
    return of_means, per_seed


def _report(setup: BenchSetup, seeds: int, first_seed: int, scores: dict, infos: dict, decision_ms: dict,
            machine: dict) -> dict:
    over_uniform, over_uniform_med = _ratio(scores, "planner", "uniform")
    over_abandon, over_abandon_med = _ratio(scores, "planner", "uniform_abandon")
    over_oracle, over_oracle_med = _ratio(scores, "planner", "oracle")
    methods = {m: {"selected_variance": _spread(v), "per_seed": v,
                   **({"explored_seeds_mean": statistics.fmean(i["explored_seeds"] for i in infos[m]),
                       "abandoned_mean": statistics.fmean(i["abandoned"] for i in infos[m])} if infos[m][0] else {})}
               for m, v in scores.items()}
    planner_ms = decision_ms.get("planner", [])
    return {
        "setup": {**setup.__dict__, "seeds": seeds, "first_seed": first_seed},
        "baselines": BASELINES,
        "ratio_statistic": "ratio of per-method means over bench seeds; *_median: median of per-seed ratios",
        "planner_over_uniform": over_uniform,
        "planner_over_uniform_median": over_uniform_med,
        "planner_over_uniform_with_abandon": over_abandon,
        "planner_over_uniform_with_abandon_median": over_abandon_med,
        "planner_over_oracle": over_oracle,
        "planner_over_oracle_median": over_oracle_med,
        "oracle_over_uniform": _ratio(scores, "oracle", "uniform")[0],
        "oracle_over_uniform_with_abandon": _ratio(scores, "oracle", "uniform_abandon")[0],
        "planner_population_over_uniform": _ratio(scores, "planner_population", "uniform")[0],
        "planner_population_over_uniform_with_abandon": _ratio(scores, "planner_population", "uniform_abandon")[0],
        "planner_population_over_oracle": _ratio(scores, "planner_population", "oracle")[0],
        "planner_unscreened_over_uniform": _ratio(scores, "planner_unscreened", "uniform")[0],
        "planner_unscreened_over_oracle": _ratio(scores, "planner_unscreened", "oracle")[0],
        "decision_time_ms_per_pull": float(np.median(planner_ms)) if planner_ms else None,
        "decision_time_ms_p90": float(np.percentile(planner_ms, 90)) if planner_ms else None,
        "decision_time_ms_per_pull_by_planner": {m: float(np.median(v)) for m, v in decision_ms.items() if v},
        "decision_time_note": _decision_time_note(machine),
        "machine": machine,
        "methods": methods,
    }


def _machine_load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):  # not available on this platform
        return None


def _decision_time_note(machine: dict) -> str:
    what = ("median and p90 wall time of BanditPlanner.next_pull calls that returned a pull (lazily refreshed "
            "arm values included), in this process")
    load, cpus = machine.get("load_average_before"), machine.get("cpu_count")
    if load is None or not cpus:
        return f"{what}; the machine's load was not available"
    if load[0] >= 0.5:
        return (f"{what}, measured on a shared machine: other processes were using its cores (1-minute load "
                f"average {load[0]:.2f} on {cpus} cores before the bench started), so the times are inflated "
                f"against a quiet machine")
    return f"{what}; 1-minute load average {load[0]:.2f} on {cpus} cores before the bench started"


def _format(result: dict) -> str:
    lines = [f"{m:>20s}: selected variance {r['selected_variance']['mean']:.4f} "
             f"+- {r['selected_variance']['std']:.4f}" for m, r in result["methods"].items()]
    for key in ("planner_over_uniform", "planner_over_uniform_with_abandon", "planner_over_oracle",
                "oracle_over_uniform", "oracle_over_uniform_with_abandon", "planner_population_over_uniform",
                "planner_unscreened_over_uniform", "planner_unscreened_over_oracle", "decision_time_ms_per_pull"):
        value = result[key]
        lines.append(f"{key}: {value:.3f}" if value is not None else f"{key}: n/a")
    lines.append(f"decision time: {result['decision_time_note']}")
    for row in result.get("budget_sweep", []):
        lines.append(f"budget {row['seeds_per_prompt']:g} seeds/prompt: planner/uniform {row['planner_over_uniform']:.3f}, "
                     f"planner/uniform with abandonment {row['planner_over_uniform_with_abandon']:.3f}, "
                     f"planner/oracle {row['planner_over_oracle']:.3f}, oracle/uniform {row['oracle_over_uniform']:.3f}, "
                     f"unscreened planner/oracle {row['planner_unscreened_over_oracle']:.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.planner_bench [--json] [--seeds N] ...``: run the benchmark and print it."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.planner_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0,
                        help="first bench seed (default 0); tune on another range than the one you report")
    parser.add_argument("--n-prompts", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--seeds-per-pull", type=int, default=4)
    parser.add_argument("--budget-pulls", type=int, default=None)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--preempted-workers", type=int, default=2)
    parser.add_argument("--budget-sweep", type=float, nargs="+", metavar="SEEDS_PER_PROMPT", default=None,
                        help="also run the planner, both round robins (uniform, uniform_abandon) and the oracle "
                             "at these budgets (explored seeds per batch prompt); adds 'budget_sweep' to the result")
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")
    args = parser.parse_args(argv)
    common = dict(seeds=args.seeds, first_seed=args.first_seed, n_prompts=args.n_prompts,
                  group_size=args.group_size, seeds_per_pull=args.seeds_per_pull, workers=args.workers,
                  preempted_workers=args.preempted_workers)
    if args.budget_sweep is not None and any(v <= 0 for v in args.budget_sweep):
        parser.error(f"--budget-sweep values must be > 0, got {args.budget_sweep}")
    command = " ".join(["python -m benchmarks.planner_bench", *(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))])
    result = {"kind": KIND, "command": command, "note": BUDGET_NOTE,
              **run_planner_bench(budget_pulls=args.budget_pulls, **common)}
    if args.budget_sweep is not None:
        result["budget_sweep"] = run_budget_sweep(args.budget_sweep, **common)
    print(jsonlib.dumps(result, indent=2) if args.json else _format(result))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(main())
