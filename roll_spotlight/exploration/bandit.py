"""Budgeted exploration planners: which prompt of the next batch gets its next m explored seeds.

While iteration t trains, spot workers explore seeds for the prompts of iteration t+1. Each prompt is
an arm; a pull explores ``seeds_per_pull`` more seeds of one prompt; the goal is the mean over
prompts of the variance of the k seeds ``select_max_variance`` will pick (k = ``group_size``). The
planner is a pure policy object: ``next_pull(now_s)`` is its one decision; the callbacks
``observe``, ``lost`` and ``update_budget`` feed it facts; ``selection(k)`` reads the outcome.

Requests are generated lazily, one per free worker, so only pulled work is ever in flight, and a
preempted pull's seeds return through ``lost`` and are re-issued (to any worker) before any new pull:
preemptions never strand planned work.

Seed lifecycle, per prompt (one seed stream per prompt, a pure function of ``base_seed``, the prompt
id and a counter; a seed is never issued twice)::

    UNISSUED --next_pull--> IN_FLIGHT --observe--> EXPLORED
                              |    ^
                          lost|    |next_pull (re-issue first)
                              v    |
                            REQUEUED --observe (late result)--> EXPLORED

Arm lifecycle: ACTIVE --(min_seeds_before_abandon explored (the bandit: see ``abandon_share``), all rewards within
``abandon_tolerance``)--> ABANDONED. With ``screen_seeds`` > 0 an arm is screened first: while
nothing of it is in flight and its explored rewards (fewer than ``min_seeds_before_abandon``; the
bandit's ``abandon_share`` of a group) are all equal, its next pull is ``screen_seeds`` seeds and the bandit ranks it with the unexplored arms; so a
prompt whose first two rewards differ has cost two seeds to show it is worth keeping, not a full pull. An abandoned arm is never pulled again (its requeued seeds are
dropped; late results are still recorded); with ``replace_abandoned`` its batch slot goes to the next
prompt of the reserve, which starts ACTIVE.

Planners (same bookkeeping, different ``_score``, the index of an arm; the highest wins, ties to the
lowest batch slot):
- ``BanditPlanner``: expected gain rate of the selected variance from a posterior predictive: exact
  Beta-binomial for two-valued prompts, else a Dirichlet-process posterior (see ``value.py``) whose
  base measure keeps each donor prompt's rewards together and borrows from donors of the prompt's
  own kind; unexplored arms first.
- ``UniformPlanner``: round robin (fewest explored + planned seeds first), the baseline.
- ``OraclePlanner``: the same gain rate computed from each prompt's true reward distribution, and
  zero-variance prompts known (and replaced) without spending a seed; an upper reference.

Performance: an arm's index is cached and recomputed only when that arm changed (a pull issued, a
result observed, a seed lost), so a decision costs one or two arm evaluations plus an argmax.
"""
from __future__ import annotations

import bisect
import hashlib
import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, Protocol, Sequence, Union

import numpy as np

from roll_spotlight.checks import require, require_choice, require_each, require_int, require_number
from roll_spotlight.exploration.budget import SeedCostModel, ExplorationBudget
from roll_spotlight.exploration.prior import DonorPool, PopulationPrior, PriorConfig, is_continuous
from roll_spotlight.exploration.select import SELECTORS, get_selector
from roll_spotlight.exploration.value import (
    best_rate,
    binary_lookahead_gains,
    draws_needed,
    horizon_pulls,
    lookahead_gain_rate,
    lookahead_gains,
    shrunk_predictive_draws,
)

logger = logging.getLogger(__name__)

PromptId = Union[int, str]

_MASK64 = (1 << 64) - 1

POSTERIORS = ("pooled", "population")


