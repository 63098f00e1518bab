"""Spotlight vs vanilla to a target: measured iterations x simulated time and cost per iteration.

For one resolution, the time-to-target ratio vanilla / Spotlight factors into

    (iterations vanilla / iterations Spotlight)  x  (s per iteration vanilla / s per iteration Spotlight)
     measured on the tiny task                        simulated on the cluster and spot trace

and likewise for cost. A factor measured only as a bound (a run that did not reach the target
within its budget) makes the product a bound: ``Ratio.bound`` is "exact", "lower" (at least),
"upper" (at most) or "unknown". vanilla / Spotlight with an exact vanilla median and a lower-bound
Spotlight median (Spotlight needs at least that many) is an upper bound; lower / exact is a lower
bound; lower / lower is unknown. A total that is at most X with X below the target is a miss, by at
least target / X; a lower bound below the target, or an upper bound above it, decides nothing.
:func:`headline` returns one row per (resolution, metric) with the project's target, whether it is
met, by how much it is missed, and why (from the simulated phases).

Three spot systems stand in the rows (``SYSTEMS``): naive spot (rollouts only), Spotlight today
(explores during training) and Spotlight with spot training (trains during training). Naive spot
and spot training compute vanilla's update, so their iterations ratio is 1.00 by construction;
Spotlight's is measured. Two vanillas stand against each: ``vanilla`` on the same on-demand GPUs
(equal on-demand), and the fair-cost vanilla on the on-demand GPUs that system's dollars buy
(``sim.shape_budget``: equal cost). Both take vanilla's measured iterations. When neither side's
iterations are known exactly (both medians censored), the ratio of the censored medians is shown
beside the row as what it is (not a bound), never as the result. ``SPOT_TRAINING_GOALS`` are the
spot-training targets, checked by :func:`goal_rows`. Pure: no I/O, no plotting.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from roll_spotlight.sim.baselines import Training, get_baseline
from roll_spotlight.sim.shape_budget import fair_cost_baseline

# Headline targets: Spotlight vs vanilla, time to target >= 4x; cost to target >= 2x at 512^2, >= 6x at 1280^2.
TARGETS: dict[int, dict[str, float]] = {512: {"time": 4.0, "cost": 2.0}, 1280: {"time": 4.0, "cost": 6.0}}
METRIC_KEYS = {"time": "time_per_iteration_s", "cost": "cost_per_iteration_usd"}
FAIR_COST_BASELINE = "vanilla_fair_cost"
VANILLAS = ("vanilla", FAIR_COST_BASELINE)
BASELINE_LABELS = {"vanilla": "vanilla, equal on-demand GPUs", FAIR_COST_BASELINE: "vanilla, equal cost"}
SYSTEMS = ("naive_spot", "spotlight", "spotlight_train")
SYSTEM_LABELS = {"naive_spot": "naive spot (rollouts only)", "spotlight": "Spotlight today (explore during training)",
                 "spotlight_train": "Spotlight with spot training"}


def setting_of(baseline: str) -> str | None:
    """The measured setting whose iterations ``baseline`` takes (convergence.SETTING_OF_BASELINE; every
    fair-cost vanilla runs vanilla's algorithm on more GPUs: vanilla's)."""
    from benchmarks.convergence import SETTING_OF_BASELINE

    if baseline.startswith(FAIR_COST_BASELINE):
        return "vanilla"
    return SETTING_OF_BASELINE.get(baseline)


def vanilla_key(baseline: str, system: str) -> str:
    """The simulation's name of ``baseline`` ("vanilla" or the fair-cost kind) for ``system``."""
    return fair_cost_baseline(system) if baseline == FAIR_COST_BASELINE else baseline


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
    shortfall: float | None       # target / total when the total is known to be below the target (a
                                  # lower bound on the miss when the total is an upper bound)
    needed_iterations_ratio: float
    why: str
    shape: str = ""               # cluster shape label, e.g. "8 on-demand + 8 spot"
    baseline: str = "vanilla"     # which vanilla: "vanilla" (equal on-demand) or "vanilla_fair_cost"
    at_medians: float | None = None  # per_iteration x the censored medians' ratio (not a bound), when undecided
    system: str = "spotlight"     # the spot system of the row (SYSTEMS)


