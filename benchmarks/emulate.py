"""``python -m benchmarks.emulate``: the claim's cluster shapes through the live system, beside the simulator.

For each row (on-demand + spot GPUs, resolution, SP degree) and system (vanilla, naive spot,
Spotlight exploring, Spotlight with spot training) it runs ``--iterations`` iterations of the
Qwen-Image OCR recipe on emulated GPUs (`worker.emulated`: the real queue, workers, trainer, spot
pool, elastic SP and notice bridge, every compute phase waiting its calibrated duration divided by
the row's time-scale), with the spot nodes as raylets that one window of the AWS p3 trace
(`trace_window`) starts, drains and kills at that time-scale; and the simulator on the same
shape, trace window and seed.

Per row and system: the emulated time per iteration (wall x time-scale, iterations 2..K: the first
one loads weights) and its cost from the run's ledger, the simulator's prediction and their ratio,
the phases of an iteration with the control plane's share (queue calls, weight fetches and the
publish, regroups, commits on notice, idle GPU time), and the correctness counters: requests and
micro-batches lost, counted twice or mismatched (every rollout's stand-in latent chain is checked
against an uninterrupted one), preemptions through real raylets, regroups. Figures are EMULATED
(measured on this machine with modelled compute), the simulator's SIMULATED.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

log = logging.getLogger(__name__)

RECIPE = Path("configs/qwen_image_ocr_512.yaml")
TRACE = "bamboo-spot-traces/aws/p3-trace.csv"  # running instances with AWS's 2-minute notices
SYSTEMS = ("vanilla", "naive_spot", "spotlight", "spotlight_train")
GPUS_PER_SPOT_NODE = 2


@dataclass(frozen=True)
class Row:
    """One cluster shape: ``ondemand`` + ``spot`` GPUs at ``resolution`` with SP groups of
    ``sp_degree``, emulated ``time_scale`` times faster than the modelled GPUs."""

    name: str
    ondemand: int
    spot: int
    resolution: int
    sp_degree: int
    time_scale: float


# Time-scales keep a modelled denoising step at >= ~3.4 ms of wall time, above what a worker's own
# per-step work costs on 2 cores (an SP group's stop check is a collective of ~2 ms): faster, and
# that overhead, not the modelled step, sets the pace.
ROWS = (Row("8+8 512", 8, 8, 512, 1, 30.0), Row("4+8 512", 4, 8, 512, 1, 40.0),
        Row("8+8 1280 SP4", 8, 8, 1280, 4, 60.0), Row("2+14 512", 2, 14, 512, 1, 40.0))

# what each system changes in the recipe (the simulator's baseline of the same name)
SYSTEM_OVERRIDES = {
    "vanilla": ("spot.enabled=false", "exploration.mode=off"),
    "naive_spot": ("spot.enabled=true", "spot.training_phase=explore", "exploration.mode=off",
                   "spot.commit_on_notice=false"),
    "spotlight": ("spot.enabled=true", "spot.training_phase=explore", "exploration.mode=stale"),
    "spotlight_train": ("spot.enabled=true", "spot.training_phase=train", "exploration.mode=off"),
}


@dataclass(frozen=True)
class EmulateBenchConfig:
    """One benchmark run; ``time_scale`` overrides every row's (1: GPU durations in wall time)."""

    gpu: str = "h100"
    iterations: int = 6  # batched, 4 iterations of 8+8 512 span 230 s: no notice and preemption fit
    rows: tuple[str, ...] = tuple(r.name for r in ROWS)
    systems: tuple[str, ...] = SYSTEMS
    time_scale: float | None = None
    seed: int = 0
    pull_batch: int = 4
    max_batch: int | None = None   # sampling.max_batch of every run (None: the recipe's)
    recipe: Path = RECIPE
    keep_runs: Path | None = None

    def __post_init__(self) -> None:
        known = {r.name for r in ROWS}
        if unknown := sorted(set(self.rows) - known):
            raise ValueError(f"--rows {unknown} unknown; known rows: {sorted(known)}")
        if unknown := sorted(set(self.systems) - set(SYSTEMS)):
            raise ValueError(f"--systems {unknown} unknown; known systems: {list(SYSTEMS)}")
        if self.iterations < 2:
            raise ValueError(f"--iterations must be >= 2 (the first one loads weights), got {self.iterations}")
        if self.time_scale is not None and not self.time_scale > 0:
            raise ValueError(f"--time-scale must be > 0, got {self.time_scale!r}")
        if self.max_batch is not None and self.max_batch < 1:
            raise ValueError(f"--max-batch must be >= 1, got {self.max_batch!r}")

    def row_list(self) -> list[Row]:
        rows = [r for r in ROWS if r.name in self.rows]
        return rows if self.time_scale is None else [dataclasses.replace(r, time_scale=self.time_scale) for r in rows]


