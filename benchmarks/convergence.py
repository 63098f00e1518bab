"""Iterations to a target validation score: vanilla vs fresh exploration vs Spotlight (stale).

    python benchmarks/convergence.py --seeds 0 1 2 --max-steps 40 --target 0.55

Three settings on the tiny task, same base model, same validation pairs, several training seeds:
  vanilla   configs/tiny_shapes.yaml            group_size random seeds per prompt
  fresh     exploration.mode=fresh              explore with current weights on the critical path
  spotlight configs/tiny_shapes_spotlight.yaml  explore with one-iteration-stale weights off it
Writes benchmarks/results/convergence.json (curves, iterations to target, rank correlations) and a
PNG. All numbers are measured; the critical-path rollouts per iteration of vanilla and Spotlight are
the same (group_size per prompt), fresh exploration adds its explored seeds to the critical path.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

# One definition of the settings and of "iterations to target" (first evaluation after iteration 0
# at or above the target), shared with `spotlight bench all`.
from roll_spotlight.tools.bench.convergence import SETTINGS, iterations_to_target


def run_setting(name: str, seeds: list[int], out: Path, overrides: list[str]) -> dict:
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.startup import start_run
    from roll_spotlight.training.metrics import read_metrics

    config, extra = SETTINGS[name]
    runs = {}
    for seed in seeds:
        cfg = load_config(RunConfig, config, [*extra, *overrides, f"seed={seed}"])
        run_dir = out / f"{name}-seed{seed}"
        result = start_run(cfg, run_dir, progress=False)
        ranks = [r["rank_spearman"] for r in read_metrics(run_dir) if "rank_spearman" in r]
        runs[seed] = {"curve": result.curve, "rank_spearman": ranks, **result.summary()}
    return runs


def summarize(report: dict, target: float) -> dict:
    out = {}
    for name, runs in report.items():
        its = [iterations_to_target(r["curve"], target) for r in runs.values()]
        reached = [i for i in its if i is not None]
        finals = [r["final"]["val_reward"] for r in runs.values()]
        ranks = [x for r in runs.values() for x in r["rank_spearman"]]
        out[name] = {"iterations_to_target": its, "reached": len(reached), "runs": len(its),
                     "median_iterations": statistics.median(reached) if reached else None,
                     "final_mean": statistics.mean(finals), "final_spread": max(finals) - min(finals),
                     "rank_spearman_mean": statistics.mean(ranks) if ranks else None}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--target", type=float, required=True, help="validation reward to reach")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--override", "-o", action="append", default=[])
    args = p.parse_args(argv)
    report = {name: run_setting(name, args.seeds, args.out / "convergence", args.override) for name in args.settings}
    payload = {"kind": "measured", "target": args.target, "summary": summarize(report, args.target), "runs": report}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "convergence.json").write_text(json.dumps(payload, indent=2, default=str))
    print(json.dumps(payload["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
