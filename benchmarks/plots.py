"""PNG figures of the report. Every title carries its kind: MEASURED, SIMULATED, or PAPER (reported).

matplotlib is imported inside each function (Agg backend), so the suite imports it only to draw.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from benchmarks.paper import PAPER_CLAIMS

PHASE_COLOURS = {"rollout": "tab:blue", "explore": "tab:green", "train": "tab:red", "sync": "tab:purple",
                 "join": "tab:orange", "restart": "black", "regroup": "tab:pink", "report": "gold",
                 "idle": "lightgrey"}
BASELINE_COLOURS = {"vanilla": "tab:grey", "explore_critical": "tab:olive", "naive_spot": "tab:orange",
                    "spotlight": "tab:blue", "spotlight_train": "tab:cyan", "fresh": "tab:olive",
                    "vanilla_fair_cost": "tab:brown"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_to_target(tables: Mapping[int, Mapping[str, Mapping[str, Any]]], metric: str, path: Path,
                   shape: str = "") -> Path:
    """Time (or cost) to target per baseline, one panel per resolution, the paper's ratio in a first column.

    ``tables``: resolution -> ``headline.time_and_cost_to_target`` output. Baselines whose
    iterations-to-target were not measured are drawn per iteration instead and say so. ``shape``
    (e.g. "8 on-demand + 8 spot") names the simulated cluster in each panel's title.
    """
    plt = _pyplot()
    key = {"time": "time_to_target_s", "cost": "cost_to_target_usd"}[metric]
    per_key = {"time": "time_per_iteration_s", "cost": "cost_per_iteration_usd"}[metric]
    fig, axes = plt.subplots(1, 1 + len(tables), figsize=(4.2 * (1 + len(tables)), 4))
    _paper_panel(axes[0], metric)
    for ax, (resolution, table) in zip(axes[1:], sorted(tables.items())):
        names = list(table)
        measured = all(table[n][key] is not None for n in names)
        values = [table[n][key] if measured else table[n][per_key] for n in names]
        scale, unit = (3600.0, "h") if metric == "time" else (1.0, "USD")
        colours = [BASELINE_COLOURS.get(n.split(":")[0], "tab:grey") for n in names]
        bars = ax.bar(names, [v / scale for v in values], color=colours)
        for bar, n in zip(bars, names):
            if table[n]["bound"] == "lower":
                bar.set_hatch("//")
        what = f"{metric} to target" if measured else f"{metric} per iteration (iterations-to-target not measured)"
        kind = "MEASURED iterations x SIMULATED per-iteration" if measured else "SIMULATED"
        where = f", {shape}" if shape else ""
        ax.set_title(f"{resolution}x{resolution}{where}: {what}\n{kind}", fontsize=8)
        ax.set_ylabel(f"{metric} ({unit}{'' if measured else ' per iteration'})")
        ax.tick_params(axis="x", labelrotation=20, labelsize=7)
    fig.text(0.99, 0.01, "hatched: lower bound (run censored by its budget)", ha="right", fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _paper_panel(ax, metric: str) -> None:
    claim = PAPER_CLAIMS["time_to_target" if metric == "time" else "cost_to_target"]
    lo, hi = claim.low, claim.high
    ax.bar(["vanilla", "spotlight"], [1.0, 1.0 / lo], color=["tab:grey", "tab:blue"])
    if hi != lo:
        ax.bar(["spotlight"], [1.0 / lo - 1.0 / hi], bottom=[1.0 / hi], color="none", edgecolor="black", hatch="..")
    ax.set_ylim(0, 1.1)
    ax.set_ylabel(f"{metric} to target, vanilla = 1")
    ax.set_title(f"PAPER (reported): {claim.text()} lower\n{claim.source}", fontsize=8)


def plot_utilisation(sim: Mapping[str, Any], path: Path, iterations: int = 3) -> Path:
    """Per-GPU phases of each baseline over its first ``iterations`` iterations (SIMULATED); of the
    fair-cost vanillas only Spotlight's (the others are vanilla on another GPU count)."""
    plt = _pyplot()
    names = [n for n, r in sim["baselines"].items() if r.get("timeline") and ":" not in n]
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 1.0 + 1.6 * len(names)), squeeze=False)
    horizon = max(sum(sim["baselines"][n]["iteration_times_s"][:iterations]) for n in names) if names else 1.0
    for ax, name in zip(axes[:, 0], names):
        _timeline_panel(ax, sim["baselines"][name]["timeline"], horizon)
        ax.set_title(f"{name}: GPU phases over the first {horizon:.0f} s (= {iterations} iterations of the slowest "
                     f"baseline) (SIMULATED)", fontsize=8, loc="left")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in PHASE_COLOURS.values()]
    fig.legend(handles, list(PHASE_COLOURS), loc="lower center", ncol=len(PHASE_COLOURS), fontsize=7)
    axes[-1, 0].set_xlabel("simulated seconds")
    fig.suptitle(f"GPU utilisation at {sim['cluster']['resolution']}^2, trace {sim['trace']['name']} (SIMULATED)",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def merge_intervals(timeline: Sequence[Sequence[Any]], horizon: float) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """gpu -> phase -> [(start, width)] within [0, horizon], touching same-phase intervals merged."""
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for gpu, start, end, phase in sorted(timeline, key=lambda x: (x[0], x[1])):
        if start >= horizon:
            continue
        end = min(end, horizon)
        spans = out.setdefault(gpu, {}).setdefault(phase, [])
        if spans and abs(spans[-1][0] + spans[-1][1] - start) < 1e-6:
            spans[-1] = (spans[-1][0], end - spans[-1][0])
        else:
            spans.append((start, end - start))
    return out


def _timeline_panel(ax, timeline, horizon: float) -> None:
    merged = merge_intervals(timeline, horizon)
    gpus = sorted(merged)
    for y, gpu in enumerate(gpus):
        for phase, spans in merged[gpu].items():
            ax.broken_barh(spans, (y - 0.4, 0.8), color=PHASE_COLOURS.get(phase, "white"))
    ax.set_xlim(0, horizon)
    ax.set_yticks(range(len(gpus)))
    ax.set_yticklabels(gpus, fontsize=5)


def plot_convergence(runs: Sequence[Mapping[str, Any]], target: float | None, path: Path,
                     subtitle: str | None = None) -> Path:
    """Validation reward against iteration for every run (MEASURED on the tiny task) and, when any
    run explored with stale weights, a second panel with its stale-vs-fresh Spearman correlations
    in the order they were logged. Records keep the correlations without their iterations, and an
    iteration with no explored seed among its rollouts logs none, so the panel counts them rather
    than naming iterations (with one per iteration from the second on, the n-th is iteration n+1).
    ``subtitle`` goes under the left panel's title (e.g. what a sensitivity run changed)."""
    plt = _pyplot()
    ranked = [run for run in runs if run.get("rank_spearman")]
    fig, axes = plt.subplots(1, 2 if ranked else 1, figsize=(12 if ranked else 7, 4), squeeze=False)
    ax = axes[0][0]
    for run in runs:
        its = [p["iteration"] for p in run["curve"]]
        ax.plot(its, [p["val_reward"] for p in run["curve"]], marker="o", markersize=3,
                color=BASELINE_COLOURS.get(run["setting"], "black"), label=f"{run['setting']} seed {run['seed']}")
    if target is not None:
        ax.axhline(target, linestyle="--", color="black", linewidth=1, label=f"target {target:.3f}")
    title = "Tiny task convergence (MEASURED, CPU)" + (f"\n{subtitle}" if subtitle else "")
    ax.set(xlabel="iteration", ylabel="validation reward", title=title)
    ax.legend(fontsize=7)
    if ranked:
        rax = axes[0][1]
        for run in ranked:
            ranks = run["rank_spearman"]
            rax.plot(range(1, 1 + len(ranks)), ranks, marker="o", markersize=3,
                     color=BASELINE_COLOURS.get(run["setting"], "black"), alpha=0.5 + 0.5 / (1 + run["seed"]),
                     label=f"{run['setting']} seed {run['seed']}")
        rax.axhline(0.0, color="grey", linewidth=0.5)
        rax.set(xlabel="correlation logged (n-th)", ylabel="Spearman, stale vs fresh rewards", ylim=(-1.05, 1.05),
                title="Rank monitor (MEASURED, CPU)")
        rax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_regroup(regroup: Mapping[str, Any], path: Path) -> Path:
    """Warm regroup vs cold restart (MEASURED) beside the paper's qualitative claim (PAPER)."""
    plt = _pyplot()
    fig, (ax_paper, ax) = plt.subplots(1, 2, figsize=(9, 3.5), gridspec_kw={"width_ratios": [1, 1.4]})
    ax_paper.axis("off")
    claim = PAPER_CLAIMS["sp_recovery"]
    ax_paper.text(0.02, 0.5, f"PAPER (reported):\n{claim.what}\n({claim.source})\nno per-case numbers published",
                  fontsize=8, va="center", wrap=True)
    ax.bar(["warm regroup", "cold restart"], [regroup["warm_regroup_median_s"], regroup["cold_restart_median_s"]],
           color=["tab:blue", "tab:grey"])
    ax.set_yscale("log")
    lost = "definition" in regroup  # newer results: time lost, the shared denoising step taken out
    ax.set_ylabel("seconds lost (median)" if lost else "seconds (median)")
    ax.set_title(f"SP recovery on this machine (MEASURED): {regroup['speedup']:.0f}x", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_verdict(rows: Sequence[Any], targets: Mapping[int, Mapping[str, float]], path: Path) -> Path:
    """Vanilla / Spotlight with spot training to target, per cluster shape: SIMULATED and EMULATED bars
    for time and cost, the project target as a tick on each group and the paper's figures as lines."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"{r.ondemand_gpus}+{r.spot_gpus}\n{r.resolution}" for r in rows]
    xs = range(len(rows))
    for ax, metric in zip(axes, ("time", "cost")):
        for offset, kind, colour in ((-0.2, "simulated", "tab:blue"), (0.2, "emulated", "tab:orange")):
            values = [r.to_target(metric, kind).value or 0.0 for r in rows]
            ax.bar([x + offset for x in xs], values, width=0.4, color=colour, label=kind.upper())
        ax.scatter(list(xs), [targets.get(r.resolution, targets[1280])[metric] for r in rows], marker="_", s=400,
                   color="black", label="project target", zorder=3)
        claim = PAPER_CLAIMS[f"{metric}_to_target"]
        ax.axhspan(claim.low, claim.high, color="tab:red", alpha=0.15 if claim.high > claim.low else 0.0)
        ax.axhline(claim.low, color="tab:red", linestyle="--", linewidth=1, label=f"PAPER {claim.text()}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_xlabel("on-demand + spot GPUs, resolution")
        ax.set_ylabel(f"vanilla / Spotlight, {metric} to target")
        ax.set_title(f"{metric} to target: Spotlight with spot training vs vanilla on demand", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
