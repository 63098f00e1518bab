"""``python -m benchmarks.suite`` (and ``make bench``): every benchmark, then ``REPORT.md`` with its figures.

Order (one table of contents, :func:`run_suite`):

1. mechanism benchmarks, measured on this machine: the exploration planner (in process), the
   warm-vs-cold SP regroup and the queue throughput (subprocesses: both start Ray);
2. the simulator at 512^2 and 1280^2 on the headline spot trace (and any extra traces), with its
   warm-regroup constant calibrated from step 1 when that ran, for three cluster shapes: today's
   (``--ondemand``/``--spot``, 8 + 8), the paper's (``--paper-shape``, 4 reserved + 8 spot) and a
   spot-heavy one (``--spot-heavy-shape``, 2 + 14), each with every spot system's fair-cost vanilla
   (``sim.shape_budget``) and the exploration budget the shape affords;
3. the convergence benchmark on the tiny task under a wall-clock budget (or a saved result of
   ``python -m benchmarks.convergence`` via ``--convergence-json``), and the iterations ratio of every
   saved convergence study in ``benchmarks/results`` (:func:`saved_studies`);
4. the headline (measured iterations x simulated per-iteration time and cost), figures and report.

Regenerating the report without new measurements (one thread, about a minute of simulation):
``python -m benchmarks.suite --convergence-json FILE... --mechanisms-json benchmarks/results/bench_all.json``
reuses the saved convergence runs and mechanism results; ``make bench`` with no arguments still
runs everything.

Budget of the full run on a fresh 2-core machine (under 60 min; the report's stage table has the
measured minutes): virtual environment ~2 min (``make bench``), base pretraining ~6 min (both
cores), planner, regroup, queue and simulator ~3 min together, convergence
``--convergence-budget-min`` (default 40, a deadline: 3 settings x 3 seeds x 10 iterations, two
runs at a time), report < 1 min. ``--smoke`` shrinks
everything to CI size (< 60 s) and skips the two Ray benchmarks.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from benchmarks.convergence import (SETTINGS, SMOKE_OVERRIDES, ConvergenceConfig, records_from_json,
                                    run_convergence, summarize, choose_target)

log = logging.getLogger(__name__)

MECHANISMS = ("planner", "regroup", "queue")
HEADLINE_TRACE = ("bamboo-spot-traces/aws/p3-trace.csv", None)
EXTRA_TRACES = (("skynomad-gcp-h100/h100_probe_counts_wide.csv", "us-central1-b"),)
SMOKE_SIM_COST = {"prompts_per_iteration": 4, "group_size": 4}
FULL_CONVERGENCE_SEEDS = (0, 1, 2)
FULL_CONVERGENCE_OVERRIDES = ("max_steps=10", "eval_steps=5")
# The paper's cluster as secondhand accounts give it: 4 reserved (priced on-demand here) + 8 spot GPUs.
PAPER_SHAPE = ("paper", 4, 8)
# Most GPUs spot: where spot GPUs that train shorten the update most.
SPOT_HEAVY_SHAPE = ("spot-heavy", 2, 14)
RESULTS_DIR = Path("benchmarks/results")
RANK_VS_STEPS_JSON = RESULTS_DIR / "explore_rank_vs_steps.json"
BATCHING_JSON = RESULTS_DIR / "sim_rollout_batching.json"
# the exploration setting's iterations ratio where it was measured to pay (benchmarks.explore_convergence)
EXPLORATION_JSON = RESULTS_DIR / "explore_convergence_g4_strict_confirm.json"
BATCHING_EMULATED = {"batched": RESULTS_DIR / "emulate_batched_8x8_512.json",
                     "max_batch 1": RESULTS_DIR / "emulate_batch1_8x8_512.json"}


@dataclass(frozen=True)
class SuiteConfig:
    """What ``python -m benchmarks.suite`` runs; ``smoke()`` and ``full()`` are the two presets."""

    out_dir: Path = Path("benchmarks/results")
    smoke: bool = False
    mechanisms: tuple[str, ...] = MECHANISMS
    planner_seeds: int = 20
    regroup_repeats: int = 5
    resolutions: tuple[int, ...] = (512, 1280)
    sim_iterations: Mapping[int, int] = field(default_factory=lambda: {512: 40, 1280: 12})
    ondemand: int = 8
    spot: int = 8
    traces_root: Path | None = None
    headline_trace: tuple[str, str | None] = HEADLINE_TRACE
    extra_traces: tuple[tuple[str, str | None], ...] = EXTRA_TRACES
    sim_cost: Mapping[str, Any] = field(default_factory=dict)
    timeline_iterations: int = 3
    # three training seeds per setting, 10 iterations each (the same horizon for every setting), evaluated every 5
    convergence: ConvergenceConfig = field(default_factory=lambda: ConvergenceConfig(
        seeds=FULL_CONVERGENCE_SEEDS, overrides=FULL_CONVERGENCE_OVERRIDES))
    convergence_json: tuple[Path, ...] = ()
    subprocess_timeout_s: float = 900.0
    # more cluster shapes simulated beside (ondemand, spot): (name, ondemand, spot)
    other_shapes: tuple[tuple[str, int, int], ...] = (PAPER_SHAPE, SPOT_HEAVY_SHAPE)
    fair_cost: bool = True                       # simulate vanilla_fair_cost (sim.shape_budget) in every shape
    mechanisms_json: Path | None = None          # reuse the mechanism results of a saved bench_all.json
    emulate_json: Path | None = None             # reuse a saved `python -m benchmarks.emulate` result (EMULATED rows)
    emulate: bool = True                         # else run it (about 30 min); never in a smoke run
    studies_dir: Path | None = RESULTS_DIR       # saved convergence studies listed in the report
    rank_vs_steps_json: Path | None = RANK_VS_STEPS_JSON  # the cheap-exploration study, quoted in the report
    batching_json: Path | None = BATCHING_JSON   # `python -m benchmarks.sim_rollout_batching`'s rows, quoted
    exploration_json: Path | None = EXPLORATION_JSON  # Spotlight exploring's rows take its iterations ratio

    def __post_init__(self) -> None:
        unknown = sorted(set(self.mechanisms) - set(MECHANISMS))
        if unknown:
            raise ValueError(f"mechanisms: unknown {unknown}; known {list(MECHANISMS)}")
        missing = sorted(set(self.resolutions) - set(self.sim_iterations))
        if missing:
            raise ValueError(f"sim_iterations has no entry for resolutions {missing}")
        if self.ondemand < 1 or self.spot < 0:
            raise ValueError(f"cluster shape: ondemand must be >= 1 and spot >= 0, got {self.ondemand}, {self.spot}")
        if self.timeline_iterations < 1:
            raise ValueError(f"timeline_iterations must be >= 1, got {self.timeline_iterations}")
        for name, ondemand, spot in self.other_shapes:
            if ondemand < 1 or spot < 0:
                raise ValueError(f"other_shapes: {name!r} needs ondemand >= 1 and spot >= 0, got {ondemand}, {spot}")

    @classmethod
    def smoke_preset(cls, **kw: Any) -> SuiteConfig:
        conv = ConvergenceConfig(seeds=(0,), budget_s=120.0, overrides=SMOKE_OVERRIDES, isolate=False,
                                 repo_root=kw.pop("repo_root", Path(".")))
        base = dict(smoke=True, mechanisms=("planner",), planner_seeds=2, sim_iterations={512: 2, 1280: 2},
                    ondemand=2, spot=2, other_shapes=(("paper", 1, 2), ("spot-heavy", 1, 3)), extra_traces=(),
                    sim_cost=SMOKE_SIM_COST,
                    timeline_iterations=2,
                    convergence=conv, out_dir=Path("benchmarks/results/smoke"))
        return cls(**(base | kw))


@dataclass
class Stage:
    """Wall time and outcome of one part of the suite, for the report's budget table."""

    name: str
    wall_s: float = 0.0
    status: str = "not run"
    note: str = ""


