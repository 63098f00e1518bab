"""Does Flow-GRPO learn on the tiny task? Curves for several training seeds, as JSON and a PNG.

    python benchmarks/tiny_learning.py --config configs/tiny_shapes.yaml --seeds 0 1 --out benchmarks/results

Two runs side by side on two cores want `--threads 1` each (or `SPOTLIGHT_THREADS=1`): torch's default
of one thread per core oversubscribes them, and the run slows about threefold.

Each seed trains from the same cached base model; validation uses the same fixed (prompt, seed) pairs,
so gains are paired. Reported per seed: base and final validation reward (mean, standard error),
the paired gain with its standard error and z, and the change in strict accuracy.
All numbers are measured on this machine (CPU).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def run(config: str, seeds: list[int], out: Path, overrides: list[str]) -> dict:
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.training.evaluate import paired_gain
    from roll_spotlight.startup import check_startup, start_run

    configs = {seed: load_config(RunConfig, config, [*overrides, f"seed={seed}"]) for seed in seeds}
    for cfg in configs.values():  # a bad key or reward fails here, before any seed trains
        check_startup(cfg)
    results = {}
    for seed, cfg in configs.items():
        t0 = time.monotonic()
        res = start_run(cfg, out / f"{cfg.exp_name}-seed{seed}")
        # the run directory relative to --out: the JSON is committed, and names no path of this machine
        results[seed] = res.summary() | {"curve": res.curve, "wall_s": time.monotonic() - t0,
                                         "run_dir": f"runs/{cfg.exp_name}-seed{seed}"}
        print(json.dumps({"seed": seed, **paired_gain(res.base, res.final),
                          "base": res.base.summary(), "final": res.final.summary()}))
    return {"kind": "measured", "config": config, "overrides": overrides, "runs": results}


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for seed, run in report["runs"].items():
        its = [p["iteration"] for p in run["curve"]]
        ax1.errorbar(its, [p["val_reward"] for p in run["curve"]], yerr=[p["val_reward_se"] for p in run["curve"]],
                     label=f"seed {seed}", capsize=2)
        ax2.plot(its, [p["val_strict"] for p in run["curve"]], label=f"seed {seed}")
    ax1.set(xlabel="iteration", ylabel="validation reward", title="validation reward (measured)")
    ax2.set(xlabel="iteration", ylabel="strict accuracy", title="strict accuracy (measured)")
    ax1.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny_shapes.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--override", "-o", action="append", default=[])
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: $SPOTLIGHT_THREADS, else torch's default)")
    args = p.parse_args(argv)
    if args.threads is not None and args.threads < 0:
        p.error(f"--threads must be >= 0, got {args.threads}")
    from roll_spotlight.startup import set_threads

    set_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    report = run(args.config, args.seeds, args.out / "runs", args.override)
    (args.out / "tiny_learning.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "tiny_learning.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