def censored_medians(vanilla: Mapping[str, Any] | None, spotlight: Mapping[str, Any] | None) -> float | None:
    """vanilla / Spotlight median iterations when the bound-aware ratio is undetermined but both
    medians exist (e.g. both censored at the horizon): a point of reference, not a bound."""
    if not vanilla or not spotlight or vanilla.get("value") is None or not (spotlight.get("value") or 0) > 0:
        return None
    if iterations_ratio(vanilla, spotlight).value is not None:
        return None
    return vanilla["value"] / spotlight["value"]


def iterations_note(estimates: Mapping[str, Mapping[str, Any]]) -> str:
    """What the measured iterations ratio is, in words: exact, a bound, undetermined, or 1.0."""
    v, s = estimates.get("vanilla"), estimates.get("spotlight")
    ratio = iterations_ratio(v, s)
    if not v or not s or v.get("value") is None or s.get("value") is None:
        return "not measured: a setting has no iterations-to-target estimate"

    def side(name: str, e: Mapping[str, Any]) -> str:
        sign = ">= " if e["bound"] == "lower" else ""
        return f"{name} {sign}{e['value']:g} iterations ({e.get('reached', '?')} of {e.get('runs', '?')} runs reached)"
    sides = f"{side('vanilla', v)}, {side('Spotlight', s)}"
    if ratio.value is None:
        medians = censored_medians(v, s)
        return (f"undetermined: {sides}; both are lower bounds (runs that never reached the target by their "
                f"horizon are censored), so vanilla / Spotlight is neither known nor bounded"
                + (f"; the censored medians' ratio is {medians:.2f}, shown only as a reference" if medians else ""))
    if ratio.bound == "exact" and abs(ratio.value - 1.0) < 1e-9:
        return f"exactly 1.00 ({sides}): exploration saved no iterations"
    kind = {"exact": "exact", "lower": "a lower bound", "upper": "an upper bound"}[ratio.bound]
    return f"{ratio.text()}, {kind} ({sides})"


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


def system_iterations(estimates: Mapping[str, Mapping[str, Any]], system: str) -> Ratio:
    """vanilla / ``system`` iterations to target: 1.00 exactly for a system that computes vanilla's
    update (naive spot, spot training: same samples, same gradient), else measured (bound-aware)."""
    setting = setting_of(system)
    if setting == "vanilla":
        return Ratio(1.0, "exact")
    return iterations_ratio(estimates.get("vanilla"), estimates.get(setting or ""))


def exploration_ratio(summary: Mapping[str, Any], setting: str) -> Ratio:
    """vanilla / ``setting`` iterations to target from ``benchmarks.explore_convergence``'s summary:
    the geometric mean of the per-seed ratios; a lower bound where only vanilla's runs were censored
    at the horizon, an upper bound where only the setting's were, unknown where both were."""
    entry, vanilla = summary["settings"].get(setting) or {}, summary["settings"].get("vanilla") or {}
    if entry.get("iterations_ratio_geomean") is None:
        return Ratio(None, "unknown")
    runs = [(vanilla["runs"][str(s)], entry["runs"][str(s)]) for s in entry["seeds"]]
    censored = (any(not v["reached"] for v, _ in runs), any(not m["reached"] for _, m in runs))
    bound = {(False, False): "exact", (True, False): "lower", (False, True): "upper"}.get(censored)
    return Ratio(entry["iterations_ratio_geomean"], bound) if bound else Ratio(None, "unknown")


