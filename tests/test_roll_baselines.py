"""exploration.baseline=pool through the ROLL host's ROLL-free parts (ROLL itself need not be
installed): the backend hands every trainer rank the whole batch's baselines, and the train strategy
a rank runs normalises advantages by them exactly as the in-process trainer does."""
from types import SimpleNamespace

import numpy as np
import pytest

from tests.runtime_helpers import random_policy, tiny_config


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class _TrainerCluster:
    """Stands in for ROLL's actor_train cluster: records what each ALL_TO_ALL argument holds."""

    world_size = 2

    def __init__(self):
        self.calls = []

    def train(self, *args, blocking):
        self.calls.append((args, blocking))
        return ["ref-0", "ref-1"]


@pytest.mark.parametrize("baselines", [None, np.array([[0.5, 0.2]] * 3 + [[0.1, 0.4]] * 3)])
def test_every_trainer_rank_gets_the_whole_batchs_baselines(baselines):
    from roll_spotlight.roll.cluster_backend import RollClusterBackend

    cluster = _TrainerCluster()
    backend = RollClusterBackend(SimpleNamespace(actor_train=cluster, reward=None, dispatch=None, tracker=None))
    rewards, group_ids = np.linspace(0, 1, 6), np.repeat([0, 1], 3)
    refs, _ = backend.start_train(list("abcdef"), list("uvwxyz"), group_ids, rewards, baselines)
    (outputs, prompts, ids, got_rewards, got_baselines), blocking = cluster.calls[0]
    assert refs == ["ref-0", "ref-1"] and blocking is False
    assert outputs == [list("abc"), list("def")] and prompts == [list("uvw"), list("xyz")]  # shards
    assert all(r is rewards for r in got_rewards) and all(i is group_ids for i in ids)  # the whole batch
    assert len(got_baselines) == cluster.world_size and all(b is baselines for b in got_baselines)


def _batch(cfg):
    """One iteration's rollouts of the tiny run, their rewards, group ids and a baseline per group."""
    from roll_spotlight.runtime.coordinator import iteration_specs
    from roll_spotlight.runtime.local import LocalBackend
    from roll_spotlight.training.prompt_pools import train_pool

    backend = LocalBackend(cfg, random_policy(cfg))
    specs = iteration_specs(cfg, train_pool(cfg.task), 1, 0)
    outputs = backend.rollouts(specs)
    rewards = np.asarray(backend.score(np.stack([o.image for o in outputs]), [s.prompt for s in specs]).rewards)
    g = cfg.train.group_size
    group_ids = np.repeat(np.arange(len(specs) // g), g)
    per_group = np.array([[rewards.mean() + 0.1 * k, 0.25 + 0.05 * k] for k in range(len(specs) // g)])
    return outputs, [s.prompt for s in specs], group_ids, rewards, per_group[group_ids]


def test_train_strategy_normalises_by_the_baselines_like_the_local_trainer():
    from roll_spotlight.roll.strategy import DiffusersTrainStrategy
    from roll_spotlight.runtime.trainer_core import TrainerCore

    cfg = tiny_config()
    outputs, prompts, group_ids, rewards, baselines = _batch(cfg)
    strategy = DiffusersTrainStrategy(TrainerCore(cfg, random_policy(cfg)))
    got = strategy.train(outputs, prompts, group_ids, rewards, baselines).metrics
    want = TrainerCore(cfg, random_policy(cfg)).train(outputs, prompts, group_ids, rewards, baselines).metrics
    own = TrainerCore(cfg, random_policy(cfg)).train(outputs, prompts, group_ids, rewards).metrics
    assert got == want and strategy.weight_version == 1
    assert got["grad_norm"] != own["grad_norm"]  # the baselines changed the update