# ================================================================ composition root
def run_suite(cfg: SuiteConfig) -> dict:
    """Run every part, write ``bench_all.json``, the figures and ``REPORT.md`` under ``cfg.out_dir``."""
    from benchmarks.report import write_report

    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    stages: list[Stage] = []
    t0 = time.monotonic()
    saved = saved_mechanisms(cfg.mechanisms_json) if cfg.mechanisms_json else {}
    mech = {name: _stage(stages, f"mechanism: {name}", lambda n=name: saved[n] if n in saved else _mechanism(n, cfg))
            for name in cfg.mechanisms}
    cost = _calibrated_cost(cfg, mech.get("regroup"))
    sims = _stage(stages, "simulator", lambda: run_simulations(cfg, cost))
    conv = _stage(stages, "convergence", lambda: _convergence(cfg))
    studies = _stage(stages, "saved convergence studies",
                     lambda: saved_studies(cfg.studies_dir, cfg.convergence_json) if cfg.studies_dir else [])
    wants_emulation = cfg.emulate_json is not None or (cfg.emulate and not cfg.smoke)
    emulated = _stage(stages, "emulated cluster shapes", lambda: _emulated(cfg)) if wants_emulation else None
    result = {"kind": "measured (mechanisms, convergence) and simulated (cluster time and cost)",
              "smoke": cfg.smoke, "command": _command_line(), "config": _config_dict(cfg),
              "mechanisms": mech, "simulator": sims, "convergence": conv, "studies": studies, "emulated": emulated,
              "cheap_exploration": cheap_exploration(cfg.rank_vs_steps_json),
              "batching": _saved(cfg.batching_json), "exploration": exploration_regime(cfg.exploration_json),
              "batching_emulated": {mode: _saved(path) for mode, path in BATCHING_EMULATED.items()},
              "stages": [dataclasses.asdict(s) for s in stages], "wall_s": time.monotonic() - t0}
    report = write_report(result, cfg.out_dir)
    result["report"] = str(report)
    (cfg.out_dir / "bench_all.json").write_text(json.dumps(_strip_timelines(result), indent=2, default=str))
    return result


