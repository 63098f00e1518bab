"""FSDP2-sharded Flow-GRPO (`train.sharding: fsdp`): 2 gloo ranks on CPU, each holding half of every
parameter and a contiguous shard of the batch, update the tiny DiT as one unsharded rank does on the
whole batch; with and without LoRA, with the KL term on (a sharded frozen copy, or the adapters
disabled), two inner epochs (the second one uses the sharded AdamW state) and, without LoRA,
activation checkpointing.

The batch is test_grpo_dp's: a zero-std group inside rank 0's shard and a group split across the
boundary, so the ranks keep 1 and 7 samples; with micro-batches of 2, rank 0 runs 1 micro-batch of
its own and 3 zero-weight padding ones, so both ranks run the same FSDP collectives.
"""
from __future__ import annotations

import copy
import datetime
import os

import numpy as np
import pytest
import torch

from roll_spotlight.config.run import GRPOConfig
from roll_spotlight.models import LoraConfig
from roll_spotlight.training.grpo import FlowGRPOTrainer, GradientSync, ScoredBatch
from roll_spotlight.training.sampling import RolloutSpec, generate
from roll_spotlight.training.sharding import sharding_plan
from tests.runtime_helpers import end_rank, random_policy, tiny_config

GROUP = 4
REWARDS = np.array([0.5, 0.5, 0.5, 0.5,  0.1, 0.9, 0.3, 0.4,  0.8, 0.2, 0.6, 0.7])  # group 0: zero std
SHARDS = [(0, 5), (5, 12)]
PROMPTS = ["a red circle", "two blue squares", "a green triangle"]
CFG = GRPOConfig(group_size=GROUP, learning_rate=1e-3, clip_range=0.2, kl_beta=0.05, micro_batch_size=2,
                 inner_epochs=2)
SCENARIOS = ("full", "lora")


def _policy(scenario: str):
    """The tiny DiT (2 blocks): fully trained with checkpointing, or with perturbed LoRA adapters."""
    checkpointing = "true" if scenario == "full" else "false"
    policy = random_policy(tiny_config("model.num_layers=2", f"model.gradient_checkpointing={checkpointing}"))
    if scenario == "lora":
        torch.manual_seed(1)
        policy.enable_lora(LoraConfig(rank=4, alpha=8.0))
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad():  # B = 0 would make the adapted model the base and lora_A's gradient zero
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    return policy


def _problem(scenario: str):
    policy = _policy(scenario)
    prompts = [p for p in PROMPTS for _ in range(GROUP)]
    with torch.no_grad():
        traj = generate(policy, prompts, list(range(100, 112)), RolloutSpec(4, 0.7, "sde", (1, 3)))
    return policy, ScoredBatch(traj, prompts, np.repeat(np.arange(3), GROUP), REWARDS, 0.7, "sde")


def _shard(batch: ScoredBatch, lo: int, hi: int) -> ScoredBatch:
    return ScoredBatch(batch.trajectory.select(range(lo, hi)), batch.prompts[lo:hi], batch.group_ids,
                       batch.rewards, batch.noise_level, batch.kind)


