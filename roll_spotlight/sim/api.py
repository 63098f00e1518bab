"""Entry points of the simulator: ``simulate``, ``project``, ``time_to_target`` and the CLI ``main``.

Every number these functions return is **simulated** (cost model + trace), and the output says so
(``"kind": "simulated"``). Exploration's effect on convergence is not simulated: iterations to a
target score are measured on the real tiny task elsewhere; ``time_to_target`` multiplies them by the
simulated time and cost per iteration.

CLI: ``spotlight simulate --trace FILE --resolution {512,1280} [--ondemand N] [--spot M]
[--iterations K] [--json]`` (the console script dispatches to ``main``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from roll_spotlight.sim.baselines import BASELINES, get_baseline
from roll_spotlight.sim.shape_budget import (FAIR_COST_DEFINITION, exploration_budget, fair_cost_baseline,
                                       fair_cost_ondemand)
from roll_spotlight.sim.costmodel import RESOLUTIONS, CostModel
from roll_spotlight.sim.gpus import gpu_spec
from roll_spotlight.sim.managed_job import MANAGED_SPOT, simulate_managed_job
from roll_spotlight.sim.spotfeed import SpotFeed, TraceLike, fake_feed, spot_feed
from roll_spotlight.sim.system import BaselineResult, ClusterSimulation, SimConfig

DEFAULT_BASELINES = ("vanilla", "explore_critical", "naive_spot", "spotlight", "spotlight_train")
SYSTEMS = (*BASELINES, MANAGED_SPOT)   # every name simulate accepts among its baselines
SIMULATED_NOTE = ("simulated: cluster time and cost come from the cost model (each constant names its "
                  "source) and the spot trace; explored rewards are synthetic; convergence is not simulated")
# Mean time between preemption batches by provider, for what-if runs without a trace file
# (`spotlight traces roll_spotlight/spot/data`: Bamboo AWS p3 8.6 min; GCP H100 probes 73 min pooled).
PROVIDER_MTBP_S = {"aws": 518.0, "gcp": 4380.0, "azure": 4380.0}

_REPORTED = ("time_per_iteration_s", "cost_per_iteration_usd", "spot_idle_fraction",
             "ondemand_idle_fraction", "preemptions", "regroups")


def simulate(trace: TraceLike, *, resolution: int, ondemand: int, spot: int, iterations: int,
             baselines: Sequence[str] = DEFAULT_BASELINES, seed: int = 0,
             cost_model: CostModel | Mapping[str, Any] | None = None, timeline: bool = False,
             start_s: float = 0.0, skip_ramp: bool = True, zones: Sequence[str] | None = None,
             gpus_per_spot_node: int = 1, spot_host_gpus: int = 8, feed: SpotFeed | None = None,
             fair_cost: bool = False, max_batch: int | None = None, serial_rollout: bool = False) -> dict:
    """Simulate each baseline on the same cluster and trace window; returns a JSON-ready dict.

    ``fair_cost``: also simulate, for each spot baseline among ``baselines``, vanilla on the
    on-demand GPUs that baseline's simulated dollars buy (``budget.fair_cost_ondemand``; needs a
    spot baseline), added to ``baselines`` as ``budget.fair_cost_baseline(name)`` with its GPU
    count and described under ``"fair_cost"`` (its top level: Spotlight's, when simulated;
    ``by_baseline``: every spot baseline's). The result's ``exploration_budget`` is
    ``budget.exploration_budget`` for this shape.

    ``managed_spot``: vanilla's whole job on ``ondemand`` spot GPUs, restarted from checkpoints
    (``sim.managed_job``). ``max_batch`` / ``serial_rollout``: how workers denoise (``SimConfig``).

    ``trace``: a ``Trace``, a trace path, or None (spot GPUs that are never preempted). ``feed``
    overrides the trace with a ready-made event feed (tests, what-ifs). ``spot_host_gpus``: with
    single-GPU trace instances, how many of them share a host (see ``cluster``; 1 = separate VMs).
    """
    if resolution not in RESOLUTIONS:
        raise ValueError(f"resolution must be one of {RESOLUTIONS}, got {resolution}")
    cost = _cost_model(cost_model)
    if unknown := [name for name in baselines if name not in SYSTEMS]:
        raise ValueError(f"unknown baseline {unknown[0]!r}; known baselines: {sorted(SYSTEMS)}")
    given_feed = feed
    if feed is None:
        feed = _feed(trace, spot, gpus_per_spot_node, seed, start_s, skip_ramp, zones)
    config = SimConfig(resolution=resolution, ondemand=ondemand, spot=spot, iterations=iterations, seed=seed,
                       gpus_per_spot_node=gpus_per_spot_node, spot_host_gpus=spot_host_gpus,
                       record_timeline=timeline, max_batch=max_batch, serial_rollout=serial_rollout)
    batch = config.batch_of(cost)
    results = {name: _result_dict(ClusterSimulation(get_baseline(name), config, cost, feed).simulate(), timeline)
               for name in baselines if name != MANAGED_SPOT}
    if MANAGED_SPOT in baselines:
        job_feed = given_feed or _feed(trace, ondemand, gpus_per_spot_node, seed, start_s, skip_ramp, zones)
        results[MANAGED_SPOT] = _managed_job(job_feed, config, cost, results.get("vanilla"))
    baselines = {name: results[name] for name in baselines}
    fair = _fair_cost_vanilla(baselines, config, cost, feed, timeline) if fair_cost else None
    return {
        "kind": "simulated",
        "note": SIMULATED_NOTE,
        "trace": {"name": feed.name, "provider": feed.provider, "notice_s": feed.notice_s,
                  "window_s": feed.window_s if math.isfinite(feed.window_s) else None},
        "cluster": {"ondemand_gpus": ondemand, "spot_gpus": spot, "gpus_per_spot_node": gpus_per_spot_node,
                    "spot_host_gpus": spot_host_gpus,
                    "gpu": gpu_spec(cost.gpu).name, "resolution": resolution},
        "rollout": {"max_batch": batch, "serial": serial_rollout},
        "iterations": iterations,
        "seed": seed,
        "phases": phase_summary(cost, resolution, ondemand, batch, serial_rollout),
        "calibration": cost.calibration,  # the published calibration, or the gpu_check file measured on a GPU
        "prices_usd_per_gpu_hour": {"ondemand": feed.prices.price("ondemand").usd_per_gpu_hour,
                                    "spot": feed.prices.price("spot").usd_per_gpu_hour},
        "exploration_budget": exploration_budget(cost, resolution, ondemand, spot, batch, serial_rollout),
        "baselines": baselines,
        **({"fair_cost": fair} if fair is not None else {}),
    }


def _managed_job(feed: SpotFeed, config: SimConfig, cost: CostModel, vanilla: dict | None) -> dict:
    """The managed spot job on ``config.ondemand`` spot GPUs, iterations as long as vanilla's there."""
    if vanilla is None:
        vanilla = _result_dict(ClusterSimulation(get_baseline("vanilla"), dataclasses.replace(config, spot=0), cost,
                                                 feed).simulate(), False)
    return simulate_managed_job(feed, cost, gpus=config.ondemand, gpus_per_node=config.gpus_per_spot_node,
                                iteration_s=vanilla["time_per_iteration_s"], iterations=config.iterations,
                                max_sim_s=config.max_sim_s)


def _fair_cost_vanilla(baselines: dict, config: SimConfig, cost: CostModel, feed: SpotFeed,
                       timeline: bool) -> dict:
    """For each spot baseline, vanilla on N_fair on-demand GPUs (one simulation per distinct N),
    added to ``baselines`` under ``fair_cost_baseline(name)``."""
    spot_names = [name for name in baselines if name in BASELINES and get_baseline(name).uses_spot]
    if not spot_names:
        raise ValueError(f"simulate(fair_cost=True) needs a spot baseline among the baselines (its dollars set "
                         f"N_fair); spot baselines: {sorted(n for n, b in BASELINES.items() if b.uses_spot)}")
    price = feed.prices.price("ondemand").usd_per_gpu_hour
    runs: dict[int, dict] = {}
    by_baseline = {}
    for name in spot_names:
        system = baselines[name]
        gpus = fair_cost_ondemand(system, price, minimum=config.ondemand)
        if gpus not in runs:
            fair_config = dataclasses.replace(config, ondemand=gpus, spot=0)
            runs[gpus] = _result_dict(ClusterSimulation(get_baseline("vanilla"), fair_config, cost, feed).simulate(),
                                      timeline)
        key = fair_cost_baseline(name)
        baselines[key] = runs[gpus] | {"name": key, "ondemand_gpus": gpus, "spot_gpus": 0}
        by_baseline[name] = {"baseline": key, "ondemand_gpus": gpus,
                             "usd_per_hour": system["cost_per_iteration_usd"] / system["time_per_iteration_s"] * 3600,
                             "train_s": cost.train_s(cost.images_per_iteration(), config.resolution, gpus)}
    reference = by_baseline.get("spotlight", by_baseline[spot_names[0]])
    return {"baseline": reference["baseline"], "definition": FAIR_COST_DEFINITION,
            "ondemand_gpus": reference["ondemand_gpus"], "equal_ondemand_gpus": config.ondemand,
            "ondemand_usd_per_gpu_hour": price, "spotlight_usd_per_hour": reference["usd_per_hour"],
            "train_s": reference["train_s"], "by_baseline": by_baseline}


def _cost_model(cost_model: CostModel | Mapping[str, Any] | None) -> CostModel:
    if cost_model is None:
        return CostModel()
    if isinstance(cost_model, CostModel):
        return cost_model
    return CostModel.from_dict(cost_model)


def _feed(trace: TraceLike, spot: int, gpus_per_node: int, seed: int, start_s: float, skip_ramp: bool,
          zones: Sequence[str] | None) -> SpotFeed:
    nodes = spot // gpus_per_node
    if trace is None:
        return fake_feed([(0.0, "up", f"stable{i}") for i in range(nodes)])
    return spot_feed(trace, spot_nodes=nodes, start_s=start_s, skip_ramp=skip_ramp, zones=zones, seed=seed)


def phase_summary(cost: CostModel, resolution: int, ondemand: int, batch: int = 1, serial: bool = False) -> dict:
    """The cost model's phase times for this shape, rollouts ``batch`` at a time (simulated inputs)."""
    degree = cost.preferred_sp(resolution)
    images = cost.images_per_iteration()
    return {
        "image_tokens": cost.image_tokens(resolution),
        "forward_tflops": cost.forward_flops(resolution) / 1e12,
        "preferred_sp_degree": degree,
        "rollout_batch": batch,
        "rollout_s_per_image_sp1": cost.rollout_s(resolution, 1, batch=batch, serial=serial) / batch,
        "rollout_s_per_image_preferred_sp": cost.rollout_s(resolution, degree, batch=batch, serial=serial) / batch,
        "images_per_iteration": images,
        "train_s": cost.train_s(images, resolution, ondemand),
        "reward_s_per_image": cost.reward_s(),
        "publish_s": cost.publish_s(),
        "train_micro_batches": cost.train_micro_batches(images),
        "train_micro_batch_s": cost.train_micro_batch_s(resolution),
        "gradient_report_s_network": cost.gradient_report_s(True, degree),
        "optimizer_step_s": cost.optimizer_step_s,
        "warm_regroup_s": cost.warm_regroup_s,
        "cold_restart_s": cost.cold_restart_s(),
        "cold_join_s": cost.cold_join_s(),
        "warm_join_s": cost.warm_join_s(peer_on_node=False),
    }


def _result_dict(result: BaselineResult, timeline: bool) -> dict:
    out = dataclasses.asdict(result)
    if not timeline:
        out.pop("timeline")
    out["kind"] = "simulated"
    return out


def time_to_target(iterations_to_target: Mapping[str, float], sim_result: Mapping[str, Any]) -> dict:
    """Measured iterations-to-target x simulated time and cost per iteration, per baseline.

    Baselines missing from either side are left out; the output names which part is measured.
    """
    out: dict[str, Any] = {"kind": "iterations measured; time and cost per iteration simulated",
                           "baselines": {}}
    for name, iters in iterations_to_target.items():
        sim = sim_result["baselines"].get(name)
        if sim is None:
            continue
        if not iters >= 0:
            raise ValueError(f"iterations_to_target[{name!r}] must be >= 0, got {iters!r}")
        out["baselines"][name] = {
            "iterations_to_target": iters,
            "time_to_target_s": iters * sim["time_per_iteration_s"],
            "cost_to_target_usd": iters * sim["cost_per_iteration_usd"],
        }
    return out


def project(market: TraceLike | str, *, ondemand: int = 8, spot: int = 8, params_b: float = 20.0,
            resolution: int = 1280, iterations: int = 20, seed: int = 0,
            baselines: Sequence[str] = DEFAULT_BASELINES, mtbp_s: float | None = None,
            cost_overrides: Mapping[str, Any] | None = None, zones: Sequence[str] | None = None,
            spot_host_gpus: int = 8) -> dict:
    """What-if for users: time and cost per iteration of each baseline for a cluster shape and model size.

    ``market``: a trace (path or ``Trace``), or a provider name ``"aws" | "gcp" | "azure"``.
    A provider name replays a synthetic trace with that provider's notice and ``mtbp_s`` (default:
    the shipped traces' mean time between preemptions for that provider). The model size scales the
    parameter count and, proportionally, the layer count (hidden size kept), so attention FLOPs
    scale too. ``zones`` keeps only those zones of a trace (see ``whatif.resolve_market``).
    """
    if not params_b > 0:
        raise ValueError(f"params_b must be > 0, got {params_b}")
    cost = CostModel.from_dict(cost_overrides).with_overrides(
        {"params_b": params_b, "num_layers": max(1, round(60 * params_b / 20.0))}, source="what-if (project)")
    trace = _market_trace(market, spot, seed, mtbp_s)
    result = simulate(trace, resolution=resolution, ondemand=ondemand, spot=spot, iterations=iterations,
                      baselines=baselines, seed=seed, cost_model=cost, zones=zones, spot_host_gpus=spot_host_gpus)
    result["what_if"] = {"market": str(market), "params_b": params_b, "mtbp_s": mtbp_s}
    return result


def _market_trace(market: TraceLike | str, spot: int, seed: int, mtbp_s: float | None) -> TraceLike:
    if isinstance(market, str) and market.lower() in PROVIDER_MTBP_S:
        from roll_spotlight.spot.synthetic import synthetic_trace

        provider = market.lower()
        return synthetic_trace(nodes=max(spot, 1), provider=provider, seed=seed,
                               mtbp_s=mtbp_s or PROVIDER_MTBP_S[provider], mean_batch=1.0,
                               replace_delay_s=600.0, zone=f"{provider}-synthetic")
    return market


# ------------------------------------------------------------------------------------------ CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotlight simulate", description=(
        "Simulate time and cost per Flow-GRPO iteration (Qwen-Image class) for vanilla, exploration on "
        "the critical path, naive spot, Spotlight and Spotlight with spot training on one cluster and "
        "spot trace. All numbers are simulated."))
    parser.add_argument("--trace", type=Path, default=None,
                        help="spot trace file or folder (omit: spot GPUs are never preempted)")
    parser.add_argument("--resolution", type=int, choices=RESOLUTIONS, required=True)
    parser.add_argument("--ondemand", type=int, default=8, help="on-demand GPUs (default 8)")
    parser.add_argument("--spot", type=int, default=8, help="most spot GPUs held at once (default 8)")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spot-host-gpus", type=int, default=8,
                        help="single-GPU spot instances sharing one host (1 = separate VMs; default 8)")
    parser.add_argument("--zone", action="append", default=None, help="keep only this zone (repeatable)")
    parser.add_argument("--start-s", type=float, default=0.0, help="trace seconds after the ramp to start at")
    parser.add_argument("--baselines", default=",".join(DEFAULT_BASELINES),
                        help=f"comma-separated subset of {sorted(SYSTEMS)}")
    parser.add_argument("--cost", type=Path, default=None,
                        help="JSON file of cost-model overrides (e.g. the rollout batch: max_batch_512)")
    parser.add_argument("--calibration", type=Path, default=None,
                        help="benchmarks/gpu_check.py JSON whose measured step times replace the assumed ones")
    parser.add_argument("--timeline", action="store_true", help="include per-GPU phase intervals (JSON)")
    parser.add_argument("--fair-cost", action="store_true",
                        help="also simulate vanilla on the on-demand GPUs each spot baseline's dollars buy "
                             "(vanilla_fair_cost; needs a spot baseline among --baselines)")
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")
    what_if = parser.add_argument_group("what-if (project a cluster before renting it)")
    what_if.add_argument("--provider", choices=("aws", "gcp", "azure"), default=None,
                         help="market instead of --trace: with --zone, that zone's shipped trace; without, "
                              "a synthetic market with the provider's notice and typical preemption rate")
    what_if.add_argument("--params-b", type=float, default=None,
                         help="model size in billions of parameters (default 20, Qwen-Image)")
    what_if.add_argument("--mtbp-s", type=float, default=None,
                         help="mean seconds between preemptions of the synthetic market (--provider without --zone)")
    what_if.add_argument("--traces-root", type=Path, default=None,
                         help="folder of spot traces for --zone (default $SPOTLIGHT_TRACES, else those "
                              "shipped in the package)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = json.loads(args.cost.read_text()) if args.cost else None
    if args.provider is not None or args.params_b is not None:
        try:
            result = _what_if(args, overrides)
        except ValueError as exc:  # user input: say which, no traceback
            sys.stderr.write(f"spotlight simulate: error: {exc}\n")
            return 2
    else:
        try:
            cost = _cost_model(overrides)
            if args.calibration is not None:
                cost = cost.with_calibration(args.calibration, args.resolution)
        except (ValueError, OSError) as exc:
            sys.stderr.write(f"spotlight simulate: error: --calibration {args.calibration}: {exc}\n")
            return 2
        baselines = [b for b in args.baselines.split(",") if b]
        if args.fair_cost and not any(get_baseline(b).uses_spot for b in baselines if b in BASELINES):
            sys.stderr.write("spotlight simulate: error: --fair-cost needs a spot baseline among --baselines\n")
            return 2
        result = simulate(args.trace, resolution=args.resolution, ondemand=args.ondemand, spot=args.spot,
                          iterations=args.iterations, baselines=baselines,
                          seed=args.seed, cost_model=cost, timeline=args.timeline,
                          start_s=args.start_s, zones=args.zone, spot_host_gpus=args.spot_host_gpus,
                          fair_cost=args.fair_cost)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_table(result))
    return 0


