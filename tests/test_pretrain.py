"""Pretraining of the tiny base: the weight average, determinism and the cache key."""
from __future__ import annotations

from pathlib import Path

import torch

from roll_spotlight.config.strict import load_config
from roll_spotlight.models import load_tiny_policy
from roll_spotlight.training import pretrain as P
from roll_spotlight.config.run import RunConfig

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
    cfg, last = _cfg("pretrain.ema_decay=0.995"), _cfg("pretrain.ema_decay=0")
    assert P.base_key(cfg) != P.base_key(last)  # the averaging is part of what the cache is keyed on
    metas = [P.pretrain(c, tmp_path / f"{i}.pt", progress=False) for i, c in enumerate((cfg, cfg, last))]
    (a, _), (b, _), (c, _) = (load_tiny_policy(tmp_path / f"{i}.pt") for i in range(3))
    assert metas[0]["weights"] == "ema" and metas[2]["weights"] == "last"
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)


def test_schedule_sigmas_follow_the_samplers_shift():
    import numpy as np

    from roll_spotlight.flow_grpo import sigma_schedule
    from roll_spotlight.flow_grpo.schedule import shift_sigmas

    pc = _cfg("pretrain.sigma_sampling=schedule").pretrain
    sigmas = P._draw_sigmas(np.random.default_rng(0), pc, image_seq_len=256)
    assert sigmas.dtype == torch.float32 and sigmas.shape == (pc.batch_size,)
    draws = torch.cat([P._draw_sigmas(np.random.default_rng(s), pc, 256) for s in range(2000)])
    assert 0 < float(draws.min()) and float(draws.max()) <= 1
    # u uniform through the shift: P(sigma > shift(0.5)) = 1/2, and the sampler's own grid is the same shift
    assert abs(float((draws > shift_sigmas(torch.tensor(0.5), 256)).float().mean()) - 0.5) < 0.03
    grid = sigma_schedule(10, 256, shift_terminal=None)[:-1].double()
    torch.testing.assert_close(shift_sigmas(torch.linspace(1.0, 0.1, 10, dtype=torch.float64), 256), grid)
    logit_pc = _cfg("pretrain.sigma_sampling=logit_normal").pretrain
    logit = torch.cat([P._draw_sigmas(np.random.default_rng(s), logit_pc, 256) for s in range(2000)])
    assert float((logit > 0.9).float().mean()) < 0.05 < float((draws > 0.9).float().mean())


def test_base_key_covers_layout_sigmas_loss_floor_and_patch_size():
    plain = ["task.layout=free", "pretrain.sigma_sampling=logit_normal", "pretrain.loss_min_sigma=0.05"]
    keys = {P.base_key(_cfg(*plain, *o)) for o in ([], ["task.layout=slots"], ["pretrain.sigma_sampling=schedule"],
                                                   ["pretrain.loss_min_sigma=0.3"], ["model.patch_size=4"])}
    assert len(keys) == 5


def test_pretrain_tags_pick_the_pretraining_world_and_the_key():
    """`pretrain.tags` decides what the base sees (and its cache key); `task.tags` alone then does not."""
    import pytest

    from roll_spotlight.config.strict import ConfigError
    from roll_spotlight.tasks.shapes.spec import TAGS
    from roll_spotlight.training.prompt_pools import train_pool

    every = "pretrain.tags=[" + ",".join(TAGS) + "]"
    whole, narrow = _cfg("task.tags=null", "pretrain.tags=null"), _cfg("task.tags=[colors,counting]", "pretrain.tags=null")
    narrow_on_whole = _cfg("task.tags=[colors,counting]", every)
    assert P.base_key(narrow_on_whole) == P.base_key(whole) != P.base_key(narrow)
    assert train_pool(P.pretrain_task(narrow_on_whole)) == train_pool(whole.task)
    assert set(train_pool(P.pretrain_task(narrow)).tags) == {"colors", "counting"}
    assert set(train_pool(narrow_on_whole.task).tags) == {"colors", "counting"}  # RL still on the task's tags
    with pytest.raises(ConfigError, match="pretrain.tags"):
        _cfg("pretrain.tags=[colours]")
    with pytest.raises(ConfigError, match="task.tags"):
        _cfg("task.tags=[]")


def test_loss_floor_reweights_the_x0_error(monkeypatch):
    """With the floor at 1 the pretraining loss is the plain x_0 MSE."""
    import numpy as np

    from roll_spotlight.models import build_policy
    from roll_spotlight.training.prompt_pools import task_vocab, train_pool

    torch.manual_seed(0)
    cfg = _cfg("pretrain.loss_min_sigma=1.0", "pretrain.learning_rate=1e-12")
    policy = build_policy(cfg.model, vocab=task_vocab(cfg.task))
    pool = train_pool(cfg.task)
    seen = {}
    velocity = policy.velocity

    def spy(xt, sigma, cond):
        out = velocity(xt, sigma, cond)
        seen.update(xt=xt, sigma=sigma, v=out)
        return out

    monkeypatch.setattr(policy, "velocity", spy)
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)
    loss = P._pretrain_step(policy, opt, pool, np.random.default_rng(3), cfg, step=0)
    s = seen["sigma"].view(-1, 1, 1)
    x0_hat = (seen["xt"] - s * seen["v"]).detach()
    rng = np.random.default_rng(3)  # replay the draws to get x_0
    ids = rng.integers(0, len(pool), size=cfg.pretrain.batch_size)
    seeds = rng.integers(0, 2**31 - 1, size=cfg.pretrain.batch_size)
    x0 = policy.encode_images(P._render_batch(pool, ids, seeds, cfg.model.image_size, cfg.task.layout))
    assert abs(loss - float(((x0_hat - x0) ** 2).mean())) < 1e-5
