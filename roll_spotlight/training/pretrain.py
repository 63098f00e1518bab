"""Flow-matching pretraining of the tiny base model on rendered scenes.

RL needs a base policy that is mediocre but not hopeless: if it never draws the right scene, no
group has reward variance; if it always does, there is nothing to learn. The base is trained by
rectified flow matching (x_sigma = (1 - sigma) x0 + sigma eps, target velocity eps - x0, sigma from
a logit-normal) for a fixed number of steps, deterministically from `pretrain.seed`, and cached in
the user's cache directory under a hash of everything that determines it.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from roll_spotlight.config.strict import to_dict
from roll_spotlight.training.averaging import lerp_average
from roll_spotlight.tasks.shapes.spec import TAGS
from roll_spotlight.config.run import RunConfig, TaskConfig

log = logging.getLogger(__name__)
FORMAT_VERSION = 2   # 2: scene sizes by object count, x_0-predicting tiny model


def cache_dir() -> Path:
    """`$SPOTLIGHT_CACHE`, else `$XDG_CACHE_HOME/roll_spotlight`, else `~/.cache/roll_spotlight`."""
    if os.environ.get("SPOTLIGHT_CACHE"):
        return Path(os.environ["SPOTLIGHT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "roll_spotlight"


def pretrain_task(cfg: RunConfig) -> TaskConfig:
    """The task whose scenes the base is pretrained on: the run's, with `pretrain.tags` when set."""
    tags = cfg.task.tags if cfg.pretrain.tags is None else cfg.pretrain.tags
    return dataclasses.replace(cfg.task, tags=None if tags is not None and tuple(tags) == TAGS else tags)


def base_key(cfg: RunConfig) -> str:
    from roll_spotlight.training.prompt_pools import task_vocab

    task = pretrain_task(cfg)
    pretrain_keys = {k: v for k, v in to_dict(cfg.pretrain).items() if k != "tags"}  # tags: under task
    payload = {"model": to_dict(cfg.model), "pretrain": pretrain_keys,
               "task": {"prompt_seed": task.prompt_seed, "train_prompts": task.train_prompts,
                        "tags": None if task.tags is None else list(task.tags),
                        "vocab": list(task_vocab(task)), "layout": task.layout},
               "format": FORMAT_VERSION}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def base_path(cfg: RunConfig) -> Path:
    return cache_dir() / "base" / f"tiny-{base_key(cfg)}.pt"


def load_or_pretrain(cfg: RunConfig, *, progress: bool = True):
    """The cached base policy for `cfg`, pretraining it first when missing."""
    from roll_spotlight.config.strict import ConfigError
    from roll_spotlight.models import load_tiny_policy

    if cfg.model.preset != "tiny":
        raise ConfigError(f"model.preset={cfg.model.preset!r}: pretraining builds the tiny base only; "
                          "a real model starts from its checkpoint at model.path")
    path = base_path(cfg)
    if not path.is_file():
        pretrain(cfg, path, progress=progress)
    policy, extra = load_tiny_policy(path)
    return policy, extra | {"path": str(path)}


def _render_batch(pool, ids: np.ndarray, seeds: np.ndarray, size: int, style: str) -> torch.Tensor:
    from roll_spotlight.tasks.shapes import parse_prompt, render

    images = [render(parse_prompt(pool.texts[i]), int(s), size=size, style=style) for i, s in zip(ids, seeds)]
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255.0


def _lr_at(step: int, cfg) -> float:
    warm = min(1.0, (step + 1) / max(cfg.warmup_steps, 1))
    decay = 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
    return cfg.learning_rate * warm * (0.1 + 0.9 * decay)


