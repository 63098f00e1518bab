"""``REPORT.md``: the suite's numbers as tables beside the paper's, and the figures, each with its kind.

Kinds: MEASURED (on this machine: mechanisms, tiny-task learning), SIMULATED (cost model + spot
trace), PAPER (the abstract's figures, cited). A headline number that is the product of a measured
and a simulated factor says so. Nothing here computes a result; it formats ``run_suite``'s.
"""
from __future__ import annotations

import datetime
import math
import os
import platform
from pathlib import Path
from typing import Any, Mapping

from roll_spotlight.tools.bench import plots
from roll_spotlight.tools.bench.headline import HeadlineRow, ceilings, headline, time_and_cost_to_target
from roll_spotlight.tools.bench.paper import PAPER_CLAIMS, paper_text

_PAPER_KEY = {"time": "time_to_target", "cost": "cost_to_target"}


def write_report(result: Mapping[str, Any], out_dir: Path) -> Path:
    """Draw the figures and write ``out_dir/REPORT.md``; returns its path."""
    out_dir = Path(out_dir)
    sims = _sims(result)
    estimates = _estimates(result)
    figures = _figures(result, sims, estimates, out_dir)
    sections = [_header(result), _headline_section(estimates, sims), _to_target_section(estimates, sims, figures),
                _utilisation_section(result, sims, figures), _extra_traces_section(result),
                _convergence_section(result, figures), _mechanism_section(result, figures),
                _cost_model_section(result), _stages_section(result), _caveats()]
    path = out_dir / "REPORT.md"
    path.write_text("\n\n".join(s for s in sections if s) + "\n")
    return path


def _sims(result: Mapping[str, Any]) -> dict[int, dict]:
    sim = result.get("simulator") or {}
    return {int(k): v for k, v in (sim.get("by_resolution") or {}).items()}


def _estimates(result: Mapping[str, Any]) -> dict:
    conv = result.get("convergence") or {}
    return (conv.get("summary") or {}).get("estimates") or {}


# ------------------------------------------------------------------------------ figures
def _figures(result, sims, estimates, out_dir: Path) -> dict[str, str]:
    figs: dict[str, str] = {}
    if sims:
        tables = {res: time_and_cost_to_target(estimates, sim) for res, sim in sims.items()}
        for metric in ("time", "cost"):
            figs[f"{metric}_to_target"] = plots.plot_to_target(tables, metric, out_dir / f"{metric}_to_target.png").name
        for res, sim in sims.items():
            figs[f"utilisation_{res}"] = plots.plot_utilisation(sim, out_dir / f"utilisation_{res}.png").name
    conv = result.get("convergence") or {}
    if conv.get("runs"):
        target = (conv.get("summary") or {}).get("target")
        figs["convergence"] = plots.plot_convergence(conv["runs"], target, out_dir / "convergence.png").name
    regroup = (result.get("mechanisms") or {}).get("regroup") or {}
    if "warm_regroup_median_s" in regroup:
        figs["regroup"] = plots.plot_regroup(regroup, out_dir / "regroup.png").name
    return figs


def _img(figs: Mapping[str, str], key: str, caption: str) -> str:
    return f"![{caption}]({figs[key]})" if key in figs else ""


# ------------------------------------------------------------------------------ sections
def _header(result) -> str:
    smoke = ("\n> **SMOKE RUN**: CI-sized models, clusters and runs. The numbers below check the plumbing "
             "and mean nothing about performance.\n") if result.get("smoke") else ""
    return (f"# Benchmarks: Spotlight vs vanilla Flow-GRPO\n{smoke}\n"
            f"Command: `{result.get('command')}`  \n"
            f"Finished {datetime.datetime.now().isoformat(timespec='seconds')} on {platform.node() or 'this machine'} "
            f"({os.cpu_count()} cores, Python {platform.python_version()}); total wall time "
            f"{result.get('wall_s', 0.0) / 60:.1f} min.\n\n"
            "Every number is labelled: **MEASURED** (on this machine: mechanism benchmarks, learning on the "
            "tiny task on CPU), **SIMULATED** (cluster time and cost from the cost model and a real spot "
            "trace; every constant names its source, see the table near the end), or **PAPER** (the figures "
            f"of the Spotlight abstract, {PAPER_CLAIMS['time_to_target'].source}; only the abstract is public).")