def _rank_main(rank: int, world: int, tmp: str) -> None:
    import torch.distributed as dist

    from roll_spotlight.training.sharding import (
        ShardedGradients,
        full_published_state,
        full_tensors,
        is_sharded,
        shard_trainer,
    )

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg_init", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))  # a collective mismatch fails, not hangs 30 min
    try:
        out = {}
        for scenario in SCENARIOS:
            state, batch = torch.load(os.path.join(tmp, f"{scenario}.pt"), weights_only=False)
            policy = _policy(scenario)
            policy.load_state_dict(state)
            if rank > 0:  # a replica that starts elsewhere takes rank 0's weights before sharding
                with torch.no_grad():
                    next(p for p in policy.parameters() if p.requires_grad).add_(1.0)
            torch.manual_seed(0)
            trainer = FlowGRPOTrainer(policy, CFG)
            plan = shard_trainer(trainer, ShardedGradients())
            metrics = trainer.step(_shard(batch, *SHARDS[rank])).metrics
            out[scenario] = {"metrics": metrics, "plan": plan, "sharded": is_sharded(policy),
                             "weights": full_tensors(policy.state_dict()),
                             "published": full_published_state(policy),
                             "local_numel": sum(p.to_local().numel() for p in trainer.params)}
        torch.save(out, os.path.join(tmp, f"rank{rank}.pt"))
    except BaseException:
        dist.destroy_process_group()
        raise
    end_rank(dist)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per scenario: the one-rank reference, the starting weights; and both ranks' results."""
    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("grpo_fsdp")
    reference = {}
    for scenario in SCENARIOS:
        policy, batch = _problem(scenario)
        torch.save((policy.state_dict(), batch), tmp / f"{scenario}.pt")  # a checkpointing policy won't pickle
        start = {k: v.clone() for k, v in policy.state_dict().items()}
        mine = copy.deepcopy(policy)
        torch.manual_seed(0)
        trainer = FlowGRPOTrainer(mine, CFG)
        metrics = trainer.step(batch).metrics
        reference[scenario] = {"metrics": metrics, "start": start, "weights": mine.state_dict(),
                               "published": mine.published_state(),
                               "numel": sum(p.numel() for p in trainer.params)}
    mp.spawn(_rank_main, args=(2, str(tmp)), nprocs=2, join=True)
    ranks = [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return reference, ranks


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.dist
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_two_fsdp_ranks_update_like_one_rank_on_the_batch(runs, scenario):
    reference, ranks = runs
    want = reference[scenario]
    assert want["metrics"]["trained_samples"] == 8  # the zero-std group is dropped
    assert _max_diff(want["weights"], want["start"]) > 1e-4  # the update moved the weights
    for rank in ranks:
        got = rank[scenario]
        assert got["sharded"]
        assert _max_diff(got["weights"], want["weights"]) < 1e-5
        assert _max_diff(got["published"], want["published"]) < 1e-5
        for name in ("loss", "policy_loss", "kl", "grad_norm", "ratio_mean", "clip_fraction"):
            assert got["metrics"][name] == pytest.approx(want["metrics"][name], rel=1e-4, abs=1e-6)
    assert _max_diff(ranks[0][scenario]["weights"], ranks[1][scenario]["weights"]) == 0.0  # one model
    # each rank holds about half of the trained parameters (dim-0 shards, the last one may be short)
    held = [rank[scenario]["local_numel"] for rank in ranks]
    assert sum(held) == want["numel"] and max(held) < 0.6 * want["numel"]


@pytest.mark.dist
def test_lora_publishes_adapters_only_and_freezes_the_base(runs):
    reference, ranks = runs
    published = ranks[0]["lora"]["published"]
    assert published and all(".lora_A." in k or ".lora_B." in k for k in published)
    start, got = reference["lora"]["start"], ranks[0]["lora"]["weights"]
    base = [k for k in start if k not in published]
    assert base and all(torch.equal(start[k], got[k]) for k in base)  # frozen base untouched


# ---------------------------------------------------------------- one process: the plan and the hook


def test_plan_shards_each_block_then_the_transformer_and_the_trained_prompt_encoder():
    policy = random_policy(tiny_config("model.num_layers=3"))
    plan = sharding_plan(policy)
    assert plan.units == ("transformer.transformer_blocks.0", "transformer.transformer_blocks.1",
                          "transformer.transformer_blocks.2", "transformer", "prompt_encoder")
    assert plan.replicated == () and plan.param_dtype is None and plan.reduce_dtype is None  # fp32


def test_plan_with_lora_keeps_the_frozen_prompt_encoder_whole():
    policy = random_policy(tiny_config("model.num_layers=2"))
    policy.enable_lora(LoraConfig(rank=2, alpha=2.0))
    plan = sharding_plan(policy)
    assert plan.units[-1] == "transformer" and plan.replicated == ("prompt_encoder",)


def test_plan_for_bf16_computes_in_bf16_and_reduces_in_fp32():
    policy = random_policy(tiny_config("model.num_layers=1", "model.dtype=bfloat16"))
    plan = sharding_plan(policy)
    assert (plan.param_dtype, plan.reduce_dtype) == (torch.bfloat16, torch.float32)
    policy.enable_lora(LoraConfig(rank=2, alpha=2.0))  # float32 adapters keep computing in float32
    assert (sharding_plan(policy).param_dtype, sharding_plan(policy).reduce_dtype) == (None, torch.float32)


def test_plan_refuses_a_trained_parameter_outside_every_module():
    policy = random_policy(tiny_config("model.num_layers=1"))
    policy.scale = torch.nn.Parameter(torch.ones(1))
    with pytest.raises(ValueError, match=r"train.sharding=fsdp: parameters \['scale'\]"):
        sharding_plan(policy)


def test_unsharded_hooks_run_no_padding_micro_batches():
    assert GradientSync().micro_batches(3) == 3


def test_sharding_key_defaults_to_replicate():
    assert GRPOConfig().sharding == "replicate"