def headline(estimates: Mapping[str, Mapping[str, Any]], sims: Mapping[int, Mapping[str, Any]],
             shape: str = "", baselines: tuple[str, ...] = VANILLAS,
             systems: tuple[str, ...] = ("spotlight",), iterations: Mapping[str, Ratio] | None = None
             ) -> list[HeadlineRow]:
    """Rows for every system of ``systems``, resolution in ``sims`` (a ``sim.api.simulate`` result
    per resolution), metric and vanilla of ``baselines`` that the simulation has (the fair-cost one
    only when simulated). ``iterations`` replaces a system's iterations ratio (one measured elsewhere,
    e.g. :func:`exploration_ratio` in a named regime)."""
    rows = []
    for system in systems:
        ratio = (iterations or {}).get(system) or system_iterations(estimates, system)
        setting = setting_of(system)
        medians = (None if setting == "vanilla" or system in (iterations or {})
                   else censored_medians(estimates.get("vanilla"), estimates.get(setting)))
        for resolution, sim in sorted(sims.items()):
            if system not in sim["baselines"]:
                continue
            for metric, target in TARGETS.get(resolution, TARGETS[1280]).items():
                for baseline in baselines:
                    if vanilla_key(baseline, system) in sim["baselines"]:
                        rows.append(_row(resolution, metric, target, ratio, sim, shape, baseline, medians, system))
    return rows


def _row(resolution: int, metric: str, target: float, iters: Ratio, sim: Mapping[str, Any], shape: str = "",
         baseline: str = "vanilla", medians: float | None = None, system: str = "spotlight") -> HeadlineRow:
    key = METRIC_KEYS[metric]
    per_iter = sim["baselines"][vanilla_key(baseline, system)][key] / sim["baselines"][system][key]
    total = Ratio(None, "unknown") if iters.value is None else Ratio(iters.value * per_iter, iters.bound)
    met = _met(total, target)
    shortfall = target / total.value if total.value and met is False else None
    why = explain(metric, target, per_iter, iters, sim, baseline, medians, system)
    return HeadlineRow(resolution, metric, target, per_iter, iters, total, met, shortfall, target / per_iter, why,
                       shape, baseline, None if medians is None else medians * per_iter, system)


def ceilings(sim: Mapping[str, Any], baseline: str = "vanilla") -> dict[str, float]:
    """Upper limits of the per-iteration gains over ``baseline``, from the simulated phases (no
    convergence effect).

    time: rollouts can shrink with more GPUs, training (on Spotlight's on-demand GPUs only) and the
    weight publication cannot, so a Spotlight iteration is at best train + publish long. cost:
    Spotlight still rents its on-demand GPUs for at least that long each iteration.
    """
    phases, base = sim["phases"], sim["baselines"][baseline]
    floor_s = phases["train_s"] + phases["publish_s"]
    od_cost_floor = sim["cluster"]["ondemand_gpus"] * sim["prices_usd_per_gpu_hour"]["ondemand"] * floor_s / 3600
    return {"floor_s": floor_s, "time": base["time_per_iteration_s"] / floor_s,
            "cost": base["cost_per_iteration_usd"] / od_cost_floor,
            "train_share": phases["train_s"] / sim["baselines"]["vanilla"]["time_per_iteration_s"]}


def explain(metric: str, target: float, per_iter: float, iters: Ratio, sim: Mapping[str, Any],
            baseline: str = "vanilla", medians: float | None = None, system: str = "spotlight") -> str:
    """Why the row lands where it does, in numbers from this run."""
    queue_training = get_baseline(system).training is Training.QUEUE
    parts = [_train_text(metric, per_iter, sim, system) if queue_training
             else _ceiling_text(metric, per_iter, sim, baseline, system)]
    if baseline != "vanilla":
        fair = sim["baselines"][vanilla_key(baseline, system)]
        parts.append(f"this vanilla has {fair.get('ondemand_gpus', '?')} on-demand GPUs ({system}'s dollars) "
                     f"against {sim['cluster']['ondemand_gpus']} + {sim['cluster']['spot_gpus']} spot")
    needed = target / per_iter
    if setting_of(system) == "vanilla":
        parts.append(f"iterations ratio 1.00 by construction: {system} computes vanilla's update, so it takes "
                     f"vanilla's measured iterations (needed {needed:.2f}x)")
    elif iters.value is None and medians is not None:
        parts.append(f"measured iterations ratio undetermined: both medians are lower bounds, their ratio "
                     f"{medians:.2f} is no bound (would need vanilla/Spotlight >= {needed:.2f}x)")
    elif iters.value is None:
        parts.append(f"iterations-to-target not measured (would need vanilla/Spotlight >= {needed:.2f}x)")
    else:
        parts.append(f"measured iterations ratio {iters.text()} (needed {needed:.2f}x)")
    if not queue_training and ceilings(sim, vanilla_key(baseline, system))[metric] < target:
        parts.append(f"the per-iteration ceiling alone is below the {target:g}x target, so the rest must "
                     f"come from fewer iterations")
    return "; ".join(parts)