@dataclass
class PlannerConfig:
    """Exploration planner settings (one per training run).

    ``predicted_train_s`` and ``spot_workers`` are the initial budget; ``update_budget`` revises it.
    ``per_seed_s`` is the initial cost estimate, refined online by an EWMA with weight ``cost_ewma``.
    ``mc_draws`` / ``prior_strength`` / ``max_lookahead_pulls`` tune the bandit's value estimate;
    ``posterior`` picks its base measure (``POSTERIORS``; see ``BanditPlanner``) and ``prior``
    tunes the ``"population"`` one (``prior.PriorConfig``). ``screen_seeds`` is the size of the screening
    pulls (module docstring; 0: none, every pull is ``seeds_per_pull``; only with
    ``abandon_zero_variance``). ``binary_prior`` is the Beta(a, a) prior on the
    high-value rate of two-valued (pass / fail) prompts, valued in closed form (0: Monte Carlo like
    the others); ``kind_donors`` lets a prompt borrow only from donors of its own kind (continuous
    or not). ``selection`` names the selector (``select.SELECTORS``) that ``selection(k)`` applies;
    the bandit values pulls by the max-variance subset whichever it is (top-bottom is one of the
    candidates that subset is chosen from, so the two values move together). ``abandon_share``: the
    bandit keeps screening an all-equal arm until it has ``max(min_seeds_before_abandon,
    ceil(abandon_share * group_size))`` rewards (0: ``min_seeds_before_abandon``; see ``BanditPlanner``);
    the other planners abandon at ``min_seeds_before_abandon``.
    """

    group_size: int = 8
    seeds_per_pull: int = 4
    min_seeds_before_abandon: int = 4
    screen_seeds: int = 2
    abandon_zero_variance: bool = True
    abandon_tolerance: float = 0.0
    replace_abandoned: bool = True
    predicted_train_s: float = 0.0
    spot_workers: int = 0
    per_seed_s: float = 1.0
    cost_ewma: float = 0.2
    mc_draws: int = 32
    prior_strength: float = 1.0
    max_lookahead_pulls: int = 4
    posterior: str = "pooled"
    prior: PriorConfig = field(default_factory=PriorConfig)
    binary_prior: float = 1.0
    kind_donors: bool = True
    base_seed: int = 0
    selection: str = "max_variance"
    abandon_share: float = 0.75

    def __post_init__(self) -> None:
        key = "PlannerConfig"
        require_int("PlannerConfig.group_size", self.group_size, ">= 2")
        require_int("PlannerConfig.min_seeds_before_abandon", self.min_seeds_before_abandon, ">= 2")
        require_each(self, key, ("seeds_per_pull", "mc_draws", "max_lookahead_pulls"), require_int)
        require_each(self, key, ("screen_seeds", "spot_workers", "base_seed"), require_int, ">= 0")
        require_each(self, key, ("binary_prior", "abandon_tolerance", "predicted_train_s"), require_number, ">= 0")
        require_each(self, key, ("per_seed_s", "prior_strength"), require_number)
        require_number("PlannerConfig.cost_ewma", self.cost_ewma, "(0, 1]")
        require_number("PlannerConfig.abandon_share", self.abandon_share, "[0, 1]")
        require_choice("PlannerConfig.selection", self.selection, sorted(SELECTORS))
        require_choice("PlannerConfig.posterior", self.posterior, POSTERIORS)
        for name in ("abandon_zero_variance", "replace_abandoned", "kind_donors"):
            require(isinstance(getattr(self, name), bool), f"PlannerConfig.{name}", getattr(self, name),
                    "must be true or false")


@dataclass(frozen=True)
class Pull:
    """Explore ``seeds`` of ``prompt_id`` (with the stale weights)."""

    prompt_id: PromptId
    seeds: tuple[int, ...]


@dataclass(frozen=True)
class PlannerSummary:
    pulls: int
    explored_seeds: int
    in_flight_seeds: int
    abandoned: tuple[PromptId, ...]
    replaced: dict
    spent_s: float
    in_flight_s: float
    remaining_s: float
    per_seed_s: float


def prompt_key(prompt_id: PromptId) -> int:
    """A stable 64-bit key for a prompt id (Python's ``hash`` of a str changes between processes)."""
    if isinstance(prompt_id, bool) or not isinstance(prompt_id, (int, str)):
        raise ValueError(f"prompt ids must be int or str, got {prompt_id!r} ({type(prompt_id).__name__})")
    data = repr(prompt_id).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def seed_stream(base_seed: int, prompt_id: PromptId) -> Iterator[int]:
    """The prompt's seeds in issue order: 63-bit ints, a pure function of (base_seed, prompt_id)."""
    root = _splitmix64(prompt_key(prompt_id) ^ _splitmix64(base_seed))
    i = 0
    while True:
        yield _splitmix64((root + i) & _MASK64) >> 1
        i += 1


@dataclass
class _Arm:
    """Per-prompt state. ``seeds``/``rewards`` are explored results in observation order."""

    prompt_id: PromptId
    stream: Iterator[int]
    seeds: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    sorted_rewards: list[float] = field(default_factory=list)
    in_flight: dict[int, float] = field(default_factory=dict)  # seed -> predicted cost
    requeued: list[int] = field(default_factory=list)
    issued: set[int] = field(default_factory=set)
    explored_set: set[int] = field(default_factory=set)
    abandoned: bool = False

    @property
    def planned(self) -> int:
        return len(self.in_flight) + len(self.requeued)

    def take_new_seeds(self, n: int) -> tuple[int, ...]:
        out = []
        while len(out) < n:
            seed = next(self.stream)
            if seed not in self.issued:
                self.issued.add(seed)
                out.append(seed)
        return tuple(out)

    def record(self, seed: int, reward: float) -> None:
        self.seeds.append(seed)
        self.explored_set.add(seed)
        self.rewards.append(reward)
        bisect.insort(self.sorted_rewards, reward)


