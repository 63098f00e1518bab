"""`spotlight compare RUN_A RUN_B`: two run directories side by side, and a CI gate on the result.

Works on any two run directories of the shared iteration loop: ``spotlight train`` runs and ROLL
runs (``<output_dir>/<exp_name>`` of ``python -m roll_spotlight.launch``) write the same files.
Read from each: ``metrics.jsonl`` (validation reward and its standard error per validated
iteration, ``iteration_s``, the cost ledger ``cost/*`` and the spot counters ``spot/*`` when a spot
pool ran) and ``summary.json`` when the run finished (per-pair final validation rewards, config).

Written to ``--out`` (default ``compare-<A>-vs-<B>``): ``compare.md``, ``compare.png`` (validation
reward with standard errors per iteration and per training wall second) and ``compare.json``.

The target is RUN_B's final validation mean unless ``--target`` is given. "Iterations to target"
is the first validated iteration whose mean reaches it; "wall time to target" sums ``iteration_s``
(rollouts, rewards, training, exploration; validation excluded) up to that iteration, and "USD to
target" is the cost ledger at that iteration.

Emulated runs (``emulation.json`` beside the metrics: ``spotlight train --emulate``, the ROLL
launcher's ``--emulate``) are compared in EMULATED GPU seconds: wall time times the time-scale.
A run without a spot pool has no ledger; an emulated one is then billed as its on-demand GPUs for
that time at the on-demand price it names. Their validation rewards are stand-ins that depend on
the weight version only, so "to the same validation score" means to the same iteration there, and
the time and cost ratios to the target are the verdict on speed and cost.

**Worse**, precisely. d = final(A) - final(B), the final validation rewards. When both runs
finished on the same validation pairs (equal ``task`` sections and pair counts in summary.json) d
is the mean paired difference and se its standard error; otherwise d is the difference of the
means and se = sqrt(se_A^2 + se_B^2). RUN_A is worse when d + z * se < -tolerance, i.e. even the
upper end of a one-sided z-interval lies more than ``tolerance`` below RUN_B. With
``--fail-if-worse`` the command then exits 1 (0 otherwise; 2 for unreadable input).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from roll_spotlight.checks import require_number
from roll_spotlight.run_report import SPOT_COUNTERS
from roll_spotlight.training.metrics import read_metrics

DEFAULT_TOLERANCE = 0.02
DEFAULT_Z = 2.0


@dataclass
class Run:
    """What a comparison reads from one run directory."""

    path: Path
    label: str
    val: list[tuple[int, float, float]]          # (iteration, mean, standard error) per validation
    wall_s: dict[int, float]                     # training wall seconds up to and including each iteration
    cost: dict[str, float] = field(default_factory=dict)
    spot: dict[str, float] = field(default_factory=dict)
    final_rewards: list[float] | None = None
    config: dict | None = None
    usd: dict[int, float] = field(default_factory=dict)  # the ledger's total up to each iteration
    emulation: dict | None = None                        # emulation.json of an emulated run

    @property
    def final(self) -> tuple[int, float, float]:
        return self.val[-1]


def load_run(path: str | Path, label: str | None = None) -> Run:
    """Read a run directory; FileNotFoundError/ValueError naming the file when it is not one."""
    path = Path(path)
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{path} has no metrics.jsonl: is it a run directory?")
    rows = read_metrics(path)
    val = [(int(r["step"]), float(r["val_reward"]), float(r.get("val_reward_se", 0.0))) for r in rows if "val_reward" in r]
    if not val:
        raise ValueError(f"{metrics} has no validation rows (val_reward): nothing to compare")
    emulation = json.loads((path / "emulation.json").read_text()) if (path / "emulation.json").is_file() else None
    scale = float(emulation["time_scale"]) if emulation else 1.0  # emulated: GPU seconds
    wall, usd, total = {}, {}, 0.0
    for r in rows:
        total += float(r.get("iteration_s", 0.0)) * scale
        wall[int(r["step"])] = total
        if "cost/usd" in r:
            usd[int(r["step"])] = float(r["cost/usd"])
        elif emulation and "ondemand_gpus" in emulation:  # no spot pool: its on-demand GPUs, billed
            usd[int(r["step"])] = total * emulation["ondemand_gpus"] * emulation["ondemand_usd_per_gpu_hour"] / 3600
    last_cost = next((r for r in reversed(rows) if "cost/usd" in r), {})
    last_spot = next((r for r in reversed(rows) if any(k.startswith("spot/") for k in r)), {})
    run = Run(path, label or path.name, val, wall,
              cost={k: float(v) for k, v in last_cost.items() if k.startswith("cost/")},
              spot={k.removeprefix("spot/"): float(v) for k, v in last_spot.items() if k.startswith("spot/")},
              usd=usd, emulation=emulation)
    summary = path / "summary.json"
    if summary.is_file():
        data = json.loads(summary.read_text())
        run.final_rewards = data.get("final_rewards")
        run.config = data.get("config")
    return run


def reach(run: Run, target: float) -> dict:
    """First validated iteration whose mean reaches `target`, and the training wall seconds (GPU
    seconds when emulated) and dollars (None without a ledger) to it."""
    for step, mean, _ in run.val:
        if mean >= target:
            return {"iteration": step, "wall_s": run.wall_s.get(step, 0.0), "usd": run.usd.get(step)}
    return {"iteration": None, "wall_s": None, "usd": None}


def ratios(a: dict, b: dict) -> dict:
    """B's time and cost to the target over A's (> 1: A is faster, cheaper); None when either did
    not reach it or has no figure."""
    def ratio(key: str):
        x, y = a[key], b[key]
        return y / x if x and y is not None else None

    return {"time": ratio("wall_s"), "cost": ratio("usd")}


def ledger(run: Run) -> dict:
    """GPU-hours and dollars from the run's cost ledger (None without a spot pool's ledger)."""
    if "cost/usd" not in run.cost:
        return {"gpu_hours": None, "usd": None, "all_ondemand_usd": None, "pools": {}}
    pools = sorted(k.removeprefix("cost/gpu_s/") for k in run.cost if k.startswith("cost/gpu_s/"))
    return {"gpu_hours": sum(run.cost[f"cost/gpu_s/{p}"] for p in pools) / 3600.0, "usd": run.cost["cost/usd"],
            "all_ondemand_usd": run.cost.get("cost/all_ondemand_usd"),
            "pools": {p: {"gpu_hours": run.cost[f"cost/gpu_s/{p}"] / 3600.0, "usd": run.cost.get(f"cost/usd/{p}")}
                      for p in pools}}


def difference(a: Run, b: Run) -> dict:
    """Final A - B with its standard error: paired on the same validation pairs when possible."""
    same_pairs = (a.final_rewards is not None and b.final_rewards is not None
                  and len(a.final_rewards) == len(b.final_rewards) > 1
                  and (a.config or {}).get("task") == (b.config or {}).get("task"))
    if same_pairs:
        diff = [x - y for x, y in zip(a.final_rewards, b.final_rewards)]
        n = len(diff)
        mean = sum(diff) / n
        se = math.sqrt(sum((d - mean) ** 2 for d in diff) / (n - 1) / n)
        return {"kind": "paired", "n": n, "d": mean, "se": se}
    (_, ma, sa), (_, mb, sb) = a.final, b.final
    return {"kind": "unpaired", "n": None, "d": ma - mb, "se": math.hypot(sa, sb)}


def compare(a: Run, b: Run, *, target: float | None = None, tolerance: float = DEFAULT_TOLERANCE,
            z: float = DEFAULT_Z) -> dict:
    """The comparison as plain data (what compare.json holds)."""
    require_number("--tolerance", tolerance, ">= 0")
    require_number("--z", z, ">= 0")
    source = "RUN_B final validation mean" if target is None else "--target"
    target = b.final[1] if target is None else float(target)
    diff = difference(a, b)
    bound = diff["d"] + z * diff["se"]
    notes = []
    if a.config and b.config and a.config.get("reward") != b.config.get("reward"):
        notes.append("the runs use different reward sections: their rewards may not be comparable")
    if diff["kind"] == "unpaired":
        notes.append("not paired: the runs did not both finish on the same validation pairs (summary.json)")
    emulated = [r.emulation for r in (a, b) if r.emulation]
    if len(emulated) == 1:
        notes.append("only one run is emulated: its seconds are GPU seconds, the other's wall seconds")
    if emulated:
        notes.append("EMULATED: validation rewards are stand-ins of the weight version, so to the target is to the "
                     "same iteration; the time and cost ratios are the verdict")
    to_target = {key: reach(r, target) for key, r in (("a", a), ("b", b))}
    return {
        "runs": {key: {"label": r.label, "path": str(r.path), "final_iteration": r.final[0],
                       "final_mean": r.final[1], "final_se": r.final[2],
                       "curve": [{"iteration": s, "mean": m, "se": e, "wall_s": r.wall_s.get(s, 0.0)} for s, m, e in r.val],
                       "to_target": to_target[key], "ledger": ledger(r), "spot": r.spot, "emulation": r.emulation}
                 for key, r in (("a", a), ("b", b))},
        "b_over_a_to_target": ratios(to_target["a"], to_target["b"]),
        "target": target, "target_source": source,
        "difference": diff | {"upper_bound": bound, "z": z, "tolerance": tolerance},
        "worse": bound < -tolerance,
        "rule": f"A is worse when d + {z:g} x se < -{tolerance:g} (d = final A - final B)",
        "notes": notes,
    }


def _fmt(value, spec: str = ".4f", none: str = "not reached") -> str:
    return none if value is None else format(value, spec)


def markdown(result: dict) -> str:
    a, b = result["runs"]["a"], result["runs"]["b"]
    d = result["difference"]
    lines = [f"# {a['label']} vs {b['label']}", "",
             f"Target validation reward: {result['target']:.4f} ({result['target_source']}).", "",
             f"| | {a['label']} (A) | {b['label']} (B) |", "|---|---|---|",
             f"| final validation reward | {a['final_mean']:.4f} ± {a['final_se']:.4f} (it {a['final_iteration']}) "
             f"| {b['final_mean']:.4f} ± {b['final_se']:.4f} (it {b['final_iteration']}) |",
             f"| iterations to target | {_fmt(a['to_target']['iteration'], 'd')} | {_fmt(b['to_target']['iteration'], 'd')} |",
             f"| {_seconds_label(a, b)} to target | {_fmt(a['to_target']['wall_s'], '.1f')} "
             f"| {_fmt(b['to_target']['wall_s'], '.1f')} |",
             f"| USD to target | {_fmt(a['to_target']['usd'], '.2f', 'no ledger')} "
             f"| {_fmt(b['to_target']['usd'], '.2f', 'no ledger')} |"]
    for key, name, spec in (("gpu_hours", "GPU-hours (ledger)", ".3f"), ("usd", "USD (ledger)", ".2f"),
                            ("all_ondemand_usd", "USD if all on demand", ".2f")):
        lines.append(f"| {name} | {_fmt(a['ledger'][key], spec, 'no ledger')} | {_fmt(b['ledger'][key], spec, 'no ledger')} |")
    for counter in SPOT_COUNTERS:
        if counter in a["spot"] or counter in b["spot"]:
            lines.append(f"| spot/{counter} | {a['spot'].get(counter, '-')} | {b['spot'].get(counter, '-')} |")
    verdict = "WORSE" if result["worse"] else "not worse"
    lines += ["", f"Final difference A - B ({d['kind']}{'' if d['n'] is None else ', n = ' + str(d['n'])}): "
              f"{d['d']:+.4f} ± {d['se']:.4f}; upper bound d + z·se = {d['upper_bound']:+.4f} (z = {d['z']:g}).",
              "", f"Rule: {result['rule']}. Verdict: **A is {verdict}** than B beyond tolerance {d['tolerance']:g}.", ""]
    r = result["b_over_a_to_target"]
    if r["time"] is not None or r["cost"] is not None:
        lines += [f"To the target, B over A: time {_fmt(r['time'], '.2f', 'n/a')}x, "
                  f"cost {_fmt(r['cost'], '.2f', 'n/a')}x (> 1: A is faster, cheaper).", ""]
    lines += [f"Note: {n}." for n in result["notes"]]
    lines += ["", "GPU-hours and dollars come from each run's cost ledger (`cost/*`, written when a spot pool ran; an "
              "emulated run without one is billed as its on-demand GPUs, emulation.json); wall time is the sum of "
              "`iteration_s` (validation excluded), times the time-scale when emulated.", "", "![curves](compare.png)", ""]
    return "\n".join(lines)


def _seconds_label(a: dict, b: dict) -> str:
    if a["emulation"] and b["emulation"]:
        gpus = sorted({a["emulation"]["gpu"], b["emulation"]["gpu"]})
        return f"EMULATED {'/'.join(gpus)} GPU s"
    return "training wall s"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for key, marker in (("a", "o"), ("b", "s")):
        run = result["runs"][key]
        curve = run["curve"]
        for ax, x in ((axes[0], [c["iteration"] for c in curve]), (axes[1], [c["wall_s"] for c in curve])):
            ax.errorbar(x, [c["mean"] for c in curve], yerr=[c["se"] for c in curve], capsize=2, marker=marker,
                        label=f"{run['label']} ({key.upper()})")
    for ax, xlabel in zip(axes, ("iteration", "training wall seconds (validation excluded)")):
        ax.axhline(result["target"], color="grey", linestyle="--", label="target")
        ax.set(xlabel=xlabel, ylabel="validation reward (mean ± SE)")
        ax.legend(fontsize=8)
    axes[0].set_title("validation reward per iteration (measured)")
    axes[1].set_title("validation reward per wall second (measured)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(result: dict, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "compare.md", "png": out / "compare.png", "json": out / "compare.json"}
    plot(result, paths["png"])
    paths["md"].write_text(markdown(result))
    paths["json"].write_text(json.dumps(result, indent=2))
    return paths


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotlight compare", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Worse: d + z*se < -tolerance, d = final(A) - final(B) "
                                            "(paired on shared validation pairs, else unpaired).")
    parser.add_argument("run_a", help="run directory A (e.g. the Spotlight run)")
    parser.add_argument("run_b", help="run directory B (e.g. its vanilla twin)")
    parser.add_argument("--out", help="output folder (default: compare-<A>-vs-<B> in the working directory)")
    parser.add_argument("--target", type=float, help="validation reward to reach (default: RUN_B's final mean)")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help=f"how far below B A may fall before it is worse (default {DEFAULT_TOLERANCE})")
    parser.add_argument("--z", type=float, default=DEFAULT_Z,
                        help=f"standard errors added to d before the test (default {DEFAULT_Z})")
    parser.add_argument("--fail-if-worse", action="store_true", help="exit 1 when A is worse than B")
    parser.add_argument("--label-a", help="name of A in the report (default: its folder name)")
    parser.add_argument("--label-b", help="name of B in the report (default: its folder name)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        a, b = load_run(args.run_a, args.label_a), load_run(args.run_b, args.label_b)
        result = compare(a, b, target=args.target, tolerance=args.tolerance, z=args.z)
    except (FileNotFoundError, ValueError) as exc:
        print(f"spotlight compare: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or f"compare-{a.label}-vs-{b.label}")
    paths = write(result, out)
    print(paths["md"].read_text())
    print(f"wrote {paths['md']}, {paths['png']}, {paths['json']}")
    return 1 if args.fail_if_worse and result["worse"] else 0


if __name__ == "__main__":
    sys.exit(main())