def pretrain(cfg: RunConfig, path: Path, *, progress: bool = True) -> dict:
    """Train the tiny base model and save it to `path`; returns the saved metadata."""
    from tqdm import tqdm

    from roll_spotlight.models import build_policy, save_policy
    from roll_spotlight.training.prompt_pools import task_vocab, train_pool

    torch.manual_seed(cfg.pretrain.seed)
    policy = build_policy(cfg.model, vocab=task_vocab(cfg.task))
    pool = train_pool(pretrain_task(cfg))
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.pretrain.learning_rate, weight_decay=0.0)
    rng = np.random.default_rng(cfg.pretrain.seed)
    started = time.monotonic()
    bar = tqdm(range(cfg.pretrain.steps), desc="pretrain base", disable=not progress, unit="step")
    averaged = copy.deepcopy(policy) if cfg.pretrain.ema_decay > 0 else None
    ema = None
    for step in bar:
        loss = _pretrain_step(policy, opt, pool, rng, cfg, step)
        if averaged is not None:
            _update_average(averaged, policy, cfg.pretrain.ema_decay, step)
        ema = loss if ema is None else 0.98 * ema + 0.02 * loss
        bar.set_postfix(loss=f"{ema:.4f}")
    if averaged is not None:
        policy = averaged
    meta = {"steps": cfg.pretrain.steps, "final_loss_ema": ema, "seconds": time.monotonic() - started,
            "key": base_key(cfg), "weights": "ema" if averaged is not None else "last"}
    meta |= _base_quality(policy, cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_policy(policy, tmp, extra=meta)
    tmp.replace(path)
    log.info("pretrained base model saved to %s: %s", path, meta)
    return meta


def _update_average(averaged, policy, decay: float, step: int) -> None:
    """One step of the weight average of pretraining (`training.averaging.lerp_average`)."""
    lerp_average(averaged.parameters(), policy.parameters(), decay, step)


def _pretrain_step(policy, opt, pool, rng, cfg: RunConfig, step: int) -> float:
    pc = cfg.pretrain
    ids = rng.integers(0, len(pool), size=pc.batch_size)
    seeds = rng.integers(0, 2**31 - 1, size=pc.batch_size)
    x0 = policy.encode_images(_render_batch(pool, ids, seeds, cfg.model.image_size, cfg.task.layout))
    sigma = _draw_sigmas(rng, pc, policy.image_seq_len)
    eps = torch.from_numpy(rng.standard_normal(x0.shape)).float()
    s = sigma.view(-1, *([1] * (x0.dim() - 1)))
    xt = (1 - s) * x0 + s * eps
    cond = policy.encode_prompts([pool.texts[i] for i in ids])
    err = (policy.velocity(xt, sigma, cond) - (eps - x0)) ** 2
    if policy.cfg.prediction == "sample":
        # v_hat - v = (x_0 - x_0_hat) / sigma: cap that 1/sigma^2 weight at sigma = loss_min_sigma
        err = err * (s / s.clamp(min=pc.loss_min_sigma)) ** 2
    loss = err.mean()
    for group in opt.param_groups:
        group["lr"] = _lr_at(step, pc)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def _draw_sigmas(rng: np.random.Generator, pc, image_seq_len: int) -> torch.Tensor:
    """Training sigmas of one batch (see `PretrainConfig.sigma_sampling`)."""
    if pc.sigma_sampling == "schedule":
        from roll_spotlight.flow_grpo.schedule import shift_sigmas

        u = torch.from_numpy(1.0 - rng.random(pc.batch_size))  # (0, 1]
        return shift_sigmas(u, image_seq_len).float()
    return torch.sigmoid(torch.from_numpy(rng.standard_normal(pc.batch_size)).float())


def _base_quality(policy, cfg: RunConfig) -> dict:
    """Strict and partial accuracy of the base on a slice of the validation set (ODE sampling)."""
    from roll_spotlight.rewards import build_reward
    from roll_spotlight.training.evaluate import evaluate
    from roll_spotlight.training.prompt_pools import ValidationSet, validation_set

    val = validation_set(pretrain_task(cfg))
    n = min(cfg.pretrain.eval_samples, len(val.texts))
    val = ValidationSet(val.texts[:n], val.tags[:n], val.seeds[:n])
    result = evaluate(policy, val, build_reward("shapes", mode="partial"), cfg.sampling)
    return {"base_val_partial": result.mean, "base_val_strict": result.strict_accuracy, "base_eval_samples": n}