class ExplorationPlanner:
    """Bookkeeping shared by all planners; subclasses define ``_score(slot, arm)``."""

    def __init__(self, config: PlannerConfig, prompt_ids: Sequence[PromptId],
                 reserve: Sequence[PromptId] = (), start_s: float = 0.0) -> None:
        self.config = config
        _check_prompt_ids(prompt_ids, reserve)
        self._arms: dict[PromptId, _Arm] = {}
        self._slots: list[PromptId] = [self._new_arm(p).prompt_id for p in prompt_ids]
        self._slot_of: dict[PromptId, int] = {pid: i for i, pid in enumerate(self._slots)}
        self._reserve = deque(reserve)
        self._replaced: dict[PromptId, PromptId] = {}
        self._requeue_order: deque[PromptId] = deque()
        self._scores = np.zeros(len(self._slots))
        self._dirty = set(range(len(self._slots)))
        self._cost = SeedCostModel(config.per_seed_s, config.cost_ewma)
        self._budget = ExplorationBudget(config.predicted_train_s, config.spot_workers, start_s)
        self._spent_s = 0.0
        self._in_flight_s = 0.0
        self._pulls = 0

    # ---- the decision ---------------------------------------------------------------------------

    def next_pull(self, now_s: float) -> Pull | None:
        """The next pull for a free worker, or None when the budget cannot pay for one (stop)."""
        self._budget.advance(now_s)
        pull = self._requeued_pull() or self._fresh_pull()
        if pull is None:
            return None
        self._issue(pull)
        return pull

    def _requeued_pull(self) -> Pull | None:
        while self._requeue_order:
            arm = self._arms[self._requeue_order[0]]
            if arm.abandoned or not arm.requeued:
                self._requeue_order.popleft()
                continue
            seeds = tuple(arm.requeued[: self.config.seeds_per_pull])
            if not self._affordable(len(seeds)):
                return None
            del arm.requeued[: len(seeds)]
            if not arm.requeued:
                self._requeue_order.popleft()
            return Pull(arm.prompt_id, seeds)
        return None

    def _fresh_pull(self) -> Pull | None:
        if self._requeue_order or not self._affordable(self._smallest_pull()):
            return None
        slot = self._best_slot()
        if slot is None:
            return None
        arm = self._arms[self._slots[slot]]
        m = self._pull_size(arm)
        if not self._affordable(m):
            return None
        return Pull(arm.prompt_id, arm.take_new_seeds(m))

    def _pull_size(self, arm: _Arm) -> int:
        """Seeds of the next pull of ``arm``: ``seeds_per_pull``, or the screening size (see ``_screening``)."""
        cfg = self.config
        if self._screening(arm):
            return min(cfg.screen_seeds, self._abandon_after() - len(arm.rewards))
        return cfg.seeds_per_pull

    def _abandon_after(self) -> int:
        """All-equal explored rewards that abandon an arm (and end its screening)."""
        return self.config.min_seeds_before_abandon

    def _smallest_pull(self) -> int:
        cfg = self.config
        return min(cfg.seeds_per_pull, cfg.screen_seeds) if self._screens() else cfg.seeds_per_pull

    def _screens(self) -> bool:
        cfg = self.config
        return cfg.screen_seeds > 0 and cfg.abandon_zero_variance

    def _screening(self, arm: _Arm) -> bool:
        """With ``screen_seeds``: the arm is still being screened for zero variance (nothing in flight,
        fewer than ``_abandon_after()`` explored, all of them equal), so its next pull is small."""
        if not self._screens() or arm.abandoned or arm.planned:
            return False
        s = len(arm.rewards)
        return s < self._abandon_after() and (
            s == 0 or arm.sorted_rewards[-1] - arm.sorted_rewards[0] <= self.config.abandon_tolerance)

    def _best_slot(self) -> int | None:
        for slot in sorted(self._dirty):
            arm = self._arms[self._slots[slot]]
            self._scores[slot] = -math.inf if arm.abandoned else self._score(slot, arm)
        self._dirty.clear()
        slot = int(np.argmax(self._scores))
        return None if self._scores[slot] == -math.inf else slot

    def _affordable(self, n_seeds: int) -> bool:
        return self._cost.predict(n_seeds) <= self.remaining_budget_s() + 1e-9

    def _issue(self, pull: Pull) -> None:
        arm = self._arms[pull.prompt_id]
        per_seed = self._cost.predict(1)
        for seed in pull.seeds:
            arm.in_flight[seed] = per_seed
        self._in_flight_s += per_seed * len(pull.seeds)
        self._pulls += 1
        self._mark_dirty(arm)

    def _score(self, slot: int, arm: _Arm) -> float:
        raise NotImplementedError

    # ---- callbacks ------------------------------------------------------------------------------

    def observe(self, prompt_id: PromptId, seed: int, reward: float, duration_s: float) -> None:
        """Record one explored seed's reward (stale weights) and its wall time. Idempotent per seed."""
        arm = self._arm(prompt_id)
        if not math.isfinite(reward):
            raise ValueError(f"reward must be finite, got {reward!r} for prompt {prompt_id!r} seed {seed}")
        if seed in arm.explored_set:
            logger.debug("duplicate result for prompt %r seed %d ignored", prompt_id, seed)
            return
        if seed not in arm.issued:
            raise ValueError(f"seed {seed} was never issued for prompt {prompt_id!r}")
        if seed in arm.in_flight:
            self._in_flight_s -= arm.in_flight.pop(seed)
        elif seed in arm.requeued:
            arm.requeued.remove(seed)  # a late result of a pull reported lost
        arm.record(seed, float(reward))
        self._cost.observe(duration_s)
        self._spent_s += duration_s
        self._on_observed(arm, float(reward))
        self._maybe_abandon(arm)
        self._mark_dirty(arm)

    def _on_observed(self, arm: _Arm, reward: float) -> None:
        """Hook for planners that learn from every reward (the bandit's pooled prior)."""

    def lost(self, pull: Pull) -> None:
        """A preempted pull: its unobserved seeds are re-issued before any new pull."""
        arm = self._arm(pull.prompt_id)
        returned = [s for s in pull.seeds if s in arm.in_flight]
        for seed in returned:
            self._in_flight_s -= arm.in_flight.pop(seed)
        if returned and not arm.abandoned:
            arm.requeued.extend(returned)
            if pull.prompt_id not in self._requeue_order:
                self._requeue_order.append(pull.prompt_id)
        self._mark_dirty(arm)

    def update_budget(self, predicted_train_s: float | None = None, workers: int | None = None,
                      elapsed_s: float | None = None, now_s: float | None = None) -> None:
        """Re-estimate the budget: remaining = (predicted_train_s - elapsed_s) * workers (see budget.py)."""
        self._budget.update(predicted_train_s, workers, elapsed_s, now_s)

    # ---- abandonment ----------------------------------------------------------------------------

    def _maybe_abandon(self, arm: _Arm) -> None:
        cfg = self.config
        if arm.abandoned or not cfg.abandon_zero_variance or len(arm.rewards) < self._abandon_after():
            return
        if arm.sorted_rewards[-1] - arm.sorted_rewards[0] <= cfg.abandon_tolerance:
            self._abandon(arm, f"{len(arm.rewards)} explored rewards all equal to {arm.rewards[0]:.4g}")

    def _abandon(self, arm: _Arm, why: str) -> None:
        arm.abandoned = True
        arm.requeued.clear()
        self._mark_dirty(arm)
        if not self.config.replace_abandoned or arm.prompt_id not in self._slot_of:
            logger.info("exploration: abandoned prompt %r (%s)", arm.prompt_id, why)
            return
        if not self._reserve:
            logger.info("exploration: abandoned prompt %r (%s); reserve empty, kept in batch", arm.prompt_id, why)
            return
        slot = self._slot_of.pop(arm.prompt_id)
        new_arm = self._new_arm(self._reserve.popleft())
        self._slots[slot] = new_arm.prompt_id
        self._slot_of[new_arm.prompt_id] = slot
        self._replaced[arm.prompt_id] = new_arm.prompt_id
        self._dirty.add(slot)
        logger.info("exploration: abandoned prompt %r (%s); replaced by %r", arm.prompt_id, why, new_arm.prompt_id)
        self._on_new_arm(new_arm)

    def _on_new_arm(self, arm: _Arm) -> None:
        """Hook: a reserve prompt entered the batch."""

    # ---- outcome --------------------------------------------------------------------------------

    def selection(self, k: int | None = None) -> dict[PromptId, list[int]]:
        """Seeds to train on per prompt of the batch (batch-slot order).

        Prompts with >= k explored seeds get the k of ``config.selection`` (max-variance by default). Prompts with fewer get all their
        explored seeds plus the next unissued seeds of their stream ("fresh": the rollout will be the
        first look at them; the bandit replaces fewer than k all-equal explored seeds with fresh ones,
        see ``BanditPlanner``). In-flight results are not waited for. Abandoned prompts that were not
        replaced stay in the batch. Pure: calling it twice gives the same answer.
        """
        k = self.config.group_size if k is None else k
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        return {pid: self._select(self._arms[pid], k) for pid in self._slots}

    def _select(self, arm: _Arm, k: int) -> list[int]:
        if len(arm.rewards) >= k:
            # a randomised selector (pps) draws anew per prompt and round: a pure function of both
            draw = _splitmix64(prompt_key(arm.prompt_id) ^ _splitmix64(self.config.base_seed + 1)) >> 33
            return [arm.seeds[i] for i in get_selector(self.config.selection)(arm.rewards, k, draw)]
        return arm.seeds + self._peek_fresh(arm, k - len(arm.rewards))

    def _peek_fresh(self, arm: _Arm, n: int) -> list[int]:
        used = set(arm.issued)
        out = []
        for seed in seed_stream(self.config.base_seed, arm.prompt_id):
            if len(out) == n:
                break
            if seed not in used:
                used.add(seed)
                out.append(seed)
        return out

    # ---- views ----------------------------------------------------------------------------------

    @property
    def batch(self) -> list[PromptId]:
        """The prompts of the next batch, by slot (replacements in place of abandoned prompts)."""
        return list(self._slots)

    def explored(self, prompt_id: PromptId) -> list[tuple[int, float]]:
        arm = self._arm(prompt_id)
        return list(zip(arm.seeds, arm.rewards))

    def is_abandoned(self, prompt_id: PromptId) -> bool:
        return self._arm(prompt_id).abandoned

    def remaining_budget_s(self) -> float:
        return self._budget.remaining_s(self._spent_s, self._in_flight_s)

    def summary(self) -> PlannerSummary:
        arms = self._arms.values()
        return PlannerSummary(
            pulls=self._pulls,
            explored_seeds=sum(len(a.rewards) for a in arms),
            in_flight_seeds=sum(len(a.in_flight) for a in arms),
            abandoned=tuple(a.prompt_id for a in arms if a.abandoned),
            replaced=dict(self._replaced),
            spent_s=self._spent_s,
            in_flight_s=self._in_flight_s,
            remaining_s=self.remaining_budget_s(),
            per_seed_s=self._cost.per_seed_s,
        )

    # ---- helpers --------------------------------------------------------------------------------

    def _new_arm(self, prompt_id: PromptId) -> _Arm:
        arm = _Arm(prompt_id, seed_stream(self.config.base_seed, prompt_id))
        self._arms[prompt_id] = arm
        return arm

    def _arm(self, prompt_id: PromptId) -> _Arm:
        try:
            return self._arms[prompt_id]
        except KeyError:
            raise ValueError(f"unknown prompt {prompt_id!r}") from None

    def _mark_dirty(self, arm: _Arm) -> None:
        slot = self._slot_of.get(arm.prompt_id)
        if slot is not None:
            self._dirty.add(slot)