def _headline_section(estimates, sims) -> str:
    if not sims:
        return "## Headline\n\nThe simulator did not run, so there is no headline (see the stages table)."
    rows = headline(estimates, sims)
    lines = ["## Headline: Spotlight vs vanilla (vanilla / Spotlight; higher is better for Spotlight)", "",
             "| resolution | to target | PAPER (reported) | target (issue 8) | ours | = iterations ratio "
             "(MEASURED) | x per-iteration ratio (SIMULATED) | met? | missed by |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.resolution}x{r.resolution} | {r.metric} | {PAPER_CLAIMS[_PAPER_KEY[r.metric]].text()} "
                     f"| >= {r.target:g}x | **{r.total.text()}** | {r.iterations.text()} | {r.per_iteration:.2f}x "
                     f"| {_met_text(r)} | {_shortfall_text(r)} |")
    lines += ["", "The paper gives one speedup (4x) and one cost range (1.4-6.4x) for both resolutions together; "
              "the per-resolution targets are the issue's.", "", "Why, row by row:", ""]
    lines += [f"- {r.resolution}x{r.resolution} {r.metric}: {r.why}." for r in rows]
    return "\n".join(lines)


def _met_text(r: HeadlineRow) -> str:
    return {True: "yes", False: "**no**", None: "undecided"}[r.met]


def _shortfall_text(r: HeadlineRow) -> str:
    if r.met is False and r.shortfall:
        return f"{r.shortfall:.2f}x (reached {r.total.value / r.target:.0%} of the target)"
    if r.met is None:
        return f"unknown; needs iterations ratio >= {r.needed_iterations_ratio:.2f}x"
    return "-"


def _to_target_section(estimates, sims, figs) -> str:
    if not sims:
        return ""
    lines = ["## Time and cost to target per baseline (MEASURED iterations x SIMULATED per iteration)", "",
             "naive spot explores nothing, so it needs vanilla's measured iterations; exploration on the critical "
             "path uses the `fresh` setting's.", ""]
    for res, sim in sorted(sims.items()):
        lines += [f"### {res}x{res} (trace `{sim['trace']['name']}`, {sim['cluster']['ondemand_gpus']} on-demand + "
                  f"{sim['cluster']['spot_gpus']} spot GPUs, {sim['iterations']} simulated iterations)", "",
                  "| baseline | iterations to target (MEASURED, setting) | s / iteration (SIM) | USD / iteration (SIM) "
                  "| time to target | cost to target |", "|---|---|---|---|---|---|"]
        for name, row in time_and_cost_to_target(estimates, sim).items():
            lines.append(f"| {name} | {_iters_text(row)} | {row['time_per_iteration_s']:.1f} | "
                         f"{row['cost_per_iteration_usd']:.2f} | {_maybe(row['time_to_target_s'], 3600, 'h', row)} | "
                         f"{_maybe(row['cost_to_target_usd'], 1, 'USD', row)} |")
        lines.append("")
    lines += [_img(figs, "time_to_target", "time to target"), "", _img(figs, "cost_to_target", "cost to target")]
    return "\n".join(lines)


def _iters_text(row) -> str:
    if row["iterations"] is None:
        return f"not measured ({row['setting']})"
    return f"{'>= ' if row['bound'] == 'lower' else ''}{row['iterations']:g} ({row['setting']})"


def _maybe(value, scale: float, unit: str, row) -> str:
    if value is None:
        return "not measured"
    return f"{'>= ' if row['bound'] == 'lower' else ''}{value / scale:.2f} {unit}"


def _utilisation_section(result, sims, figs) -> str:
    if not sims:
        return ""
    note = (result.get("simulator") or {}).get("note")
    lines = ["## GPU utilisation (SIMULATED)", ""] + ([f"> {note}", ""] if note else []) + [
        f"PAPER: spot GPUs cost {paper_text('spot_discount')} less than on-demand; the abstract's premise is that they sit idle "
        "during training without exploration (no idle fraction is published).", ""]
    for res, sim in sorted(sims.items()):
        c = ceilings(sim)
        lines += [f"### {res}x{res}: training {sim['phases']['train_s']:.0f} s of a vanilla iteration of "
                  f"{sim['baselines']['vanilla']['time_per_iteration_s']:.0f} s (per-iteration ceilings: time "
                  f"{c['time']:.2f}x, cost {c['cost']:.2f}x)", "",
                  "| baseline | on-demand idle | spot idle | preemptions | notices | regroups | cold restarts | "
                  "commits | lost GPU-s |", "|---|---|---|---|---|---|---|---|---|"]
        for name, r in sim["baselines"].items():
            spot_idle = "-" if r["spot_idle_fraction"] is None else f"{r['spot_idle_fraction']:.1%}"
            lines.append(f"| {name} | {r['ondemand_idle_fraction']:.1%} | {spot_idle} | {r['preemptions']} | "
                         f"{r['notices']} | {r['regroups']} | {r['cold_restarts']} | {r['commits']} | "
                         f"{r['lost_gpu_s']:.0f} |")
        lines += ["", _img(figs, f"utilisation_{res}", f"GPU phases at {res}"), ""]
    return "\n".join(lines)