def _emulated(cfg: SuiteConfig) -> dict:
    """`python -m benchmarks.emulate`'s result: a saved one, or a fresh run."""
    if cfg.emulate_json is not None:
        return json.loads(Path(cfg.emulate_json).read_text())
    from benchmarks.emulate import EmulateBenchConfig, run_bench

    result = run_bench(EmulateBenchConfig())
    (cfg.out_dir / "emulate.json").write_text(json.dumps(result, indent=1))
    return result


def _stage(stages: list[Stage], name: str, fn: Callable[[], Any]) -> Any:
    """Run one part; a failure is recorded (and reported), never hidden, and the suite goes on."""
    stage = Stage(name)
    stages.append(stage)
    t0 = time.monotonic()
    try:
        out = fn()
        stage.status = "skipped" if isinstance(out, dict) and "skipped" in out else "ok"
        stage.note = out.get("skipped", "") if isinstance(out, dict) else ""
        if isinstance(out, dict) and "reused_from" in out:
            stage.status, stage.note = "reused", f"measured earlier, read from {out['reused_from']}"
        return out
    except Exception as exc:  # noqa: BLE001 - reported in REPORT.md and logged with its traceback
        log.exception("bench all: %s failed", name)
        stage.status, stage.note = "failed", f"{type(exc).__name__}: {exc}"
        return {"error": stage.note}
    finally:
        stage.wall_s = time.monotonic() - t0


def _command_line() -> str:
    ran_as_main = Path(sys.argv[0]).resolve() == Path(__file__).resolve()
    return "python -m benchmarks.suite " + " ".join(sys.argv[1:]) if ran_as_main else "run_suite()"


def _config_dict(cfg: SuiteConfig) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def _strip_timelines(result: dict) -> dict:
    out = json.loads(json.dumps(result, default=str))
    sim = out.get("simulator", {})
    for block in [sim.get("by_resolution", {}), *[e.get("by_resolution", {}) for e in sim.get("extra", [])],
                  *[s.get("by_resolution", {}) for s in sim.get("other_shapes", [])]]:
        for sim in block.values():
            for r in sim.get("baselines", {}).values():
                r.pop("timeline", None)
    return out