def _check_prompt_ids(prompt_ids: Sequence[PromptId], reserve: Sequence[PromptId]) -> None:
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids must not be empty")
    everything = list(prompt_ids) + list(reserve)
    for pid in everything:
        prompt_key(pid)
    if len(set(everything)) != len(everything):
        raise ValueError("prompt ids (batch and reserve together) must be unique")


class BanditPlanner(ExplorationPlanner):
    """Greedy budgeted bandit: pull the arm with the highest expected gain in selected variance per
    second of exploration (module ``value``).

    Unexplored arms come first (index +inf): one pull per prompt is what reveals zero-variance
    prompts, which abandonment then replaces, and it shows every prompt before any is concentrated
    on. At low budgets this, not the value estimate, is what separates the bandit from the oracle,
    which knows zero-variance prompts for free. Measured in the bench's simulation (seeds 0..19)
    with a diagnostic planner: the same explore-first rule, zero-variance prompts found by
    exploring as here, but every explored prompt valued by the oracle's index on its *true*
    distribution, reaches only 0.862 / 0.886 / 0.913 of the oracle at 4 / 6.4 / 8 explored seeds
    per prompt (0.922 / 0.930 / 0.957 when zero-variance prompts are also known for free). On the
    tuning seeds 100..119 the same diagnostic gives 0.846 / 0.874 / 0.902 / 0.974 at 4 / 6.4 / 8 /
    12, and giving it a finite index for unexplored prompts does not raise that ceiling: the true
    population's blind look-ahead gain (abandonment valued) 0.850 / 0.868 / 0.899 / 0.957, a
    Gittins-style retirement index (the rate at which one first pull, followed by its best
    continuation only where that beats the rate, breaks even; abandonment valued) 0.847 / 0.861 /
    0.891 / 0.936, or 0.845 / 0.882 / 0.901 / 0.971 with that index scaled by 1.5. With this
    bandit's own posterior the Gittins-style index was 1-2% worse than explore-first at 4-12 seeds
    per prompt (seeds 100..119), and within 0.7% of it either way when scaled by 1.5 or 2 (seeds
    100..139). Earlier alternatives were worse or within noise too: a fixed finite index for
    unexplored prompts, and reserving the last 30% of the budget for concentration (under 1%). So
    the rule stays.

    What did move that ceiling is making the first look cheaper (``screen_seeds``, module docstring):
    a prompt with two different rewards cannot have zero variance, so it needs no more screening, and
    at low budgets the seeds saved go to concentration. Mean selected variance over the oracle's on
    the tuning seeds 100..139, full first pulls -> two-seed screening, at 4 / 6.4 / 8 / 12 / 16 / 24
    explored seeds per prompt: 0.838 -> 0.896, 0.873 -> 0.923, 0.890 -> 0.939, 0.939 -> 0.951,
    0.951 -> 0.950, 0.961 -> 0.965 (the bench's ``planner_unscreened`` keeps the former as an
    ablation).

    The predictive of a prompt's next rewards (what the look-ahead of ``value`` averages over):

    - two-valued prompts (three or more explored rewards, exactly two distinct values: pass / fail
      rewards) are valued in closed form (``value.binary_lookahead_gains``): the rate of the high
      value has a Beta(``binary_prior`` + highs, ``binary_prior`` + lows) posterior and future seeds
      are Beta-binomial, so the look-ahead is exact (no Monte Carlo noise) and a prompt with one
      success in eight is credited with its uncertain rate, not with exactly 1/8;
    - every other prompt: a Dirichlet-process posterior (``value``): its own rewards with weight
      s / (s + ``prior_strength``), else a draw from a base measure learnt across prompts, chosen by
      ``PlannerConfig.posterior``:
      - ``"pooled"``: the explored prompts of the batch (abandoned ones included), one donor prompt
        per Monte Carlo row, uniformly, the row's base draws resampled from that donor's rewards
        (``prior.DonorPool``: a hypothetical future never mixes two prompts' rewards);
      - ``"population"``: the explored prompts as donors, weighted by how well each explains this
        prompt's rewards (``prior.py``), so binary prompts borrow from binary ones, etc.
      With ``kind_donors`` a prompt with three or more explored rewards borrows only from donors of
      its own kind (``prior.is_continuous``: continuous-looking or not) when there are any: a
      continuous score cannot produce the 0s and 1s of a pass / fail donor, and borrowing them
      doubled the predicted gain of unimodal continuous prompts (calibration against the true gains
      on tuning seeds 100..109: predicted 0.021 vs true 0.011 after four seeds; 0.014 with kind
      donors).

    Measured on tuning seeds 100..139 against the previous posterior (pooled donors of any kind,
    Monte Carlo for binary prompts too), mean selected variance: +0.8% at 12 and +0.6% at 16 seeds
    per prompt (about 3 standard errors of the per-seed ratio), within +-0.2% at 4, 6.4, 8, 24 and 48.
    The remaining gap to the oracle at 12-48 seeds per prompt is the value of continuous prompts:
    the diagnostic above with true values for the continuous prompts only (previous posterior for the
    rest) recovers nearly all of it at 12 and 24 (0.969 and 1.005 of the oracle, seeds 100..119),
    with true values for the binary prompts only, under 1%. Smoothing a continuous prompt's own
    rewards (a Gaussian kernel) lowered the score at 8-24, and looking further ahead (up to 6 pulls,
    not just one past the flat part) changed it by under 1% at 8-24 for twice the decision time.

    The Monte Carlo uniforms are drawn once from ``base_seed`` and shared by all evaluations (common
    random numbers): decisions are deterministic, and arms are compared on the same noise.

    When screening (``screen_seeds`` > 0), an all-equal arm is screened until it has
    ``ceil(abandon_share * group_size)`` rewards (6 of a group of 8), not just
    ``min_seeds_before_abandon``, before it is abandoned. All-equal first rewards are also what the
    most valuable arms show: a pass / fail prompt with a rare outcome (rate near 1 / k) gives
    a plain group of k seeds little variance, but the selection from many explored seeds a balanced
    one, and such a prompt shows no rare outcome in 4 seeds far more often than in 6 (at rate 1/8:
    59% vs 45%). The breakdown of the gap to the oracle at 4 seeds per prompt (bench seeds
    100..119) showed it: the planner abandoned twice as many pass / fail prompts as the oracle (which
    pours seeds into them). Planner over oracle, abandonment at 4 -> at 6 equal rewards, tuning
    seeds 100..139 (mean of its two 20-seed halves): 0.923 -> 0.952 at 6.4 explored seeds per prompt,
    0.939 -> 0.968 at 8; seeds 100..119: 0.904 -> 0.899 at 4, 0.960 -> 0.998 at 12, 0.956 -> 0.997
    at 16 (8 equal rewards: 0.870, 0.939, 0.971, 1.004, 1.004 at 4 / 6.4 / 8 / 12 / 16, 5: 0.902,
    0.945, 0.964, 0.982, 0.984). Abandoning at 3 was worse
    everywhere (0.864 at 4), and a threshold following the budget per prompt (estimated online)
    did worse than the fixed one at 6.4 and 8. Without screening the threshold stays
    ``min_seeds_before_abandon``: an all-equal arm past it would be left to the value estimate,
    which rarely pulls it again, and constant prompts would stay in the batch.

    A prompt with fewer than k explored rewards, all equal, is selected as k fresh seeds
    (``_select``): its equal rewards are the prompt's common outcome, and a group holding them has
    less expected variance than a fresh one (pass / fail at rate p < 1/2, four known fails in a group
    of eight: 0.042 vs 0.079 at p = 0.1). Where explored rollouts would be trained on (the runtime's
    fresh mode) this costs those rollouts again. At budgets near 4 explored seeds per prompt the
    planner stays under 0.95 of the oracle, which knows constant prompts without exploring them
    (docs/measurements.md, "The exploration planner").
    """

    def __init__(self, config: PlannerConfig, prompt_ids: Sequence[PromptId],
                 reserve: Sequence[PromptId] = (), start_s: float = 0.0) -> None:
        super().__init__(config, prompt_ids, reserve, start_s)
        self._donors = DonorPool()
        self._prior = PopulationPrior(config.prior) if config.posterior == "population" else None
        self._row_of: dict[PromptId, int] = {}
        self._uniforms = np.empty((0, 4, config.mc_draws))

    def _abandon_after(self) -> int:
        cfg = self.config
        if not self._screens():
            return cfg.min_seeds_before_abandon
        return max(cfg.min_seeds_before_abandon, math.ceil(cfg.abandon_share * cfg.group_size - 1e-9))

    def _select(self, arm: _Arm, k: int) -> list[int]:
        """Fewer than k explored rewards, all equal: k fresh seeds (class docstring); else the default."""
        s = len(arm.rewards)
        if 0 < s < k and arm.sorted_rewards[-1] - arm.sorted_rewards[0] <= self.config.abandon_tolerance:
            return self._peek_fresh(arm, k)
        return super()._select(arm, k)

    def _on_observed(self, arm: _Arm, reward: float) -> None:
        row = self._row_of.setdefault(arm.prompt_id, len(self._row_of))
        self._donors.append(row, reward)
        if self._prior is not None:
            self._prior.set_rewards(row, np.asarray(arm.rewards))

    def _score(self, slot: int, arm: _Arm) -> float:
        s, planned = len(arm.rewards), arm.planned
        if s + planned == 0 or self._screening(arm):
            return math.inf
        if s == 0 and self._donors.rows == 0:
            return 0.0
        _, gains = self._lookahead(arm, planned)
        return best_rate(gains, self.config.seeds_per_pull)[0] / self._cost.predict(1)

    def _lookahead(self, arm: _Arm, planned: int) -> tuple[float, np.ndarray]:
        """(E[V now], expected gains of 1..H more pulls) under the predictive (class docstring)."""
        cfg = self.config
        s = len(arm.rewards)
        k, m = cfg.group_size, cfg.seeds_per_pull
        horizons = horizon_pulls(s, planned, k, m, cfg.max_lookahead_pulls)
        two_values = _two_values(arm.sorted_rewards) if cfg.binary_prior > 0 else None
        if two_values is not None:
            lo, hi = two_values
            highs = s - bisect.bisect_left(arm.sorted_rewards, hi)
            return binary_lookahead_gains(highs, s - highs, hi - lo, cfg.binary_prior, cfg.binary_prior,
                                          k, planned, m, horizons)
        u_mix, u_pick, u_donor, u_value = self._columns(draws_needed(s, planned, k, m, horizons))
        explored = np.asarray(arm.sorted_rewards)
        base = self._base_draws(arm, explored, u_pick, u_donor, u_value)
        draws = shrunk_predictive_draws(explored, base, cfg.prior_strength, u_mix, u_pick)
        return lookahead_gains(explored, draws, k, planned, m, horizons)

    def _base_draws(self, arm: _Arm, explored: np.ndarray, u_pick: np.ndarray, u_donor: np.ndarray,
                    u_value: np.ndarray) -> np.ndarray:
        """Draws from the base measure (see the class docstring); the pooled donors when the population
        prior has none, and the prompt's own rewards when no other prompt has been explored yet."""
        row = self._row_of.get(arm.prompt_id)
        kind = is_continuous(explored) if self.config.kind_donors and explored.shape[0] >= 3 else None
        if self._prior is not None:
            weights = self._prior.donor_weights(self._prior.bin_counts(explored), row)
            if weights is not None and kind is not None:
                same = weights * (self._donors.kinds(weights.size) == kind)
                weights = same / same.sum() if same.sum() > 0 else weights
            if weights is not None:
                return self._prior.draw(weights, u_donor, u_value)
        draws = self._donors.draw(u_donor[:, 0], u_value, exclude=row, continuous=kind)
        if draws is None:  # the only explored prompt: nothing to borrow from
            s = explored.shape[0]
            return explored[np.minimum((u_pick * s).astype(np.int64), s - 1)]
        return draws

    def _columns(self, width: int) -> tuple[np.ndarray, ...]:
        """Four (D, width) uniforms; regenerated column-major (column first in memory) so a column's
        values never change when more columns are needed: the common random numbers hold across widths."""
        if self._uniforms.shape[0] < width:
            rng = np.random.default_rng([self.config.base_seed, 0x5EED])
            grown = max(width, 2 * self._uniforms.shape[0], 16)
            self._uniforms = rng.random((grown, 4, self.config.mc_draws))
        return tuple(self._uniforms[:width, i].T for i in range(4))