def _ceiling_text(metric: str, per_iter: float, sim: Mapping[str, Any], baseline: str, system: str) -> str:
    c = ceilings(sim, vanilla_key(baseline, system))
    return (f"simulated per-iteration gain {per_iter:.2f}x (ceiling {c[metric]:.2f}x: training, "
            f"{c['train_share']:.0%} of an equal-on-demand vanilla iteration, runs on the on-demand GPUs only"
            + (", which the system still pays for" if metric == "cost" else "") + ")")


def _train_text(metric: str, per_iter: float, sim: Mapping[str, Any], system: str) -> str:
    """Spot training: where the simulated iteration's seconds went, against vanilla's."""
    mine, vanilla = sim["baselines"][system], sim["baselines"]["vanilla"]
    train = mine.get("train") or {}
    rollout_s = mine["time_per_iteration_s"] - mine["mean_train_phase_s"]
    return (f"simulated per-iteration gain {per_iter:.2f}x: training {mine['mean_train_phase_s']:.0f} s (vanilla "
            f"{vanilla['mean_train_phase_s']:.0f} s), {train.get('spot_share', 0.0):.0%} of the micro-batches "
            f"trained on spot GPUs; rollouts, rewards and weight sync {rollout_s:.0f} s (vanilla "
            f"{vanilla['time_per_iteration_s'] - vanilla['mean_train_phase_s']:.0f} s)"
            + ("; the on-demand GPUs are paid for the whole iteration" if metric == "cost" else ""))


def time_and_cost_to_target(estimates: Mapping[str, Mapping[str, Any]], sim: Mapping[str, Any]) -> dict:
    """Per simulated baseline: iterations (measured, via ``SETTING_OF_BASELINE``) x per-iteration (simulated)."""
    out = {}
    for name, result in sim["baselines"].items():
        est = estimates.get(setting_of(name) or "")
        value = None if not est else est["value"]
        out[name] = {"setting": setting_of(name), "iterations": value,
                     "bound": "unknown" if value is None else est["bound"],
                     "time_per_iteration_s": result["time_per_iteration_s"],
                     "cost_per_iteration_usd": result["cost_per_iteration_usd"],
                     "time_to_target_s": None if value is None else value * result["time_per_iteration_s"],
                     "cost_to_target_usd": None if value is None else value * result["cost_per_iteration_usd"]}
    return out


# ------------------------------------------------------------------------------ the spot-training targets
@dataclass(frozen=True)
class Goal:
    """One spot-training target for ``system`` on cluster shape ``shape`` (the suite's shape name):
    ``scope`` "per_iteration" (simulated alone) or "to_target" (x the iterations ratio)."""

    system: str
    shape: str
    resolution: int
    metric: str
    scope: str
    baseline: str
    target: float


# Spot training: per-iteration time vs the equal-on-demand vanilla, 8 + 8 at 512, >= 1.8x;
# cost to target >= 2x at the paper's 4 + 8 and the spot-heavy shape, 512 and 1280 (both vanillas reported).
SPOT_TRAINING_GOALS: tuple[Goal, ...] = (
    Goal("spotlight_train", "today", 512, "time", "per_iteration", "vanilla", 1.8),
    *(Goal("spotlight_train", shape, res, "cost", "to_target", baseline, 2.0)
      for shape in ("paper", "spot-heavy") for res in (512, 1280) for baseline in VANILLAS),
)


@dataclass(frozen=True)
class GoalRow:
    goal: Goal
    value: Ratio          # vanilla / system: per iteration (SIMULATED) or to target (x MEASURED iterations)
    met: bool | None
    found: bool           # False: the shape, resolution or baseline was not simulated


