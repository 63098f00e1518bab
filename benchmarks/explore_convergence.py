"""Iterations and on-demand time to a target: vanilla against exploration settings, paired by seed.

    python -m benchmarks.explore_convergence --config configs/tiny_shapes.yaml --threads 1 \
        --start RUN/checkpoints/iter-000040 --settings vanilla screen screen-hw --seeds 0 1 2 3 \
        -o max_steps=20 -o eval_steps=2 --runs RUNS_DIR --out benchmarks/results/explore_convergence.json
    python -m benchmarks.explore_convergence --summarise --runs RUNS_DIR --out ...   # tables from finished runs

Every run starts from the same policy (the config's base, or `--start`: a run checkpoint's policy,
with a fresh optimiser) and runs in this process, one after another in seed-major order; a run
whose `summary.json` exists is not run again, so two processes on disjoint `--seeds` can share
`--runs`, and a stopped study resumes. Settings are override lists (`SETTINGS`); `-o` applies after
them (e.g. `-o exploration.seeds_per_prompt=8` for groups of 4).

What is reported (all MEASURED), per setting against vanilla, paired by seed:
- iterations to the target (default: vanilla's mean final validation reward), the first evaluated
  iteration at or above it; a run that never reaches it counts as its horizon (a lower bound: the
  ratio vanilla / setting is then conservative for the setting when vanilla is censored, and
  generous when the setting is);
- the ratio vanilla / setting per seed, its geometric mean and a one-sided paired t-test of
  log(ratio) > 0 (seeds - 1 df); the mean validation difference over the run and a two-sided t;
- the all-equal share of trained groups, the share of the unscreened draw skipped, explored seeds
  and exploring seconds per iteration (the spot time the screen costs), and the on-demand seconds
  per iteration (`iteration_s - explore_s`: exploration runs after the update in one process, and
  on spot GPUs while it trains), with time to target = iterations x median on-demand seconds.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np

_STALE = ["exploration.mode=stale", "exploration.adaptive=false"]
SETTINGS: dict[str, list[str]] = {
    "vanilla": ["exploration.mode=off"],
    "seeds": [*_STALE, "exploration.seeds_per_prompt=32"],  # Spotlight's seed selection (the configs')
    "seeds-hw": [*_STALE, "exploration.seeds_per_prompt=32", "exploration.selection=pps",
                 "exploration.baseline=pool", "exploration.planner=uniform", "exploration.unbiased=true"],
    "screen": [*_STALE, "exploration.target=prompts"],
    "screen-hw": [*_STALE, "exploration.target=prompts", "exploration.unbiased=true"],
    "adaptive": ["exploration.mode=stale", "exploration.seeds_per_prompt=32", "exploration.adaptive=true"],
}
ITERATION_KEYS = ("groups_all_equal", "screen/skipped", "explored_seeds", "explore_s", "iteration_s",
                  "rollout_s", "train_s", "trained_samples", "zero_std_ratio", "explore/target")


def run_one(config: str, overrides: list[str], setting: str, seed: int, start: str | None, runs: Path) -> Path:
    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.startup import start_run
    from benchmarks.explore_screen import load_start_policy

    run_dir = runs / f"{setting}-seed{seed}"
    if (run_dir / "summary.json").is_file():
        return run_dir
    cfg = load_config(RunConfig, config, [*SETTINGS[setting], *overrides, f"seed={seed}"])  # -o wins
    policy, _ = load_start_policy(cfg, start)
    t0 = time.monotonic()
    start_run(cfg, run_dir, policy=copy.deepcopy(policy), progress=False)
    print(json.dumps({"setting": setting, "seed": seed, "wall_s": time.monotonic() - t0}), flush=True)
    return run_dir


def read_run(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    its = [r for r in rows if r.get("step", 0) >= 1 and "iteration_s" in r]
    per_it = {k: [r[k] for r in its if isinstance(r.get(k), (int, float))] for k in ITERATION_KEYS}
    return {"curve": [{"iteration": p["iteration"], "val_reward": p["val_reward"]} for p in summary["curve"]],
            "iterations": per_it}


def iterations_to(curve: list[dict], target: float) -> tuple[int, bool]:
    """(first evaluated iteration >= 1 at or above `target`, reached); the horizon when never."""
    hits = [p["iteration"] for p in curve if p["iteration"] >= 1 and p["val_reward"] >= target]
    return (min(hits), True) if hits else (max(p["iteration"] for p in curve), False)


def _t_test(x: np.ndarray, one_sided: bool) -> tuple[float, float, float]:
    from scipy import stats as st

    if len(x) < 2 or x.std(ddof=1) == 0:
        return float(x.mean()), math.nan, math.nan
    se = float(x.std(ddof=1) / math.sqrt(len(x)))
    t = float(x.mean() / se)
    p = float(st.t.sf(t, len(x) - 1)) if one_sided else float(2 * st.t.sf(abs(t), len(x) - 1))
    return se, t, p


def _mean(values) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def summarise(runs: dict[tuple[str, int], dict], target: float | None) -> dict:
    vanilla = {seed: r for (name, seed), r in runs.items() if name == "vanilla"}
    if target is None:
        target = statistics.fmean(r["curve"][-1]["val_reward"] for r in vanilla.values())
    out = {"target": target, "settings": {}}
    for name in dict.fromkeys(n for n, _ in runs):
        mine = {seed: r for (n, seed), r in runs.items() if n == name}
        rows = {}
        for seed, r in sorted(mine.items()):
            its, reached = iterations_to(r["curve"], target)
            on_demand = [a - b for a, b in zip(r["iterations"]["iteration_s"], r["iterations"]["explore_s"])]
            rows[seed] = {"iterations": its, "reached": reached, "final": r["curve"][-1]["val_reward"],
                          "on_demand_s": statistics.median(on_demand), "explore_s": _mean(r["iterations"]["explore_s"]),
                          "explored_seeds": _mean(r["iterations"]["explored_seeds"]),
                          "all_equal": _mean(r["iterations"]["groups_all_equal"]),
                          "skipped": _mean(r["iterations"]["screen/skipped"])}
            rows[seed]["time_to_target_s"] = its * rows[seed]["on_demand_s"]
        paired = sorted(set(mine) & set(vanilla))
        entry = {"runs": rows, "seeds": paired}
        if name != "vanilla" and len(paired) >= 2:
            v_its = np.array([iterations_to(vanilla[s]["curve"], target)[0] for s in paired], dtype=float)
            m_its = np.array([rows[s]["iterations"] for s in paired], dtype=float)
            log_ratio = np.log(v_its / m_its)
            se, t, p = _t_test(log_ratio, one_sided=True)
            diffs = np.array([_curve_difference(mine[s]["curve"], vanilla[s]["curve"]) for s in paired])
            dse, dt, dp = _t_test(diffs, one_sided=False)
            od = np.array([rows[s]["on_demand_s"] / statistics.median(
                [a - b for a, b in zip(vanilla[s]["iterations"]["iteration_s"], vanilla[s]["iterations"]["explore_s"])])
                for s in paired])
            entry |= {"iterations_ratio_per_seed": (v_its / m_its).tolist(),
                      "iterations_ratio_geomean": float(np.exp(log_ratio.mean())), "log_ratio_se": se,
                      "log_ratio_t": t, "p_one_sided": p,
                      "val_difference_over_run": float(diffs.mean()), "val_difference_se": dse, "val_difference_p": dp,
                      "on_demand_ratio_per_seed": od.tolist(), "on_demand_ratio_mean": float(od.mean())}
        out["settings"][name] = entry
    return out


def _curve_difference(curve: list[dict], reference: list[dict]) -> float:
    """Mean over the evaluations both runs made after iteration 0 of (curve - reference)."""
    ref = {p["iteration"]: p["val_reward"] for p in reference if p["iteration"] >= 1}
    diffs = [p["val_reward"] - ref[p["iteration"]] for p in curve if p["iteration"] in ref]
    return float(np.mean(diffs))


def table(summary: dict) -> str:
    lines = [f"target {summary['target']:.4f}",
             "| setting | seeds | iterations per seed | vanilla / setting (geomean) | p (one-sided) | "
             "val diff over run (p) | all-equal groups | skipped | explored seeds / it | explore s / it | "
             "on-demand s / it (ratio) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, e in summary["settings"].items():
        runs = e["runs"].values()
        its = ", ".join(f"{r['iterations']}{'' if r['reached'] else '+'}" for r in runs)
        ratio = (f"{e['iterations_ratio_geomean']:.2f}" if "iterations_ratio_geomean" in e else "-")
        p = f"{e['p_one_sided']:.3f}" if "p_one_sided" in e else "-"
        diff = (f"{e['val_difference_over_run']:+.4f} +- {e['val_difference_se']:.4f} ({e['val_difference_p']:.3f})"
                if "val_difference_over_run" in e else "-")
        od = statistics.fmean(r["on_demand_s"] for r in runs)
        od_ratio = f" ({e['on_demand_ratio_mean']:.2f})" if "on_demand_ratio_mean" in e else ""
        lines.append(f"| {name} | {len(e['runs'])} | {its} | {ratio} | {p} | {diff} | "
                     f"{statistics.fmean(r['all_equal'] for r in runs):.2f} | "
                     f"{_fmt(statistics.fmean(r['skipped'] for r in runs))} | "
                     f"{_fmt(statistics.fmean(r['explored_seeds'] for r in runs), 0)} | "
                     f"{statistics.fmean(r['explore_s'] for r in runs):.1f} | {od:.1f}{od_ratio} |")
    return "\n".join(lines)


def _fmt(x: float, digits: int = 2) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny_shapes.yaml")
    p.add_argument("-o", "--override", action="append", default=[])
    p.add_argument("--settings", nargs="+", default=["vanilla", "screen", "screen-hw"], choices=list(SETTINGS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--start", default=None, help="a run checkpoint (directory or backend.pt); default: the base")
    p.add_argument("--target", type=float, default=None, help="default: vanilla's mean final validation reward")
    p.add_argument("--runs", type=Path, required=True, help="the runs' directories (kept outside the repository)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--summarise", action="store_true", help="only summarise the finished runs under --runs")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not args.summarise:
        from roll_spotlight.startup import set_threads

        set_threads(args.threads)
        for seed in args.seeds:
            for name in args.settings:
                run_one(args.config, args.override, name, seed, args.start, args.runs)
    runs = {}
    for run_dir in sorted(args.runs.glob("*-seed*")):
        if (run_dir / "summary.json").is_file():
            name, seed = run_dir.name.rsplit("-seed", 1)
            runs[(name, int(seed))] = read_run(run_dir)
    if not any(name == "vanilla" for name, _ in runs):
        raise SystemExit(f"{args.runs}: no finished vanilla run to pair against")
    summary = summarise(runs, args.target)
    print(table(summary))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"kind": "measured", "config": args.config, "overrides": args.override,
                                        "start": args.start, "summary": summary,
                                        "curves": {f"{n}-seed{s}": r["curve"] for (n, s), r in runs.items()}},
                                       indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
