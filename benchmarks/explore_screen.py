"""Screen seed exploration settings by the validation change of one Flow-GRPO update, paired.

    python benchmarks/explore_screen.py --config configs/tiny_shapes.yaml --threads 1 --replicates 6 \
        --pools 2 4 6 --out benchmarks/results/explore_screen.json
    python benchmarks/explore_screen.py ... -o reward.kwargs.mode=strict --pools 2 4 6 \
        --only P4-max_variance-pool P2-top_bottom-selected --out benchmarks/results/explore_screen_strict.json

The reward regime is the config's `reward` section, so `-o reward.kwargs.mode=strict|partial|mix`
varies it (validation then scores the same reward; strict accuracy is recorded beside it). Each
update is appended to `--jsonl` (default: `--out` with .jsonl) as it finishes, so a stopped screen
loses nothing; `--summarise-jsonl FILE...` prints the table of such files' complete replicates.

A cheap screen before convergence runs. Each replicate draws one iteration's prompts (the run's
`iteration_specs` of a high iteration number) and, per prompt, `max(pools) x group_size` seeds, and
rolls them all out once with the base under the rollouts' schedule (this is fresh-mode exploration:
explored with the weights that are updated, so staleness is not part of this screen). Settings:

- vanilla: the first group_size seeds of each prompt (random seeds), the group's own statistics;
- for each pool P (explored seeds per trained seed), selection (max_variance, top_bottom) and
  baseline (selected, pool): the first P x group_size seeds are the pool, the selector picks the
  group, and advantages use the group's own mean/std or the pool's.

Each setting takes one update from the base on its batch (same optimiser state: none) and is
validated on the same held-out (prompt, seed) pairs (ODE, `--val-pairs` of the validation set).
The test, fixed before the runs: per replicate, d = (validation change of the setting) -
(validation change of vanilla); over replicates, mean d, its standard error, t = mean / se and a
two-sided p from Student's t with replicates - 1 degrees of freedom. The same replicate shares
prompts, pools and validation pairs across settings (paired seeds).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np


def _batch_of(traj, rewards, prompts, pick, g):
    """Trajectory rows `pick` (per prompt, its chosen indices into the flat batch) as one batch."""
    rows = [i for chosen in pick for i in chosen]
    return traj.select(rows), rewards[rows], [prompts[i] for i in rows], np.repeat(np.arange(len(pick)), g)


def setting_names(pools: list[int], selections: list[str], baselines: list[str],
                  only: list[str] | None = None) -> list[tuple[str, int, str, str]]:
    """(name, pool, selection, baseline) of vanilla and every pool x selection x baseline, or of
    vanilla and the names in `only` (vanilla is always kept: every test is paired against it)."""
    settings = [("vanilla", 1, "random", "selected")] + [
        (f"P{p}-{sel}-{bl}", p, sel, bl) for p in pools for sel in selections for bl in baselines]
    if only:
        known = {name for name, *_ in settings}
        unknown = sorted(set(only) - known)
        if unknown:
            raise ValueError(f"--only names {unknown} are not settings of these pools/selections/baselines")
        settings = [s for s in settings if s[0] == "vanilla" or s[0] in only]
    return settings


def replicate(cfg, base, r: int, pools: list[int], selections: list[str], baselines: list[str], val,
              only: list[str] | None = None, sink=None) -> dict:
    import torch

    from roll_spotlight.exploration import get_selector
    from roll_spotlight.rewards.configured import configured_reward
    from roll_spotlight.runtime.coordinator import iteration_specs
    from roll_spotlight.training.evaluate import evaluate
    from roll_spotlight.training.grpo import FlowGRPOTrainer, ScoredBatch
    from roll_spotlight.training.prompt_pools import draw_seeds, train_pool
    from roll_spotlight.training.sampling import generate, to_uint8_images, train_spec

    g = cfg.train.group_size
    it = 200_000 + r
    specs = iteration_specs(cfg, train_pool(cfg.task), it, weight_version=0)
    texts = [s.prompt for s in specs[::g]]
    n = max(pools) * g
    seeds = draw_seeds(len(texts) * n, seed=cfg.seed, iteration=it)
    prompts = [t for t in texts for _ in range(n)]
    reward = configured_reward(cfg.reward)
    t0 = time.monotonic()
    base.eval()
    traj = generate(base, prompts, seeds, train_spec(cfg.sampling, specs[0].schedule.window))
    rewards = np.asarray(reward(to_uint8_images(base, traj.final), prompts).rewards, dtype=float)
    explore_s = time.monotonic() - t0
    before_ev = evaluate(base, val, reward, cfg.sampling)
    before = before_ev.rewards

    settings = setting_names(pools, selections, baselines, only)
    out = {"replicate": r, "iteration": it, "prompts": texts, "explore_s": explore_s,
           "base_val": float(before.mean()), "base_val_strict": float(np.nanmean(before_ev.strict)), "settings": {}}
    for name, p, sel, bl in settings:
        pick, stats = [], []
        for j in range(len(texts)):
            idx = np.arange(j * n, j * n + p * g)
            chosen = idx[:g] if sel == "random" else idx[get_selector(sel)(rewards[idx], g, 0)]
            pick.append(chosen.tolist())
            stats.append((rewards[idx].mean(), rewards[idx].std()))
        sub, rw, pr, gid = _batch_of(traj, rewards, prompts, pick, g)
        base_arr = np.repeat(np.array(stats), g, axis=0) if bl == "pool" else None
        policy = copy.deepcopy(base)
        torch.manual_seed(cfg.seed)
        trainer = FlowGRPOTrainer(policy, cfg.train)
        t1 = time.monotonic()
        metrics = trainer.step(ScoredBatch(sub, pr, gid, rw, cfg.sampling.noise_level, cfg.sampling.kind,
                                           baselines=base_arr)).metrics
        after_ev = evaluate(policy, val, reward, cfg.sampling)
        after = after_ev.rewards
        diff = after - before
        groups = rw.reshape(len(texts), g)
        out["settings"][name] = {
            "pool": p, "selection": sel, "baseline": bl, "val_change": float(diff.mean()),
            "val_change_se_pairs": float(diff.std(ddof=1) / math.sqrt(len(diff))),
            "val_strict_change": float(np.nanmean(after_ev.strict - before_ev.strict)),
            "trained_reward_std": float(groups.std(axis=1).mean()),
            "all_equal_groups": float(np.mean(groups.max(axis=1) == groups.min(axis=1))),
            "trained_samples": int(metrics.get("trained_samples", 0)), "seconds": time.monotonic() - t1}
        line = json.dumps({"replicate": r, "setting": name, "reward_kwargs": dict(cfg.reward.kwargs),
                           "base_val": out["base_val"], "explore_s": explore_s, **out["settings"][name]})
        print(line, flush=True)
        if sink is not None:
            sink.write(line + "\n")
            sink.flush()
    return out


def replicates_from_jsonl(paths) -> list[dict]:
    """The complete replicates (every setting the fullest one has) of one or more screen JSONLs (a
    screen resumed with --first-replicate writes a second file), in replicate order."""
    reps: dict[int, dict] = {}
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        for text in Path(path).read_text().splitlines():
            if text.strip():
                row = json.loads(text)
                reps.setdefault(row["replicate"], {"replicate": row["replicate"], "settings": {}})["settings"][row["setting"]] = row
    ordered = [reps[k] for k in sorted(reps)]
    if not ordered:
        return []
    names = max((set(rep["settings"]) for rep in ordered), key=len)
    return [rep for rep in ordered if set(rep["settings"]) >= names]


def summarise(reps: list[dict]) -> dict:
    from scipy import stats as st

    names = list(reps[0]["settings"])
    rows = {}
    for name in names:
        change = np.array([rep["settings"][name]["val_change"] for rep in reps])
        d = change - np.array([rep["settings"]["vanilla"]["val_change"] for rep in reps])
        k = len(d)
        se = float(d.std(ddof=1) / math.sqrt(k)) if k > 1 else math.nan
        t = float(d.mean() / se) if k > 1 and se > 0 else math.nan
        rows[name] = {"n": k, "val_change_mean": float(change.mean()), "diff_vs_vanilla": float(d.mean()),
                      "diff_se": se, "t": t, "p_two_sided": float(2 * st.t.sf(abs(t), k - 1)) if math.isfinite(t) else math.nan,
                      "trained_reward_std": float(np.mean([rep["settings"][name]["trained_reward_std"] for rep in reps])),
                      "all_equal_groups": float(np.mean([rep["settings"][name]["all_equal_groups"] for rep in reps])),
                      "val_strict_change": float(np.mean([rep["settings"][name].get("val_strict_change", math.nan)
                                                          for rep in reps]))}
    return rows


def table(summary: dict) -> str:
    lines = ["| setting | n | validation change | d = minus vanilla | se | t | p | "
             "trained group std | all-equal groups | strict change |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in summary.items():
        lines.append(f"| {name} | {r['n']} | {r['val_change_mean']:+.4f} | {r['diff_vs_vanilla']:+.4f} | "
                     f"{r['diff_se']:.4f} | {r['t']:.2f} | {r['p_two_sided']:.3f} | {r['trained_reward_std']:.3f} | "
                     f"{r['all_equal_groups']:.2f} | {r['val_strict_change']:+.4f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny_shapes.yaml")
    p.add_argument("-o", "--override", action="append", default=[])
    p.add_argument("--replicates", type=int, default=4)
    p.add_argument("--first-replicate", type=int, default=0)
    p.add_argument("--pools", type=int, nargs="+", default=[2, 4])
    p.add_argument("--selections", nargs="+", default=["max_variance", "top_bottom"])
    p.add_argument("--baselines", nargs="+", default=["selected", "pool"])
    p.add_argument("--only", nargs="+", default=None, help="vanilla and these settings only (e.g. P4-top_bottom-pool)")
    p.add_argument("--val-pairs", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="benchmarks/results/explore_screen.json")
    p.add_argument("--jsonl", default=None, help="one line per update, written as it finishes (default: --out .jsonl)")
    p.add_argument("--summarise-jsonl", nargs="+", default=None,
                   help="print the table of these JSONLs' complete replicates and exit")
    p.add_argument("--summary-out", default=None, help="with --summarise-jsonl: also write the summary JSON here")
    args = p.parse_args(argv)
    if args.summarise_jsonl:
        reps = replicates_from_jsonl(args.summarise_jsonl)
        if len(reps) < 2:
            raise SystemExit(f"{' '.join(args.summarise_jsonl)}: {len(reps)} complete replicates; the test needs 2 or more")
        summary = summarise(reps)
        if args.summary_out:
            Path(args.summary_out).write_text(json.dumps(
                {"kind": "measured", "jsonl": args.summarise_jsonl, "replicates_complete": [r["replicate"] for r in reps],
                 "reward_kwargs": reps[0]["settings"]["vanilla"].get("reward_kwargs"),
                 "settings_tested": len(summary) - 1,
                 "test": "per replicate d = setting's validation change - vanilla's; mean d / se over replicates, "
                         "two-sided Student t with replicates - 1 df", "summary": summary}, indent=2))
        print(table(summary))
        return 0
    setting_names(args.pools, args.selections, args.baselines, args.only)  # fail on a bad --only before the base loads

    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.startup import set_threads
    from roll_spotlight.training.pretrain import load_or_pretrain
    from roll_spotlight.training.prompt_pools import validation_set

    set_threads(args.threads)
    cfg = load_config(RunConfig, args.config, args.override)
    base, meta = load_or_pretrain(cfg, progress=False)
    full = validation_set(cfg.task)
    v = min(args.val_pairs, len(full.texts))
    val = dataclasses.replace(full, texts=full.texts[:v], tags=full.tags[:v], seeds=full.seeds[:v])
    t0 = time.monotonic()
    jsonl = Path(args.jsonl or Path(args.out).with_suffix(".jsonl"))
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    with jsonl.open("w") as sink:
        reps = [replicate(cfg, base, r, args.pools, args.selections, args.baselines, val, args.only, sink)
                for r in range(args.first_replicate, args.first_replicate + args.replicates)]
    summary = summarise(reps)
    result = {"kind": "measured", "config": args.config, "overrides": args.override,
              "policy": Path(meta["path"]).name, "reward": cfg.reward.name, "reward_kwargs": dict(cfg.reward.kwargs),
              "group_size": cfg.train.group_size, "learning_rate": cfg.train.learning_rate, "val_pairs": v,
              "test": "per replicate d = setting's validation change - vanilla's; mean d / se over replicates, "
                      "two-sided Student t with replicates - 1 df",
              "settings_tested": len(summary) - 1, "jsonl": str(jsonl),
              "wall_s": time.monotonic() - t0, "replicates": reps, "summary": summary,
              "command": "python benchmarks/explore_screen.py " + " ".join(argv or __import__("sys").argv[1:])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
