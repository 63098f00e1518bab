"""Data-parallel Flow-GRPO: 2 gloo ranks on CPU, each on a contiguous shard, equal 1 rank on the batch.

The batch has a zero-std group inside rank 0's shard (dropped by ``drop_zero_std``) and a group
split across the shard boundary, so the ranks keep 1 and 7 samples: averaging per-rank means
instead of the global mean would weight rank 0's single sample 1/2 instead of 1/8.
"""
from __future__ import annotations

import datetime
import os

import numpy as np
import pytest
import torch

from roll_spotlight.flow_grpo import group_advantages
from roll_spotlight.config.run import GRPOConfig
from roll_spotlight.training.grpo import AllReduceGradients, FlowGRPOTrainer, GradientSync, ScoredBatch
from tests.runtime_helpers import end_rank

GROUP = 4
REWARDS = np.array([0.5, 0.5, 0.5, 0.5,  0.1, 0.9, 0.3, 0.4,  0.8, 0.2, 0.6, 0.7])  # group 0: zero std
SHARDS = [(0, 5), (5, 12)]  # contiguous, uneven, group 1 split between the ranks
CFG = GRPOConfig(group_size=GROUP, learning_rate=1e-4, clip_range=0.2, kl_beta=0.01, micro_batch_size=4,
                 inner_epochs=2)


class LinearPolicy(torch.nn.Module):
    """The policy interface FlowGRPOTrainer uses (prompts -> conditioning, velocity), without
    diffusers: a word-embedding prompt encoder and a linear velocity over the flat latent. Its
    GEMMs are batch-size dependent in their rounding, like a DiT's."""

    latent_shape = (4, 4, 4)
    words = ("a", "red", "blue", "green", "circle", "two", "squares", "triangle")

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        dim = int(np.prod(self.latent_shape))
        self.embed = torch.nn.Embedding(len(self.words), 8)
        self.linear = torch.nn.Linear(dim + 8 + 1, dim)

    def trainable_parameters(self):
        return self.parameters()

    def encode_prompts(self, prompts: list[str]) -> torch.Tensor:
        ids = [torch.tensor([self.words.index(w) for w in p.split()]) for p in prompts]
        return torch.stack([self.embed(i).mean(0) for i in ids])

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        x = torch.cat([latents.flatten(1), cond, sigma[:, None]], dim=1)
        return torch.tanh(self.linear(x)).view_as(latents)


def _problem():
    """A random policy and a scored batch of 12 seeded rollouts (4 steps, 2 noised)."""
    from roll_spotlight.flow_grpo import SdeWindow, rollout, sigma_schedule

    policy = LinearPolicy()
    prompts = [p for p in ("a red circle", "two blue squares", "a green triangle") for _ in range(GROUP)]
    cond = policy.encode_prompts(prompts)
    traj = rollout(lambda x, s: policy.velocity(x, s, cond), list(range(100, 112)), sigma_schedule(4, 16),
                   policy.latent_shape, noise_level=0.7, kind="sde", window=SdeWindow(1, 3))
    return policy, ScoredBatch(traj, prompts, np.repeat(np.arange(3), GROUP), REWARDS, 0.7, "sde")


def _shard(batch: ScoredBatch, lo: int, hi: int, *, whole_rewards=None, whole_groups=None) -> ScoredBatch:
    return ScoredBatch(batch.trajectory.select(range(lo, hi)), batch.prompts[lo:hi],
                       batch.group_ids if whole_groups is None else whole_groups,
                       batch.rewards if whole_rewards is None else whole_rewards, batch.noise_level, batch.kind)


def _train(policy, batch: ScoredBatch, sync: GradientSync | None) -> dict:
    torch.manual_seed(0)
    metrics = FlowGRPOTrainer(policy, CFG, sync).step(batch).metrics
    return {"metrics": metrics, "weights": {k: v.clone() for k, v in policy.state_dict().items()}}


