"""SpotlightPipeline on real ROLL (tier 4, `-m roll`): config round trip through dacite, worker
names resolving to ROLL workers, the launcher, and two iterations of the CPU recipe on a local
Ray cluster with CPU-only ROLL clusters, compared with the in-process reference loop."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.runtime_helpers import denoise_lease

pytestmark = pytest.mark.roll

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "configs" / "roll"
ROLES = ("actor_train", "actor_infer", "reward")
# `++key=value` sets a key whether or not the recipe has it (`+` fails when it has, a bare key when
# it has not), so these overrides survive recipe edits.
TINY = ["max_steps=2", "eval_steps=0", "rollout_batch_size=2", "++train.group_size=4", "++base_pretrain.steps=5",
        "++base_pretrain.batch_size=8", "++base_pretrain.warmup_steps=1", "++base_pretrain.eval_samples=8",
        "++task.train_prompts=64", "++task.val_prompts=4", "++sampling.num_steps=4", "++sampling.sde_window=2",
        "++sampling.window_range=[0,2]", "++sampling.eval_num_steps=4", "++actor_infer.world_size=2"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("roll")
    mp = pytest.MonkeyPatch()
    mp.chdir(path)  # ROLL writes ./output/logs relative to the working directory
    mp.setenv("SPOTLIGHT_CACHE", str(path / "cache"))
    yield path
    mp.undo()


def _tiny_config(workdir: Path, *extra: str):
    from roll_spotlight.roll.spotlight_config import compose_mapping, from_mapping

    return from_mapping(compose_mapping(str(RECIPES), "tiny_shapes_roll", TINY + [f"output_dir={workdir}/out", *extra]))


def test_config_round_trip_through_dacite(workdir):
    from roll_spotlight.roll.spotlight_config import SpotlightConfig, from_mapping, to_mapping

    cfg = _tiny_config(workdir)
    again = from_mapping(to_mapping(cfg))
    assert isinstance(again, SpotlightConfig)
    assert again.sections == cfg.sections and again.to_run_config() == cfg.to_run_config()
    assert again.exploration == cfg.to_run_config().exploration  # the standalone host's section
    for role in ("actor_train", "actor_infer", "reward"):
        assert getattr(again, role).worker_cls == getattr(cfg, role).worker_cls
        assert getattr(again, role).world_size == getattr(cfg, role).world_size
    assert cfg.sequence_length == 1 and cfg.to_run_config().max_steps == 2


def test_unknown_spotlight_key_fails_although_dacite_is_lenient(workdir):
    from roll_spotlight.config.strict import ConfigError

    with pytest.raises(ConfigError, match="spot.max_wrokers"):
        _tiny_config(workdir, "+spot.max_wrokers=3")
    with pytest.raises(ConfigError, match="'trainer'.*actor_train"):  # dacite would drop the old role name
        _tiny_config(workdir, "+trainer.world_size=2")


def test_actor_infer_strategy_is_refused_before_rolls_assertion(workdir):
    """ROLL's BaseConfig asserts actor_infer.strategy_args names vllm/sglang; we say why first."""
    from roll_spotlight.config.strict import ConfigError

    with pytest.raises(ConfigError, match="actor_infer.strategy_args.*remove strategy_args"):
        _tiny_config(workdir, "+actor_infer.strategy_args.strategy_name=hf_infer")
    cfg = _tiny_config(workdir)
    assert cfg.actor_infer.strategy_args is None
    assert cfg.actor_train.worker_cls == "roll_spotlight.roll.workers.DiTTrainerWorker"


def test_more_trainer_ranks_than_samples_fail_at_parse_time_with_the_fix(workdir):
    from roll_spotlight.config.strict import ConfigError

    with pytest.raises(ConfigError, match=r"actor_train.world_size=9 exceeds the 8 samples.*fewer actor_train ranks"):
        _tiny_config(workdir, "actor_train.world_size=9")  # rollout_batch_size=2 x group_size=4
    assert _tiny_config(workdir, "actor_train.world_size=8").actor_train.world_size == 8


def test_worker_names_resolve_to_roll_workers(workdir):
    from roll.distributed.executor.worker import Worker
    from roll.distributed.scheduler.decorator import BIND_WORKER_METHOD_FLAG

    from roll_spotlight import plugins
    from roll_spotlight.roll import SpotlightPipeline

    cfg = _tiny_config(workdir)
    for name in ("dit_trainer", "dit_rollout", "dit_reward", *(getattr(cfg, r).worker_cls for r in ROLES)):
        cls = plugins.resolve("workers", name)
        assert issubclass(cls, Worker) and hasattr(cls.initialize, BIND_WORKER_METHOD_FLAG)
    assert plugins.resolve("pipelines", "spotlight") is SpotlightPipeline
    assert plugins.resolve("pipelines", "roll_spotlight.roll.pipeline.SpotlightPipeline") is SpotlightPipeline