# ================================================================ mechanisms
def saved_mechanisms(path: Path) -> dict[str, dict]:
    """The mechanism results of a saved ``bench_all.json``, each marked ``reused_from`` (kept from an
    earlier reuse, so the file that measured it is named). Failed or skipped ones are not reused."""
    payload = json.loads(Path(path).read_text())
    mech = payload.get("mechanisms")
    if not isinstance(mech, dict):
        raise ValueError(f"--mechanisms-json {path}: no 'mechanisms' object (expected a bench_all.json)")
    return {name: {**r, "reused_from": r.get("reused_from", str(path))} for name, r in mech.items()
            if isinstance(r, dict) and "error" not in r and "skipped" not in r}


def _mechanism(name: str, cfg: SuiteConfig) -> dict:
    if name == "planner":
        from benchmarks.planner_bench import run_planner_bench

        if cfg.smoke:
            return run_planner_bench(seeds=cfg.planner_seeds, n_prompts=8, group_size=4, workers=4)
        return run_planner_bench(seeds=cfg.planner_seeds)
    if name == "regroup":
        return _json_subprocess([sys.executable, "-m", "benchmarks.regroup", "--json",
                                 "--repeats", str(cfg.regroup_repeats)], cfg.subprocess_timeout_s,
                                cwd=cfg.convergence.repo_root)
    if name == "queue":
        script = cfg.convergence.repo_root / "benchmarks" / "queue_throughput.py"
        if not script.is_file():
            return {"skipped": f"{script} not found (run from the repository root)"}
        return _json_subprocess([sys.executable, str(script), "--json", "--workers", "64"], cfg.subprocess_timeout_s)
    raise ValueError(f"unknown mechanism benchmark {name!r}; known {list(MECHANISMS)}")


def _json_subprocess(cmd: Sequence[str], timeout_s: float, cwd: Path | None = None) -> dict:
    """Run a benchmark that prints JSON; returns the last JSON object it printed."""
    env = {**os.environ, "SPOTLIGHT_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[1:4])} exited {proc.returncode}: {proc.stderr[-1500:]}")
    return parse_last_json(proc.stdout)


def parse_last_json(text: str) -> dict:
    """The last top-level JSON object in ``text`` (benchmarks print one, pretty or on one line)."""
    decoder = json.JSONDecoder()
    found = None
    i = text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            found = obj
        i = text.find("{", end)
    if found is None:
        raise ValueError(f"no JSON object in benchmark output: {text[-300:]!r}")
    return found


# ================================================================ simulator
def _calibrated_cost(cfg: SuiteConfig, regroup: Mapping[str, Any] | None):
    """The cost model, with the warm SP regroup replaced by this machine's measured one if it ran.

    Only the regroup part (group re-formation) is taken: the measured cold restart and weight
    copy are of a few-hundred-MB CPU model and would not scale to a 20B model on GPUs.
    """
    from roll_spotlight.sim.costmodel import CostModel

    cost = CostModel.from_dict(dict(cfg.sim_cost))
    parts = (regroup or {}).get("warm_parts_median_s") or {}
    if parts.get("regroup_s"):
        when = f"reused from {regroup['reused_from']}" if regroup.get("reused_from") else "this run"
        cost = cost.calibrate({"warm_regroup_s": float(parts["regroup_s"])},
                              note=f"python -m benchmarks.regroup, gloo on CPU ({when})")
    return cost