def _extra_traces_section(result) -> str:
    extra = (result.get("simulator") or {}).get("extra") or []
    if not extra:
        return ""
    lines = ["## Other spot traces (SIMULATED, per iteration, vanilla / Spotlight)", "",
             "| trace | zone | resolution | time ratio | cost ratio | Spotlight preemptions | Spotlight spot idle |",
             "|---|---|---|---|---|---|---|"]
    for e in extra:
        for res, sim in sorted(e["by_resolution"].items(), key=lambda kv: int(kv[0])):
            v, s = sim["baselines"]["vanilla"], sim["baselines"]["spotlight"]
            lines.append(f"| {e['trace']} | {e['zone'] or 'all'} | {res} | "
                         f"{v['time_per_iteration_s'] / s['time_per_iteration_s']:.2f}x | "
                         f"{v['cost_per_iteration_usd'] / s['cost_per_iteration_usd']:.2f}x | {s['preemptions']} | "
                         f"{s['spot_idle_fraction']:.1%} |")
    return "\n".join(lines)


def _convergence_section(result, figs) -> str:
    conv = result.get("convergence") or {}
    if "error" in conv:
        return f"## Convergence on the tiny task (MEASURED)\n\nFailed: {conv['error']}"
    summary = conv.get("summary") or {}
    budget = conv.get("budget") or {}
    lines = ["## Convergence on the tiny task (MEASURED, CPU)", "",
             f"Source: {conv.get('source', 'this run')}. Target rule: {summary.get('target_rule')}. Base model "
             f"validation reward: {_f(summary.get('base_val_reward'))}."]
    if budget:
        limit = (f"{budget.get('parallel')} at a time, every run to the same iteration horizon, all stopped "
                 f"at a {budget.get('budget_s', 0) / 60:.0f}-minute deadline" if budget.get("deadline")
                 else "in process, no time limit")
        lines.append(f"Training runs: {limit}; overrides {budget.get('overrides') or 'none'}. A run stopped before "
                     "reaching the target gives only a lower bound.")
    lines += ["", "| setting | runs | reached | iterations to target per run | horizon per run | median | kind |",
              "|---|---|---|---|---|---|---|"]
    for name, e in (summary.get("estimates") or {}).items():
        lines.append(f"| {name} | {e['runs']} | {e['reached']} | {list(e['per_run'])} | {list(e['horizons'])} | "
                     f"{_f(e['value'], 1)} | {e['bound']} |")
    gains = summary.get("paired_vs_vanilla") or {}
    if gains:
        lines += ["", "Paired by training seed against vanilla (validations both runs made after iteration 0; "
                  "mean +- standard error over seeds): the curve is the mean difference over those validations, "
                  "the final the difference at the last one.", "",
                  "| setting | seeds | mean final val reward | curve difference | final difference |",
                  "|---|---|---|---|---|"]
        for name, g in gains.items():
            lines.append(f"| {name} | {len(g['seeds'])} | {_f((summary.get('final_mean') or {}).get(name))} | "
                         f"{_pm(g['curve'])} | {_pm(g['final'])} |")
    lines += ["", "| setting | seed | status | wall s | last iteration evaluated | final val reward | median s / "
              "iteration | mean stale-vs-fresh Spearman |", "|---|---|---|---|---|---|---|---|"]
    for r in conv.get("runs") or []:
        final = r["curve"][-1]["val_reward"] if r["curve"] else None
        lines.append(f"| {r['setting']} | {r['seed']} | {r['status']} | {r['wall_s']:.0f} | {r['horizon']} | "
                     f"{_f(final)} | {_f(r.get('iteration_s_median'), 1)} | {_mean_rank(r.get('rank_spearman'))} |")
    if summary.get("target") is None:
        lines += ["", "**Iterations-to-target could not be measured** in this run (see the target rule above), so "
                  "the headline's totals are 'not measured'; only the simulated per-iteration factors stand."]
    lines += ["", _img(figs, "convergence", "convergence")]
    return "\n".join(lines)


def _pm(spread: dict) -> str:
    se = spread.get("se")
    return f"{spread['mean']:+.4f}" + (f" +- {se:.4f}" if se is not None else "")


def _mean_rank(ranks) -> str:
    """Mean of the logged correlations that are defined: a Spearman of rewards that are all equal
    (a pass / fail reward where every regenerated seed failed) is NaN and says nothing about rank."""
    if not ranks:
        return "-"
    defined = [x for x in ranks if math.isfinite(x)]
    if not defined:
        return f"undefined in all {len(ranks)}"
    mean = _f(sum(defined) / len(defined))
    return mean if len(defined) == len(ranks) else f"{mean} ({len(defined)} of {len(ranks)} defined)"


