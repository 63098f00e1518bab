"""Screen exploration settings by the validation change of one Flow-GRPO update, paired.

    python -m benchmarks.explore_screen --config configs/tiny_shapes.yaml --threads 1 --replicates 6 \
        --pools 2 4 6 --out benchmarks/results/explore_screen.json
    python -m benchmarks.explore_screen ... -o reward.kwargs.mode=strict --pools 2 4 6 \
        --only P4-max_variance-pool P2-top_bottom-selected --out benchmarks/results/explore_screen_strict.json
    python -m benchmarks.explore_screen ... --screen --pools 2 --selections max_variance --baselines selected \
        --start RUN/checkpoints/iter-000040 --out benchmarks/results/explore_screen_late.json

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
  group, and advantages use the group's own mean/std or the pool's;
- with `--screen`: prompt screening ("screen": a second draw of as many prompts refills the
  candidates, each candidate's all-equal probability comes from `--screen-seeds` more of its seeds,
  and `exploration.screen.screen_draw` keeps the batch; groups are the kept prompts' first
  group_size seeds), and the unbiased variants ("-hw", Horvitz-Thompson weights: "screen-hw" and
  "P{p}-pps-pool-hw", randomised PPS selection against the pool's statistics).

`--start` begins from a run checkpoint's policy instead of the base (the late-training regime).

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


def load_start_policy(cfg, start: str | None):
    """(policy, name): the config's cached base, or with `start` the policy weights of a run
    checkpoint (its directory or its backend.pt) loaded into it."""
    import torch

    from roll_spotlight.training.pretrain import load_or_pretrain

    policy, meta = load_or_pretrain(cfg, progress=False)
    if not start:
        return policy, Path(meta["path"]).name
    path = Path(start) / "backend.pt" if Path(start).is_dir() else Path(start)
    policy.load_state_dict(torch.load(path, map_location="cpu", weights_only=True)["policy"])
    return policy, str(path)


def _batch_of(traj, rewards, prompts, pick, g):
    """Trajectory rows `pick` (per prompt, its chosen indices into the flat batch) as one batch."""
    rows = [i for chosen in pick for i in chosen]
    return traj.select(rows), rewards[rows], [prompts[i] for i in rows], np.repeat(np.arange(len(pick)), g)


def setting_names(pools: list[int], selections: list[str], baselines: list[str],
                  only: list[str] | None = None, screen: bool = False) -> list[tuple[str, int, str, str]]:
    """(name, pool, selection, baseline) of vanilla and every pool x selection x baseline (with
    `screen` also prompt screening, "screen" and "screen-hw", and the unbiased seed selection
    "P{p}-pps-pool-hw" per pool), or of vanilla and the names in `only` (vanilla is always kept:
    every test is paired against it). "-hw": Horvitz-Thompson weights (`exploration.unbiased`)."""
    settings = [("vanilla", 1, "random", "selected")] + [
        (f"P{p}-{sel}-{bl}", p, sel, bl) for p in pools for sel in selections for bl in baselines]
    if screen:
        settings += [("screen", 1, "screen", "selected"), ("screen-hw", 1, "screen", "selected")]
        settings += [(f"P{p}-pps-pool-hw", p, "pps", "pool") for p in pools]
    if only:
        known = {name for name, *_ in settings}
        unknown = sorted(set(only) - known)
        if unknown:
            raise ValueError(f"--only names {unknown} are not settings of these pools/selections/baselines")
        settings = [s for s in settings if s[0] == "vanilla" or s[0] in only]
    return settings


def _seed_groups(rewards, n: int, prompts: int, p: int, g: int, sel: str, bl: str, weighted: bool, r: int):
    """Per prompt, the chosen rows of its pool (the first p x g of its n seeds), and the (N, 2 or 3)
    baselines: the pool's (mean, std) with baseline pool, and k / (n pi) with `weighted`."""
    from roll_spotlight.exploration import get_selector
    from roll_spotlight.exploration.select import pps_inclusion

    pick, rows = [], []
    for j in range(prompts):
        idx = np.arange(j * n, j * n + p * g)
        chosen = idx[:g] if sel == "random" else idx[get_selector(sel)(rewards[idx], g, 1000 * r + j)]
        pick.append(chosen.tolist())
        stats = (rewards[idx].mean(), rewards[idx].std()) if bl == "pool" else (np.nan, np.nan)
        weights = g / (len(idx) * pps_inclusion(rewards[idx], g)[chosen - idx[0]]) if weighted else np.ones(g)
        rows += [(*stats, w) for w in weights]
    base = np.array(rows)
    return pick, (base if weighted else base[:, :2] if bl == "pool" else None), {}


def _screened_groups(rewards, n: int, candidates: int, batch: int, g: int, screen_seeds: int, weighted: bool,
                     floor: float, r: int):
    """Prompt screening: each candidate's all-equal probability from its seeds g..g+screen_seeds-1
    (the first g are its group), the screen's draw of `batch` of them, their groups of g."""
    from roll_spotlight.exploration.screen import PromptHistory, screen_draw

    history = PromptHistory(decay=1.0)
    for j in range(candidates):
        history.observe(j, rewards[j * n + g:j * n + g + screen_seeds])
    draw = screen_draw([history.all_equal(j, g) for j in range(candidates)], batch, floor,
                       np.random.default_rng([r, 0x5C4EE]))
    pick = [list(range(j * n, j * n + g)) for j in draw.chosen]
    base = np.column_stack([np.full((batch * g, 2), np.nan), np.repeat(draw.weights, g)]) if weighted else None
    return pick, base, {"skipped": draw.skipped, "predicted_unscreened": draw.baseline_share,
                        "predicted_batch": float(draw.predicted[draw.chosen].mean())}