def run_simulations(cfg: SuiteConfig, cost) -> dict:
    """The baselines per resolution on the headline trace (timelines kept for the figures), for
    today's shape and each of ``other_shapes`` (no timelines), with the fair-cost vanilla."""
    from roll_spotlight.sim.api import simulate
    from roll_spotlight.spot.traces import traces_root

    root = traces_root(cfg.traces_root)
    head_path, head_zone = _trace_path(root, cfg.headline_trace)
    common = dict(ondemand=cfg.ondemand, spot=cfg.spot, cost_model=cost)
    by_res = {res: simulate(head_path, resolution=res, iterations=cfg.sim_iterations[res], timeline=True,
                            zones=[head_zone] if head_zone else None, fair_cost=cfg.fair_cost, **common)
              for res in cfg.resolutions}
    others = [{"name": name, "ondemand": od, "spot": sp, "by_resolution": {
        res: simulate(head_path, resolution=res, iterations=cfg.sim_iterations[res], ondemand=od, spot=sp,
                      cost_model=cost, zones=[head_zone] if head_zone else None, fair_cost=cfg.fair_cost)
        for res in cfg.resolutions}} for name, od, sp in cfg.other_shapes]
    extra = []
    for rel, zone in cfg.extra_traces:
        path, _ = _trace_path(root, (rel, zone))
        if path is None:
            continue
        extra.append({"trace": rel, "zone": zone, "by_resolution": {
            res: simulate(path, resolution=res, iterations=cfg.sim_iterations[res], zones=[zone] if zone else None,
                          **common) for res in cfg.resolutions}})
    note = None if head_path else f"{cfg.headline_trace[0]} not under the traces root: spot GPUs are never preempted"
    return {"kind": "simulated", "note": note,
            "headline_trace": cfg.headline_trace[0] if head_path else None,
            "cost_model": cost.table(), "shape": {"name": "today", "ondemand": cfg.ondemand, "spot": cfg.spot},
            "by_resolution": by_res, "other_shapes": others, "extra": extra}


def _trace_path(root: Path, spec: tuple[str, str | None]) -> tuple[Path | None, str | None]:
    if not (root / spec[0]).exists():
        return None, None
    return root / spec[0], spec[1]


# ================================================================ convergence
def _convergence(cfg: SuiteConfig) -> dict:
    if cfg.convergence_json:
        paths = [Path(p) for p in cfg.convergence_json]
        payloads = [json.loads(p.read_text()) for p in paths]
        records = merge_saved_runs(paths, payloads)
        saved_targets = {pl.get("target") for pl in payloads}
        target, rule = choose_target(records, cfg.convergence.target if cfg.convergence.target is not None
                                     else (saved_targets.pop() if len(saved_targets) == 1 else None))
        return {"kind": "measured", "source": ", ".join(str(p) for p in paths),
                "regime": regime_label((payloads[0].get("budget") or {}).get("overrides") or []),
                "summary": summarize(records, target, rule),
                "runs": [dataclasses.asdict(r) | {"horizon": r.horizon} for r in records], "budget": None}
    return run_convergence(cfg.convergence, cfg.out_dir / "convergence") | {
        "regime": regime_label(cfg.convergence.overrides)}


def regime_label(overrides: Sequence[str], config: str | Path = "configs/tiny_shapes.yaml") -> str:
    """The regime a tiny-task study trained in, in words: reward, group size, horizon (the last override wins)."""
    import yaml

    base = yaml.safe_load(Path(config).read_text()) if Path(config).is_file() else {}
    given = dict(o.split("=", 1) for o in overrides if "=" in o)
    mode = given.get("reward.kwargs.mode", ((base.get("reward") or {}).get("kwargs") or {}).get("mode", "?"))
    group = given.get("train.group_size", (base.get("train") or {}).get("group_size", "?"))
    return f"tiny shapes, {mode} reward, groups of {group}, {given.get('max_steps', base.get('max_steps', '?'))} iterations"


def exploration_regime(path: Path | None, setting: str = "adaptive") -> dict | None:
    """``benchmarks.explore_convergence``'s saved study of ``setting`` against vanilla, with its regime
    in words (MEASURED); None when the file is absent."""
    data = _saved(path)
    if data is None:
        return None
    return {"source": str(path), "setting": setting, "summary": data["summary"],
            "regime": regime_label(data.get("overrides") or [], data.get("config") or "configs/tiny_shapes.yaml")}


