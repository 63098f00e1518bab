"""``APPENDIX.md``: every table behind REPORT.md's verdict, each number with its kind.

Kinds: MEASURED (on this machine: mechanisms, tiny-task learning), SIMULATED (cost model + spot
trace), EMULATED (the live system with compute replaced by the cost model's durations), PAPER (the
abstract's figures, cited). Nothing here computes a result; it formats the suite's.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from roll_spotlight.sim.baselines import BASELINES
from benchmarks.headline import (BASELINE_LABELS, SYSTEM_LABELS, SYSTEMS, HeadlineRow, ceilings, goal_rows, headline,
                                 iterations_note, time_and_cost_to_target)
from benchmarks.paper import PAPER_CLAIMS, paper_text

_PAPER_KEY = {"time": "time_to_target", "cost": "cost_to_target"}


def appendix_sections(result: Mapping[str, Any], estimates, shapes, named_shapes, figs) -> list[str]:
    """The appendix's sections, in order (empty strings for what did not run)."""
    return [_goals_section(estimates, result, named_shapes), _headline_section(estimates, shapes, result),
            _spot_training_section(result, shapes), _emulated_section(result), _budget_section(result, shapes),
            _to_target_section(estimates, shapes, figs), _utilisation_section(result, shapes, figs),
            _extra_traces_section(result), _studies_section(result), _convergence_section(result, figs),
            _mechanism_section(result, figs), _cost_model_section(result), _stages_section(result), _caveats()]


def shape_label(name: str, sims: Mapping[int, Mapping[str, Any]]) -> str:
    """"today: 8 on-demand + 8 spot" for a simulated cluster shape."""
    cluster = next(iter(sims.values()))["cluster"]
    kind = "reserved" if name == "paper" else "on-demand"
    return f"{name}: {cluster['ondemand_gpus']} {kind} + {cluster['spot_gpus']} spot"


def _img(figs: Mapping[str, str], key: str, caption: str) -> str:
    return f"![{caption}]({figs[key]})" if key in figs else ""


def _goals_section(estimates, result, shapes) -> str:
    """The spot-training targets, each met or missed with its number."""
    if not shapes:
        return ""
    labels = {name: shape_label(name, sims) for name, sims in shapes.items()}
    lines = ["## Spot-training targets: Spotlight with spot training", "",
             "Per-iteration figures are SIMULATED; to-target figures are the SIMULATED per-iteration ratio x the "
             "iterations ratio, 1.00 by construction for spot training (it computes vanilla's update; vanilla's "
             "iterations are MEASURED). Both vanillas are reported for the cost targets; the targets name no one.", "",
             "| target | cluster | resolution | against | target | ours | met? | missed by |",
             "|---|---|---|---|---|---|---|---|"]
    for row in goal_rows(estimates, shapes):
        g = row.goal
        what = f"{g.metric} {'per iteration' if g.scope == 'per_iteration' else 'to target'}"
        ours = "not simulated" if not row.found else row.value.text()
        met = {True: "yes", False: "**no**", None: "undecided"}[row.met]
        missed = (f"{g.target / row.value.value:.2f}x (reached {row.value.value / g.target:.0%} of the target)"
                  if row.met is False else "-")
        lines.append(f"| {what}, {SYSTEM_LABELS[g.system]} | {labels.get(g.shape, g.shape)} | {g.resolution}x"
                     f"{g.resolution} | {BASELINE_LABELS[g.baseline]} | >= {g.target:g}x | **{ours}** | {met} "
                     f"| {missed} |")
    return "\n".join(lines)