def _what_if(args: argparse.Namespace, overrides: Mapping[str, Any] | None) -> dict:
    """``--provider``/``--params-b``: ``project`` on the market that ``whatif.resolve_market`` picks."""
    from roll_spotlight.sim.whatif import resolve_market

    if args.zone and len(args.zone) > 1 and args.provider:
        raise ValueError("--provider takes one --zone")
    market = resolve_market(args.provider, args.zone[0] if args.zone else None, args.trace, args.traces_root)
    result = project(market.source, ondemand=args.ondemand, spot=args.spot, resolution=args.resolution,
                     params_b=args.params_b or 20.0, iterations=args.iterations, seed=args.seed,
                     baselines=[b for b in args.baselines.split(",") if b], mtbp_s=args.mtbp_s,
                     cost_overrides=overrides, zones=args.zone if args.trace else market.zones,
                     spot_host_gpus=args.spot_host_gpus)
    result["what_if"]["market"] = market.description
    return result


def format_table(result: Mapping[str, Any]) -> str:
    """A plain-text table of the headline numbers, labelled simulated."""
    trace = result["trace"]
    lines = [f"SIMULATED ({result['note']})",
             f"trace={trace['name']} provider={trace['provider']} resolution={result['cluster']['resolution']} "
             f"ondemand={result['cluster']['ondemand_gpus']} spot={result['cluster']['spot_gpus']} "
             f"iterations={result['iterations']} GPU step times: {result.get('calibration', 'published')}",
             *([f"what-if: {result['what_if']['market']}, model {result['what_if']['params_b']:g}B parameters"]
               if "what_if" in result else []),
             f"{'baseline':<18}{'s/iter':>10}{'$/iter':>10}{'spot idle':>11}{'od idle':>9}"
             f"{'preempt':>9}{'regroup':>9}"]
    for name, r in result["baselines"].items():
        spot_idle = "-" if r["spot_idle_fraction"] is None else f"{r['spot_idle_fraction']:.1%}"
        lines.append(f"{name:<18}{r['time_per_iteration_s']:>10.1f}{r['cost_per_iteration_usd']:>10.2f}"
                     f"{spot_idle:>11}{r['ondemand_idle_fraction']:>9.1%}{r['preemptions']:>9d}"
                     f"{r['regroups']:>9d}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
