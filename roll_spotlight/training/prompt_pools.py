"""Prompt sources for training and validation, deterministic by seed.

The validation set is a fixed list of (prompt, seed) pairs so that two evaluations of two policies
are paired sample by sample (the standard error of a difference is then the paired one).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from roll_spotlight.config.run import TaskConfig

VAL_SEED_BASE = 10_000_000


@dataclass(frozen=True)
class PromptPool:
    texts: tuple[str, ...]
    tags: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class ValidationSet:
    """Fixed (prompt, seed) pairs; seeds are disjoint from every training seed."""

    texts: tuple[str, ...]
    tags: tuple[str, ...]
    seeds: tuple[int, ...]


def task_vocab(cfg: TaskConfig) -> tuple[str, ...]:
    """The words of the shapes task (what the tiny model's prompt encoder knows); () for files."""
    if cfg.name != "shapes":
        return ()
    from roll_spotlight.tasks.shapes import VOCAB

    return tuple(VOCAB)


def _file_task(cfg: TaskConfig):
    from roll_spotlight.tasks.prompt_files import PromptFileTask

    return PromptFileTask(cfg.train_file, cfg.test_file, cfg.format)


def train_pool(cfg: TaskConfig) -> PromptPool:
    if cfg.name == "prompts":
        records = _file_task(cfg).train_records()
        return PromptPool(tuple(r.text for r in records), tuple(r.tag for r in records))
    from roll_spotlight.tasks.shapes import make_prompt_set

    prompts = make_prompt_set("train", cfg.train_prompts, cfg.prompt_seed, tags=cfg.tags)
    return PromptPool(tuple(p.text for p in prompts), tuple(p.tag for p in prompts))


def validation_set(cfg: TaskConfig) -> ValidationSet:
    if cfg.name == "prompts":
        records = _file_task(cfg).test_records()[:cfg.val_prompts]
        texts, tags = tuple(r.text for r in records), tuple(r.tag for r in records)
    else:
        from roll_spotlight.tasks.shapes import make_prompt_set

        prompts = make_prompt_set("val", cfg.val_prompts, cfg.prompt_seed + 1, tags=cfg.tags)
        texts, tags = tuple(p.text for p in prompts), tuple(p.tag for p in prompts)
    return ValidationSet(texts, tags, tuple(VAL_SEED_BASE + i for i in range(len(texts))))


def draw_prompt_ids(pool_size: int, n: int, *, seed: int, iteration: int, stream: int = 0) -> list[int]:
    """Prompts of one iteration: a deterministic function of (run seed, iteration); `stream` > 0
    draws independent extra prompts (the prompt screen's refills)."""
    rng = np.random.default_rng([seed, iteration, 0x5EED] + ([stream] if stream else []))
    return rng.choice(pool_size, size=n, replace=n > pool_size).tolist()


def draw_seeds(n: int, *, seed: int, iteration: int) -> list[int]:
    """Fresh rollout seeds for one iteration; below VAL_SEED_BASE so they never hit validation."""
    rng = np.random.default_rng([seed, iteration, 0xD1CE])
    return rng.integers(0, VAL_SEED_BASE, size=n).tolist()
