"""Exploration: seed selection, prompt screening (`screen`), the budgeted planner, rank monitoring, the adaptive budget.

Pure numpy (no torch, no Ray): the runtime wraps these policies.
"""
from roll_spotlight.exploration.adaptive import (
    AdaptiveBudget,
    AdaptiveConfig,
    RoundContrast,
    all_equal_probability,
    random_subset_variance,
    round_contrast,
)
from roll_spotlight.exploration.bandit import (
    BanditPlanner,
    OraclePlanner,
    PlannerConfig,
    PlannerSummary,
    POSTERIORS,
    Pull,
    UniformPlanner,
    seed_stream,
)
from roll_spotlight.exploration.budget import SeedCostModel, ExplorationBudget
from roll_spotlight.exploration.prior import DonorPool, PopulationPrior, PriorConfig
from roll_spotlight.exploration.rank import RankMonitor, RankReport, kendall_tau_b, spearman_rho
from roll_spotlight.exploration.select import (
    SELECTORS,
    get_selector,
    max_variance,
    select_best_worst_halves,
    select_max_variance,
    select_random,
    select_top,
)

__all__ = [
    "AdaptiveBudget",
    "AdaptiveConfig",
    "RoundContrast",
    "all_equal_probability",
    "random_subset_variance",
    "round_contrast",
    "BanditPlanner",
    "SeedCostModel",
    "DonorPool",
    "ExplorationBudget",
    "OraclePlanner",
    "PlannerConfig",
    "PlannerSummary",
    "POSTERIORS",
    "PopulationPrior",
    "PriorConfig",
    "Pull",
    "RankMonitor",
    "RankReport",
    "SELECTORS",
    "UniformPlanner",
    "get_selector",
    "kendall_tau_b",
    "max_variance",
    "seed_stream",
    "select_best_worst_halves",
    "select_max_variance",
    "select_random",
    "select_top",
    "spearman_rho",
]