def _rank_main(rank: int, world: int, problem_path: str, init_file: str, out_dir: str) -> None:
    """One rank: the uneven contiguous shard, then identical shards (the batch twice over)."""
    import copy

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))  # a collective mismatch fails, not hangs 30 min
    try:
        policy, batch = torch.load(problem_path, weights_only=False)
        lo, hi = SHARDS[rank]
        mine = copy.deepcopy(policy)
        if rank > 0:  # a replica that starts elsewhere (e.g. a random adapter) takes rank 0's weights
            with torch.no_grad():
                mine.linear.weight.add_(1.0)
        sync = AllReduceGradients()
        sync.replicate(mine)
        sharded = _train(mine, _shard(batch, lo, hi), sync)
        twice = _shard(batch, 0, len(batch), whole_rewards=np.tile(batch.rewards, world),
                       whole_groups=np.tile(batch.group_ids, world))
        identical = _train(copy.deepcopy(policy), twice, AllReduceGradients())
        torch.save({"sharded": sharded, "identical": identical}, os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:
        dist.destroy_process_group()
        raise
    end_rank(dist)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The one-rank reference and both ranks' results of both scenarios."""
    import copy

    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("grpo_dp")
    policy, batch = _problem()
    torch.save((policy, batch), tmp / "problem.pt")
    reference = _train(copy.deepcopy(policy), batch, None)
    mp.spawn(_rank_main, args=(2, str(tmp / "problem.pt"), str(tmp / "pg_init"), str(tmp)), nprocs=2, join=True)
    ranks = [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return reference, ranks, policy


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.dist
def test_two_ranks_on_contiguous_shards_update_like_one_rank_on_the_batch(runs):
    reference, ranks, start = runs
    assert reference["metrics"]["trained_samples"] == 8  # the zero-std group is dropped
    assert _max_diff(reference["weights"], {k: v for k, v in start.state_dict().items()}) > 1e-5  # it moved
    for rank in ranks:
        got = rank["sharded"]
        assert _max_diff(got["weights"], reference["weights"]) < 1e-6
        for name in ("loss", "policy_loss", "kl", "grad_norm", "ratio_mean"):
            assert got["metrics"][name] == pytest.approx(reference["metrics"][name], rel=1e-5, abs=1e-6)
    assert _max_diff(ranks[0]["sharded"]["weights"], ranks[1]["sharded"]["weights"]) == 0.0  # replicas agree


@pytest.mark.dist
def test_two_ranks_on_identical_shards_give_the_same_loss_and_weights(runs):
    reference, ranks, _ = runs
    for rank in ranks:
        got = rank["identical"]
        assert got["metrics"]["trained_samples"] == 16
        assert got["metrics"]["loss"] == pytest.approx(reference["metrics"]["loss"], rel=1e-6, abs=1e-12)
        assert _max_diff(got["weights"], reference["weights"]) < 1e-6


def test_the_shards_keep_unequal_counts():
    """Guards the DP test's power: averaging per-rank means would weight rank 0's one kept sample
    by 1/2 instead of 1/8 (doing so moves the weights by 4e-4, not < 1e-6)."""
    groups = torch.as_tensor(np.repeat(np.arange(3), GROUP))
    adv = group_advantages(torch.as_tensor(REWARDS, dtype=torch.float32), groups)
    kept = np.flatnonzero(~adv.zero_std_mask.numpy())
    assert [int(((kept >= lo) & (kept < hi)).sum()) for lo, hi in SHARDS] == [1, 7]


def test_single_rank_hook_refuses_a_shard():
    batch = ScoredBatch(None, ["a"] * 3, np.zeros(4), np.arange(4.0), 0.7, "sde")
    assert len(batch) == 4 and batch.rows == 3
    with pytest.raises(ValueError, match="3 of 4 samples"):
        GradientSync().shard_offset(batch.rows, len(batch))


def test_all_reduce_hook_needs_a_process_group():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    with pytest.raises(ValueError, match="init_process_group"):
        AllReduceGradients()
