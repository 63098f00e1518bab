"""Iterations to a target validation score on the tiny task, measured under a wall-clock budget.

    python -m benchmarks.convergence --seeds 0 1 2 -o max_steps=40 --target 0.55

Three settings share the base model and the validation pairs (``SETTINGS``; the configs differ
only in their exploration keys). In the suite each training run is a ``spotlight train``
subprocess with a timeout, so a run that is still going when its share of the budget is spent is
stopped and its curve is read back from ``metrics.jsonl``: a run that did not reach the target by
then is *censored* (we know only that it needs more iterations than it ran), never extrapolated.

Estimates across seeds (:class:`IterationsEstimate`): each run contributes its iterations to the
target, or its horizon (last evaluated iteration) when it did not reach it; a censored run is known
only to need more than its horizon. The median of those values is *exact* when at least
``n // 2 + 1`` of the ``n`` runs reached the target no later than the smallest censored horizon
(every median position is then held by a known value below every censored one; for even ``n`` both
middle values are), and a *lower bound* otherwise (replacing a censored run by its horizon can only
lower the median). Example: reached at 6, 10, 10, 10 and two censored at 10 -> median exactly 10;
reached at 6, 6, 10 and three censored at 10 -> median >= 10.

Run lifecycle (one training run)::

    queued -> running --exit 0--> finished
                      --timeout--> stopped (curve read up to the last evaluation; censored)
                      --exit !=0--> failed (kept in the record with its stderr tail)
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

log = logging.getLogger(__name__)

SETTINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "vanilla": ("configs/tiny_shapes.yaml", ()),
    "fresh": ("configs/tiny_shapes_spotlight.yaml", ("exploration.mode=fresh",)),
    "spotlight": ("configs/tiny_shapes_spotlight.yaml", ()),
}
# Which simulated baseline each measured setting stands for (naive_spot explores nothing and
# spotlight_train computes vanilla's update: both take vanilla's iterations).
SIM_BASELINE_OF: dict[str, str] = {"vanilla": "vanilla", "fresh": "explore_critical", "spotlight": "spotlight"}
SETTING_OF_BASELINE: dict[str, str] = {"vanilla": "vanilla", "explore_critical": "fresh",
                                       "naive_spot": "vanilla", "spotlight": "spotlight",
                                       "spotlight_train": "vanilla"}

# CI-sized runs: a 2-step pretrain, 2 prompts x 2 seeds, 2 iterations evaluated after each.
SMOKE_OVERRIDES: tuple[str, ...] = (
    "max_steps=2", "eval_steps=1", "rollout_batch_size=2", "train.group_size=2", "train.micro_batch_size=4",
    "task.train_prompts=16", "task.val_prompts=4", "pretrain.steps=2", "pretrain.batch_size=4",
    "pretrain.eval_samples=4", "sampling.num_steps=4", "sampling.sde_window=2", "sampling.window_range=[0,2]",
    "exploration.seeds_per_prompt=4", "exploration.seeds_per_pull=2", "exploration.min_seeds_before_abandon=2",
)
_STOP_GRACE_S = 15.0


@dataclass(frozen=True)
class ConvergenceConfig:
    """How the suite runs the convergence benchmark.

    Every run goes to the same iteration horizon (the config's ``max_steps``, e.g. an override):
    iterations to the target are what is compared, and on one CPU an exploring setting spends more
    wall time per iteration than it would with spot GPUs beside it, so a per-run wall-clock share
    would give it fewer iterations. ``budget_s`` is a deadline for all training runs together
    (the cached base model is pretrained first, outside it): runs go ``parallel`` at a time, and a
    run still going at the deadline is stopped (its curve is kept and censored). ``isolate=False``
    runs in this process with no deadline (CI smoke sizes only). ``target``: the validation reward
    to reach; None = vanilla's final validation reward (mean over seeds), see :func:`choose_target`.
    """

    settings: tuple[str, ...] = tuple(SETTINGS)
    seeds: tuple[int, ...] = (0,)
    budget_s: float = 2400.0
    parallel: int = 2
    overrides: tuple[str, ...] = ()
    isolate: bool = True
    target: float | None = None
    repo_root: Path = Path(".")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.settings) - set(SETTINGS))
        if unknown or not self.settings:
            raise ValueError(f"convergence.settings={list(self.settings)}: unknown {unknown}; known {list(SETTINGS)}")
        if not self.seeds:
            raise ValueError("convergence.seeds must name at least one seed")
        if not self.budget_s > 0:
            raise ValueError(f"convergence.budget_s must be > 0, got {self.budget_s}")
        if self.parallel < 1:
            raise ValueError(f"convergence.parallel must be >= 1, got {self.parallel}")

    @property
    def runs(self) -> list[tuple[str, int]]:
        """Seed-major order, so a budget cut loses whole seeds rather than whole settings."""
        return [(name, seed) for seed in self.seeds for name in self.settings]


@dataclass
class RunRecord:
    """One training run as measured: its validation curve and how it ended."""

    setting: str
    seed: int
    status: str                      # finished | stopped | failed
    wall_s: float
    curve: list[dict] = field(default_factory=list)
    iteration_s_median: float | None = None
    rank_spearman: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def horizon(self) -> int:
        return max((p["iteration"] for p in self.curve), default=0)


@dataclass(frozen=True)
class IterationsEstimate:
    """Median iterations to the target over seeds; ``bound`` is "exact", "lower" or "none"."""

    setting: str
    value: float | None
    bound: str
    reached: int
    runs: int
    per_run: tuple[int | None, ...]
    horizons: tuple[int, ...]


# ------------------------------------------------------------------------------ reading curves
def curve_from_metrics(run_dir: Path) -> tuple[list[dict], list[float], list[float]]:
    """(validation curve, per-iteration wall seconds, stale-vs-fresh Spearman) from ``metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return [], [], []
    curve, its, ranks = [], [], []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # the last line of a run stopped mid-write
            log.warning("%s: skipping a partial line", path)
            continue
        if "val_reward" in row:
            curve.append({"iteration": row["step"], "val_reward": row["val_reward"],
                          "val_reward_se": row.get("val_reward_se"), "val_strict": row.get("val_strict")})
        if "iteration_s" in row:
            its.append(float(row["iteration_s"]))
        if row.get("rank_spearman") is not None:
            ranks.append(float(row["rank_spearman"]))
    return curve, its, ranks


def iterations_to_target(curve: Sequence[Mapping[str, Any]], target: float) -> int | None:
    """First evaluated iteration >= 1 whose validation reward reaches ``target`` (None: never)."""
    hits = [p["iteration"] for p in curve if p["iteration"] >= 1 and p["val_reward"] >= target]
    return min(hits) if hits else None


def base_score(records: Sequence[RunRecord]) -> float | None:
    scores = [p["val_reward"] for r in records for p in r.curve if p["iteration"] == 0]
    return statistics.fmean(scores) if scores else None


def final_scores(records: Sequence[RunRecord], setting: str) -> list[float]:
    """The last validation reward of each run of ``setting`` evaluated after iteration 0."""
    return [r.curve[-1]["val_reward"] for r in records if r.setting == setting and r.horizon >= 1]


def choose_target(records: Sequence[RunRecord], explicit: float | None) -> tuple[float | None, str]:
    """The target and the rule that produced it.

    Default rule: the mean over vanilla runs of their last validation reward (the paper compares
    the time each system needs to reach the *same* score). A target not above the base model's
    score measures no learning, so it is rejected (None) and the reason returned.
    """
    if explicit is not None:
        return explicit, f"given: {explicit:.4f}"
    finals = final_scores(records, "vanilla")
    if not finals:
        return None, "no vanilla run evaluated after iteration 0: no target"
    target = statistics.fmean(finals)
    base = base_score(records)
    if base is not None and target <= base:
        return None, (f"vanilla's final validation reward {target:.4f} is not above the base model's "
                      f"{base:.4f}: no learning measured, so no target")
    return target, f"vanilla's final validation reward, mean over {len(finals)} run(s): {target:.4f}"


def estimate(setting: str, records: Sequence[RunRecord], target: float | None) -> IterationsEstimate:
    mine = [r for r in records if r.setting == setting and r.curve]
    if target is None or not mine:
        return IterationsEstimate(setting, None, "none", 0, len(mine), (), tuple(r.horizon for r in mine))
    per_run = tuple(iterations_to_target(r.curve, target) for r in mine)
    horizons = tuple(r.horizon for r in mine)
    censored = [h if it is None else it for it, h in zip(per_run, horizons)]
    reached = sum(it is not None for it in per_run)
    return IterationsEstimate(setting, float(statistics.median(censored)), median_bound(per_run, horizons),
                              reached, len(mine), per_run, horizons)


def median_bound(per_run: Sequence[int | None], horizons: Sequence[int]) -> str:
    """"exact" when at least ``n // 2 + 1`` runs reached the target no later than the smallest
    horizon of a censored run (``per_run`` None), else "lower" (see the module docstring)."""
    censored = [h for it, h in zip(per_run, horizons) if it is None]
    if not censored:
        return "exact"
    early = sum(it is not None and it <= min(censored) for it in per_run)
    return "exact" if early >= len(per_run) // 2 + 1 else "lower"


def paired_gain(records: Sequence[RunRecord], setting: str, reference: str = "vanilla") -> dict | None:
    """``setting`` minus ``reference`` on the same training seeds, over the validations both runs made.

    Per seed: the mean over the common evaluated iterations after 0 of the difference in validation
    reward ("curve", which uses every evaluation, not only the first crossing of a target), and the
    difference at the last common iteration ("final"). Across seeds: mean, standard error (n - 1)
    and the per-seed values. None when no seed has both runs evaluated after iteration 0.
    """
    ref = {r.seed: {p["iteration"]: p["val_reward"] for p in r.curve} for r in records if r.setting == reference}
    curve, final, seeds = [], [], []
    for r in records:
        if r.setting != setting or r.seed not in ref:
            continue
        mine = {p["iteration"]: p["val_reward"] for p in r.curve}
        common = sorted(i for i in set(mine) & set(ref[r.seed]) if i > 0)
        if not common:
            continue
        seeds.append(r.seed)
        curve.append(statistics.fmean(mine[i] - ref[r.seed][i] for i in common))
        final.append(mine[common[-1]] - ref[r.seed][common[-1]])
    if not seeds:
        return None

    def spread(values: list[float]) -> dict:
        se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else None
        return {"mean": statistics.fmean(values), "se": se, "per_seed": values}

    return {"reference": reference, "seeds": seeds, "curve": spread(curve), "final": spread(final)}


def summarize(records: Sequence[RunRecord], target: float | None, rule: str) -> dict:
    settings = sorted({r.setting for r in records}, key=list(SETTINGS).index)
    finals = {s: final_scores(records, s) for s in settings}
    gains = {s: paired_gain(records, s) for s in settings if s != "vanilla"}
    return {"target": target, "target_rule": rule, "base_val_reward": base_score(records),
            "estimates": {s: asdict(estimate(s, records, target)) for s in settings},
            "final_mean": {s: statistics.fmean(v) for s, v in finals.items() if v},
            "paired_vs_vanilla": {s: g for s, g in gains.items() if g is not None}}


# ------------------------------------------------------------------------------ running
def run_convergence(cfg: ConvergenceConfig, out_dir: Path) -> dict:
    """Run every (setting, seed) within the budget; returns a JSON-ready, measured result."""
    out_dir = Path(out_dir)
    t0 = time.monotonic()
    if cfg.isolate:
        _pretrain_bases(cfg)
        deadline = time.monotonic() + cfg.budget_s
        with ThreadPoolExecutor(max_workers=cfg.parallel) as pool:
            records = list(pool.map(lambda job: _run_subprocess(cfg, *job, out_dir, deadline), cfg.runs))
    else:
        records = [_run_inprocess(cfg, name, seed, out_dir) for name, seed in cfg.runs]
    target, rule = choose_target(records, cfg.target)
    return {"kind": "measured", "wall_s": time.monotonic() - t0,
            "budget": {"budget_s": cfg.budget_s, "parallel": cfg.parallel, "isolate": cfg.isolate,
                       "deadline": cfg.isolate, "overrides": list(cfg.overrides)},
            "summary": summarize(records, target, rule),
            "runs": [asdict(r) | {"horizon": r.horizon} for r in records]}


def _config_args(cfg: ConvergenceConfig, setting: str, seed: int) -> tuple[Path, list[str]]:
    config, extra = SETTINGS[setting]
    return cfg.repo_root / config, [*extra, *cfg.overrides, f"seed={seed}"]


def _child_env() -> dict[str, str]:
    return {**os.environ, "SPOTLIGHT_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _pretrain_bases(cfg: ConvergenceConfig) -> None:
    """Pretrain (or find cached) each distinct base once, before runs start in parallel.

    Pretraining runs alone, so it gets every core (the training runs after it take one each).
    """
    threads = str(max(1, os.cpu_count() or 1))
    env = {**_child_env(), "SPOTLIGHT_THREADS": threads, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    for config in sorted({SETTINGS[s][0] for s in cfg.settings}):
        cmd = [sys.executable, "-m", "roll_spotlight.cli", "pretrain", "--config", str(cfg.repo_root / config),
               "--threads", threads, "--no-progress", *[a for o in cfg.overrides for a in ("-o", o)]]
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def _run_subprocess(cfg: ConvergenceConfig, setting: str, seed: int, out_dir: Path, deadline: float) -> RunRecord:
    config, overrides = _config_args(cfg, setting, seed)
    run_dir = out_dir / f"{setting}-seed{seed}"
    _clear_metrics(run_dir)
    left_s = deadline - time.monotonic()
    if left_s < 1.0:
        log.info("convergence %s seed %d: not started, the budget's deadline has passed", setting, seed)
        return _record(setting, seed, run_dir, "stopped", 0.0, None)
    cmd = [sys.executable, "-m", "roll_spotlight.cli", "train", "--config", str(config), "--run-dir", str(run_dir),
           "--threads", "1", "--no-progress", *[a for o in overrides for a in ("-o", o)]]
    status, wall_s, error = run_with_timeout(cmd, left_s, _child_env())
    return _record(setting, seed, run_dir, status, wall_s, error)


def run_with_timeout(cmd: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None
                     ) -> tuple[str, float, str | None]:
    """Run ``cmd``; past ``timeout_s`` send it SIGTERM (then SIGKILL). Returns (status, wall_s, error)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(list(cmd), env=dict(env) if env else None, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        return "stopped", time.monotonic() - t0, None
    wall_s = time.monotonic() - t0
    if proc.returncode != 0:
        return "failed", wall_s, (stderr or "")[-2000:]
    return "finished", wall_s, None


def _run_inprocess(cfg: ConvergenceConfig, setting: str, seed: int, out_dir: Path) -> RunRecord:
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.startup import start_run

    config, overrides = _config_args(cfg, setting, seed)
    run_dir = out_dir / f"{setting}-seed{seed}"
    _clear_metrics(run_dir)
    t0 = time.monotonic()
    start_run(load_config(RunConfig, str(config), overrides), run_dir, progress=False)
    return _record(setting, seed, run_dir, "finished", time.monotonic() - t0, None)


def _clear_metrics(run_dir: Path) -> None:
    """A rerun must not read the curve of an earlier run in the same folder."""
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)


def _record(setting: str, seed: int, run_dir: Path, status: str, wall_s: float, error: str | None) -> RunRecord:
    curve, its, ranks = curve_from_metrics(run_dir)
    log.info("convergence %s seed %d: %s after %.0f s, evaluated up to iteration %d", setting, seed, status,
             wall_s, max((p["iteration"] for p in curve), default=0))
    return RunRecord(setting, seed, status, wall_s, curve, statistics.median(its) if its else None, ranks, error)


def records_from_json(payload: Mapping[str, Any]) -> list[RunRecord]:
    """Records from a saved result: this module's ``runs`` list, or the older
    ``{setting: {seed: {"curve": ...}}}`` mapping (saved runs made before the suite ran them)."""
    runs = payload["runs"]
    if isinstance(runs, list):
        return [RunRecord(r["setting"], int(r["seed"]), r["status"], r["wall_s"], r["curve"],
                          r.get("iteration_s_median"), r.get("rank_spearman", []), r.get("error")) for r in runs]
    return [RunRecord(name, int(seed), "finished", float(run.get("wall_s", 0.0)), list(run["curve"]), None,
                      list(run.get("rank_spearman", [])))
            for name, by_seed in runs.items() for seed, run in by_seed.items()]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the settings over seeds on their own (the suite runs them too) and write convergence.json."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.convergence", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--target", type=float, help="validation reward to reach (default: vanilla's final score)")
    p.add_argument("--budget-s", type=float, default=ConvergenceConfig.budget_s, help="deadline of all runs")
    p.add_argument("--parallel", type=int, default=ConvergenceConfig.parallel)
    p.add_argument("--in-process", action="store_true", help="no subprocesses and no deadline (small runs)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--override", "-o", action="append", default=[])
    args = p.parse_args(argv)
    cfg = ConvergenceConfig(tuple(args.settings), tuple(args.seeds), args.budget_s, args.parallel,
                            tuple(args.override), not args.in_process, args.target)
    result = run_convergence(cfg, args.out / "convergence")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "convergence.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