def run_bench(cfg: EmulateBenchConfig) -> dict:
    """Every row and system; the JSON result (see the module docstring)."""
    from roll_spotlight.spot.traces import load_trace, traces_root

    trace = load_trace(traces_root() / TRACE)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="emulate") as tmp:
        prompts = _prompt_files(Path(tmp))
        runs = cfg.keep_runs or Path(tmp)
        rows = []
        for row in cfg.row_list():
            window = trace_window(trace, row, cfg)
            sim = simulated(trace, row, cfg, window)
            for system in cfg.systems:
                emulated = run_system(cfg, row, system, prompts, window, runs / f"{row.name}-{system}".replace(" ", "_"))
                rows.append(compare(row, system, emulated, sim["baselines"][system]))
                log.info("%s %s: %s", row.name, system, json.dumps(rows[-1]["summary"]))
    return {"kind": "emulated", "gpu": cfg.gpu, "iterations": cfg.iterations, "trace": TRACE, "seed": cfg.seed,
            "rollout": sim_rollout(cfg),
            "wall_minutes": (time.time() - started) / 60.0, "rows": rows}


def _prompt_files(folder: Path) -> Path:
    """OCR prompt files as `spotlight prompts ocr` writes them (the recipe's task)."""
    from roll_spotlight.tasks.ocr_prompts import write_ocr_prompts

    write_ocr_prompts(folder / "prompts", 4000, 200, 0)
    return folder / "prompts"


# The emulated workers denoise batches, each step one forward of rows x CFG branches
# (`worker.emulated`); the simulator beside them runs the same mode (True: the batch-1 engine's).
EMULATED_SERIAL = False


def sim_rollout(cfg: EmulateBenchConfig) -> dict:
    """How the simulator's workers denoise: as the emulated ones (serial, or the run's max_batch)."""
    if EMULATED_SERIAL:
        return {"serial_rollout": True}
    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.config.strict import load_config

    return {"max_batch": cfg.max_batch or load_config(RunConfig, cfg.recipe, []).sampling.max_batch}


def trace_window(trace, row: Row, cfg: EmulateBenchConfig) -> float:
    """The trace second the window starts at: the first at which the capped spot fleet is full and
    after which a node gets its notice and goes during the steady iterations (the simulator's span
    of the run, less its first iteration), so every spot row sees a preemption with notice while
    the spot GPUs otherwise serve; 0 when the trace has no such window."""
    from roll_spotlight.sim.api import simulate
    from roll_spotlight.spot.market import EventKind, MarketConfig, SpotMarket

    span = simulate(trace, resolution=row.resolution, ondemand=row.ondemand, spot=row.spot,
                    iterations=cfg.iterations, baselines=("spotlight_train",), seed=cfg.seed,
                    cost_model=row_cost_model(cfg, row), gpus_per_spot_node=GPUS_PER_SPOT_NODE,
                    spot_host_gpus=GPUS_PER_SPOT_NODE, **sim_rollout(cfg))["baselines"]["spotlight_train"]["sim_end_s"]
    cap = row.spot // GPUS_PER_SPOT_NODE
    market = SpotMarket(trace, MarketConfig(cap_nodes=cap, seed=cfg.seed))
    first = span / cfg.iterations + market.notice_s  # the notice, too, after the first iteration
    downs = sorted(ev.time_s for ev in market.events if ev.kind is EventKind.NODE_DOWN)
    for up in sorted({ev.time_s for ev in market.events if ev.kind is EventKind.NODE_UP}):
        if len(market.alive_at(up)) == cap and any(up + first <= d < up + span for d in downs):
            return up
    return 0.0


def row_cost_model(cfg: EmulateBenchConfig, row: Row):
    """The cost model of the recipe's workload at the row's resolution on ``cfg.gpu``: the one the
    emulated workers wait on (`worker.emulated.workload_of`), so both sides model one shape."""
    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.worker.emulated import workload_of

    recipe = load_config(RunConfig, cfg.recipe, [f"model.image_size={row.resolution}"])
    return workload_of(recipe).cost_model(cfg.gpu)


