"""``REPORT.md``, verdict first, and ``APPENDIX.md`` with every table behind it.

The first screen is one table: per cluster shape, time and cost to target of Spotlight with spot
training against vanilla on demand, SIMULATED and EMULATED side by side, the paper's figure
beside, met or missed, and one figure. What follows stays short; everything else is in the
appendix (`benchmarks.appendix`). Every number keeps its kind: MEASURED, SIMULATED, EMULATED or
PAPER. Nothing here computes a result; it formats the suite's.
"""
from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path
from typing import Any, Mapping

from benchmarks import plots
from benchmarks.appendix import appendix_sections, shape_label
from benchmarks.headline import (TARGETS, Ratio, VerdictRow, exploration_ratio, headline, iterations_note,
                                 time_and_cost_to_target, verdict_rows)
from benchmarks.paper import PAPER_CLAIMS

APPENDIX = "APPENDIX.md"
_PAPER = {"time": PAPER_CLAIMS["time_to_target"].text(), "cost": PAPER_CLAIMS["cost_to_target"].text()}


def write_report(result: Mapping[str, Any], out_dir: Path) -> Path:
    """Draw the figures, write ``out_dir/REPORT.md`` and ``out_dir/APPENDIX.md``; returns REPORT.md's path."""
    out_dir = Path(out_dir)
    named = _named_shapes(result)
    shapes = _shapes(result)
    estimates = _estimates(result)
    rows = verdict_rows(estimates, named, (result.get("emulated") or {}).get("rows"))
    figures = _figures(result, _sims(result), estimates, rows, out_dir)
    report = [_header(result), _verdict_section(rows, estimates, figures), _reading_section(result, estimates),
              *(section(result) for section in EXTRA_SECTIONS), _appendix_link()]
    path = out_dir / "REPORT.md"
    path.write_text("\n\n".join(s for s in report if s) + "\n")
    appendix = ["# Appendix to REPORT.md: every table behind the verdict",
                *appendix_sections(result, estimates, shapes, named, figures)]
    (out_dir / APPENDIX).write_text("\n\n".join(s for s in appendix if s) + "\n")
    return path


def _sims(result: Mapping[str, Any]) -> dict[int, dict]:
    sim = result.get("simulator") or {}
    return {int(k): v for k, v in (sim.get("by_resolution") or {}).items()}


def _named_shapes(result: Mapping[str, Any]) -> dict[str, dict[int, dict]]:
    """Sims by resolution per simulated cluster shape name ("today" first, then the suite's others)."""
    sim = result.get("simulator") or {}
    out = {"today": _sims(result)} if sim.get("by_resolution") else {}
    for other in sim.get("other_shapes") or []:
        out[other["name"]] = {int(k): v for k, v in other["by_resolution"].items()}
    return out


def _shapes(result: Mapping[str, Any]) -> list[tuple[str, dict[int, dict]]]:
    """(label, sims by resolution) per simulated cluster shape, today's first."""
    return [(shape_label(name, sims), sims) for name, sims in _named_shapes(result).items()]


def _estimates(result: Mapping[str, Any]) -> dict:
    return ((result.get("convergence") or {}).get("summary") or {}).get("estimates") or {}


def _figures(result, sims, estimates, rows: list[VerdictRow], out_dir: Path) -> dict[str, str]:
    figs: dict[str, str] = {}
    if rows:
        figs["verdict"] = plots.plot_verdict(rows, TARGETS, out_dir / "verdict.png").name
    if sims:
        tables = {res: time_and_cost_to_target(estimates, sim) for res, sim in sims.items()}
        cluster = next(iter(sims.values()))["cluster"]
        shape = f"{cluster['ondemand_gpus']} on-demand + {cluster['spot_gpus']} spot"
        for metric in ("time", "cost"):
            figs[f"{metric}_to_target"] = plots.plot_to_target(tables, metric, out_dir / f"{metric}_to_target.png",
                                                               shape=shape).name
        for res, sim in sims.items():
            if not any(r.get("timeline") for r in sim["baselines"].values()):
                continue  # a simulation kept without its timelines (a saved JSON)
            figs[f"utilisation_{res}"] = plots.plot_utilisation(sim, out_dir / f"utilisation_{res}.png").name
    conv = result.get("convergence") or {}
    if conv.get("runs"):
        target = (conv.get("summary") or {}).get("target")
        figs["convergence"] = plots.plot_convergence(conv["runs"], target, out_dir / "convergence.png").name
    regroup = (result.get("mechanisms") or {}).get("regroup") or {}
    if "warm_regroup_median_s" in regroup:
        figs["regroup"] = plots.plot_regroup(regroup, out_dir / "regroup.png").name
    return figs


