"""The coordinator loop on Ray actors reproduces the in-process loop exactly."""
import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from roll_spotlight.runtime.coordinator import Coordinator  # noqa: E402
from roll_spotlight.runtime.ray_backend import RayBackend, RayClusterConfig  # noqa: E402
from roll_spotlight.training.loop import run_training  # noqa: E402
from roll_spotlight.training.metrics import read_metrics  # noqa: E402
from tests.runtime_helpers import random_policy, save_random_policy, tiny_config  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_cluster():
    from roll_spotlight.runtime.ray_backend import init_ray

    init_ray(RayClusterConfig(num_cpus=2, ondemand_workers=2))
    yield
    ray.shutdown()


def test_ray_backend_matches_local(tmp_path, ray_cluster):
    torch.set_num_threads(1)
    cfg = tiny_config()
    path = save_random_policy(cfg, tmp_path / "policy.pt")
    local = run_training(cfg, tmp_path / "local", policy=random_policy(cfg), progress=False)
    backend = RayBackend(cfg, path, RayClusterConfig(ondemand_workers=2))
    try:
        result = Coordinator(cfg, backend, tmp_path / "ray", progress=False).run()
        stats = [ray.get(w.stats.remote()) for w in backend.workers.values()]
    finally:
        backend.close()
    assert np.array_equal(result.base.rewards, local.base.rewards)
    assert np.array_equal(result.final.rewards, local.final.rewards)
    rows = read_metrics(tmp_path / "ray")
    assert [r["reward_mean"] for r in rows[1:]] == [r["reward_mean"] for r in read_metrics(tmp_path / "local")[1:]]
    assert sum(s["completed"] for s in stats) == cfg.max_steps * cfg.rollout_batch_size * cfg.train.group_size
    assert all(s["weight_fetches"] >= 1 for s in stats if s["completed"])
    phases = {e["phase"] for e in result_timeline(tmp_path)}
    assert {"rollout", "reward", "train", "validate"} <= phases


def result_timeline(run_dir):
    import json

    return json.loads((run_dir / "ray" / "timeline.json").read_text())
