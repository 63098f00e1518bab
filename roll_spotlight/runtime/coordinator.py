"""The iteration loop shared by every host (standalone CLI, Ray runtime, ROLL pipeline).

    for each iteration t:
        draw prompts and seeds of t          (pure functions of (run seed, t))
        enqueue one rollout request per (prompt, seed) under weight version t-1
        collect outputs in request-id order   (workers pull; nothing is pushed)
        reward -> group advantages -> train -> publish weight version t
        every eval_steps: validation on the fixed (prompt, seed) pairs; every save_steps: checkpoint

The backend decides where each phase runs (in process, or on Ray actors); the loop does not.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from roll_spotlight.config.strict import to_dict
from roll_spotlight.dispatch.requests import RequestKind, RequestSpec, Schedule
from roll_spotlight.exploration import AdaptiveBudget, AdaptiveConfig, RankMonitor
from roll_spotlight.exploration.adaptive import TargetSwitch
from roll_spotlight.exploration.screen import PromptHistory, ScreenedDraw, screen_draw
from roll_spotlight.exploration.spot_share import SpotPlacement
from roll_spotlight.runtime.exploration_round import ExplorationRound, ResumedRound, round_state
from roll_spotlight.runtime.update_report import UpdateReport
from roll_spotlight.config.run import RunConfig
from roll_spotlight.training.evaluate import Evaluation, paired_gain, save_samples
from roll_spotlight.training.metrics import MetricsWriter
from roll_spotlight.training.sampling import choose_window
from roll_spotlight.training.prompt_pools import draw_prompt_ids, draw_seeds

log = logging.getLogger(__name__)


class Backend(Protocol):
    """Where the phases of an iteration run."""

    weight_version: int

    def rollouts(self, specs: list[RequestSpec]) -> list: ...  # RolloutOutput, request-id order
    def score(self, images: np.ndarray, prompts: list[str]): ...  # RewardOutput
    def rollouts_scored(self, specs: list[RequestSpec]) -> tuple: ...  # (outputs, RewardOutput); may overlap
    def explore(self, specs: list[RequestSpec]) -> list: ...  # like rollouts, under the specs' version
    # one update; publishes weight_version + 1 when done. `baselines`: (N, 2) per-sample advantage
    # (mean, std), the explored pool's (`exploration.baseline: pool`), or None (each group's own)
    def start_train(self, outputs: list, prompts: list[str], group_ids: np.ndarray, rewards: np.ndarray,
                    baselines: np.ndarray | None = None): ...
    # queue training (spot.training_phase): let `share` of the spot workers pull exploration before
    # training micro-batches during the next update; returns how many that is (0 without spot)
    def place_spot(self, share: float) -> int: ...
    def training(self, handle) -> bool: ...  # is the update still running (exploration may go on)?
    def finish_train(self, handle) -> UpdateReport: ...  # metrics to log; who trained what
    def evaluate(self) -> Evaluation: ...
    def save_checkpoint(self, path: Path) -> None: ...
    def load_checkpoint(self, path: Path) -> None: ...
    def timeline(self) -> list[dict]: ...
    def close(self) -> None: ...


def rollouts_then_scores(backend: Backend, specs: list[RequestSpec]) -> tuple:
    """`Backend.rollouts_scored` for a backend that cannot overlap rewards with rollouts."""
    outputs = backend.rollouts(specs)
    return outputs, backend.score(np.stack([o.image for o in outputs]), [s.prompt for s in specs])


@dataclass
class RunResult:
    run_dir: Path
    base: Evaluation
    final: Evaluation
    curve: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        return {"base": self.base.summary(), "final": self.final.summary(),
                "paired": paired_gain(self.base, self.final), "run_dir": str(self.run_dir)}


def iteration_specs(cfg: RunConfig, pool, iteration: int, weight_version: int,
                    prompt_ids: list[int] | None = None) -> list[RequestSpec]:
    """The rollout requests of one iteration: group_size seeds for each drawn prompt (`prompt_ids`:
    the prompt screen's choice instead of the run's draw)."""
    g = cfg.train.group_size
    ids = prompt_ids if prompt_ids is not None else draw_prompt_ids(len(pool), cfg.rollout_batch_size,
                                                                    seed=cfg.seed, iteration=iteration)
    seeds = draw_seeds(len(ids) * g, seed=cfg.seed, iteration=iteration)
    window = choose_window(cfg.sampling, seed=cfg.seed, iteration=iteration)
    lo, hi = window if window is not None else (0, cfg.sampling.num_steps)
    schedule = Schedule(cfg.sampling.num_steps, cfg.sampling.noise_level, cfg.sampling.kind, lo, hi)
    return [RequestSpec(prompt_id=int(pid), prompt=pool.texts[pid], seed=int(seeds[i * g + j]),
                        schedule=schedule, weight_version=weight_version, kind=RequestKind.ROLLOUT,
                        iteration=iteration)
            for i, pid in enumerate(ids) for j in range(g)]


class Coordinator:
    """Runs iterations on a backend and writes metrics, checkpoints and a summary to `run_dir`."""

    def __init__(self, cfg: RunConfig, backend: Backend, run_dir: Path, *, progress: bool = True):
        from roll_spotlight.training.prompt_pools import train_pool, validation_set

        self.cfg, self.backend, self.run_dir, self.progress = cfg, backend, Path(run_dir), progress
        self.pool = train_pool(cfg.task)
        self.validation = validation_set(cfg.task)  # the pairs the backend validates on (for the samples' prompts)
        self.writer = MetricsWriter(self.run_dir, cfg.track_with)
        self.curve: list[dict] = []
        self.start_iteration = 1
        self.base: Evaluation | None = None
        self.last: Evaluation | None = None
        self.pending: ExplorationRound | None = None
        self.fallback_active = False
        self.rank_monitor = RankMonitor(threshold=cfg.exploration.rank_threshold,
                                        fallback=cfg.exploration.fallback, min_pairs=4)
        explore = cfg.exploration
        self.adaptive = (AdaptiveBudget(AdaptiveConfig.from_exploration(explore, cfg.train.group_size))
                         if explore.adaptive and explore.mode != "off" else None)
        self.switch = (TargetSwitch(explore.target, explore.adaptive_screen_above, explore.adaptive_min_screen_value,
                                    explore.adaptive_window, explore.adaptive_probe_every)
                       if self.adaptive is not None else None)
        if explore.baseline == "pool" and explore.mode != "off":
            _require_baselines(backend)
        # spot.training_phase: auto weighs exploring against training on the spot workers
        self.placement = (SpotPlacement(explore.adaptive_probe_every or 5)
                          if cfg.spot_trains() and cfg.spot.training_phase == "auto" and explore.mode == "stale"
                          else None)
        self.explorers: dict[int, int] = {}  # iteration -> spot workers that explored first while it trained
        self.iteration_s: dict[int, float] = {}
        self.history = PromptHistory(explore.prompt_decay) if explore.mode != "off" else None
        self.draw: ScreenedDraw | None = None  # the prompt screen's choice for the current iteration

    def train(self) -> RunResult:
        from tqdm import tqdm

        if self.base is None:
            self.base = self.last = self.backend.evaluate()
            save_samples(self.run_dir / "samples" / "base.npz", self.base, self.validation)
            self.curve = [{"iteration": 0} | self.base.summary()]
            self.writer.write(0, self.curve[-1])
        bar = tqdm(range(self.start_iteration, self.cfg.max_steps + 1), desc=self.cfg.exp_name,
                   disable=not self.progress, unit="it", initial=self.start_iteration - 1, total=self.cfg.max_steps)
        for it in bar:
            stats = self.iteration(it)
            if self._due(it, self.cfg.eval_steps) or it == self.cfg.max_steps:
                self.last = self.backend.evaluate()
                stats |= self.last.summary()
                self.curve.append({"iteration": it} | self.last.summary())
            self.writer.write(it, stats)
            if self._due(it, self.cfg.save_steps):
                self.checkpoint(it)
            bar.set_postfix(phase="done", reward=f"{stats['reward_mean']:.3f}", val=f"{self.last.mean:.3f}")
        return self._finish(self.last)

    def iteration(self, it: int) -> dict:
        # every key ending in _s is a time (durations; started_s is the epoch second the iteration
        # began): the only keys that may differ between two runs of the same seed
        t0, started_at = time.monotonic(), time.time()
        stats: dict = {"explore_s": 0.0}
        if self._screening() and self._mode() == "fresh":  # screen on the critical path
            stats["explored_seeds"] = self._screen_explore(it, lambda: True)
            stats["explore_s"] = time.monotonic() - t0
        specs = self._draw(it)
        if self.draw is not None:
            stats |= self.draw.metrics()
        if self._mode() == "fresh" and not self._screening():
            specs, outputs, stats["explored_seeds"], rnd = self._explore_fresh(specs, it)
            t_roll = time.monotonic()
            scored = self.backend.score(np.stack([o.image for o in outputs]), [s.prompt for s in specs])
        else:  # rewards may be computed while rollouts run: rollout_s then includes them
            specs = self._apply_selection(specs)
            outputs, scored = self.backend.rollouts_scored(specs)
            t_roll = time.monotonic()
            rnd = self.pending if self._mode() == "stale" else None
        prompts = [s.prompt for s in specs]
        rewards = np.asarray(scored.rewards, dtype=np.float64)
        stats["groups_all_equal"] = self._remember(specs, rewards)
        stats |= self._rank_check(specs, rewards)
        stats |= self._adapt(rnd, stats.get("rank_spearman", math.nan))
        stats |= self._switch_target(rnd, stats["groups_all_equal"], not np.isin(rewards, (0.0, 1.0)).all())
        baselines = self._baselines(rnd, specs)
        t_reward = time.monotonic()
        g = self.cfg.train.group_size
        extra = {} if baselines is None else {"baselines": baselines}  # exploration.baseline: pool
        stats |= self._place_spot(it)
        handle = self.backend.start_train(outputs, prompts, np.repeat(np.arange(len(specs) // g), g), rewards,
                                          **extra)
        if self._mode() == "stale":
            t_explore = time.monotonic()
            stats["explored_seeds"] = self._explore_next(it, handle)
            stats["explore_s"] = time.monotonic() - t_explore
        report = self.backend.finish_train(handle)
        stats |= report.metrics
        t_train = time.monotonic()
        self.iteration_s[it] = t_train - t0
        if self.placement is not None and report.split is not None:
            self.placement.observe_training(it, report.split.spot_saved_s, report.split.spot_workers)
        return stats | {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
                        "rollout_s": t_roll - t0, "reward_s": t_reward - t_roll, "train_s": t_train - t_reward,
                        "iteration_s": t_train - t0, "weight_version": self.backend.weight_version,
                        "started_s": started_at}

    # --- exploration (docs/design.md section 3) ---------------------------------------------------
    def _mode(self) -> str:
        """The exploration mode in force: the configured one, or the fallback after a rank drop."""
        mode = self.cfg.exploration.mode
        if self.fallback_active and mode == "stale":
            return "fresh" if self.cfg.exploration.fallback == "fresh" else "off"
        return mode

    def _round(self, specs: list[RequestSpec], it: int, version: int, budget: int | None = None) -> ExplorationRound:
        g = self.cfg.train.group_size
        prompts = [(s.prompt_id, s.prompt) for s in specs[::g]]
        return ExplorationRound(self.cfg.exploration, g, prompts, specs[0].schedule, version, it, self.cfg.seed,
                                seeds_per_prompt=budget)

    def _budget(self, it: int) -> int | None:
        """Explored seeds per prompt for the prompts of `it`: the adaptive controller's (0: none), else
        None (the configured budget)."""
        if self.switch is not None and self.switch.target == "off":
            return 0
        return None if self.adaptive is None else self.adaptive.seeds_per_prompt(it)

    def _explore_next(self, it: int, handle) -> int:
        """While iteration `it` trains: explore the prompts of it+1 with the weights of `it`."""
        if self._screening():
            self.pending = None
            return 0 if it >= self.cfg.max_steps else self._screen_explore(it + 1, lambda: self.backend.training(handle))
        budget = self._budget(it + 1)
        if it >= self.cfg.max_steps or budget == 0:  # budget 0: spot workers serve rollouts only
            self.pending = None
            return 0
        nxt = iteration_specs(self.cfg, self.pool, it + 1, self.backend.weight_version)
        self.pending = self._round(nxt, it + 1, self.backend.weight_version, budget)
        return self.pending.explore(self.backend, keep_going=lambda: self.backend.training(handle))

    def _explore_fresh(self, specs: list[RequestSpec], it: int):
        """Exploration on the critical path: explore with the current weights, train on the selection.
        Explored outputs are trained on only when explored with the rollouts' own schedule."""
        budget = self._budget(it)
        if budget == 0:
            return specs, self.backend.rollouts(specs), 0, None
        rnd = self._round(specs, it, self.backend.weight_version, budget)
        explored = rnd.explore(self.backend)
        chosen = self._with_seeds(specs, rnd.selection())
        reusable = {} if rnd.schedule != specs[0].schedule else rnd.explored
        missing = [s for s, slot in zip(chosen, self._slots(chosen)) if (slot, s.seed) not in reusable]
        extra = dict(zip((s.seed for s in missing), self.backend.rollouts(missing))) if missing else {}
        outputs = [reusable[(slot, s.seed)].output if (slot, s.seed) in reusable else extra[s.seed]
                   for s, slot in zip(chosen, self._slots(chosen))]
        return chosen, outputs, explored, rnd

    def _adapt(self, rnd, spearman: float) -> dict:
        """`exploration.adaptive`: what the round behind this batch bought, and the budget it leaves;
        with `spot.training_phase: auto` also what that round was worth against training."""
        if rnd is None:
            return {} if self.adaptive is None else {"explore/budget_scale": self.adaptive.scale,
                                                      "explore/reason": self.adaptive.reason}
        contrast = rnd.contrast(self.cfg.train.group_size)
        out = {} if self.adaptive is None else self.adaptive.observe(contrast, spearman)
        hosted = rnd.iteration - 1  # the round ran while that iteration's update trained
        if self.placement is not None and hosted in self.explorers:
            self.placement.observe_exploration(hosted, contrast.equal_removed, contrast.equal_random,
                                               self.iteration_s.get(hosted, math.nan), self.explorers[hosted],
                                               buys=self.adaptive is None or self.adaptive.buys)
        return out

    def _place_spot(self, it: int) -> dict:
        """Queue training: which spot workers explore first while this iteration's update trains."""
        if not self.cfg.spot_trains():
            return {}
        share = self.placement.explore_share(it) if self.placement is not None else 0.0
        self.explorers[it] = self.backend.place_spot(share)
        out = {"spot/explorers_first": float(self.explorers[it])}
        return out | (self.placement.metrics() if self.placement is not None else {"spot/explore_share": 0.0})

    def _baselines(self, rnd, specs: list[RequestSpec]) -> np.ndarray | None:
        """Per sample (mean, std) of its prompt's explored stale rewards (`exploration.baseline: pool`;
        NaN: the group's own), and with `exploration.unbiased` the Horvitz-Thompson weight."""
        explore, slots = self.cfg.exploration, self._slots(specs)
        if self.draw is not None:  # this batch was screened (the switch may since have moved on)
            weights = np.repeat(self.draw.weights, self.cfg.train.group_size) if explore.unbiased else None
            stats = np.full((len(specs), 2), np.nan)
        elif explore.baseline != "pool" or rnd is None:
            return None
        else:
            stats = np.array([rnd.pool_baseline(slot) for slot in slots], dtype=np.float64)
            weights = (np.array([rnd.seed_weight(slot, s.seed, self.cfg.train.group_size)
                                 for s, slot in zip(specs, slots)]) if explore.unbiased else None)
        return stats if weights is None else np.column_stack([stats, weights])

    # --- prompt screening (exploration.target: prompts; exploration/screen.py) ---------------------
    def _screening(self) -> bool:
        target = self.cfg.exploration.target if self.switch is None else self.switch.target
        return target == "prompts" and self._mode() != "off"

    def _switch_target(self, rnd, trained_all_equal: float, graded: bool) -> dict:
        """`exploration.adaptive`: the unscreened draw's all-equal share (the screen's value, whether the
        rewards are graded) decide what the next iterations explore for."""
        if self.switch is None:
            return {}
        share, value = trained_all_equal, math.nan
        if self.draw is not None:
            share = self.draw.baseline_share
            value = share - trained_all_equal
        elif rnd is not None and rnd.contrast(self.cfg.train.group_size).prompts:
            share = rnd.contrast(self.cfg.train.group_size).equal_random
        return self.switch.observe(share, value, graded)

    def _candidates(self, it: int) -> list[int]:
        """The run's draw for `it`, then the refills (`prompt_candidates` x the batch in all)."""
        b, explore = self.cfg.rollout_batch_size, self.cfg.exploration
        refill = draw_prompt_ids(len(self.pool), (explore.prompt_candidates - 1) * b, seed=self.cfg.seed,
                                 iteration=it, stream=1)
        return draw_prompt_ids(len(self.pool), b, seed=self.cfg.seed, iteration=it) + refill

    def _draw(self, it: int) -> list[RequestSpec]:
        """The prompts of `it`: the run's draw, or the screen's choice among the candidates."""
        self.draw = None
        if not self._screening():
            return iteration_specs(self.cfg, self.pool, it, self.backend.weight_version)
        cands, g = self._candidates(it), self.cfg.train.group_size
        predicted = [self.history.all_equal(self.pool.texts[c], g) for c in cands]
        self.history.advance()
        self.draw = screen_draw(predicted, self.cfg.rollout_batch_size, self.cfg.exploration.prompt_floor,
                                np.random.default_rng([self.cfg.seed, it, 0x5C4EE]))
        chosen = [cands[i] for i in self.draw.chosen]
        return iteration_specs(self.cfg, self.pool, it, self.backend.weight_version, prompt_ids=chosen)

    def _screen_explore(self, it: int, keep_going) -> int:
        """Explore `prompt_screen_seeds` seeds of each candidate of `it`; their rewards join the history."""
        seeds = self.cfg.exploration.prompt_screen_seeds
        if seeds == 0:
            return 0
        cfg = dataclasses.replace(self.cfg.exploration, planner="uniform", seeds_per_pull=seeds,
                                  min_seeds_before_abandon=max(2, seeds))
        prompts = [(c, self.pool.texts[c]) for c in self._candidates(it)]
        schedule = iteration_specs(self.cfg, self.pool, it, self.backend.weight_version)[0].schedule
        rnd = ExplorationRound(cfg, self.cfg.train.group_size, prompts, schedule, self.backend.weight_version,
                               it, self.cfg.seed, seeds_per_prompt=seeds)
        explored = rnd.explore(self.backend, keep_going)
        for slot, (_, text) in enumerate(prompts):
            self.history.observe(text, rnd.pool(slot))
        return explored

    def _remember(self, specs: list[RequestSpec], rewards: np.ndarray) -> float:
        """Trained groups join the prompt history; returns the share of them all equal."""
        groups = rewards.reshape(-1, self.cfg.train.group_size)
        if self.history is not None:
            for spec, group in zip(specs[::self.cfg.train.group_size], groups):
                self.history.observe(spec.prompt, group)
        return float(np.mean(groups.max(axis=1) == groups.min(axis=1)))

    def _slots(self, specs: list[RequestSpec]) -> list[int]:
        return [i // self.cfg.train.group_size for i in range(len(specs))]

    def _with_seeds(self, specs: list[RequestSpec], selection: dict[int, list[int]]) -> list[RequestSpec]:
        return [dataclasses.replace(s, seed=selection[slot][i % self.cfg.train.group_size])
                for i, (s, slot) in enumerate(zip(specs, self._slots(specs)))]

    def _apply_selection(self, specs: list[RequestSpec]) -> list[RequestSpec]:
        """Stale mode: regenerate the seeds chosen while the previous iteration trained."""
        if self._mode() != "stale" or self.pending is None:
            return specs
        return self._with_seeds(specs, self.pending.selection())

    def _rank_check(self, specs: list[RequestSpec], fresh: np.ndarray) -> dict:
        """Stale vs fresh rewards of the same seeds: Spearman/Kendall, and the fallback switch."""
        if self._mode() != "stale" or self.pending is None:
            return {}
        slots = self._slots(specs)
        stale = [self.pending.explored.get((slot, s.seed)) for s, slot in zip(specs, slots)]
        pairs = [(e.reward, f, slot) for e, f, slot in zip(stale, fresh, slots) if e is not None]
        self.pending = None
        if not pairs:
            return {}
        st, fr, groups = (list(x) for x in zip(*pairs))
        report = self.rank_monitor.update(np.array(st), np.array(fr), groups=np.array(groups))
        if report.fallback_active and not self.fallback_active:
            log.warning("rank correlation fell below the threshold; falling back to %s seeds: %s",
                        self.cfg.exploration.fallback, report.message)
        self.fallback_active = report.fallback_active
        return {"rank_spearman": report.spearman, "rank_kendall": report.kendall, "rank_pairs": report.n,
                "rank_fallback": float(report.fallback_active)}

    def checkpoint(self, it: int) -> Path:
        """Weights, optimiser, iteration and curve; everything else is a function of (seed, t).

        Written into `iter-NNNNNN.tmp` and renamed when complete, so a crash mid-save leaves no
        directory that looks finished; meta.json records the size and SHA-256 of backend.pt, so a
        truncated or corrupted file is recognised at resume (see `verify_checkpoint`).
        """
        path = self.run_dir / "checkpoints" / f"iter-{it:06d}"
        tmp = path.with_name(path.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.backend.save_checkpoint(tmp / BACKEND_FILE)
        meta = {"iteration": it, "curve": self.curve, "base": _eval_dump(self.base), "last": _eval_dump(self.last),
                "pending": None if self.pending is None else round_state(self.pending),
                "fallback_active": self.fallback_active, "rank_history": self.rank_monitor.history,
                **({} if self.adaptive is None else {"adaptive": self.adaptive.state_dict()}),
                **({} if self.placement is None else {"placement": self.placement.state_dict()}),
                **({} if self.history is None else {"prompt_history": self.history.state_dict()}),
                **({} if self.switch is None else {"switch": self.switch.state_dict()}),
                "weight_version": self.backend.weight_version, "config": to_dict(self.cfg),
                "files": {BACKEND_FILE: _file_digest(tmp / BACKEND_FILE)}}
        (tmp / META_FILE).write_text(json.dumps(meta))
        if path.exists():  # a resumed run re-reaching a saved iteration replaces it
            shutil.rmtree(path)
        tmp.rename(path)
        return path

    def resume_latest(self, run_dir: Path | None = None) -> Path:
        """Resume from the newest checkpoint of `run_dir` that verifies and loads; a corrupted or
        truncated one is reported (naming the file) and the previous one is used. Returns the
        checkpoint used; CheckpointError when none is usable."""
        candidates = list_checkpoints(Path(run_dir or self.run_dir))
        if not candidates:
            raise CheckpointError(f"no checkpoint under {Path(run_dir or self.run_dir) / 'checkpoints'}: "
                                  "nothing to resume")
        problems = []
        for path in reversed(candidates):
            try:
                self.resume(path)
                return path
            except CheckpointError as err:
                log.warning("%s; trying the previous checkpoint", err)
                problems.append(str(err))
        raise CheckpointError("no usable checkpoint: " + "; ".join(problems))

    def resume(self, path: Path) -> None:
        """Continue after checkpoint `path`; CheckpointError naming the file if it is damaged."""
        meta = verify_checkpoint(Path(path))
        try:
            self.backend.load_checkpoint(Path(path) / BACKEND_FILE)
        except Exception as err:  # torch/pickle/Ray errors of many kinds: all mean "cannot load"
            raise CheckpointError(f"checkpoint file {Path(path) / BACKEND_FILE} cannot be loaded: "
                                  f"{type(err).__name__}: {err}") from err
        self.start_iteration = meta["iteration"] + 1
        self.curve = meta["curve"]
        self.base, self.last = _eval_load(meta["base"]), _eval_load(meta["last"])
        self.pending = ResumedRound(meta["pending"]) if meta.get("pending") else None
        self.fallback_active = bool(meta.get("fallback_active", False))
        self.rank_monitor.history[:] = meta.get("rank_history", [])
        if self.adaptive is not None and meta.get("adaptive"):
            self.adaptive.load_state_dict(meta["adaptive"])
        if self.placement is not None and meta.get("placement"):
            self.placement.load_state_dict(meta["placement"])
        if self.history is not None and meta.get("prompt_history"):
            self.history.load_state_dict(meta["prompt_history"])
        if self.switch is not None and meta.get("switch"):
            self.switch.load_state_dict(meta["switch"])
        self.writer.truncate_after(meta["iteration"])

    @staticmethod
    def _due(it: int, every: int) -> bool:
        return every > 0 and it % every == 0

    def _finish(self, last: Evaluation) -> RunResult:
        self.writer.close()
        save_samples(self.run_dir / "samples" / "final.npz", last, self.validation)
        result = RunResult(self.run_dir, self.base, last, self.curve)
        payload = result.summary() | {"config": to_dict(self.cfg), "curve": self.curve,
                                      "final_rewards": last.rewards.tolist()}
        (self.run_dir / "summary.json").write_text(json.dumps(payload, indent=2))
        (self.run_dir / "timeline.json").write_text(json.dumps(self.backend.timeline()))
        return result


BACKEND_FILE, META_FILE = "backend.pt", "meta.json"
META_KEYS = ("iteration", "curve", "base", "last")


def _require_baselines(backend) -> None:
    """exploration.baseline=pool hands per-sample baselines to `start_train(..., baselines=)`.

    Every backend of this package takes them (local, Ray, ROLL); this refuses, before the first
    iteration, a backend written to the older four-argument protocol (a test double, a user's own)
    instead of failing with a TypeError once exploration has run.
    """
    params = inspect.signature(backend.start_train).parameters
    if "baselines" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise ValueError(f"exploration.baseline='pool' needs a backend whose start_train takes baselines=; "
                         f"{type(backend).__name__}.start_train does not (use exploration.baseline='selected')")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and what is wrong with it."""


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (half-written ones end in .tmp)."""
    root = Path(run_dir) / "checkpoints"
    return sorted(p for p in root.glob("iter-*") if p.is_dir() and not p.name.endswith(".tmp"))


def verify_checkpoint(path: Path) -> dict:
    """The checkpoint's metadata after checking that meta.json parses and holds the resume keys,
    and that backend.pt exists with the recorded size and SHA-256 (when recorded)."""
    meta_path, backend = path / META_FILE, path / BACKEND_FILE
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint file {meta_path} is unreadable: {err}") from err
    missing = [k for k in META_KEYS if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise CheckpointError(f"checkpoint file {meta_path} lacks {missing}")
    if not backend.is_file():
        raise CheckpointError(f"checkpoint file {backend} is missing")
    recorded = meta.get("files", {}).get(BACKEND_FILE)  # absent in checkpoints of older versions
    actual = _file_digest(backend) if recorded is not None else None
    if actual != recorded:
        raise CheckpointError(f"checkpoint file {backend} is truncated or corrupted: size/SHA-256 "
                              f"{actual} differ from the recorded {recorded}")
    return meta


def _file_digest(path: Path) -> dict:
    """Size and SHA-256 of a file, read in 1 MiB chunks (SHA-256 runs at roughly 0.5-1 GB/s per core)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return {"size": path.stat().st_size, "sha256": digest.hexdigest()}


def _eval_dump(ev: Evaluation | None) -> dict | None:
    if ev is None:
        return None
    out = {"rewards": ev.rewards.tolist(), "strict": ev.strict.tolist()}
    return out | ({} if ev.background is None else {"background": ev.background.tolist()})


def _eval_load(data: dict | None) -> Evaluation | None:
    if data is None:
        return None
    background = np.asarray(data["background"]) if "background" in data else None
    return Evaluation(np.asarray(data["rewards"]), np.asarray(data["strict"]), background=background)
