"""`DiffusersTrainStrategy` with `train.sharding: fsdp` on 2 gloo ranks (what a ROLL trainer rank
runs): the ranks start from rank 0's weights, rank 0 publishes whole tensors, and one update on
the ranks' shards of a batch of real rollouts publishes the weights the one-rank strategy
publishes on the whole batch; digests agree, and a checkpoint written by the sharded ranks
round-trips. The default `replicate` path is tests/test_grpo_dp.py and tests/test_roll_dp.py."""
from __future__ import annotations

import math
import datetime
import os

import numpy as np
import pytest
import torch

from tests.runtime_helpers import denoise_lease, end_rank, random_policy, tiny_config

pytestmark = pytest.mark.dist
OVERRIDES = ("model.num_layers=2", "train.micro_batch_size=2", "train.kl_beta=0.05")


class RecordingStore:
    """A weight store that keeps what is published, by version."""

    def __init__(self) -> None:
        self.versions: dict[int, dict[str, torch.Tensor]] = {}

    def publish(self, version: int, state: dict) -> None:
        self.versions[version] = {k: v.detach().clone() for k, v in state.items()}


def _batch(cfg):
    """Rollout outputs of one iteration from the seed-0 policy, and continuous rewards."""
    from roll_spotlight.dispatch.requests import Lease, Request
    from roll_spotlight.runtime.coordinator import iteration_specs
    from roll_spotlight.worker.engine import RolloutEngine
    from roll_spotlight.training.prompt_pools import train_pool

    specs = iteration_specs(cfg, train_pool(cfg.task), 1, weight_version=0)
    executor = RolloutEngine(random_policy(cfg))
    outputs = [denoise_lease(executor, Lease(0, Request.from_spec(i, s), "t", math.inf, None, 1)).output
               for i, s in enumerate(specs)]
    groups = np.repeat(np.arange(len(specs) // cfg.train.group_size), cfg.train.group_size)
    rewards = np.random.default_rng(3).uniform(size=len(specs))
    return outputs, [s.prompt for s in specs], groups, rewards


def _rank_main(rank: int, world: int, tmp: str) -> None:
    import torch.distributed as dist

    from roll_spotlight.roll.strategy import DiffusersTrainStrategy
    from roll_spotlight.runtime.trainer_core import TrainerCore
    from roll_spotlight.training.grpo import AllReduceGradients

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg_init", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))  # a collective mismatch fails, not hangs 30 min
    try:
        cfg = tiny_config(*OVERRIDES, "train.sharding=fsdp")
        store = RecordingStore() if rank == 0 else None
        outputs, prompts, groups, rewards = torch.load(os.path.join(tmp, "batch.pt"), weights_only=False)
        half = len(outputs) // 2
        lo, hi = (0, half) if rank == 0 else (half, len(outputs))
        # a rank that starts elsewhere takes rank 0's weights
        strategy = DiffusersTrainStrategy(TrainerCore(cfg, random_policy(cfg, seed=rank)), store, AllReduceGradients())
        metrics = strategy.train(outputs[lo:hi], prompts[lo:hi], groups, rewards).metrics
        digest = strategy.weights_digest()
        strategy.save(os.path.join(tmp, "ckpt.pt"))
        dist.barrier()  # rank 0 has written the file
        strategy.load(os.path.join(tmp, "ckpt.pt"))
        out = {"metrics": metrics, "digest": digest, "reloaded": strategy.weights_digest(),
               "sharded": strategy.sharded, "versions": None if store is None else store.versions}
        torch.save(out, os.path.join(tmp, f"rank{rank}.pt"))
    except BaseException:
        dist.destroy_process_group()
        raise
    end_rank(dist)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import torch.multiprocessing as mp

    from roll_spotlight.roll.strategy import DiffusersTrainStrategy
    from roll_spotlight.runtime.trainer_core import TrainerCore

    tmp = tmp_path_factory.mktemp("strategy_fsdp")
    cfg = tiny_config(*OVERRIDES)
    batch = _batch(cfg)
    torch.save(batch, tmp / "batch.pt")
    store = RecordingStore()
    one = DiffusersTrainStrategy(TrainerCore(cfg, random_policy(cfg)), store)
    metrics = one.train(*batch).metrics
    reference = {"metrics": metrics, "digest": one.weights_digest(), "versions": store.versions}
    mp.spawn(_rank_main, args=(2, str(tmp)), nprocs=2, join=True)
    ranks = [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return reference, ranks, torch.load(tmp / "ckpt.pt", weights_only=True)


def test_sharded_ranks_publish_what_one_rank_publishes(runs):
    reference, ranks, _ = runs
    assert all(rank["sharded"] for rank in ranks)
    assert reference["metrics"]["trained_samples"] > 0
    published = ranks[0]["versions"]
    assert sorted(published) == sorted(reference["versions"]) == [0, 1]
    for version in (0, 1):
        want, got = reference["versions"][version], published[version]
        assert got.keys() == want.keys()
        tolerance = 0.0 if version == 0 else 1e-5  # the base is rank 0's weights, bit for bit
        assert max(float((got[k] - want[k]).abs().max()) for k in want) <= tolerance
    assert max(float((reference["versions"][1][k] - reference["versions"][0][k]).abs().max())
               for k in published[0]) > 1e-4  # the update moved the weights
    for rank in ranks:
        for name in ("loss", "grad_norm", "kl"):
            assert rank["metrics"][name] == pytest.approx(reference["metrics"][name], rel=1e-4, abs=1e-6)


def test_sharded_ranks_agree_and_their_checkpoint_round_trips(runs):
    _, ranks, checkpoint = runs
    assert ranks[0]["digest"] == ranks[1]["digest"]
    assert all(rank["reloaded"] == rank["digest"] for rank in ranks)
    assert checkpoint["sharding"] == "fsdp" and checkpoint["weight_version"] == 1
    assert all(not hasattr(v, "to_local") for v in checkpoint["policy"].values())  # whole tensors