# ------------------------------------------------------------------------------ the first screen
def _header(result) -> str:
    smoke = ("\n> **SMOKE RUN**: CI-sized models, clusters and runs; the numbers check the plumbing and mean "
             "nothing about performance.\n") if result.get("smoke") else ""
    return (f"# Spotlight vs vanilla Flow-GRPO: the verdict\n{smoke}\n"
            "Kinds: **SIMULATED** (cost model + a real spot trace), **EMULATED** (the live system on this machine, "
            "every compute phase waiting the cost model's duration), **MEASURED** (on this machine), **PAPER** "
            "(the Spotlight abstract). "
            f"`{result.get('command')}`, {datetime.date.today().isoformat()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}.")


def _verdict_section(rows: list[VerdictRow], estimates, figs) -> str:
    if not rows:
        return "## Verdict\n\nThe simulator did not run, so there is no verdict (see the appendix's stages)."
    lines = ["## Verdict", "", *_verdict_sentences(rows), "",
             "Vanilla / Spotlight with spot training, to the same target (higher is better for Spotlight); each "
             "figure is the iterations ratio x the per-iteration ratio of that kind; met? is SIMULATED / EMULATED "
             "against the project target (the paper's figure, per resolution).", "",
             "| cluster | resolution | time SIMULATED | time EMULATED | PAPER | target | met? "
             "| cost SIMULATED | cost EMULATED | PAPER | target | met? |",
             "|---|---|---:|---:|---|---|---|---:|---:|---|---|---|"]
    for r in rows:
        cells = []
        for metric in ("time", "cost"):
            target = TARGETS.get(r.resolution, TARGETS[1280])[metric]
            met = " / ".join(_met(r.met(metric, kind)) if kind == "simulated" or r.emulated else "-"
                             for kind in ("simulated", "emulated"))
            cells += [f"**{r.to_target(metric, 'simulated').text()}**", _text(r.to_target(metric, "emulated")),
                      _PAPER[metric], f">= {target:g}x", met]
        lines.append(f"| {r.shape}: {r.ondemand_gpus} + {r.spot_gpus} spot | {r.resolution}x{r.resolution} | "
                     + " | ".join(cells) + " |")
    lines += ["", f"![vanilla / Spotlight with spot training, to target]({figs['verdict']})" if "verdict" in figs
              else ""]
    return "\n".join(lines)


def _verdict_sentences(rows: list[VerdictRow]) -> list[str]:
    out = []
    for metric, noun in (("time", "time to target"), ("cost", "cost to target")):
        for kind in ("simulated", "emulated"):
            values = [r.to_target(metric, kind).value for r in rows if r.to_target(metric, kind).value is not None]
            if not values:
                continue
            met = sum(bool(r.met(metric, kind)) for r in rows if r.to_target(metric, kind).value is not None)
            span = f"{min(values):.2f}x" if len(values) == 1 else f"{min(values):.2f}x to {max(values):.2f}x"
            shapes = "1 cluster shape" if len(values) == 1 else f"{len(values)} cluster shapes"
            out.append(f"- {noun.capitalize()}, {kind.upper()}: {span} better "
                       f"than vanilla on demand across {shapes}; the project target is met "
                       f"on {met} of {len(values)} (PAPER: {_PAPER[metric]}).")
    return out