def simulated(trace, row: Row, cfg: EmulateBenchConfig, window: float) -> dict:
    """The simulator on the row's shape, trace window and seed (SIMULATED)."""
    from roll_spotlight.sim.api import simulate

    return simulate(trace, resolution=row.resolution, ondemand=row.ondemand, spot=row.spot,
                    iterations=cfg.iterations, baselines=cfg.systems, seed=cfg.seed, cost_model=row_cost_model(cfg, row),
                    start_s=window, skip_ramp=False, gpus_per_spot_node=GPUS_PER_SPOT_NODE,
                    spot_host_gpus=GPUS_PER_SPOT_NODE, **sim_rollout(cfg))


def run_config(cfg: EmulateBenchConfig, row: Row, system: str, prompts: Path, window: float):
    """The recipe as the row and system run it."""
    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.spot.traces import traces_root

    # pull_batch 4: a worker reports a batch and leases the next in one queue call (dispatch docs)
    overrides = [f"model.image_size={row.resolution}", f"max_steps={cfg.iterations}", "eval_steps=0",
                 f"dispatch.pull_batch={cfg.pull_batch}",
                 "save_steps=0", f"seed={cfg.seed}", f"task.train_file={prompts / 'train.txt'}",
                 f"task.test_file={prompts / 'test.txt'}", "task.val_prompts=16", "train.colocated=true",
                 f"spot.trace={traces_root() / TRACE}", f"spot.start_s={window}",
                 f"spot.max_workers={row.spot // GPUS_PER_SPOT_NODE}", f"spot.gpus_per_node={GPUS_PER_SPOT_NODE}",
                 f"spot.seed={cfg.seed}", *SYSTEM_OVERRIDES[system],
                 *([f"sampling.max_batch={cfg.max_batch}"] if cfg.max_batch is not None else [])]
    return load_config(RunConfig, cfg.recipe, overrides)


def run_system(cfg: EmulateBenchConfig, row: Row, system: str, prompts: Path, window: float, run_dir: Path) -> dict:
    """One emulated run; its figures (`figures`)."""
    from roll_spotlight.startup import WorkerPlacement, start_run

    placement = WorkerPlacement(workers=row.ondemand, sp_degree=row.sp_degree, emulate=cfg.gpu,
                                time_scale=row.time_scale,
                                sp_min_degree=row.sp_degree if system == "naive_spot" else None)
    start_run(run_config(cfg, row, system, prompts, window), run_dir, placement=placement, progress=False)
    return figures(run_dir, row, system)


def figures(run_dir: Path, row: Row, system: str) -> dict:
    """Per-iteration time and cost (iterations 2..K, scaled back), phases, and the counters."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    its = [r for r in rows if r.get("iteration_s") is not None]
    steady = its[1:]
    scale = row.time_scale
    per_it = statistics.fmean(r["iteration_s"] for r in steady) * scale
    cost = _cost_per_iteration(steady, row, scale)
    events = json.loads((run_dir / "timeline.json").read_text())
    last = its[-1]
    counters = {k: last.get(k, 0.0) for k in ("spot/preemptions", "spot/notices", "spot/commits", "spot/regroups",
                                              "spot/leases_requeued", "spot/duplicate_completions",
                                              "spot/requests_failed", "spot/steps_lost")}
    raylets = run_dir / "spot_nodes.json"  # what the trace did to the raylets (emulated spot rows)
    if raylets.is_file():
        stats = json.loads(raylets.read_text())
        counters["raylets_killed_after_notice"] = stats["kills_after_notice"]
        counters["raylets_killed_without_notice"] = stats["kills_without_notice"]
    counters["mismatched_outputs"] = sum(r.get("emulated/mismatched_outputs", 0.0) for r in its)
    counters["micro_batches_refused"] = sum(r.get("train/reports_refused", 0.0) for r in its)
    return {"time_per_iteration_s": per_it, "cost_per_iteration_usd": cost,
            "iteration_s": [r["iteration_s"] * scale for r in its],
            "phases_s": {k: statistics.fmean(r[k] for r in steady) * scale for k in ("rollout_s", "reward_s", "train_s")},
            "control_plane": control_plane(events, steady, scale), "counters": counters}


def _cost_per_iteration(steady: list[dict], row: Row, scale: float) -> float:
    """The ledger's dollars per steady iteration (spot runs); vanilla: its on-demand GPUs at the
    ledger's on-demand price."""
    if "cost/usd" in steady[-1] and len(steady) > 1:
        return (steady[-1]["cost/usd"] - steady[0]["cost/usd"]) / (len(steady) - 1)
    from roll_spotlight.spot.prices import default_prices

    price = default_prices("H100").price("ondemand").usd_per_gpu_hour
    return row.ondemand * statistics.fmean(r["iteration_s"] for r in steady) * scale * price / 3600.0


