"""SIMULATED: what batched rollouts change, against batch 1, with the calibration they rest on, as JSON.

    python -m benchmarks.sim_rollout_batching --out benchmarks/results/sim_rollout_batching.json

One JSON (every figure simulated or published, labelled) for docs/measurements.md and the report:

- ``fit``: every published batching ratio beside the fitted curve's (``benchmarks.batching_fit``);
- ``calibration``: verl-omni's two published rows beside the simulator's vanilla of each, and the
  waterfall from one to the other (``benchmarks.sim_reference``);
- ``vanilla_rollout``: vanilla on 8 on-demand H100 at 512 and 1280, the rollout phase batched (the
  recipes' ``sampling.max_batch``) and serial (batch 1, CFG branches one after the other);
- ``same_shape_as_verl_omni``: this project's vanilla on the LoRA row's shape (4 x H800, 32 x 16 at
  512^2), batched and serial, beside the published 420 s;
- ``shapes``: vanilla, naive spot, Spotlight, Spotlight with spot training and the managed spot
  job on the headline trace for 8 + 8 and 4 + 8 at 512 and 8 + 8 at 1280, batched and serial.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import batching_fit
from benchmarks import sim_reference as reference
from roll_spotlight.sim.api import simulate
from roll_spotlight.sim.costmodel import CostModel
from roll_spotlight.spot.traces import traces_root

REPO = Path(__file__).resolve().parents[1]

HEADLINE_TRACE = "bamboo-spot-traces/aws/p3-trace.csv"
SYSTEMS = ("vanilla", "naive_spot", "spotlight", "spotlight_train", "managed_spot")
SHAPES = (("8+8", 8, 8, 512), ("4+8", 4, 8, 512), ("8+8", 8, 8, 1280))
ITERATIONS = {512: 40, 1280: 12}
# "batch 1": the engine before issue 54 (one request, CFG branches one after the other), as the issue
# and verl-omni's published runs mean it; "max_batch 1": the batched engine at sampling.max_batch 1
# (both CFG branches in one forward), in the vanilla rows only
MODES = {"batched": {}, "batch 1": {"serial_rollout": True}}
ONE_FUSED = {"max_batch 1": {"max_batch": 1}}
REPORTED = ("time_per_iteration_s", "cost_per_iteration_usd", "preemptions", "lost_gpu_s", "spot_idle_fraction",
            "spot_gpus", "restarts", "redone_iterations", "waiting_s", "restarting_s")   # the last five: managed job


def vanilla_rollout(cost: CostModel) -> dict:
    """The rollout phase of vanilla on 8 on-demand H100, per resolution: batched, serial, max_batch 1."""
    out = {}
    for res in (512, 1280):
        modes = {name: simulate(None, resolution=res, ondemand=8, spot=0, iterations=2, baselines=("vanilla",),
                                cost_model=cost, **kwargs)["baselines"]["vanilla"]["phases_per_iteration"]["wall_s"]
                 for name, kwargs in {**MODES, **ONE_FUSED}.items()}
        out[str(res)] = {"kind": "simulated", "max_batch": cost.max_batch(res), "wall_s": modes,
                         "rollout_speedup": modes["batch 1"]["rollout"] / modes["batched"]["rollout"],
                         "iteration_speedup": sum(modes["batch 1"].values()) / sum(modes["batched"].values())}
    return out


def same_shape(cost: CostModel) -> dict:
    """This project's vanilla (its own reward servers, no old-log-prob pass) on the LoRA row's shape."""
    run = reference.VERL_OMNI_LORA
    model = run.workload.cost_model(run.gpu, cost)
    rows = {name: simulate(None, resolution=512, ondemand=run.gpus, spot=0, iterations=2, baselines=("vanilla",),
                           cost_model=model, **kwargs)["baselines"]["vanilla"]["time_per_iteration_s"]
            for name, kwargs in MODES.items()}
    return {"kind": "simulated beside published", "run": run.name, "published_s": run.step_s, "simulated_s": rows}


def shapes(cost: CostModel, trace: Path | None) -> list[dict]:
    out = []
    for name, ondemand, spot, res in SHAPES:
        for mode, kwargs in MODES.items():
            sim = simulate(trace, resolution=res, ondemand=ondemand, spot=spot, iterations=ITERATIONS[res],
                           baselines=SYSTEMS, cost_model=cost, **kwargs)
            out.append({"kind": "simulated", "shape": name, "resolution": res, "mode": mode,
                        "max_batch": sim["rollout"]["max_batch"], "trace": sim["trace"]["name"],
                        "iterations": ITERATIONS[res],
                        "systems": {s: _row(r, sim["baselines"]["vanilla"]) for s, r in sim["baselines"].items()}})
            print(f"{name} {res} {mode}: " + ", ".join(
                f"{s} {r['time_per_iteration_s']:.1f} s" for s, r in sim["baselines"].items()), flush=True)
    return out


def _row(r: dict, vanilla: dict) -> dict:
    return {**{k: r[k] for k in REPORTED if k in r},
            "speedup_vs_vanilla": vanilla["time_per_iteration_s"] / r["time_per_iteration_s"],
            "cost_ratio_vs_vanilla": vanilla["cost_per_iteration_usd"] / r["cost_per_iteration_usd"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sim_rollout_batching.json")
    parser.add_argument("--cost", type=Path, default=None, help="JSON of cost-model overrides")
    parser.add_argument("--skip-shapes", action="store_true", help="leave out the spot shapes (the slow part)")
    args = parser.parse_args(argv)
    overrides = json.loads(args.cost.read_text()) if args.cost else None
    cost = CostModel.from_dict(overrides)
    trace = traces_root(None) / HEADLINE_TRACE
    result = {"kind": "simulated (published where marked)", "cost_overrides": overrides,
              "fit": batching_fit.fit(cost),
              "calibration": {"rows": reference.both_rows(cost), "waterfall": reference.waterfall(cost)},
              "vanilla_rollout": vanilla_rollout(cost), "same_shape_as_verl_omni": same_shape(cost),
              "shapes": [] if args.skip_shapes else shapes(cost, trace if trace.is_file() else None)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
