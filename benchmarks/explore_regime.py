"""How many of a policy's groups are all equal: per prompt of the task, under each shapes reward.

    python -m benchmarks.explore_regime --config configs/tiny_shapes.yaml --threads 1 \
        --start RUN/checkpoints/iter-000040 --groups 2 --out benchmarks/results/explore_regime_it40.json

For every distinct training prompt, `--groups` groups of `train.group_size` seeds are rolled out
once under the rollouts' schedule and scored by the strict, partial and mix rewards; a group is
all equal when its rewards are. Shares are weighted by how often the pool holds each prompt (what
the run's uniform draw trains on). This is where prompt screening can pay: an all-equal group has
zero advantage and is dropped. MEASURED.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

MODES = ("strict", "partial", "mix")


def probe(cfg, policy, groups: int) -> dict:
    from roll_spotlight.rewards.reward import build_reward
    from roll_spotlight.runtime.coordinator import iteration_specs
    from roll_spotlight.training.prompt_pools import draw_seeds, train_pool
    from roll_spotlight.training.sampling import generate, to_uint8_images, train_spec

    g, pool = cfg.train.group_size, train_pool(cfg.task)
    freq = Counter(pool.texts)
    texts = sorted(freq)
    prompts = [t for t in texts for _ in range(groups * g)]
    it = 300_000
    window = iteration_specs(cfg, pool, it, weight_version=0)[0].schedule.window
    policy.eval()
    traj = generate(policy, prompts, draw_seeds(len(prompts), seed=cfg.seed, iteration=it), train_spec(cfg.sampling, window))
    images = to_uint8_images(policy, traj.final)
    rows, weights = {}, np.array([freq[t] for t in texts], dtype=float) / len(pool)
    for mode in MODES:
        r = np.asarray(build_reward("shapes", mode=mode)(images, prompts).rewards, dtype=float).reshape(len(texts), groups, g)
        equal = (r.max(axis=2) == r.min(axis=2)).mean(axis=1)
        rows[mode] = {"all_equal_share": float(weights @ equal), "mean_reward": float(weights @ r.mean(axis=(1, 2))),
                      "per_prompt_all_equal": dict(zip(texts, equal.tolist())),
                      "per_prompt_mean": dict(zip(texts, r.mean(axis=(1, 2)).tolist()))}
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny_shapes.yaml")
    p.add_argument("-o", "--override", action="append", default=[])
    p.add_argument("--start", default=None, help="a run checkpoint (directory or backend.pt); default: the base")
    p.add_argument("--groups", type=int, default=2, help="groups per distinct prompt")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.startup import set_threads
    from benchmarks.explore_screen import load_start_policy

    set_threads(args.threads)
    cfg = load_config(RunConfig, args.config, args.override)
    policy, name = load_start_policy(cfg, args.start)
    t0 = time.monotonic()
    rows = probe(cfg, policy, args.groups)
    for mode, row in rows.items():
        print(f"{mode}: all-equal share {row['all_equal_share']:.3f}, mean reward {row['mean_reward']:.3f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"kind": "measured", "config": args.config, "overrides": args.override,
                                        "policy": name, "groups_per_prompt": args.groups,
                                        "group_size": cfg.train.group_size, "wall_s": time.monotonic() - t0,
                                        "modes": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
