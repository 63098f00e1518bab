"""The coordinator loop on Ray actors reproduces the in-process loop exactly."""
import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from roll_spotlight.runtime.coordinator import Coordinator  # noqa: E402
from roll_spotlight.runtime.ray_backend import RayBackend, RayClusterConfig  # noqa: E402
from roll_spotlight.startup import start_run  # noqa: E402
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
    local = start_run(cfg, tmp_path / "local", policy=random_policy(cfg), progress=False)
    # one trainer thread, as the local run: results are bit-identical only at equal thread counts
    backend = RayBackend(cfg, path, RayClusterConfig(ondemand_workers=2, trainer_threads=1), run_dir=tmp_path / "ray")
    try:
        result = Coordinator(cfg, backend, tmp_path / "ray", progress=False).train()
        stats = [ray.get(w.stats.remote()) for w in backend.workers.values()]
        reward = ray.get(backend.reward.stats.remote())
    finally:
        backend.close()
    assert (reward["batches"], reward["repeats"]) == (cfg.max_steps, 0), "one batch id per iteration, none reused"
    assert (tmp_path / "ray" / "queue.log").is_file(), "the queue journals into the run directory"
    _assert_queue_survives_a_crash(backend.queue)
    assert np.array_equal(result.base.rewards, local.base.rewards)
    assert np.array_equal(result.final.rewards, local.final.rewards)
    rows = read_metrics(tmp_path / "ray")
    assert [r["reward_mean"] for r in rows[1:]] == [r["reward_mean"] for r in read_metrics(tmp_path / "local")[1:]]
    validations = 1 + cfg.max_steps // cfg.eval_steps  # the base's, then every eval_steps: on the workers too
    assert sum(s["completed"] for s in stats) == (cfg.max_steps * cfg.rollout_batch_size * cfg.train.group_size
                                                  + validations * cfg.task.val_prompts)
    assert all(s["weight_fetches"] >= 1 for s in stats if s["completed"])
    phases = {e["phase"] for e in result_timeline(tmp_path)}
    assert {"rollout", "reward", "train", "validate"} <= phases


def test_pool_baseline_reaches_the_ray_trainer(tmp_path, ray_cluster):
    """exploration.baseline=pool on Ray trains exactly as in process, and not as the selected baseline does.

    Fresh exploration runs on the critical path, so its pools (and the baselines) are the local run's."""
    torch.set_num_threads(1)
    explore = ["exploration.mode=fresh", "exploration.seeds_per_prompt=6", "exploration.seeds_per_pull=2",
               "exploration.min_seeds_before_abandon=2", "eval_steps=0"]
    cfg = tiny_config(*explore, "exploration.baseline=pool")
    path = save_random_policy(cfg, tmp_path / "policy.pt")
    start_run(cfg, tmp_path / "local", policy=random_policy(cfg), progress=False)
    selected = tiny_config(*explore, "exploration.baseline=selected")
    start_run(selected, tmp_path / "selected", policy=random_policy(selected), progress=False)
    backend = RayBackend(cfg, path, RayClusterConfig(ondemand_workers=2, trainer_threads=1), run_dir=tmp_path / "ray")
    try:
        Coordinator(cfg, backend, tmp_path / "ray", progress=False).train()
    finally:
        backend.close()
    norms = {name: [r["grad_norm"] for r in read_metrics(tmp_path / name)[1:]] for name in ("local", "selected", "ray")}
    assert len(norms["ray"]) == cfg.max_steps
    assert norms["ray"] == norms["local"]
    assert norms["ray"] != norms["selected"]


def result_timeline(run_dir):
    import json

    return json.loads((run_dir / "ray" / "timeline.json").read_text())


def _assert_queue_survives_a_crash(queue):
    """Ray restarts the journalled queue actor, which rebuilds the same queue from the run dir."""
    before = ray.get(queue.stats.remote())
    assert before.submitted > 0 and before.completed == before.submitted
    ray.kill(queue, no_restart=False)
    assert ray.get(queue.stats.remote()) == before


def test_reward_batch_ids_are_unique_and_name_iteration_and_phase():
    from types import SimpleNamespace

    from roll_spotlight.dispatch.requests import RequestKind
    from roll_spotlight.runtime.ray_backend import RewardBatchIds

    ids = RewardBatchIds()
    issued = []
    for it, kind, batches in [(1, RequestKind.ROLLOUT, 1), (2, RequestKind.EXPLORE, 3), (1, RequestKind.ROLLOUT, 1)]:
        ids.collected([SimpleNamespace(iteration=it, kind=kind)])
        issued += [ids.next() for _ in range(batches)]
    ids.collected([])  # nothing collected: the label stays
    issued.append(ids.next())
    assert issued == [(1, "rollout", 0), (2, "explore", 0), (2, "explore", 1), (2, "explore", 2),
                      (1, "rollout", 1), (1, "rollout", 2)]


def test_a_new_driver_starts_a_fresh_queue_journal(tmp_path):
    from roll_spotlight.runtime.ray_backend import fresh_queue_journal

    for name in ("queue.state", "queue.log", "queue.state.tmp", "config.yaml"):
        (tmp_path / name).write_text("x")
    assert fresh_queue_journal(tmp_path) == tmp_path / "queue"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"], "only the journal's files go"


def test_trainer_threads_take_the_cluster_cpus_unless_stale_exploration_overlaps_training():
    cluster = RayClusterConfig(num_cpus=4)
    assert [cluster.trainer_threads_for(m) for m in ("off", "fresh", "stale")] == [4, 4, 1]
    assert RayClusterConfig(trainer_threads=3).trainer_threads_for("stale") == 3
    with pytest.raises(ValueError, match="trainer_threads"):
        RayClusterConfig(trainer_threads=0)


def test_the_backend_starts_the_run_only_once_its_workers_and_reward_actors_are_up(monkeypatch, caplog):
    """As the spot pool waits for its initial fleet: iteration 1 starts on a loaded cluster (the
    simulator's time 0), not while the workers' processes still start (times the time-scale on
    emulated GPUs, with the spot trace's clock already running)."""
    import roll_spotlight.runtime.ray_backend as rb

    class Handle:
        def __init__(self, name):
            self.weight_version = self.stats = type("M", (), {"remote": staticmethod(lambda: name)})

    waited = []

    def wait(refs, num_returns, timeout):
        waited.append((sorted(refs), num_returns, timeout))
        return refs[:-1], refs[-1:]

    monkeypatch.setattr(rb.ray, "wait", wait)
    backend = object.__new__(RayBackend)
    backend.workers = {"ondemand-0": Handle("w0"), "ondemand-1": Handle("w1")}
    backend.rewards = [Handle("r0")]
    backend._wait_started(timeout_s=7.0)
    assert waited == [(["r0", "w0", "w1"], 3, 7.0)]
    assert "1 of 3 workers and reward actors were not up after 7 s" in caplog.text