def saved_studies(folder: Path, headline_files: Sequence[Path] = ()) -> list[dict]:
    """The iterations-to-target ratio of every saved convergence study in ``folder`` (MEASURED).

    A study is ``convergence<name>.json`` merged with its ``convergence<name>_seeds<digits>.json``
    continuations (more seeds of the same command). Each gets the target rule of the headline
    (vanilla's mean final validation reward unless the file fixed one), the bound-aware ratio and
    :func:`headline.iterations_note`; ``headline`` marks the study the headline uses. A study that
    cannot be merged is listed with its error.
    """
    import re

    from benchmarks.headline import censored_medians, iterations_note, iterations_ratio

    groups: dict[str, list[Path]] = {}
    for path in sorted(Path(folder).glob("convergence*.json")):
        groups.setdefault(re.sub(r"_seeds\d+$", "", path.stem), []).append(path)
    chosen = {Path(p).resolve() for p in headline_files}
    out = []
    for name, paths in groups.items():
        entry: dict[str, Any] = {"study": name, "files": [str(p) for p in paths],
                                 "headline": bool(chosen) and {p.resolve() for p in paths} == chosen}
        try:
            payloads = [json.loads(p.read_text()) for p in paths]
            records = merge_saved_runs(paths, payloads)
            fixed = {pl.get("target") for pl in payloads}
            target, rule = choose_target(records, fixed.pop() if len(fixed) == 1 else None)
            summary = summarize(records, target, rule)
        except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
            out.append(entry | {"error": f"{type(exc).__name__}: {exc}"})
            continue
        est = summary["estimates"]
        ratio = iterations_ratio(est.get("vanilla"), est.get("spotlight"))
        overrides = (payloads[0].get("budget") or {}).get("overrides") or []
        out.append(entry | {
            "overrides": [f"{k}={v}" for k, v in dict(o.split("=", 1) for o in overrides if "=" in o).items()],
            "target": target, "target_rule": rule, "ratio": {"value": ratio.value, "bound": ratio.bound},
            "censored_medians": censored_medians(est.get("vanilla"), est.get("spotlight")),
            "note": iterations_note(est),
            "estimates": {k: {f: e[f] for f in ("value", "bound", "reached", "runs")} for k, e in est.items()},
            "paired_spotlight": (summary.get("paired_vs_vanilla") or {}).get("spotlight")})
    return out


def _saved(path: Path | None) -> dict | None:
    return json.loads(Path(path).read_text()) if path is not None and Path(path).is_file() else None


def cheap_exploration(path: Path | None) -> dict | None:
    """Spearman of stale few-step explored rewards against fresh full-step ones, per schedule, from
    ``benchmarks/explore_rank_vs_steps.py``'s JSON (MEASURED); None when the file is absent."""
    if path is None or not Path(path).is_file():
        return None
    data = json.loads(Path(path).read_text())
    rows = [{k: r.get(k) for k in ("kind", "num_steps", "relative_cost", "spearman", "spearman_se", "pool_in_budget")}
            for r in data.get("rows") or []]
    return {"kind": "measured", "source": str(path), "command": data.get("command"), "rows": rows}


def merge_saved_runs(paths: Sequence[Path], payloads: Sequence[Mapping[str, Any]]) -> list:
    """The runs of several saved convergence results as one study (e.g. seeds 0-2, then 3-5).

    They must have trained under the same overrides (``budget.overrides``, where saved) and must not
    repeat a (setting, seed) run; either mistake is an error naming the files.
    """
    records, owner, first = [], {}, None
    for path, payload in zip(paths, payloads):
        saved = (payload.get("budget") or {}).get("overrides")
        if saved is not None:
            first = first or (saved, path)
            if saved != first[0]:
                raise ValueError(f"--convergence-json: {first[1]} trained with overrides {first[0]} but {path} "
                                 f"with {saved}; merge only results of the same settings")
        for record in records_from_json(payload):
            key = (record.setting, record.seed)
            if key in owner:
                raise ValueError(f"--convergence-json: {record.setting} seed {record.seed} is in both "
                                 f"{owner[key]} and {path}")
            owner[key] = path
            records.append(record)
    return records