def _reading_section(result, estimates) -> str:
    emu = result.get("emulated") or {}
    scales = sorted({r["row"]["time_scale"] for r in emu.get("rows") or []})
    return "\n".join([
        "How to read it:", "",
        f"- Iterations ratio: {iterations_note(estimates)} for Spotlight exploring "
        f"({(result.get('convergence') or {}).get('regime', 'regime not recorded')}); Spotlight with spot training "
        "computes vanilla's update (the same samples and gradient, summed in another order), so it takes "
        "vanilla's MEASURED iterations: 1.00 by construction.",
        "- Per iteration: SIMULATED on the cluster and trace named in the appendix; EMULATED by the live system "
        f"(queue, workers, trainer, spot raylets) on this machine at time-scale {', '.join(f'{s:g}' for s in scales) or '-'}, "
        "iterations 2 onwards, where the shape was emulated ('-' where not).",
        "- Vanilla is vanilla on the same on-demand GPUs, without spot GPUs; the equal-cost vanilla, naive spot and "
        "Spotlight exploring are in the appendix."])


def _appendix_link() -> str:
    return (f"Every other table (per-iteration phases, utilisation, the exploration budget, convergence studies, "
            f"mechanisms, the cost model's constants, stages): [{APPENDIX}]({APPENDIX}).")


def _met(value: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "open"}[value]


def _text(ratio: Ratio) -> str:
    return "-" if ratio.value is None else ratio.text()