def test_pipeline_refuses_a_config_parsed_by_another_launcher(workdir):
    """ROLL's own start scripts parse a recipe into their config classes (dropping our sections);
    the pipeline says which launcher to use instead of failing somewhere inside ROLL."""
    from roll_spotlight.config.strict import ConfigError
    from roll_spotlight.roll import SpotlightPipeline

    with pytest.raises(ConfigError, match="python -m roll_spotlight.launch"):
        SpotlightPipeline(object())


def test_launcher_check_mode(workdir, capsys):
    from roll_spotlight.launch import main

    assert main(["--config_path", str(RECIPES), "--config_name", "tiny_shapes_roll", "--check", "max_steps=3"]) == 0
    out = capsys.readouterr().out
    assert "tiny_shapes_roll.yaml: OK" in out and "warning" not in out
    assert main(["--config_path", str(RECIPES), "--config_name", "tiny_shapes_roll", "--check", "elastic.sp_degree=2",
                 "actor_infer.world_size=2"]) == 0
    assert "elastic.sp_degree=2: rollouts run in SP groups of 2 consecutive actor_infer ranks" in capsys.readouterr().out
    from roll_spotlight.config.strict import ConfigError

    with pytest.raises(ConfigError, match=r"actor_infer.world_size=2 must be a multiple of elastic.sp_degree=4"):
        _tiny_config(workdir, "elastic.sp_degree=4")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _run_like_the_reference(workdir: Path, name: str, pipeline_cls, *overrides: str) -> list[dict]:
    """Two iterations through SpotlightPipeline, then the in-process reference loop on the same
    run config: rollouts are pure functions of (weights, prompt, seed, schedule), so the curves
    must agree whoever ran each request. Returns the pipeline's metrics rows."""
    from roll_spotlight.startup import start_run

    cfg = _tiny_config(workdir, f"exp_name={name}", *overrides)
    pipeline = pipeline_cls(cfg)
    assert pipeline.actor_infer.world_size == 2 and pipeline.resource_manager.gpu_per_node == 0
    result = pipeline.run()
    rows = _rows(pipeline.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [r["weight_version"] for r in rows[1:]] == [1, 2]
    # in process (spot off: spot workers would put the reference on Ray, where this test's local
    # cluster has no on-demand resource); who runs a request does not change its output
    run_cfg = cfg.to_run_config()
    run_cfg = dataclasses.replace(run_cfg, spot=dataclasses.replace(run_cfg.spot, enabled=False))
    reference = start_run(run_cfg, workdir / f"{name}-reference", progress=False)
    for got, want in zip(rows[1:], _rows(workdir / f"{name}-reference" / "metrics.jsonl")[1:]):
        assert got["reward_mean"] == pytest.approx(want["reward_mean"], abs=1e-3)
        assert got["trained_samples"] == want["trained_samples"]
        assert got.get("explored_seeds") == want.get("explored_seeds")
    assert result.final.mean == pytest.approx(reference.final.mean, abs=1e-3)
    return rows


@pytest.fixture
def local_ray():
    """A fresh local Ray per run: ROLL names its cluster actors (actor_train-0, ...) in one namespace."""
    import ray

    ray.init(num_cpus=2, resources={"spot_gpu": 2}, include_dashboard=False)
    yield ray
    ray.shutdown()


def _spot_pipeline_cls():
    """SpotlightPipeline whose pool replays a market of one spot node that joins at once and stays."""
    from roll_spotlight.roll import SpotlightPipeline
    from roll_spotlight.worker.policy_source import policy_setup, policy_source
    from roll_spotlight.spot_pool.training_pool import spot_elastic, start_training_pool, training_market
    from roll_spotlight.spot import EventList, NodeEvent, Trace

    trace = Trace(name="one-node", kind="events", measures="running", provider="aws",
                  zones={"z": EventList((NodeEvent(0.0, "add", "a"),), 0.0, 1e6)}, gpu_type="V100")

    class OneSpotNode(SpotlightPipeline):
        def make_spot_pool(self, queue):
            self._check_spot(self.pipeline_config)
            spot, elastic = self.pipeline_config.spot, self.pipeline_config.elastic
            source = policy_source(self.run_config.model, self.base_path, policy_setup(self.run_config))
            return start_training_pool(spot, source, queue, self.store, ondemand_gpus=3,
                                       market=training_market(spot, trace), inbox=self.inbox,
                                       elastic=spot_elastic(self.run_config.model, elastic.sp_degree,
                                                            elastic.group_timeout_s, source))

    return OneSpotNode


@pytest.mark.slow
@pytest.mark.ray
def test_pull_queue_with_a_spot_worker_trains_like_the_reference(workdir, local_ray):
    rows = _run_like_the_reference(workdir, "pull_spot", _spot_pipeline_cls(), "dispatch.mode=pull",
                                   "spot.enabled=true", "exploration.mode=off")
    assert rows[2]["spot/nodes_started"] == 1 and rows[2]["spot/requests_failed"] == 0
    assert rows[2]["spot/duplicate_completions"] == 0


@pytest.mark.slow
@pytest.mark.ray
def test_static_dispatch_with_exploration_trains_like_the_reference(workdir, local_ray):
    from roll_spotlight.roll import SpotlightPipeline

    rows = _run_like_the_reference(workdir, "static_fresh", SpotlightPipeline, "dispatch.mode=static",
                                   "spot.enabled=false", "exploration.mode=fresh", "exploration.seeds_per_prompt=4",
                                   "exploration.seeds_per_pull=2")
    assert all(r["explored_seeds"] > 0 for r in rows[1:])


@pytest.mark.slow
@pytest.mark.ray
def test_pool_baseline_reaches_the_roll_trainer_like_the_reference(workdir, local_ray):
    """exploration.baseline=pool: the trainer cluster normalises by the explored pools as in process
    (rewards of both iterations and the final validation within 1e-3 of the in-process pool run;
    the pipeline's rows carry no grad_norm, tests/test_roll_baselines.py checks the strategy's)."""
    from roll_spotlight.roll import SpotlightPipeline

    rows = _run_like_the_reference(workdir, "static_pool", SpotlightPipeline, "dispatch.mode=static",
                                   "spot.enabled=false", "exploration.mode=fresh", "exploration.seeds_per_prompt=6",
                                   "exploration.seeds_per_pull=2", "+exploration.baseline=pool")
    assert all(r["explored_seeds"] > 0 for r in rows[1:])


@pytest.mark.slow
@pytest.mark.ray
def test_sp_groups_of_rollout_ranks_and_of_a_spot_node_train_like_the_reference(workdir, local_ray):
    """elastic.sp_degree=2: the two rollout ranks drain the queue as one SP group and the spot
    node's two workers (spot.gpus_per_node=2, both spot_gpu units) join one elastic SP group; the
    curve matches SP 1's reference."""
    rows = _run_like_the_reference(workdir, "pull_spot_sp2", _spot_pipeline_cls(), "dispatch.mode=pull",
                                   "spot.enabled=true", "exploration.mode=off", "elastic.sp_degree=2",
                                   "spot.gpus_per_node=2")
    assert rows[2]["spot/nodes_started"] == 1 and rows[2]["spot/requests_failed"] == 0
    assert rows[-1]["spot/regroups"] == 1 and rows[-1]["spot/newcomer_weights_same_node_peer"] == 1


@pytest.mark.slow
@pytest.mark.ray
def test_static_shares_go_to_sp_groups_and_train_like_the_reference(workdir, local_ray):
    from roll_spotlight.roll import SpotlightPipeline

    _run_like_the_reference(workdir, "static_sp2", SpotlightPipeline, "dispatch.mode=static", "spot.enabled=false",
                            "exploration.mode=off", "elastic.sp_degree=2")


# queue training (spot.training_phase): the update's micro-batches pulled by the actor_train rank,
# the actor_infer ranks and the spot workers; the tolerance is tests/test_queue_training.py's
# (3 prompts: iteration 1 of the tiny base has 2 groups with a reward spread, iteration 2 has 3)
SPOT_TRAINING = ("rollout_batch_size=3", "++train.use_lora=true", "++train.lora.rank=4", "++train.lora.alpha=8.0",
                 "++train.micro_batch_size=1", "dispatch.mode=pull", "spot.enabled=true", "++spot.training_phase=train",
                 "exploration.mode=off")


def _in_process_update(run_cfg, base_path: str, before: dict) -> dict:
    """The first update as the in-process trainer makes it (`TrainerCore`, every micro-batch
    here) from the adapters `before`, on iteration 1's rollouts and rewards: the adapters after."""
    import numpy as np

    from roll_spotlight.dispatch.requests import Lease, Request
    from roll_spotlight.models import load_tiny_policy
    from roll_spotlight.rewards.configured import configured_reward
    from roll_spotlight.runtime.coordinator import iteration_specs
    from roll_spotlight.worker.engine import RolloutEngine
    from roll_spotlight.worker.policy_source import policy_setup, prepare_policy
    from roll_spotlight.runtime.trainer_core import TrainerCore
    from roll_spotlight.training.prompt_pools import train_pool

    policy = prepare_policy(load_tiny_policy(base_path)[0], policy_setup(run_cfg))
    policy.load_published_state(before)
    specs = iteration_specs(run_cfg, train_pool(run_cfg.task), 1, 0)
    executor = RolloutEngine(policy)
    outputs = [denoise_lease(executor, Lease(i, Request.from_spec(i, s), "in-process", float("inf"), None, 1)).output
               for i, s in enumerate(specs)]
    prompts = [s.prompt for s in specs]
    rewards = configured_reward(run_cfg.reward)(np.stack([o.image for o in outputs]), prompts).rewards
    g = run_cfg.train.group_size
    core = TrainerCore(run_cfg, policy)
    core.train(outputs, prompts, np.repeat(np.arange(len(specs) // g), g), np.asarray(rewards, dtype=np.float64))
    return policy.published_state()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("sp", [1, 2])
def test_spot_workers_and_actor_infer_ranks_train_micro_batches_and_the_update_equals_in_process(workdir, local_ray,
                                                                                                  sp):
    """LoRA with spot.training_phase=train: each update's micro-batches go through the queue and
    the spot workers and the actor_infer ranks compute some (over two updates of 16 and 24
    micro-batches), nothing is refused or lost, and the first update equals the in-process update
    of the same batch from the same adapters within rtol 1e-5, atol 1e-7. At SP 2 the two
    actor_infer ranks and the spot node's two workers are one SP group each, training
    data-parallel."""
    import torch

    from tests.test_queue_training import ATOL, RTOL

    sp_groups = ("elastic.sp_degree=2", "spot.gpus_per_node=2") if sp == 2 else ()
    cfg = _tiny_config(workdir, f"exp_name=spot_train_sp{sp}", *SPOT_TRAINING, *sp_groups)
    run_cfg = cfg.to_run_config()
    assert run_cfg.spot_trains()
    pipeline = _spot_pipeline_cls()(cfg)
    assert pipeline.inbox is not None and pipeline.actor_infer.world_size == 2
    before = pipeline.store.fetch(0, copy=True)  # the trainer's adapters (version 0; the store keeps two)
    pipeline.run()
    after = pipeline.store.fetch(1, copy=True)
    rows = _rows(pipeline.run_dir / "metrics.jsonl")[1:]
    assert [r["weight_version"] for r in rows] == [1, 2]
    assert [r["train/micro_batches"] for r in rows] == [16, 24]  # kept samples x 2 trained steps

    def total(key: str) -> float:
        return sum(r[key] for r in rows)

    assert total("train/micro_batches") == total("train/micro_batches_spot") + total("train/micro_batches_ondemand")
    assert total("train/micro_batches_spot") > 0, "the spot worker trained micro-batches"
    assert total("train/micro_batches_ondemand") - total("train/micro_batches_trainer") > 0, \
        "the actor_infer ranks trained micro-batches"
    assert total("train/reports_refused") == 0 and rows[-1]["spot/requests_failed"] == 0
    assert max(r["train/spot_workers"] for r in rows) == 1  # one spot worker, or one SP group of two
    expected = _in_process_update(run_cfg, pipeline.base_path, before)
    assert set(after) == set(expected)
    assert any(not torch.equal(after[n], before[n]) for n in after), "the update changed the adapters"
    for name, tensor in expected.items():
        torch.testing.assert_close(after[name], tensor, rtol=RTOL, atol=ATOL)


def test_spot_training_asked_for_with_two_trainer_ranks_fails_at_parse_time_naming_the_keys(workdir):
    from roll_spotlight.config.strict import ConfigError

    with pytest.raises(ConfigError, match=r"spot.training_phase=train needs actor_train.world_size=1, got 2"):
        _tiny_config(workdir, *SPOT_TRAINING, "actor_train.world_size=2")
    cfg = _tiny_config(workdir, *[o for o in SPOT_TRAINING if "training_phase" not in o], "actor_train.world_size=2")
    assert cfg.to_run_config().spot.training_phase == "explore"  # auto: the spot workers explore
    assert "actor_train.world_size=2" in cfg.spot_training_summary()