def _mechanism_section(result, figs) -> str:
    mech = result.get("mechanisms") or {}
    lines = ["## Mechanism benchmarks (MEASURED on this machine) beside the paper", "",
             "| benchmark | metric | ours (MEASURED) | issue target | PAPER (reported) |", "|---|---|---|---|---|"]
    p = mech.get("planner") or {}
    if "planner_over_uniform" in p:
        lines += [f"| planner | planner_over_uniform (plain round robin) | {_f(p['planner_over_uniform'], 3)} "
                  "| >= 1.2 | - |",
                  *([f"| planner | planner_over_uniform_with_abandon (round robin that also abandons and replaces "
                     f"all-equal prompts) | {_f(p['planner_over_uniform_with_abandon'], 3)} | - | - |"]
                    if "planner_over_uniform_with_abandon" in p else []),
                  f"| planner | planner_over_oracle | {_f(p['planner_over_oracle'], 3)} | >= 0.9 | - |",
                  *([f"| planner | planner_unscreened_over_oracle (ablation: full first pulls, no screening) "
                     f"| {_f(p['planner_unscreened_over_oracle'], 3)} | - | - |"]
                    if p.get("planner_unscreened_over_oracle") is not None else []),
                  f"| planner | decision ms / pull (median) | {_f(p['decision_time_ms_per_pull'], 3)} | < 1 | - |"]
        setup = p.get("setup") or {}
        if setup.get("budget_pulls") and setup.get("n_prompts"):
            per_prompt = setup["budget_pulls"] * setup["seeds_per_pull"] / setup["n_prompts"]
            lines.append(f"| planner | budget: explored seeds per prompt (groups of {setup['group_size']}; "
                         f"the simulator's cost model at 512x512) | {per_prompt:.2f} | - | - |")
    g = mech.get("regroup") or {}
    if "warm_regroup_median_s" in g:
        lost = " (time lost)" if "definition" in g else ""
        lines += [f"| regroup | warm regroup median s{lost} | {g['warm_regroup_median_s']:.3f} | < 1 | sub-second |",
                  f"| regroup | cold restart median s{lost} | {g['cold_restart_median_s']:.2f} | - | minutes |",
                  f"| regroup | speedup{lost} | {g['speedup']:.1f}x | >= 50 | - |",
                  *([f"| regroup | speedup with the first denoising step included | "
                     f"{g['speedup_including_step']:.1f}x | - | - |"] if g.get("speedup_including_step") else []),
                  f"| regroup | SP max abs diff (fp32) | {g['sp_max_abs_diff']:.1e} | < 1e-5 | - |"]
    q = mech.get("queue") or {}
    targets = {"requests_per_s_median": ">= 5000 (64 pullers)", "queue_share_of_rollout": "< 0.01"}
    for key in ("workers", "pull_batch", "requests_per_s_median", "queue_ms_per_request", "queue_share_of_rollout",
                "queue_share_of_step"):
        if key in q:
            lines.append(f"| queue | {key} | {_f(q[key], 4)} | {targets.get(key, '-')} | - |")
    for name, r in mech.items():
        if "error" in r or "skipped" in r:
            lines.append(f"| {name} | - | {'failed: ' + r['error'] if 'error' in r else 'skipped: ' + r['skipped']} | - | - |")
    skipped = [m for m in ("planner", "regroup", "queue") if m not in mech]
    if skipped:
        lines += ["", f"Not run in this mode: {', '.join(skipped)}."]
    lines += ["", _img(figs, "regroup", "regroup")]
    return "\n".join(lines)


def _cost_model_section(result) -> str:
    table = (result.get("simulator") or {}).get("cost_model") or []
    if not table:
        return ""
    lines = ["## Cost model in force (the SIMULATED numbers' inputs)", "", "| constant | value | unit | source |",
             "|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['value']:g} | {r['unit']} | {r['source']} |" for r in table]
    return "\n".join(lines)


def _stages_section(result) -> str:
    lines = ["## Stages (wall time on this machine)", "", "| stage | status | minutes | note |", "|---|---|---|---|"]
    lines += [f"| {s['name']} | {s['status']} | {s['wall_s'] / 60:.1f} | {s['note'][:200]} |"
              for s in result.get("stages") or []]
    return "\n".join(lines)


def _caveats() -> str:
    return "\n".join([
        "## What is measured, what is simulated, what is missing", "",
        "- Learning is measured on a 1.3M-parameter DiT drawing shapes on CPU, not on Qwen-Image; the iterations "
        "ratio is assumed to carry over to the simulated Qwen-Image cluster. That transfer is an assumption.",
        "- Cluster time and cost per iteration are simulated (H100-class GPUs, Flow-GRPO's released settings); no "
        "GPU cluster was used. The warm regroup constant is replaced by this machine's measurement when the "
        "regroup benchmark ran; cold restarts remain modelled.",
        "- The paper's numbers are the abstract's; its cluster shapes, traces and per-resolution results are not "
        "public, so the PAPER column is a reference, not a like-for-like comparison.",
    ])


def _f(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