# ================================================================ CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite", description=(
        "Run the mechanism benchmarks, the simulator and the convergence benchmark; write REPORT.md "
        "with PNG figures (each labelled MEASURED, SIMULATED or PAPER)."))
    p.add_argument("--smoke", action="store_true", help="CI-sized run (< 60 s); writes under benchmarks/results/smoke")
    p.add_argument("--out", type=Path, default=None, help="output folder (default benchmarks/results[/smoke])")
    p.add_argument("--traces-root", type=Path, default=None,
                   help="folder of spot traces (default $SPOTLIGHT_TRACES, else those shipped in the package)")
    p.add_argument("--skip", action="append", default=[], choices=MECHANISMS, help="skip a mechanism benchmark")
    p.add_argument("--ondemand", type=int, default=None, help="simulated on-demand GPUs (default 8)")
    p.add_argument("--spot", type=int, default=None, help="simulated spot GPUs (default 8)")
    p.add_argument("--paper-shape", type=int, nargs=2, default=None, metavar=("ONDEMAND", "SPOT"),
                   help="second simulated cluster shape, the paper's (default 4 reserved, priced on-demand, + 8 spot)")
    p.add_argument("--spot-heavy-shape", type=int, nargs=2, default=None, metavar=("ONDEMAND", "SPOT"),
                   help="third simulated cluster shape, mostly spot GPUs (default 2 on-demand + 14 spot)")
    p.add_argument("--emulate-json", type=Path, default=None,
                   help="reuse a saved `python -m benchmarks.emulate` JSON (benchmarks/results/emulate.json)")
    p.add_argument("--mechanisms-json", type=Path, default=None,
                   help="reuse the mechanism results of a saved bench_all.json instead of measuring them again "
                        "(those it lacks are run)")
    p.add_argument("--convergence-budget-min", type=float, default=None,
                   help="deadline in minutes for all convergence training runs (default 40)")
    p.add_argument("--convergence-seeds", type=int, nargs="+", default=None, help="training seeds (default 0 1 2)")
    p.add_argument("--convergence-settings", nargs="+", default=None, choices=list(SETTINGS),
                   help=f"settings to train (default all: {' '.join(SETTINGS)})")
    p.add_argument("--convergence-parallel", type=int, default=None, help="runs at once (default: min(2, cores))")
    p.add_argument("--convergence-override", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every convergence run (repeatable)")
    p.add_argument("--target", type=float, default=None,
                   help="validation reward to reach (default: vanilla's final validation reward)")
    p.add_argument("--exploration-json", type=Path, default=None,
                   help=f"`python -m benchmarks.explore_convergence`'s study whose measured iterations ratio the "
                        f"Spotlight-exploring rows take, with its regime (default {EXPLORATION_JSON})")
    p.add_argument("--convergence-json", type=Path, nargs="+", default=None,
                   help="use saved convergence results (python -m benchmarks.convergence or the suite's output) instead of "
                        "running; several files (e.g. seeds 0-2 and 3-5) are merged into one study")
    return p


def config_from_args(args: argparse.Namespace) -> SuiteConfig:
    repo_root = Path(".")
    base = SuiteConfig.smoke_preset(repo_root=repo_root) if args.smoke else SuiteConfig()
    conv = base.convergence
    conv = dataclasses.replace(
        conv, repo_root=repo_root, target=args.target,
        overrides=tuple(conv.overrides) + tuple(args.convergence_override),
        seeds=tuple(args.convergence_seeds) if args.convergence_seeds else conv.seeds,
        settings=tuple(dict.fromkeys(args.convergence_settings)) if args.convergence_settings else conv.settings,
        budget_s=args.convergence_budget_min * 60 if args.convergence_budget_min else conv.budget_s,
        parallel=args.convergence_parallel or (conv.parallel if args.smoke else max(1, min(2, os.cpu_count() or 1))))
    changes: dict[str, Any] = {"convergence": conv, "convergence_json": tuple(args.convergence_json or ()),
                               "mechanisms": tuple(m for m in base.mechanisms if m not in args.skip)}
    for key in ("ondemand", "spot", "traces_root", "mechanisms_json", "emulate_json", "exploration_json"):
        if getattr(args, key) is not None:
            changes[key] = getattr(args, key)
    given = {"paper": args.paper_shape, "spot-heavy": args.spot_heavy_shape}
    if any(v is not None for v in given.values()):
        changes["other_shapes"] = tuple((name, *given[name]) if given.get(name) is not None else (name, od, sp)
                                        for name, od, sp in base.other_shapes)
    if args.out is not None:
        changes["out_dir"] = args.out
    return dataclasses.replace(base, **changes)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    result = run_suite(cfg)
    failed = [s["name"] for s in result["stages"] if s["status"] == "failed"]
    print(f"report: {result['report']} ({result['wall_s']:.0f} s)")
    if failed:
        print(f"failed parts (see the report): {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