def _two_values(sorted_values: list[float]) -> tuple[float, float] | None:
    """(low, high) when at least three rewards take exactly two distinct values, else None."""
    if len(sorted_values) < 3:
        return None
    lo, hi = sorted_values[0], sorted_values[-1]
    if lo == hi:
        return None
    i = bisect.bisect_right(sorted_values, lo)
    return (lo, hi) if sorted_values[i] == hi else None


class UniformPlanner(ExplorationPlanner):
    """Round robin with the same budget: the arm with the fewest explored + planned seeds, lowest
    slot first. Abandonment and replacement follow the same config as the bandit's."""

    def _score(self, slot: int, arm: _Arm) -> float:
        return -float(len(arm.rewards) + arm.planned)


class RewardDistribution(Protocol):
    """What the oracle knows about a prompt: its true reward distribution."""

    @property
    def variance(self) -> float: ...

    def sample(self, rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray: ...


class OraclePlanner(ExplorationPlanner):
    """Knows every prompt's true reward distribution (a benchmark reference, not deployable).

    Index = the exact look-ahead gain rate (as the bandit's) with draws from the true distribution
    (``oracle_draws`` Monte Carlo rows, fresh per evaluation). Prompts with zero true variance are
    abandoned at no cost before anything is explored (and replaced when configured); the oracle
    never spends seeds to find out.
    """

    def __init__(self, config: PlannerConfig, prompt_ids: Sequence[PromptId],
                 distributions: Mapping[PromptId, RewardDistribution], reserve: Sequence[PromptId] = (),
                 start_s: float = 0.0, oracle_draws: int = 1024) -> None:
        missing = [p for p in list(prompt_ids) + list(reserve) if p not in distributions]
        if missing:
            raise ValueError(f"distributions missing for prompts {missing[:5]}")
        super().__init__(config, prompt_ids, reserve, start_s)
        self._dists = distributions
        self._oracle_draws = oracle_draws
        self._rng = np.random.default_rng([config.base_seed, 0x0AC1E])
        for pid in list(self._slots):
            self._abandon_if_constant(self._arms[pid])

    def _on_new_arm(self, arm: _Arm) -> None:
        self._abandon_if_constant(arm)

    def _screens(self) -> bool:
        return False  # knows zero-variance prompts without exploring

    def _abandon_if_constant(self, arm: _Arm) -> None:
        if self.config.abandon_zero_variance and self._dists[arm.prompt_id].variance <= 0:
            self._abandon(arm, "true variance 0 (oracle)")

    def _score(self, slot: int, arm: _Arm) -> float:
        cfg = self.config
        k, m = cfg.group_size, cfg.seeds_per_pull
        s, planned = len(arm.rewards), arm.planned
        horizons = horizon_pulls(s, planned, k, m, cfg.max_lookahead_pulls)
        width = draws_needed(s, planned, k, m, horizons)
        draws = np.asarray(self._dists[arm.prompt_id].sample(self._rng, (self._oracle_draws, width)), dtype=float)
        rate = lookahead_gain_rate(np.asarray(arm.sorted_rewards), draws, k, planned, m, horizons)
        return rate / self._cost.predict(1)


def iter_seeds(pulls: Iterable[Pull]) -> Iterator[tuple[PromptId, int]]:
    """(prompt, seed) pairs of a sequence of pulls (test and bench helper)."""
    for pull in pulls:
        for seed in pull.seeds:
            yield pull.prompt_id, seed
