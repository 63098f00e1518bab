"""Pretraining of the tiny base: the weight average, determinism and the cache key."""
from __future__ import annotations

from pathlib import Path

import torch

from roll_spotlight.configuration import load_config
from roll_spotlight.models import load_tiny_policy
from roll_spotlight.training import pretrain as P
from roll_spotlight.training.config import RunConfig

REPO = Path(__file__).resolve().parents[1]
SMALL = ["pretrain.steps=3", "pretrain.batch_size=4", "pretrain.eval_samples=4", "pretrain.warmup_steps=1",
         "task.train_prompts=16", "task.val_prompts=8", "model.num_layers=1"]


def _cfg(*overrides: str) -> RunConfig:
    return load_config(RunConfig, REPO / "configs" / "tiny_shapes.yaml", [*SMALL, *overrides])


def test_update_average_warms_up_the_decay():
    live, avg = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    before = avg.weight.detach().clone()
    P._update_average(avg, live, decay=0.995, step=0)  # decay min(0.995, 1/10) = 0.1
    torch.testing.assert_close(avg.weight, 0.1 * before + 0.9 * live.weight.detach())
    for step in range(1, 5000):
        P._update_average(avg, live, decay=0.995, step=step)
    torch.testing.assert_close(avg.weight, live.weight.detach())


def test_pretrain_is_deterministic_and_saves_the_average(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    cfg, last = _cfg(), _cfg("pretrain.ema_decay=0")
    assert P.base_key(cfg) != P.base_key(last)  # the averaging is part of what the cache is keyed on
    metas = [P.pretrain(c, tmp_path / f"{i}.pt", progress=False) for i, c in enumerate((cfg, cfg, last))]
    (a, _), (b, _), (c, _) = (load_tiny_policy(tmp_path / f"{i}.pt") for i in range(3))
    assert metas[0]["weights"] == "ema" and metas[2]["weights"] == "last"
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)
