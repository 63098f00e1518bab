"""`spotlight report RUN_DIR`: a Markdown report with PNG plots of one run (all figures measured).

Plots: training reward and validation reward (with standard errors) per iteration; strict accuracy;
validation images of the base and the final policy for the same prompts and seeds; and a
per-worker timeline of rollout, reward, train and validation phases (idle is the gaps) with
preemption notices, commits and preempted workers marked.
Runs with spot workers also get their cost ledger (GPU-seconds and USD per pool, vs all on
demand) and the spot pool's preemption, notice and resume counters.
"""
from __future__ import annotations

import json
from pathlib import Path

from roll_spotlight.training.metrics import read_metrics


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(rows: list[dict], path: Path) -> None:
    plt = _plt()
    ranked = [r for r in rows if "rank_spearman" in r]
    fig, axes = plt.subplots(1, 3 if ranked else 2, figsize=(16 if ranked else 11, 4))
    ax1, ax2 = axes[0], axes[1]
    if ranked:
        axes[2].plot([r["step"] for r in ranked], [r["rank_spearman"] for r in ranked], marker="o", label="Spearman")
        axes[2].plot([r["step"] for r in ranked], [r["rank_kendall"] for r in ranked], marker="x", label="Kendall")
        axes[2].set(xlabel="iteration", ylabel="rank correlation", ylim=(-1.05, 1.05),
                    title="stale vs fresh rewards of the same seeds (measured)")
        axes[2].legend()
    train = [r for r in rows if "reward_mean" in r]
    val = [r for r in rows if "val_reward" in r]
    ax1.plot([r["step"] for r in train], [r["reward_mean"] for r in train], label="training reward (mean)")
    ax1.errorbar([r["step"] for r in val], [r["val_reward"] for r in val], yerr=[r["val_reward_se"] for r in val],
                 capsize=2, marker="o", label="validation reward")
    ax1.set(xlabel="iteration", ylabel="reward", title="reward (measured)")
    ax1.legend()
    ax2.plot([r["step"] for r in val], [r["val_strict"] for r in val], marker="o")
    ax2.set(xlabel="iteration", ylabel="strict accuracy", title="validation strict accuracy (measured)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


PHASE_COLORS = {"rollout": "tab:blue", "explore": "tab:cyan", "reward": "tab:orange", "train": "tab:red",
                "validate": "tab:green", "wait_rollouts": "lightgrey"}


MARKS = {"notice": ("v", "gold"), "commit": ("o", "green"), "preempted": ("x", "red"), "died": ("x", "black")}


def plot_timeline(events: list[dict], path: Path) -> None:
    """One row per worker (every spot worker the run started, alive or gone): phases as bars,
    preemption notices, commits of in-flight state and the end of preempted workers as marks."""
    plt = _plt()
    workers = sorted({e["worker"] for e in events})
    t0 = min(e["start"] for e in events)
    fig, ax = plt.subplots(figsize=(11, 0.35 * len(workers) + 1.5))
    for row, worker in enumerate(workers):
        for e in (e for e in events if e["worker"] == worker):
            if e["phase"] in MARKS:
                marker, color = MARKS[e["phase"]]
                ax.scatter([e["start"] - t0], [row], marker=marker, color=color, s=40, zorder=3)
            else:
                ax.barh(row, e["end"] - e["start"], left=e["start"] - t0, color=PHASE_COLORS.get(e["phase"], "k"))
    ax.set_yticks(range(len(workers)), workers, fontsize=7)
    ax.set(xlabel="seconds since start", title="per-worker timeline (measured; gaps are idle)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in PHASE_COLORS.values()]
    handles += [plt.Line2D([], [], marker=m, color=c, linestyle="") for m, c in MARKS.values()]
    ax.legend(handles, [*PHASE_COLORS, *MARKS], loc="upper right", fontsize=7, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_samples(base: dict, final: dict, path: Path) -> None:
    """Validation images of the same prompts and seeds: the base policy's row above the final one,
    each titled with its reward, the prompt under each column."""
    import textwrap

    plt = _plt()
    n = len(base["images"])
    fig, axes = plt.subplots(2, n, figsize=(1.9 * n, 4.6), squeeze=False)
    for col in range(n):
        for row, (label, data) in enumerate((("base", base), ("final", final))):
            ax = axes[row][col]
            ax.imshow(data["images"][col], interpolation="nearest")
            ax.set_xticks([]), ax.set_yticks([])
            ax.set_title(f"{label} {float(data['rewards'][col]):.2f}", fontsize=8)
        axes[1][col].set_xlabel("\n".join(textwrap.wrap(str(base["prompts"][col]), 22)), fontsize=7)
    fig.suptitle("validation samples: base (top) vs final (bottom), same prompt and seed; reward in titles")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def busy_fractions(events: list[dict]) -> dict[str, float]:
    if not events:
        return {}
    span = max(e["end"] for e in events) - min(e["start"] for e in events)
    busy: dict[str, float] = {}
    for e in events:
        if e["phase"] != "wait_rollouts":
            busy[e["worker"]] = busy.get(e["worker"], 0.0) + e["end"] - e["start"]
    return {w: b / span for w, b in busy.items()} if span > 0 else {}


def rollout_cpu(events: list[dict]) -> tuple[float, int] | None:
    """(CPU seconds, denoising steps of one sample) of the workers' rollout and explore batches:
    each worker process's CPU time while it denoised them, decode included (`worker.loop`)."""
    phases = [e for e in events if e["phase"] in ("rollout", "explore") and "cpu_s" in e]
    steps = sum(e["row_steps"] for e in phases)
    return (sum(e["cpu_s"] for e in phases), steps) if steps else None


def _cpu_lines(events: list[dict], config: dict) -> list[str]:
    cost = rollout_cpu(events)
    if cost is None:
        return []
    sampling = config.get("sampling", {})
    steps, batch = sampling.get("num_steps", 10), sampling.get("max_batch", 1)
    return [f"Rollout CPU: {1e3 * cost[0] / cost[1] * steps:.1f} ms per sample of {steps} steps at "
            f"`sampling.max_batch` {batch} ({cost[0]:.0f} CPU seconds over {cost[1] / steps:.0f} samples' steps, "
            "validation included; each worker process's CPU time while it denoised, decode included).", ""]


def write_report(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl: is it a run directory?")
    rows = read_metrics(run_dir)
    plot_curves(rows, run_dir / "curves.png")
    emulation = run_dir / "emulation.json"
    lines = [f"# Run report: {run_dir.name}", "", "All figures are measured on the machine that ran it.", ""]
    if emulation.is_file():
        lines = lines[:2] + _emulation_lines(json.loads(emulation.read_text()), rows)
    summary_path = run_dir / "summary.json"
    summary = {}
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        lines += _summary_lines(summary) + _variation_lines(summary.get("config", {}))
    lines += ["![curves](curves.png)", ""]
    lines += _sample_lines(run_dir)
    lines += _training_lines(rows)
    lines += _spot_lines(rows)
    timeline_path = run_dir / "timeline.json"
    if timeline_path.is_file() and (events := json.loads(timeline_path.read_text())):
        plot_timeline(events, run_dir / "timeline.png")
        lines += ["## Timeline", "", "| worker | busy fraction |", "|---|---|"]
        lines += [f"| {w} | {f:.2f} |" for w, f in sorted(busy_fractions(events).items())]
        lines += [""] + _cpu_lines(events, summary.get("config", {}))
        marks = {m: sum(e["phase"] == m for e in events) for m in MARKS}
        lines += ["Marks: " + ", ".join(f"{n} {m}" for m, n in marks.items()) + ".", ""]
        lines += ["![timeline](timeline.png)", ""]
    out = run_dir / "report.md"
    out.write_text("\n".join(lines))
    return out


def _emulation_lines(emulation: dict, rows: list[dict]) -> list[str]:
    """An emulated run (`spotlight train --emulate`): the GPU and time-scale, the memory plan on
    that GPU, and each iteration's time and cost scaled back to the emulated GPUs (EMULATED)."""
    scale = emulation["time_scale"]
    plan = ", ".join(f"{role} {gib:.1f} GiB" for role, gib in emulation["memory_plan_gib"].items())
    lines = [f"EMULATED: a dry run on {emulation['gpu']} GPUs at time-scale {scale:g} (every compute phase waited "
             "the cost model's duration divided by it; the queue, workers, trainer and spot nodes were real). "
             "Times below are scaled back to the emulated GPUs; rewards are stand-ins, so validation means "
             "nothing here; the other figures are measured wall time.", "",
             f"Memory plan on one {emulation['gpu']} ({emulation['gpu_memory_gib']:g} GiB): {plan}.", "",
             "| iteration | seconds (EMULATED) | rollout | reward | train | cost so far (USD) |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("iteration_s") is None:
            continue
        lines.append(f"| {r['step']} | {r['iteration_s'] * scale:.1f} | {r['rollout_s'] * scale:.1f} | "
                     f"{r['reward_s'] * scale:.1f} | {r['train_s'] * scale:.1f} | {r.get('cost/usd', float('nan')):.2f} |")
    return lines + [""]


def _sample_lines(run_dir: Path) -> list[str]:
    """The base-vs-final grid, when the run kept validation samples (`training.evaluate.save_samples`)."""
    import numpy as np

    files = [run_dir / "samples" / f"{name}.npz" for name in ("base", "final")]
    if not all(f.is_file() for f in files):
        return []
    base, final = ({k: v for k, v in np.load(f).items()} for f in files)
    plot_samples(base, final, run_dir / "samples.png")
    return ["## Validation samples", "", "![samples](samples.png)", ""]


def _summary_lines(summary: dict) -> list[str]:
    b, f, p = summary["base"], summary["final"], summary["paired"]
    bg = all(k in e for k in ("val_bg_level", "val_bg_grid") for e in (b, f))
    head = "| | validation reward | strict accuracy |" + (" background level | background patch grid |" if bg else "")

    def row(name: str, e: dict) -> str:
        cells = f"| {name} | {e['val_reward']:.4f} ± {e['val_reward_se']:.4f} | {e['val_strict']:.3f} |"
        return cells + (f" {e['val_bg_level']:.2f} | {e['val_bg_grid']:.3f} |" if bg else "")

    lines = [head, "|---|---|---|" + ("---|---|" if bg else ""), row("base", b), row("final", f), "",
             f"Paired gain: {p['gain']:+.4f} ± {p['gain_se']:.4f} (z = {p['z']:.1f}); "
             f"strict accuracy change {p['strict_change']:+.3f}.", ""]
    if bg:
        lines += ["Background columns: what the reward cannot see, over every validation pair: the mean intensity "
                  "(0-255) of the black background away from the shapes, and the spread of that mean over the "
                  "pixel positions of one token's patch (a texture on the patch grid); `tasks.shapes.artefacts`.", ""]
    return lines


# The quickstart's run-to-run spread, measured once on configs/quickstart.yaml as it ships
# (docs/measurements.md, "How much a run varies", with the command).
QUICKSTART_SPREAD = {"seeds": (0, 1, 2), "gains": (0.110, 0.063, 0.044), "z": (5.1, 3.2, 2.4)}


def _variation_lines(config: dict) -> list[str]:
    """What makes this run differ from another: its seed, and where Ray's timing and the spot market
    enter; for the quickstart, the spread of the gain measured over seeds."""
    if "seed" not in config:
        return []
    explore = config.get("exploration", {}).get("mode") == "stale"
    spot = config.get("spot", {}).get("enabled", False)
    lines = [f"Seed {config['seed']} (it draws the prompts, the rollouts' seeds and the SDE windows); the base is "
             f"pretrained with pretrain.seed {config.get('pretrain', {}).get('seed')} and cached, so later runs of "
             "any seed start from the same weights."]
    if spot:
        batch = config.get("sampling", {}).get("max_batch", 1)
        exact = ("a rollout is a pure function of (weights, prompt, seed, schedule), resumed bit for bit after a "
                 "commit" if batch == 1 else f"workers denoise up to {batch} requests together, and a rollout, "
                 "committed and resumed in any batch, stays within 1e-4 of itself alone")
        lines.append(f"The spot market replays on the wall clock ({config['spot'].get('compression', 1):g}x faster), "
                     f"so when notices and preemptions fall differs from run to run; {exact}, and an update sums its "
                     "micro-batches in id order, so preemptions alone do not change the curve"
                     f"{'' if batch == 1 else ' beyond that rounding'}.")
    if explore:
        lines.append("Stale exploration runs while each update trains and stops when it ends, so how many seeds it "
                     "explores, and so which seeds the next iteration trains on, depends on how fast the workers "
                     "run: on Ray two runs of the same seed can differ.")
    if config.get("exp_name") == "quickstart":
        gains = QUICKSTART_SPREAD["gains"]
        cells = ", ".join(f"{g:+.3f} (seed {s}, z {z:.1f})"
                          for s, g, z in zip(QUICKSTART_SPREAD["seeds"], gains, QUICKSTART_SPREAD["z"]))
        lines.append(f"Measured once over seeds of `configs/quickstart.yaml` as it ships (docs/measurements.md): "
                     f"paired gains {cells}; spread {min(gains):+.3f} to {max(gains):+.3f}.")
    return ["## How much a run varies", "", " ".join(lines), ""]


def _count(n: float, noun: str) -> str:
    return f"{n:g} {noun}" + ("" if n == 1 else "s")


def _training_lines(rows: list[dict]) -> list[str]:
    """Queue training (`spot.training_phase`): who computed the updates' micro-batches."""
    rows = [r for r in rows if "train/micro_batches" in r]
    if not rows:
        return []
    total = sum(r["train/micro_batches"] for r in rows)
    spot = sum(r.get("train/micro_batches_spot", 0.0) for r in rows)
    trainer = sum(r.get("train/micro_batches_trainer", 0.0) for r in rows)
    workers = sum(r.get("train/workers", 0.0) for r in rows)
    spot_workers = sum(r.get("train/spot_workers", 0.0) for r in rows)
    lines = ["## Training micro-batches", "",
             f"{len(rows)} updates, {total:g} micro-batches: {trainer:g} on the trainer, "
             f"{total - trainer - spot:g} on on-demand rollout workers, {spot:g} on spot workers "
             f"({100 * spot / total:.1f}%; spot workers were {100 * spot_workers / max(workers, 1):.1f}% of the "
             f"workers that trained). Refused reports: {sum(r.get('train/reports_refused', 0.0) for r in rows):g}; "
             f"training seconds the spot workers saved (their micro-batches at the on-demand rate): "
             f"{sum(r.get('train/spot_saved_s', 0.0) for r in rows):.1f}.", ""]
    notices = sum(r.get("spot/notices_in_training", 0.0) for r in rows)
    kills = sum(r.get("spot/preemptions_in_training", 0.0) for r in rows)
    if notices or kills:
        lines += [f"While updates trained the market sent {_count(notices, 'notice')} and preempted "
                  f"{_count(kills, 'spot node')}; every update still counted each of its micro-batches exactly once "
                  "(the trainer asserts it).", ""]
    placed = [r for r in rows if "spot/placement" in r]
    if placed:
        lines += [f"Last placement (`spot.training_phase: auto`): {placed[-1]['spot/placement']}.", ""]
    return lines


SPOT_COUNTERS = ("nodes_started", "preemptions", "notices", "notices_late", "actor_deaths", "commits",
                 "resumed_from_commit", "outputs_resumed", "completed_on_spot", "steps_lost", "requests_failed",
                 "duplicate_completions", "late_completions_rejected")


def _spot_lines(rows: list[dict]) -> list[str]:
    """The spot pool's counters and the cost ledger, from the last metrics row that has them
    (written after the last training step: the final validation is not billed)."""
    last = next((r for r in reversed(rows) if "cost/usd" in r), None)
    if last is None:
        return []
    scale = last["cost/bill_scale"]
    pools = sorted(k.removeprefix("cost/gpu_s/") for k in last if k.startswith("cost/gpu_s/"))
    lines = ["## Spot workers and cost", "",
             f"GPU-seconds on the spot market's clock x {scale:g} (its time compression, so trace seconds); "
             "rollout GPUs are simulated, so dollars are what this schedule would cost at the listed prices.", "",
             "| pool | GPU-hours | USD |", "|---|---|---|"]
    lines += [f"| {p} | {last[f'cost/gpu_s/{p}'] / 3600:.3f} | {last[f'cost/usd/{p}']:.2f} |" for p in pools]
    lines += [f"| total | | {last['cost/usd']:.2f} |", "",
              f"All on demand: {last['cost/all_ondemand_usd']:.2f} USD; saved {last['cost/savings_usd']:.2f} USD "
              f"({100 * last['cost/savings_fraction']:.1f}%).", "",
              "| counter | value |", "|---|---|"]
    lines += [f"| {name} | {last[f'spot/{name}']:g} |" for name in SPOT_COUNTERS if f"spot/{name}" in last]
    return lines + [""]