CONTROL = {"fetch": "weight fetches", "publish": "publish", "sp_join": "regroups", "commit": "commits on notice",
           "notice": "commits on notice"}
COMPUTE = ("rollout", "explore", "train", "reward")


def control_plane(events: list[dict], steady: list[dict], scale: float) -> dict:
    """Where the GPUs' time went in the steady iterations, as shares of (GPUs x wall time): compute
    phases, queue round trips (``queue_s`` of the workers' phases), weight fetches and the publish,
    regroups, commits on notice; idle is the rest (waiting for others, polling an empty queue). A
    fetch and a commit's queue call happen inside their rollout's phase and count in both, so the
    shares may sum to a little over 1 (idle is then 0)."""
    start = steady[0]["started_s"]
    end = steady[-1]["started_s"] + steady[-1]["iteration_s"]
    workers = {e["worker"] for e in events if e["phase"] in ("rollout", "train") and e["worker"] not in ("trainer",)}
    span = max(end - start, 1e-9) * max(len(workers), 1)
    spent: dict[str, float] = {}
    for e in events:
        overlap = max(0.0, min(e["end"], end) - max(e["start"], start))
        if e["worker"] not in workers or overlap <= 0 and e.get("queue_s", 0.0) <= 0:
            continue
        name = "compute" if e["phase"] in COMPUTE else CONTROL.get(e["phase"], e["phase"])
        spent[name] = spent.get(name, 0.0) + overlap
        if start <= e["end"] <= end:
            spent["queue calls"] = spent.get("queue calls", 0.0) + e.get("queue_s", 0.0)
    shares = {k: v / span for k, v in spent.items()}
    shares["idle"] = max(0.0, 1.0 - sum(shares.values()))
    return {"gpus": len(workers), "wall_s": (end - start) * scale, "shares": shares}


def compare(row: Row, system: str, emulated: dict, sim: dict) -> dict:
    """One row and system: emulated beside simulated, both over the steady iterations (2..K)."""
    times = sim.get("iteration_times_s") or []
    steady = statistics.fmean(times[1:]) if len(times) > 1 else sim["time_per_iteration_s"]
    ratio = emulated["time_per_iteration_s"] / steady
    summary = {"row": row.name, "system": system, "emulated_s": round(emulated["time_per_iteration_s"], 1),
               "simulated_s": round(steady, 1), "ratio": round(ratio, 3),
               "emulated_usd": round(emulated["cost_per_iteration_usd"], 3),
               "simulated_usd": round(sim["cost_per_iteration_usd"], 3)}
    return {"row": dataclasses.asdict(row), "system": system, "emulated": emulated,
            "simulated": {"steady_time_per_iteration_s": steady,
                          **{k: sim.get(k) for k in ("time_per_iteration_s", "iteration_times_s", "cost_per_iteration_usd",
                                                     "preemptions", "notices", "regroups", "phases_per_iteration")}},
            "ratio": ratio, "summary": summary}


def build_parser() -> argparse.ArgumentParser:
    d = EmulateBenchConfig()
    p = argparse.ArgumentParser(prog="python -m benchmarks.emulate", description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", default=d.gpu, help="the emulated GPU (h100, h800, h200, a100)")
    p.add_argument("--iterations", type=int, default=d.iterations, help="iterations per system (>= 2)")
    p.add_argument("--rows", nargs="+", default=list(d.rows), help=f"rows to run, of {[r.name for r in ROWS]}")
    p.add_argument("--systems", nargs="+", default=list(d.systems), help=f"systems to run, of {list(SYSTEMS)}")
    p.add_argument("--time-scale", type=float, default=None, help="one time-scale for every row (default: the row's)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--pull-batch", type=int, default=d.pull_batch, help="dispatch.pull_batch of every run")
    p.add_argument("--max-batch", type=int, default=None, help="sampling.max_batch of every run (default: the recipe's)")
    p.add_argument("--keep-runs", type=Path, default=None, help="keep every run's directory under this folder")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/emulate.json"), help="JSON result")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, force=True,  # `spotlight` set one
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = EmulateBenchConfig(gpu=args.gpu, iterations=args.iterations, rows=tuple(args.rows),
                                 systems=tuple(args.systems), time_scale=args.time_scale, seed=args.seed,
                                 pull_batch=args.pull_batch, max_batch=args.max_batch, keep_runs=args.keep_runs)
    except ValueError as err:
        print(f"python -m benchmarks.emulate: {err}", file=sys.stderr)
        return 2
    with contextlib.redirect_stdout(sys.stderr):  # Ray prints each killed raylet's last log lines
        result = run_bench(cfg)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for row in result["rows"]:
        print(json.dumps(row["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