def goal_rows(estimates: Mapping[str, Mapping[str, Any]], shapes: Mapping[str, Mapping[int, Mapping[str, Any]]],
              goals: tuple[Goal, ...] = SPOT_TRAINING_GOALS) -> list[GoalRow]:
    """Each goal against the simulations by shape name (then resolution)."""
    rows = []
    for goal in goals:
        sim = shapes.get(goal.shape, {}).get(goal.resolution)
        key = vanilla_key(goal.baseline, goal.system)
        if sim is None or goal.system not in sim["baselines"] or key not in sim["baselines"]:
            rows.append(GoalRow(goal, Ratio(None, "unknown"), None, False))
            continue
        metric = METRIC_KEYS[goal.metric]
        per_iter = sim["baselines"][key][metric] / sim["baselines"][goal.system][metric]
        iters = Ratio(1.0, "exact") if goal.scope == "per_iteration" else system_iterations(estimates, goal.system)
        value = Ratio(None, "unknown") if iters.value is None else Ratio(iters.value * per_iter, iters.bound)
        rows.append(GoalRow(goal, value, _met(value, goal.target), True))
    return rows


# ------------------------------------------------------------------------------ the verdict
VERDICT_SYSTEM = "spotlight_train"


@dataclass(frozen=True)
class VerdictRow:
    """Spotlight (with spot training) against vanilla on demand, to target, on one cluster shape:
    ``simulated`` and ``emulated`` map a metric to the per-iteration ratio vanilla / Spotlight
    (``emulated`` None where the shape was not emulated), ``iterations`` is vanilla / Spotlight
    iterations to target (MEASURED, or 1.00 by construction), so a to-target figure is their product."""

    shape: str
    resolution: int
    ondemand_gpus: int
    spot_gpus: int
    iterations: Ratio
    simulated: dict[str, float]
    emulated: dict[str, float] | None

    def to_target(self, metric: str, kind: str) -> Ratio:
        per_iteration = (self.simulated if kind == "simulated" else self.emulated or {}).get(metric)
        if per_iteration is None or self.iterations.value is None:
            return Ratio(None, "unknown")
        return Ratio(self.iterations.value * per_iteration, self.iterations.bound)

    def met(self, metric: str, kind: str) -> bool | None:
        return _met(self.to_target(metric, kind), TARGETS.get(self.resolution, TARGETS[1280])[metric])


def verdict_rows(estimates: Mapping[str, Mapping[str, Any]], shapes: Mapping[str, Mapping[int, Mapping[str, Any]]],
                 emulated: list[Mapping[str, Any]] | None = None) -> list[VerdictRow]:
    """One row per simulated cluster shape and resolution where Spotlight with spot training ran;
    ``emulated`` is the emulate benchmark's rows (matched by GPUs and resolution)."""
    iterations = system_iterations(estimates, VERDICT_SYSTEM)
    rows = []
    for name, sims in shapes.items():
        for resolution, sim in sorted(sims.items()):
            runs = sim["baselines"]
            if VERDICT_SYSTEM not in runs:
                continue
            cluster = sim["cluster"]
            simulated = {m: runs["vanilla"][k] / runs[VERDICT_SYSTEM][k] for m, k in METRIC_KEYS.items()}
            rows.append(VerdictRow(name, resolution, cluster["ondemand_gpus"], cluster["spot_gpus"], iterations,
                                   simulated, _emulated_ratios(emulated or [], cluster, resolution)))
    return rows


def _emulated_ratios(rows: list[Mapping[str, Any]], cluster: Mapping[str, Any], resolution: int) -> dict | None:
    """vanilla / spot training per iteration in the emulate rows of this shape (the compressed
    time-scale's rows, each system's first)."""
    runs = {}
    for r in rows:
        shape = r["row"]
        if (shape["ondemand"], shape["spot"], shape["resolution"]) == (
                cluster["ondemand_gpus"], cluster["spot_gpus"], resolution):
            runs.setdefault(r["system"], r["emulated"])
    if "vanilla" not in runs or VERDICT_SYSTEM not in runs:
        return None
    return {m: runs["vanilla"][k] / runs[VERDICT_SYSTEM][k] for m, k in METRIC_KEYS.items()}