def _batching_section(result) -> str:
    """Batched rollouts against batch 1, the managed spot job and the calibration rows (SIMULATED)."""
    b = result.get("batching")
    if not b:
        return ""
    lines = ["## Batched rollouts, the managed spot job and the calibration", "",
             "SIMULATED per iteration on the AWS p3 trace, batched (the recipe's `sampling.max_batch`) beside batch 1 (the "
             "engine before batching: one request at a time, CFG as two forwards); "
             "vanilla on demand, Spotlight with spot training, and the whole job on spot GPUs with checkpoints and "
             "a restart after each preemption (managed spot).", "",
             "| cluster | resolution | batch | vanilla s/it | Spotlight+train s/it (x) | managed spot s/it "
             "| vanilla $/it | Spotlight+train $/it (x) | managed spot $/it |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for shape in b.get("shapes") or []:
        sys_ = shape["systems"]
        van, spt, man = (sys_.get(k) or {} for k in ("vanilla", "spotlight_train", "managed_spot"))
        t, c = "time_per_iteration_s", "cost_per_iteration_usd"
        lines.append(f"| {shape['shape']} | {shape['resolution']} | {shape['mode']} ({shape['max_batch']}) | {van[t]:.1f} | "
                     f"{spt[t]:.1f} ({van[t] / spt[t]:.2f}x) | {man.get(t, float('nan')):.1f} | {van[c]:.2f} | "
                     f"{spt[c]:.2f} ({van[c] / spt[c]:.2f}x) | {man.get(c, float('nan')):.2f} |")
    for res, v in sorted((b.get("vanilla_rollout") or {}).items(), key=lambda kv: int(kv[0])):
        w = v["wall_s"]
        lines.append(f"\nVanilla 8 x H100 at {res}x{res}: rollout phase {w['batch 1']['rollout']:.1f} s at batch 1, "
                     f"{w['batched']['rollout']:.1f} s at batch {v['max_batch']} ({v['rollout_speedup']:.2f}x; "
                     f"iteration {v['iteration_speedup']:.2f}x)"
                     + (f"; {w['max_batch 1']['rollout']:.1f} s at max_batch 1 (CFG in one forward)."
                        if "max_batch 1" in w else "."))
    same = b.get("same_shape_as_verl_omni")
    if same:
        lines.append(f"\nThis project's vanilla on verl-omni's shape ({same['run']}): "
                     f"{same['simulated_s']['batched']:.1f} s batched, {same['simulated_s']['batch 1']:.1f} s at "
                     f"batch 1, against {same['published_s']:.0f} s PUBLISHED by verl-omni.")
    lines += _emulated_batching_rows(result.get("batching_emulated") or {})
    lines += ["", "| calibration row | PUBLISHED s | SIMULATED s | gap |", "|---|---:|---:|---:|"]
    lines += [f"| {r['run']} | {r['published_s']:.0f} | {r['simulated_s']:.1f} | {r['gap']:+.1%} |"
              for r in (b.get("calibration") or {}).get("rows") or []]
    return "\n".join(lines)


def _emulated_batching_rows(runs: Mapping[str, Any]) -> list[str]:
    """EMULATED vanilla and Spotlight with spot training per iteration, batched beside max_batch 1."""
    lines = []
    for mode, run in runs.items():
        by_system = {r["system"]: r for r in (run or {}).get("rows") or []}
        if "vanilla" not in by_system or "spotlight_train" not in by_system:
            continue
        van, spt = by_system["vanilla"], by_system["spotlight_train"]
        t = "time_per_iteration_s"
        shape = van["row"]
        lines.append(f"| {shape['name']} | {mode} | {shape['time_scale']:g} | {van['emulated'][t]:.1f} "
                     f"({van['simulated'][t]:.1f}) | {spt['emulated'][t]:.1f} ({spt['simulated'][t]:.1f}) | "
                     f"{van['emulated'][t] / spt['emulated'][t]:.2f}x ({van['simulated'][t] / spt['simulated'][t]:.2f}x) |")
    if not lines:
        return []
    return ["", "EMULATED (the live system on this machine, every compute phase waiting the cost model's duration; "
            "SIMULATED on the same trace window in brackets), per iteration:", "",
            "| cluster | engine | time-scale | vanilla s/it | Spotlight+train s/it | vanilla / Spotlight+train |",
            "|---|---|---:|---:|---:|---:|", *lines]


def _exploration_section(result) -> str:
    """Spotlight exploring to target in the regime of ``result["exploration"]``: its MEASURED iterations
    ratio (``benchmarks.explore_convergence``) x its SIMULATED per-iteration ratio, per cluster shape."""
    exp, named = result.get("exploration"), _named_shapes(result)
    if not exp or not named:
        return ""
    summary, setting = exp["summary"], exp["setting"]
    entry, vanilla = summary["settings"].get(setting) or {}, summary["settings"].get("vanilla") or {}
    ratio = exploration_ratio(summary, setting)
    per_seed = ", ".join(f"{x:.2f}" for x in entry.get("iterations_ratio_per_seed") or [])
    p = entry.get("p_one_sided")
    share = [r["all_equal"] for r in (vanilla.get("runs") or {}).values()]
    by_cell: dict = {}
    for name, sims in named.items():
        for r in headline(_estimates(result), sims, shape=shape_label(name, sims), baselines=("vanilla",),
                          systems=("spotlight",), iterations={"spotlight": ratio}):
            by_cell.setdefault((r.shape, r.resolution), {})[r.metric] = r
    lines = ["## Spotlight exploring, in the regime where its iterations were measured", "",
             f"Regime: **{exp['regime']}**"
             + (f" (vanilla's trained groups {sum(share) / len(share):.2f} all equal, MEASURED)" if share else "")
             + f". Vanilla / Spotlight (`{setting}`) iterations to {summary['target']:.4f}: **{ratio.text()}** "
             f"MEASURED (geometric mean over seeds {', '.join(str(s) for s in entry.get('seeds') or [])}: {per_seed}; "
             f"one-sided p {'-' if p is None else f'{p:.3f}'}; `{exp['source']}`). Each figure is that ratio x "
             "Spotlight exploring's SIMULATED per-iteration ratio against vanilla on the same on-demand GPUs.", "",
             "| cluster | resolution | time to target | cost to target | per iteration time / cost (SIMULATED) "
             "| target time / cost | met? |", "|---|---|---:|---:|---|---|---|"]
    for (shape, res), rows in by_cell.items():
        t, c = rows["time"], rows["cost"]
        lines.append(f"| {shape} | {res}x{res} | **{_text(t.total)}** | **{_text(c.total)}** | "
                     f"{t.per_iteration:.2f}x / {c.per_iteration:.2f}x | >= {t.target:g}x / >= {c.target:g}x "
                     f"| {_met(t.met)} / {_met(c.met)} |")
    return "\n".join(lines)


EXTRA_SECTIONS: tuple = (_exploration_section, _batching_section)  # short sections after the verdict: (result) -> str
