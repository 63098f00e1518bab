"""Spotlight vs vanilla to a target: measured iterations x simulated time and cost per iteration.

For one resolution, the time-to-target ratio vanilla / Spotlight factors into

    (iterations vanilla / iterations Spotlight)  x  (s per iteration vanilla / s per iteration Spotlight)
     measured on the tiny task                        simulated on the cluster and spot trace

and likewise for cost. A factor measured only as a bound (a run that did not reach the target
within its budget) makes the product a bound: ``Ratio.bound`` is "exact", "lower" (at least),
"upper" (at most) or "unknown". :func:`headline` returns one row per (resolution, metric) with the
issue's target, whether it is met, by how much it is missed, and why (from the simulated phases).
Pure: no I/O, no plotting.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# Issue 8 targets: Spotlight vs vanilla, time to target >= 4x; cost to target >= 2x at 512^2, >= 6x at 1280^2.
TARGETS: dict[int, dict[str, float]] = {512: {"time": 4.0, "cost": 2.0}, 1280: {"time": 4.0, "cost": 6.0}}
METRIC_KEYS = {"time": "time_per_iteration_s", "cost": "cost_per_iteration_usd"}


@dataclass(frozen=True)
class Ratio:
    value: float | None
    bound: str  # exact | lower | upper | unknown

    def __post_init__(self) -> None:
        assert self.bound in ("exact", "lower", "upper", "unknown"), self.bound
        assert (self.value is None) == (self.bound == "unknown"), (self.value, self.bound)

    def text(self) -> str:
        if self.value is None:
            return "not measured"
        prefix = {"exact": "", "lower": ">= ", "upper": "<= "}[self.bound]
        return f"{prefix}{self.value:.2f}x"


@dataclass(frozen=True)
class HeadlineRow:
    resolution: int
    metric: str
    target: float
    per_iteration: float          # simulated vanilla / Spotlight per iteration
    iterations: Ratio             # measured vanilla / Spotlight iterations to target
    total: Ratio                  # the product
    met: bool | None              # None: the bound does not decide it
    shortfall: float | None       # target / total when the total is known to be below the target
    needed_iterations_ratio: float
    why: str


def iterations_ratio(vanilla: Mapping[str, Any] | None, spotlight: Mapping[str, Any] | None) -> Ratio:
    """vanilla / Spotlight iterations from two ``IterationsEstimate`` dicts (bound-aware)."""
    if not vanilla or not spotlight or vanilla["value"] is None or spotlight["value"] is None:
        return Ratio(None, "unknown")
    if not spotlight["value"] > 0:
        return Ratio(None, "unknown")
    value = vanilla["value"] / spotlight["value"]
    bounds = (vanilla["bound"], spotlight["bound"])
    kind = {("exact", "exact"): "exact", ("lower", "exact"): "lower", ("exact", "lower"): "upper"}.get(bounds)
    return Ratio(value, kind) if kind else Ratio(None, "unknown")


def _met(total: Ratio, target: float) -> bool | None:
    if total.value is None:
        return None
    if total.bound == "exact":
        return total.value >= target
    if total.bound == "lower":
        return True if total.value >= target else None
    return False if total.value < target else None


def headline(estimates: Mapping[str, Mapping[str, Any]], sims: Mapping[int, Mapping[str, Any]]) -> list[HeadlineRow]:
    """Rows for every resolution in ``sims`` (a ``sim.run.simulate`` result per resolution)."""
    ratio = iterations_ratio(estimates.get("vanilla"), estimates.get("spotlight"))
    rows = []
    for resolution, sim in sorted(sims.items()):
        for metric, target in TARGETS.get(resolution, TARGETS[1280]).items():
            rows.append(_row(resolution, metric, target, ratio, sim))
    return rows


def _row(resolution: int, metric: str, target: float, iters: Ratio, sim: Mapping[str, Any]) -> HeadlineRow:
    key = METRIC_KEYS[metric]
    per_iter = sim["baselines"]["vanilla"][key] / sim["baselines"]["spotlight"][key]
    total = Ratio(None, "unknown") if iters.value is None else Ratio(iters.value * per_iter, iters.bound)
    met = _met(total, target)
    shortfall = target / total.value if total.value and met is False else None
    return HeadlineRow(resolution, metric, target, per_iter, iters, total, met, shortfall,
                       target / per_iter, explain(metric, target, per_iter, iters, sim))


def ceilings(sim: Mapping[str, Any]) -> dict[str, float]:
    """Upper limits of the per-iteration gains, from the simulated phases (no convergence effect).

    time: rollouts can shrink with more GPUs, training (on-demand only) and the weight publication
    cannot, so an iteration is at best train + publish long. cost: Spotlight still rents the
    on-demand GPUs for at least that long each iteration.
    """
    phases, vanilla = sim["phases"], sim["baselines"]["vanilla"]
    floor_s = phases["train_s"] + phases["publish_s"]
    od_cost_floor = sim["cluster"]["ondemand_gpus"] * sim["prices_usd_per_gpu_hour"]["ondemand"] * floor_s / 3600
    return {"floor_s": floor_s, "time": vanilla["time_per_iteration_s"] / floor_s,
            "cost": vanilla["cost_per_iteration_usd"] / od_cost_floor,
            "train_share": phases["train_s"] / vanilla["time_per_iteration_s"]}


def explain(metric: str, target: float, per_iter: float, iters: Ratio, sim: Mapping[str, Any]) -> str:
    """Why the row lands where it does, in numbers from this run."""
    c = ceilings(sim)
    parts = [f"simulated per-iteration gain {per_iter:.2f}x (ceiling {c[metric]:.2f}x: training, "
             f"{c['train_share']:.0%} of a vanilla iteration, runs on the on-demand GPUs only"
             + (", which Spotlight still pays for" if metric == "cost" else "") + ")"]
    needed = target / per_iter
    if iters.value is None:
        parts.append(f"iterations-to-target not measured (would need vanilla/Spotlight >= {needed:.2f}x)")
    else:
        parts.append(f"measured iterations ratio {iters.text()} (needed {needed:.2f}x)")
    if c[metric] < target:
        parts.append(f"the per-iteration ceiling alone is below the {target:g}x target, so the rest must "
                     f"come from fewer iterations")
    return "; ".join(parts)


def time_and_cost_to_target(estimates: Mapping[str, Mapping[str, Any]], sim: Mapping[str, Any]) -> dict:
    """Per simulated baseline: iterations (measured, via ``SETTING_OF_BASELINE``) x per-iteration (simulated)."""
    from roll_spotlight.tools.bench.convergence import SETTING_OF_BASELINE

    out = {}
    for name, result in sim["baselines"].items():
        est = estimates.get(SETTING_OF_BASELINE.get(name, ""))
        value = None if not est else est["value"]
        out[name] = {"setting": SETTING_OF_BASELINE.get(name), "iterations": value,
                     "bound": "unknown" if value is None else est["bound"],
                     "time_per_iteration_s": result["time_per_iteration_s"],
                     "cost_per_iteration_usd": result["cost_per_iteration_usd"],
                     "time_to_target_s": None if value is None else value * result["time_per_iteration_s"],
                     "cost_to_target_usd": None if value is None else value * result["cost_per_iteration_usd"]}
    return out