def _headline_section(estimates, shapes, result) -> str:
    if not shapes:
        return "## Headline\n\nThe simulator did not run, so there is no headline (see the stages table)."
    conv = result.get("convergence") or {}
    rows = [r for label, sims in shapes for r in headline(estimates, sims, shape=label, systems=SYSTEMS)]
    vanilla = estimates.get("vanilla") or {}
    count = "not measured" if vanilla.get("value") is None else (
        f"{'>= ' if vanilla.get('bound') == 'lower' else ''}{vanilla['value']:g}")
    lines = ["## Headline: spot systems vs vanilla (vanilla / system; higher is better for the system)", "",
             f"**Iterations ratio of Spotlight today (MEASURED, {conv.get('regime', 'tiny task')}, "
             f"{conv.get('source', 'this run')})**: "
             f"{iterations_note(estimates)}.", "",
             "**Naive spot and Spotlight with spot training compute vanilla's update** (the same samples; spot "
             "training adds the same micro-batch gradients in another float summation order, which the runtime "
             f"tests), so they take vanilla's MEASURED iterations ({count}) and their iterations ratio is 1.00 by "
             "construction.", "",
             "Every total is the iterations ratio times the SIMULATED per-iteration ratio for the cluster shape "
             "named. Two vanillas per system: *equal on-demand* (vanilla on the system's on-demand GPUs, no spot) "
             "and *equal cost* (vanilla on the on-demand GPUs that system's dollars buy; GPU counts below). The "
             "reference column multiplies the per-iteration ratio by the ratio of the censored medians when the "
             "measured ratio is undetermined: not a result and not a bound.", "",
             "| cluster (SIMULATED) | resolution | to target | system | against | PAPER (reported) | project target "
             "| ours | = iterations ratio | x per-iteration ratio (SIMULATED) | at the censored medians' ratio "
             "(reference) | met? | missed by |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ref = "-" if r.at_medians is None else f"{r.at_medians:.2f}x"
        paper = PAPER_CLAIMS[_PAPER_KEY[r.metric]].text()
        iters = (f"{_ratio_text(r, r.iterations)} (MEASURED)" if r.system == "spotlight"
                 else f"{r.iterations.text()} (by construction)")
        lines.append(f"| {r.shape} | {r.resolution}x{r.resolution} | {r.metric} | {SYSTEM_LABELS[r.system]} "
                     f"| {BASELINE_LABELS[r.baseline]} | {paper} | >= {r.target:g}x | **{_ratio_text(r, r.total)}** "
                     f"| {iters} | {r.per_iteration:.2f}x | {ref} | {_met_text(r)} | {_shortfall_text(r)} |")
    lines += ["", "The paper gives one speedup (4x) and one cost range (1.4-6.4x) for both resolutions together and no "
              "cluster shape; the per-resolution targets are the project's. 'undetermined': both iteration counts "
              "were measured but are lower bounds (see the bold line), so neither the ratio nor the total is known.",
              "",
              "Why, per cluster, resolution and system (the time row against the equal-on-demand vanilla; the "
              "cost rows and the equal-cost vanilla differ only in the ratio):", ""]
    lines += [f"- {r.shape}, {r.resolution}x{r.resolution}, {SYSTEM_LABELS[r.system]}: {r.why}."
              for r in rows if r.metric == "time" and r.baseline == "vanilla"]
    return "\n".join(lines)


def _spot_training_section(result, shapes) -> str:
    """How spot training is simulated, with the constants it rests on and which are assumed."""
    table = {r["name"]: r for r in (result.get("simulator") or {}).get("cost_model") or []}
    if not shapes or "lora_adapter_gb" not in table:
        return ""
    phases = {res: sim["phases"] for _, sims in shapes[:1] for res, sim in sorted(sims.items())}
    per_res = "; ".join(f"{res}x{res}: {p['train_micro_batches']} micro-batches of {p['train_micro_batch_s']:.1f} s "
                        f"on one GPU, a gradient report {p['gradient_report_s_network']:.2f} s over the network "
                        f"(SP degree {p['preferred_sp_degree']})" for res, p in phases.items())
    assumed = [r["name"] for r in table.values() if str(r["source"]).startswith("assumption")]
    full_gb = table["params_b"]["value"] * table["bytes_per_param"]["value"]
    net = table["network_gb_s"]["value"]

    def const(name: str) -> str:
        r = table[name]
        kind = "assumed" if str(r["source"]).startswith("assumption") else "sourced, see the table"
        return f"`{name}` = {r['value']:g} {r['unit']} ({kind})"
    return "\n".join([
        "## Spot training, as simulated (SIMULATED)", "",
        "Spotlight with spot training (`spotlight_train`) rolls out on every GPU as Spotlight does, then splits the "
        "update into TRAIN micro-batch requests in the same queue: every on-demand and spot worker pulls "
        f"{const('train_lease_micro_batches')} and its GPUs train them data-parallel (an SP group's members each "
        "take their own), then the worker reports one gradient sum (`RequestQueue.complete_all`, all or "
        f"nothing) of {const('lora_adapter_gb')}. Spot reports cross the network into the trainer's node one at a "
        "time; on-demand ones on the trainer's node cross NVLink. When every micro-batch is in an accepted sum "
        f"the trainer steps: {const('optimizer_step_s')}. A micro-batch is {const('train_micro_batch_images')}, "
        "with the FLOPs per sample and the MFU of vanilla's training. A notice: the worker finishes the "
        "micro-batch in hand if it and the report fit before the deadline (else reports what finished), and "
        "hands the rest back; a kill without notice requeues everything since its last accepted report and "
        "counts it as lost GPU-seconds. Spot GPUs do not explore in this system.", "",
        f"Per micro-batch and report (today's shape): {per_res}.", "",
        "**Changed for every spot row**: a weight version published to the spot workers is the LoRA adapters "
        f"({table['lora_adapter_gb']['value']:g} GB, {shapes[0][1][min(phases)]['phases']['publish_s']:.2f} s at the "
        f"network's bandwidth), not the whole model as before ({full_gb:.0f} GB, {full_gb / net:.1f} s): "
        "every Qwen-Image config here trains flow_grpo's LoRA. All rows were re-simulated with it.", "",
        f"**Assumed constants** (the rest cite a datasheet, a config or a measurement; table near the end): "
        f"{', '.join(f'`{n}`' for n in assumed)}."])
def _budget_section(result, shapes) -> str:
    """Per shape and resolution: the exploration budget and the fair-cost vanilla's GPUs (SIMULATED)."""
    if not shapes:
        return ""
    lines = ["## Cluster shapes: exploration budget and the fair-cost vanilla (SIMULATED)", "",
             "Exploration budget per iteration (Spotlight today) = spot GPU-seconds during training / GPU-seconds of "
             "one explored seed (the cost model's rollout at `explore_steps` denoising steps on an SP group of the "
             "preferred degree). Spotlight today trains on the on-demand GPUs only, so fewer of them lengthen "
             "training and enlarge the budget: the paper's shape halves the on-demand GPUs and doubles it. "
             "'Explored' is what the simulated Spotlight run explored after joins, regroups and preemptions. The "
             "fair-cost vanilla's GPUs are given per spot system (naive spot / Spotlight today / Spotlight with "
             "spot training), each from that system's dollars.", "",
             "| cluster | resolution | training s / iteration | spot GPU-s during training | GPU-s per explored seed "
             "| explored seeds / iteration (budget) | per prompt | pool / trained group | explored (simulated run) "
             "| fair-cost vanilla GPUs (naive / today / spot training) | Spotlight USD / h |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, sims in shapes:
        for res, sim in sorted(sims.items()):
            b = sim.get("exploration_budget")
            if not b:
                continue
            fair = sim.get("fair_cost") or {}
            explored = sim["baselines"].get("spotlight", {}).get("explored_seeds_per_iteration")
            lines.append(f"| {label} | {res}x{res} | {b['train_s']:.0f} | {b['spot_gpu_s_during_training']:.0f} | "
                         f"{b['gpu_s_per_explored_seed']:.2f} ({b['explore_steps']} steps, SP {b['sp_degree']}) | "
                         f"{b['seeds_per_iteration']:.0f} | {b['seeds_per_prompt']:.1f} | "
                         f"{b['pool_over_group']:.2f}x of {b['group_size']} | "
                         f"{'-' if explored is None else f'{explored:.0f}'} | "
                         f"{_fair_gpus(fair)} (vs {fair.get('equal_ondemand_gpus', '-')}) | "
                         f"{_f(fair.get('spotlight_usd_per_hour'), 1)} |")
    fair = next((sim["fair_cost"] for _, sims in shapes for sim in sims.values() if sim.get("fair_cost")), None)
    if fair:
        lines += ["", f"**Fair-cost vanilla** (`vanilla_fair_cost`, SIMULATED): {fair['definition']}. On-demand "
                  f"price {fair['ondemand_usd_per_gpu_hour']:.4f} USD per GPU-hour; the spot GPUs' price comes from "
                  "the trace's price table, billed only while held. The paper's reserved GPUs are priced on-demand "
                  "here (a reservation discount would lower both Spotlight's and vanilla's bills)."]
    lines += ["", _cheap_exploration_text(result, shapes)]
    return "\n".join(lines)


def _fair_gpus(fair: Mapping[str, Any]) -> str:
    by = fair.get("by_baseline") or {}
    if not by:
        return str(fair.get("ondemand_gpus", "-"))
    return " / ".join(str(by[s]["ondemand_gpus"]) if s in by else "-" for s in SYSTEMS)


def _cheap_exploration_text(result, shapes) -> str:
    budget = next((sim["exploration_budget"] for _, sims in shapes for sim in sims.values()
                   if sim.get("exploration_budget")), None)
    steps = f"{budget['explore_steps']} of {budget['sampling_steps']}" if budget else "?"
    head = (f"**The explorer's per-seed cost is the full rollout's** (explore_steps = {steps} denoising steps, SDE): ")
    cheap = result.get("cheap_exploration")
    if not cheap or not cheap.get("rows"):
        return head + ("the cheap-exploration study's JSON (benchmarks/results/explore_rank_vs_steps.json) was not "
                       "found, so this rests on the cost model's assumption alone.")
    parts = [f"{r['kind'].upper()} {r['num_steps']} steps {r['spearman']:+.2f} +- {r['spearman_se']:.2f}"
             for r in cheap["rows"] if r.get("spearman") is not None and r.get("spearman_se") is not None]
    return head + ("the cheap-exploration study (MEASURED on the tiny task, `" + str(cheap.get("command")) + "`) "
                   "found that only full-step SDE rewards from stale weights rank the fresh full-step rewards "
                   "(Spearman per schedule, mean +- standard error over prompts: " + "; ".join(parts) + "), so "
                   "fewer-step or ODE exploration buys a larger pool of uninformative rewards and the budget above "
                   "prices each explored seed as a full rollout.")


def _met_text(r: HeadlineRow) -> str:
    return {True: "yes", False: "**no**", None: "undecided"}[r.met]


def _ratio_text(r: HeadlineRow, ratio) -> str:
    return "undetermined" if ratio.value is None and r.at_medians is not None else ratio.text()


def _shortfall_text(r: HeadlineRow) -> str:
    if r.met is False and r.shortfall:
        if r.total.bound == "upper":   # the total is at most X: missed by at least target / X
            return f">= {r.shortfall:.2f}x (reached at most {r.total.value / r.target:.0%} of the target)"
        return f"{r.shortfall:.2f}x (reached {r.total.value / r.target:.0%} of the target)"
    if r.met is None:
        ref = (f" (at the censored medians' ratio: {r.at_medians:.2f}x, {r.at_medians / r.target:.0%} of the target)"
               if r.at_medians is not None else "")
        return f"unknown; needs iterations ratio >= {r.needed_iterations_ratio:.2f}x{ref}"
    return "-"


def _to_target_section(estimates, shapes, figs) -> str:
    if not shapes:
        return ""
    lines = ["## Time and cost to target per baseline (MEASURED iterations x SIMULATED per iteration)", "",
             "naive spot explores nothing and spot training computes vanilla's update, so both need vanilla's measured "
             "iterations; exploration on the critical path uses the `fresh` setting's; every vanilla uses vanilla's "
             "(`vanilla_fair_cost:X` is the equal-cost vanilla of system X; plain `vanilla_fair_cost` is Spotlight "
             "today's). The figures show today's shape.", ""]
    for label, sims in shapes:
        for res, sim in sorted(sims.items()):
            lines += [f"### {label}, {res}x{res} (trace `{sim['trace']['name']}`, {sim['iterations']} simulated "
                      "iterations)", "",
                      "| baseline | GPUs (on-demand + spot) | iterations to target (MEASURED, setting) "
                      "| s / iteration (SIM) | USD / iteration (SIM) | time to target | cost to target |",
                      "|---|---|---|---|---|---|---|"]
            for name, row in time_and_cost_to_target(estimates, sim).items():
                lines.append(f"| {name} | {_gpus(sim, name)} | {_iters_text(row)} | {row['time_per_iteration_s']:.1f} "
                             f"| {row['cost_per_iteration_usd']:.2f} "
                             f"| {_maybe(row['time_to_target_s'], 3600, 'h', row)} "
                             f"| {_maybe(row['cost_to_target_usd'], 1, 'USD', row)} |")
            lines.append("")
    lines += [_img(figs, "time_to_target", "time to target"), "", _img(figs, "cost_to_target", "cost to target")]
    return "\n".join(lines)


def _gpus(sim, name: str) -> str:
    r, cluster = sim["baselines"][name], sim["cluster"]
    od = r.get("ondemand_gpus", cluster["ondemand_gpus"])
    uses_spot = name in BASELINES and BASELINES[name].uses_spot
    spot = r.get("spot_gpus", cluster["spot_gpus"] if uses_spot else 0)
    return f"{od} + {spot}"


def _iters_text(row) -> str:
    if row["iterations"] is None:
        return f"not measured ({row['setting']})"
    return f"{'>= ' if row['bound'] == 'lower' else ''}{row['iterations']:g} ({row['setting']})"


def _maybe(value, scale: float, unit: str, row) -> str:
    if value is None:
        return "not measured"
    return f"{'>= ' if row['bound'] == 'lower' else ''}{value / scale:.2f} {unit}"


def _utilisation_section(result, shapes, figs) -> str:
    if not shapes:
        return ""
    note = (result.get("simulator") or {}).get("note")
    lines = ["## GPU utilisation (SIMULATED)", ""] + ([f"> {note}", ""] if note else []) + [
        f"PAPER: spot GPUs cost {paper_text('spot_discount')} less than on-demand; the abstract's premise is that "
        "they sit idle during training without exploration (no idle fraction is published).", ""]
    for i, (label, sims) in enumerate(shapes):
        for res, sim in sorted(sims.items()):
            c = ceilings(sim)
            lines += [f"### {label}, {res}x{res}: training {sim['phases']['train_s']:.0f} s of a vanilla iteration of "
                      f"{sim['baselines']['vanilla']['time_per_iteration_s']:.0f} s (per-iteration ceilings over the "
                      f"equal-on-demand vanilla of the systems that train on the on-demand GPUs only: time "
                      f"{c['time']:.2f}x, cost {c['cost']:.2f}x)", "",
                      "| baseline | on-demand idle | spot idle | training s / iteration | micro-batches on spot "
                      "| preemptions | notices | regroups | cold restarts | commits | lost GPU-s | lost micro-batches |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for name, r in sim["baselines"].items():
                spot_idle = "-" if r["spot_idle_fraction"] is None else f"{r['spot_idle_fraction']:.1%}"
                train = r.get("train") or {}
                lines.append(f"| {name} | {r['ondemand_idle_fraction']:.1%} | {spot_idle} | "
                             f"{r.get('mean_train_phase_s', 0.0):.0f} | "
                             f"{'-' if not train else format(train['spot_share'], '.0%')} | {r['preemptions']} | "
                             f"{r['notices']} | {r['regroups']} | {r['cold_restarts']} | {r['commits']} | "
                             f"{r['lost_gpu_s']:.0f} | {train.get('lost_micro_batches', '-')} |")
            lines += ["", _img(figs, f"utilisation_{res}", f"GPU phases at {res}") if i == 0 else "", ""]
    return "\n".join(lines)


def _extra_traces_section(result) -> str:
    extra = (result.get("simulator") or {}).get("extra") or []
    if not extra:
        return ""
    lines = ["## Other spot traces (SIMULATED, per iteration, vanilla / system)", "",
             "Today's shape on each trace, against the equal-on-demand vanilla.", "",
             "| trace | zone | resolution | system | time ratio | cost ratio | preemptions | spot idle "
             "| lost micro-batches |", "|---|---|---|---|---|---|---|---|---|"]
    for e in extra:
        for res, sim in sorted(e["by_resolution"].items(), key=lambda kv: int(kv[0])):
            v = sim["baselines"]["vanilla"]
            for name in ("spotlight", "spotlight_train"):
                s = sim["baselines"].get(name)
                if s is None:
                    continue
                lost = (s.get("train") or {}).get("lost_micro_batches", "-")
                lines.append(f"| {e['trace']} | {e['zone'] or 'all'} | {res} | {SYSTEM_LABELS[name]} | "
                             f"{v['time_per_iteration_s'] / s['time_per_iteration_s']:.2f}x | "
                             f"{v['cost_per_iteration_usd'] / s['cost_per_iteration_usd']:.2f}x | {s['preemptions']} | "
                             f"{s['spot_idle_fraction']:.1%} | {lost} |")
    return "\n".join(lines)


def _studies_section(result) -> str:
    studies = result.get("studies") or []
    if not studies or not isinstance(studies, list):
        return ""
    lines = ["## Iterations to target in every saved convergence study (MEASURED, tiny task, CPU)", "",
             "Each study with the headline's target rule (vanilla's mean final validation reward) and the same "
             "bound-aware ratio; runs that never reach the target are censored, so a median can be only a lower "
             "bound and a ratio of two lower bounds is undetermined.", "",
             "| study | files | overrides | target | vanilla iterations | Spotlight iterations | vanilla / Spotlight "
             "| censored medians' ratio (reference) | paired curve difference, Spotlight - vanilla | headline |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for st in studies:
        files = ", ".join(Path(f).name for f in st["files"])
        if "error" in st:
            lines.append(f"| {st['study']} | {files} | - | - | - | - | failed: {st['error']} | - | - | - |")
            continue
        est = st["estimates"]
        ratio = st["ratio"]
        ratio_text = ("undetermined" if ratio["value"] is None else
                      f"{'>= ' if ratio['bound'] == 'lower' else '<= ' if ratio['bound'] == 'upper' else ''}"
                      f"{ratio['value']:.2f}x")
        paired = st.get("paired_spotlight")
        paired_text = f"{_pm(paired['curve'])} ({len(paired['seeds'])} seeds)" if paired else "-"
        lines.append(f"| {st['study']} | {files} | {' '.join(st.get('overrides') or []) or '-'} | "
                     f"{_f(st.get('target'))} | {_est_text(est.get('vanilla'))} | {_est_text(est.get('spotlight'))} | "
                     f"{ratio_text} | {_f(st.get('censored_medians'), 2)} | "
                     f"{paired_text} | "
                     f"{'yes' if st.get('headline') else '-'} |")
    return "\n".join(lines)


def _est_text(e) -> str:
    if not e or e.get("value") is None:
        return "-"
    return f"{'>= ' if e['bound'] == 'lower' else ''}{e['value']:g} ({e['reached']}/{e['runs']} reached)"


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
             "| benchmark | metric | ours (MEASURED) | project target | PAPER (reported) |", "|---|---|---|---|---|"]
    p = mech.get("planner") or {}
    if "planner_over_uniform" in p:
        lines += [f"| planner | planner_over_uniform (plain round robin) | {_f(p['planner_over_uniform'], 3)} "
                  "| >= 1.2 | - |",
                  *([f"| planner | planner_over_uniform_with_abandon (round robin that also abandons and replaces "
                     f"all-equal prompts) | {_f(p['planner_over_uniform_with_abandon'], 3)} | - | - |"]
                    if "planner_over_uniform_with_abandon" in p else []),
                  f"| planner | planner_over_oracle | {_f(p['planner_over_oracle'], 3)} | >= 0.95 | - |",
                  *([f"| planner | planner_unscreened_over_oracle (ablation: full first pulls, no screening) "
                     f"| {_f(p['planner_unscreened_over_oracle'], 3)} | - | - |"]
                    if p.get("planner_unscreened_over_oracle") is not None else []),
                  f"| planner | decision ms / pull (median) | {_f(p['decision_time_ms_per_pull'], 3)} | < 1 | - |"]
        setup = p.get("setup") or {}
        if setup.get("budget_pulls") and setup.get("n_prompts"):
            per_prompt = setup["budget_pulls"] * setup["seeds_per_pull"] / setup["n_prompts"]
            lines.append(f"| planner | budget: explored seeds per prompt (groups of {setup['group_size']}; "
                         f"the simulator's cost model at 512x512) | {per_prompt:.2f} | - | - |")
        sweep = [r for r in p.get("budget_sweep") or [] if r.get("planner_over_oracle") is not None]
        for key, target in (("planner_over_oracle", ">= 0.95 at every budget"), ("planner_over_uniform", ">= 1.2")):
            if sweep and all(r.get(key) is not None for r in sweep):
                cells = "; ".join(f"{r['seeds_per_prompt']:g}: {r[key]:.3f}" for r in sweep)
                lines.append(f"| planner | {key} across budgets (explored seeds per prompt: ratio) | {cells} "
                             f"| {target} | - |")
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
    reused = sorted({r["reused_from"] for r in mech.values() if isinstance(r, dict) and r.get("reused_from")})
    if reused:
        names = [n for n, r in mech.items() if isinstance(r, dict) and r.get("reused_from")]
        lines += ["", f"Reused, not re-measured in this run ({', '.join(names)}): read from {', '.join(reused)}."]
    skipped = [m for m in ("planner", "regroup", "queue") if m not in mech]
    if skipped:
        lines += ["", f"Not run in this mode: {', '.join(skipped)}."]
    lines += ["", _img(figs, "regroup", "regroup")]
    return "\n".join(lines)


EMULATED_TARGETS = {"8+8 512": 1.8, "4+8 512": 2.5}  # spot training vs vanilla, per iteration


def _emulated_section(result) -> str:
    """The live system on emulated GPUs beside the simulator, per row and system (EMULATED)."""
    emu = result.get("emulated")
    if not emu or not emu.get("rows"):
        return ""
    lines = [f"## The live system on emulated GPUs (EMULATED, `python -m benchmarks.emulate`, {emu['gpu']})", "",
             "Real queue, workers, trainer, spot pool and notice bridge on this machine; spot nodes are raylets "
             f"that one window of `{emu['trace']}` starts, drains and kills; every compute phase waits the cost "
             "model's duration divided by the row's time-scale; times are scaled back. Per iteration: iterations "
             f"2..{emu['iterations']} (the first loads weights), on both sides. The window is the first in which "
             "the spot fleet is full and then loses a node after its notice; the simulator ran the same shape, "
             "window and seed. Preemptions: nodes the run saw go; in brackets, raylets the trace killed during "
             "the run (a run sees a kill once Ray's health checks declared the node dead, 9 s of wall time later).",
             "", "| row | system | time-scale | EMULATED s/it | SIMULATED s/it | ratio | EMULATED $/it | SIMULATED $/it "
             "| preemptions (raylets killed) | regroups | lost / duplicated / mismatched "
             "| compute / queue / fetch+publish / idle |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in emu["rows"]:
        e, c = r["emulated"], r["emulated"]["counters"]
        sh = e["control_plane"]["shares"]
        fetch = sh.get("weight fetches", 0.0) + sh.get("publish", 0.0)
        lost = f"{c['spot/requests_failed']:g} / {c['spot/duplicate_completions']:g} / {c['mismatched_outputs']:g}"
        killed = c.get("raylets_killed_after_notice", 0) + c.get("raylets_killed_without_notice", 0)
        preempted = f"{c['spot/preemptions']:g}" + (f" ({killed:g})" if "raylets_killed_after_notice" in c else "")
        lines.append(f"| {r['row']['name']} | {r['system']} | {r['row']['time_scale']:g} | "
                     f"{e['time_per_iteration_s']:.1f} | {_steady_sim_s(r):.1f} | {r['ratio']:.2f} | "
                     f"{e['cost_per_iteration_usd']:.2f} | {r['simulated']['cost_per_iteration_usd']:.2f} | "
                     f"{preempted} | {c['spot/regroups']:g} | {lost} | "
                     f"{sh.get('compute', 0):.0%} / {sh.get('queue calls', 0):.0%} / {fetch:.0%} / {sh.get('idle', 0):.0%} |")
    return "\n".join(lines + ["", *_emulated_targets(emu)])


def _steady_sim_s(row: dict) -> float:
    """The simulator's seconds per steady iteration (2..K) of an emulate row."""
    sim = row["simulated"]
    return sim.get("steady_time_per_iteration_s", sim["time_per_iteration_s"])


def _emulated_targets(emu) -> list[str]:
    """Spot training against vanilla per iteration, emulated and simulated, against the targets
    (per time-scale, where a row ran at several)."""
    by = {(r["row"]["name"], r["row"]["time_scale"], r["system"]): r for r in emu["rows"]}
    out = []
    for (row, scale, system), train in by.items():
        if system != "spotlight_train" or row not in EMULATED_TARGETS or (row, scale, "vanilla") not in by:
            continue
        van, target = by[(row, scale, "vanilla")], EMULATED_TARGETS[row]
        emulated = van["emulated"]["time_per_iteration_s"] / train["emulated"]["time_per_iteration_s"]
        simulated = _steady_sim_s(van) / _steady_sim_s(train)
        verdict = "met" if emulated >= target else "MISSED"
        out.append(f"- {row} at time-scale {scale:g}: spot training is {emulated:.2f}x vanilla per iteration "
                   f"EMULATED ({simulated:.2f}x SIMULATED); target {target}x: {verdict}.")
    return out


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
        "public, so the PAPER column is a reference, not a like-for-like comparison. Its 4 reserved + 8 spot shape "
        "is secondhand; reserved GPUs are priced on-demand here.",
        "- The fair-cost vanilla is simulated on more on-demand GPUs with vanilla's measured iterations (same "
        "algorithm and batch); it assumes rollouts and FSDP training scale to those GPUs as the cost model says.",
        "- The exploration budget is the cost model's; whether a larger pool (the paper's shape) cuts iterations "
        "to target is only measured on the tiny task (the saved studies above), not at the budget simulated.",
        "- Spot training is simulated, not measured at scale: a spot GPU is assumed to hold the trainer's memory "
        "plan (48.2 GiB at 512, 54.7 GiB at 1280 with one sample at a time: four-sample micro-batches at 1280 run "
        "as accumulated passes, same FLOPs) and to train at vanilla's MFU; gradient reports share one 100 Gbit/s "
        "link into the trainer's node. Its iterations to target equal vanilla's because it computes vanilla's "
        "update (the live runtime tests the step against the one-trainer step); that is by construction, not a "
        "measurement of learning.",
    ])


def _f(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
