"""Iteration time with rewards overlapping the rollouts vs rewards after all rollouts (measured).

    python -m benchmarks.reward_overlap --seconds-per-image 0.5 --iterations 4 --repeats 2 --json

Both settings run in one Ray session, alternating (on, off, on, off, ...), on the tiny model with a
random policy and an artificially slow reward (`SlowReward`: the task's shapes
reward after a sleep per image, named by its dotted path, so the Ray reward actors import it too): with `reward.overlap` the reward actor scores each batch of `reward.batch_size`
images as soon as it completes; without, it scores the whole batch after the last rollout. Reported:
the median iteration time of each setting over every iteration but each run's first (warm-up), and
their ratio. Results go to benchmarks/results/reward_overlap.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from roll_spotlight.rewards.reward import Reward, RewardOutput, build_reward

REPO = Path(__file__).resolve().parent.parent


class SlowReward(Reward):
    """`inner`'s rewards after sleeping `seconds_per_image` per image of the batch: what a slow reward
    model costs an iteration, without one. Never useful for training."""

    def __init__(self, inner: str = "brightness", seconds_per_image: float = 0.5, **inner_kwargs: Any) -> None:
        if not seconds_per_image >= 0:
            raise ValueError(f"reward.kwargs.seconds_per_image must be >= 0, got {seconds_per_image!r}")
        self.inner, self.seconds_per_image = build_reward(inner, **inner_kwargs), float(seconds_per_image)

    def score(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        time.sleep(self.seconds_per_image * len(images))
        return self.inner(images, prompts)


def one_run(overlap: bool, args, policy_path: str, run_dir: Path) -> list[float]:
    from roll_spotlight.config import RunConfig, load_config
    from roll_spotlight.runtime.ray_backend import RayBackend, RayClusterConfig
    from roll_spotlight.startup import run_loop

    overrides = [f"max_steps={args.iterations}", "eval_steps=0", "rollout_batch_size=4", "train.group_size=4",
                 "task.val_prompts=4", "reward.name=benchmarks.reward_overlap:SlowReward",
                 "reward.kwargs.inner=shapes", f"reward.kwargs.seconds_per_image={args.seconds_per_image}",
                 f"reward.overlap={str(overlap).lower()}", f"reward.batch_size={args.batch_size}"]
    cfg = load_config(RunConfig, REPO / "configs" / "tiny_shapes.yaml", overrides)
    backend = RayBackend(cfg, policy_path, RayClusterConfig(ondemand_workers=2, trainer_threads=1))
    try:
        run_loop(cfg, backend, run_dir, progress=False)
    finally:
        backend.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["iteration_s"] for r in rows if "iteration_s" in r][1:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds-per-image", type=float, default=0.5)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "reward_overlap.json"))
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)

    import ray
    import torch

    from roll_spotlight.config import RunConfig, load_config
    from roll_spotlight.models import build_policy, save_policy
    from roll_spotlight.training.prompt_pools import task_vocab

    torch.set_num_threads(1)
    cfg = load_config(RunConfig, REPO / "configs" / "tiny_shapes.yaml")
    times: dict[str, list[float]] = {"overlap": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        policy_path = str(Path(tmp) / "policy.pt")
        save_policy(build_policy(cfg.model, vocab=task_vocab(cfg.task)), policy_path)
        for r in range(args.repeats):
            for overlap in (True, False):
                name = "overlap" if overlap else "after"
                times[name] += one_run(overlap, args, policy_path, Path(tmp) / f"{name}-{r}")
    ray.shutdown()
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"kind": "measured", "seconds_per_image": args.seconds_per_image, "images_per_iteration": 16,
              "batch_size": args.batch_size, "iterations_per_run": args.iterations, "repeats": args.repeats,
              "iteration_s": times, "median_iteration_s": med, "after_over_overlap": med["after"] / med["overlap"]}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result if args.json else {k: result[k] for k in ("median_iteration_s", "after_over_overlap")},
                     indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