def replicate(cfg, base, r: int, pools: list[int], selections: list[str], baselines: list[str], val,
              only: list[str] | None = None, sink=None, screen: bool = False, screen_seeds: int = 4,
              floor: float = 0.1) -> dict:
    import torch

    from roll_spotlight.rewards.configured import configured_reward
    from roll_spotlight.runtime.coordinator import iteration_specs
    from roll_spotlight.training.evaluate import evaluate
    from roll_spotlight.training.grpo import FlowGRPOTrainer, ScoredBatch
    from roll_spotlight.training.prompt_pools import draw_prompt_ids, draw_seeds, train_pool
    from roll_spotlight.training.sampling import generate, to_uint8_images, train_spec

    g = cfg.train.group_size
    it = 200_000 + r
    pool = train_pool(cfg.task)
    specs = iteration_specs(cfg, pool, it, weight_version=0)
    texts = [s.prompt for s in specs[::g]]
    batch = len(texts)
    if screen:  # the refill candidates (the run's second prompt stream), after the draw's own
        texts += [pool.texts[i] for i in draw_prompt_ids(len(pool), batch, seed=cfg.seed, iteration=it, stream=1)]
    n = max(max(pools) * g, g + screen_seeds if screen else 0)
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

    settings = setting_names(pools, selections, baselines, only, screen)
    out = {"replicate": r, "iteration": it, "prompts": texts, "explore_s": explore_s,
           "base_val": float(before.mean()), "base_val_strict": float(np.nanmean(before_ev.strict)), "settings": {}}
    for name, p, sel, bl in settings:
        weighted = name.endswith("-hw")
        if sel == "screen":
            pick, base_arr, extra = _screened_groups(rewards, n, len(texts), batch, g, screen_seeds, weighted, floor, r)
        else:
            pick, base_arr, extra = _seed_groups(rewards, n, batch, p, g, sel, bl, weighted, r)
        sub, rw, pr, gid = _batch_of(traj, rewards, prompts, pick, g)
        policy = copy.deepcopy(base)
        torch.manual_seed(cfg.seed)
        trainer = FlowGRPOTrainer(policy, cfg.train)
        t1 = time.monotonic()
        metrics = trainer.step(ScoredBatch(sub, pr, gid, rw, cfg.sampling.noise_level, cfg.sampling.kind,
                                           baselines=base_arr)).metrics
        after_ev = evaluate(policy, val, reward, cfg.sampling)
        after = after_ev.rewards
        diff = after - before
        groups = rw.reshape(batch, g)
        out["settings"][name] = {
            "pool": p, "selection": sel, "baseline": bl, "val_change": float(diff.mean()),
            "val_change_se_pairs": float(diff.std(ddof=1) / math.sqrt(len(diff))),
            "val_strict_change": float(np.nanmean(after_ev.strict - before_ev.strict)),
            "trained_reward_std": float(groups.std(axis=1).mean()),
            "all_equal_groups": float(np.mean(groups.max(axis=1) == groups.min(axis=1))),
            "trained_samples": int(metrics.get("trained_samples", 0)), "seconds": time.monotonic() - t1, **extra}
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
    p.add_argument("--screen", action="store_true",
                   help="also prompt screening (screen, screen-hw) and unbiased seed selection (P{p}-pps-pool-hw)")
    p.add_argument("--screen-seeds", type=int, default=4, help="explored seeds per candidate prompt")
    p.add_argument("--floor", type=float, default=0.1, help="the screen's floor (exploration.prompt_floor)")
    p.add_argument("--start", default=None, help="a run checkpoint (directory or backend.pt) to start from; "
                                                 "default: the config's base")
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
    setting_names(args.pools, args.selections, args.baselines, args.only, args.screen)  # fail on a bad --only first

    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.startup import set_threads
    from roll_spotlight.training.prompt_pools import validation_set

    set_threads(args.threads)
    cfg = load_config(RunConfig, args.config, args.override)
    base, policy_name = load_start_policy(cfg, args.start)
    full = validation_set(cfg.task)
    v = min(args.val_pairs, len(full.texts))
    val = dataclasses.replace(full, texts=full.texts[:v], tags=full.tags[:v], seeds=full.seeds[:v])
    t0 = time.monotonic()
    jsonl = Path(args.jsonl or Path(args.out).with_suffix(".jsonl"))
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    with jsonl.open("w") as sink:
        reps = [replicate(cfg, base, r, args.pools, args.selections, args.baselines, val, args.only, sink,
                          args.screen, args.screen_seeds, args.floor)
                for r in range(args.first_replicate, args.first_replicate + args.replicates)]
    summary = summarise(reps)
    result = {"kind": "measured", "config": args.config, "overrides": args.override,
              "policy": policy_name, "reward": cfg.reward.name, "reward_kwargs": dict(cfg.reward.kwargs),
              "group_size": cfg.train.group_size, "learning_rate": cfg.train.learning_rate, "val_pairs": v,
              "test": "per replicate d = setting's validation change - vanilla's; mean d / se over replicates, "
                      "two-sided Student t with replicates - 1 df",
              "settings_tested": len(summary) - 1, "jsonl": str(jsonl),
              "wall_s": time.monotonic() - t0, "replicates": reps, "summary": summary,
              "command": "python -m benchmarks.explore_screen " + " ".join(argv or __import__("sys").argv[1:])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
