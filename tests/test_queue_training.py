"""Training micro-batches through the queue (`spot.training_phase`): the update's micro-batches are
pulled by the trainer and by rollout workers, spot ones included, and the update must equal the
one-trainer update up to float summation order.

Tolerance (stated once, used by every comparison below): gradients and updated weights within
rtol 1e-5, atol 1e-7 of the one-trainer update; bit-identical when one sum covers every
micro-batch in plan order, and independent of the order in which sums arrive.

Tier 1: the micro-batch plan, sums, combination and the config's start-up rules. Tier 3: a Ray
update with a trainer, an on-demand and spot rollout workers, with a notice mid-sum and a kill
without notice injected deterministically (`worker.faults`).
"""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch

from roll_spotlight.config.strict import ConfigError
from roll_spotlight.training.grpo import FlowGRPOTrainer, ScoredBatch
from roll_spotlight.dispatch.requests import plan_micro_batches
from roll_spotlight.training.micro_batches import GradientSum, TrainWork, combine, compute_sum
from tests.runtime_helpers import denoise_lease, random_policy, tiny_config

RTOL, ATOL = 1e-5, 1e-7
LORA = ("train.use_lora=true", "train.lora.rank=4", "train.lora.alpha=8.0")


def lora_config(*extra: str):
    return tiny_config(*LORA, "rollout_batch_size=4", "train.micro_batch_size=2", *extra)


def scored_batch(cfg, policy, seed: int = 0) -> ScoredBatch:
    """A real batch: rollouts of the config's first iteration by `policy`, rewarded by its reward."""
    from roll_spotlight.runtime.coordinator import iteration_specs
    from roll_spotlight.worker.engine import RolloutEngine, stack_outputs
    from roll_spotlight.dispatch.requests import Lease, Request
    from roll_spotlight.rewards.configured import configured_reward
    from roll_spotlight.training.prompt_pools import train_pool
    from roll_spotlight.flow_grpo import sigma_schedule

    specs = iteration_specs(cfg, train_pool(cfg.task), 1, 0)
    executor = RolloutEngine(policy)
    outputs = [denoise_lease(executor, Lease(i, Request.from_spec(i, s), "w", float("inf"), None, 1)).output
               for i, s in enumerate(specs)]
    rewards = np.asarray(configured_reward(cfg.reward)(np.stack([o.image for o in outputs]),
                                                       [s.prompt for s in specs]).rewards)
    if np.all(rewards == rewards[0]):  # a batch with nothing to train on tests nothing
        rewards = rewards + np.arange(len(rewards)) % 3 * 0.1
    s = cfg.sampling
    traj = stack_outputs(outputs, sigma_schedule(s.num_steps, policy.image_seq_len), s.noise_level, s.kind)
    g = cfg.train.group_size
    return ScoredBatch(traj, [sp.prompt for sp in specs], np.repeat(np.arange(len(specs) // g), g), rewards,
                       s.noise_level, s.kind)


def trainer_and_work(cfg, seed: int = 0):
    from roll_spotlight.dispatch.requests import Schedule
    from roll_spotlight.worker.policy_source import policy_setup, prepare_policy

    policy = prepare_policy(random_policy(cfg, seed), policy_setup(cfg))
    trainer = FlowGRPOTrainer(policy, cfg.train)
    batch = scored_batch(cfg, policy)
    adv, local, norm, steps, _ = trainer._plan(batch)
    plan = plan_micro_batches(local, steps, cfg.train.micro_batch_size)
    s = cfg.sampling
    return trainer, TrainWork(0, batch, adv, norm, tuple(plan), cfg.train, Schedule(s.num_steps, s.noise_level))


@pytest.fixture(scope="module")
def update():
    """(trainer, work) of one LoRA update of the tiny model; tests leave its weights unchanged."""
    return trainer_and_work(lora_config())


def named_trained(trainer) -> dict:
    ids = {id(p) for p in trainer.params}
    return {n: p for n, p in trainer.policy.named_parameters() if id(p) in ids}


# ---------------------------------------------------------------------------------------------
# Tier 1


def test_the_plan_is_chunk_major_and_covers_every_kept_row_at_every_step():
    plan = plan_micro_batches(np.array([0, 2, 3, 7, 9]), [1, 4], 2)
    assert [(mb.index, mb.rows, mb.step) for mb in plan] == [
        (0, (0, 2), 1), (1, (0, 2), 4), (2, (3, 7), 1), (3, (3, 7), 4), (4, (9,), 1), (5, (9,), 4)]


def test_one_sum_over_the_whole_plan_is_the_local_update_bit_for_bit(update):
    trainer, work = update
    local = trainer.gradient(work.batch)
    params = named_trained(trainer)
    total = compute_sum(trainer.loss, params, work, work.micro_batches, "solo")
    grads, totals = combine([total], [mb.index for mb in work.micro_batches], torch.device("cpu"))
    assert set(grads) == set(local) and len(local) > 0
    assert all(torch.equal(grads[n], local[n]) for n in local)
    assert totals["loss"] != 0.0


def test_split_sums_equal_the_local_update_within_the_tolerance_in_any_arrival_order(update):
    trainer, work = update
    local = trainer.gradient(work.batch)
    params = named_trained(trainer)
    mbs = list(work.micro_batches)
    assert len(mbs) >= 3
    parts = [mbs[1::3], mbs[0::3], mbs[2::3]]  # interleaved, as pulls by three workers would be
    sums = [compute_sum(trainer.loss, params, work, part, f"w{i}") for i, part in enumerate(parts)]
    indices = [mb.index for mb in mbs]
    forward, _ = combine(sums, indices, torch.device("cpu"))
    backward, _ = combine(sums[::-1], indices, torch.device("cpu"))
    for name in local:
        assert torch.equal(forward[name], backward[name])  # the arrival order does not matter
        torch.testing.assert_close(forward[name], local[name], rtol=RTOL, atol=ATOL)


def test_combine_refuses_a_micro_batch_missing_or_counted_twice():
    one = GradientSum("a", (0, 1), {}, dict.fromkeys(("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean"), 0.0),
                      0.0)
    with pytest.raises(AssertionError, match="cover"):
        combine([one], [0, 1, 2], torch.device("cpu"))
    with pytest.raises(AssertionError, match="cover"):
        combine([one, dataclasses.replace(one, indices=(1,))], [0, 1], torch.device("cpu"))


def test_a_sum_stops_where_it_is_told_and_reports_only_what_finished(update):
    trainer, work = update
    calls = []
    part = compute_sum(trainer.loss, named_trained(trainer), work, work.micro_batches[:3], "w",
                       should_stop=lambda: calls.append(1) or len(calls) >= 2)
    assert part.indices == (work.micro_batches[0].index, work.micro_batches[1].index)
    assert all(p.grad is None for p in trainer.params)  # scratch space left clean


@pytest.mark.parametrize("override, needle", [
    (("spot.training_phase=train",), "train.use_lora is off"),
    ((*LORA, "spot.training_phase=train", "train.inner_epochs=2"), "train.inner_epochs=2"),
    ((*LORA, "spot.training_phase=train", "train.sharding=fsdp"), "train.sharding=fsdp"),
    (("spot.training_phase=sometimes",), "spot.training_phase"),
])
def test_spot_training_that_cannot_run_fails_at_start_up_naming_the_key(override, needle):
    with pytest.raises(ConfigError, match="spot.training_phase") as err:
        tiny_config("spot.enabled=true", *override)
    assert needle in str(err.value)


def test_spot_workers_train_by_default_wherever_the_run_can():
    assert tiny_config("spot.enabled=true", *LORA).spot_trains()
    assert tiny_config("spot.enabled=true", *LORA, "spot.training_phase=auto").spot_trains()
    assert not tiny_config("spot.enabled=true").spot_trains()  # full fine-tuning: the trainer alone
    assert not tiny_config("spot.enabled=true", "spot.training_phase=auto").spot_trains()
    assert not tiny_config("spot.enabled=true", *LORA, "spot.training_phase=explore").spot_trains()
    assert not tiny_config(*LORA).spot_trains()  # no spot workers at all


# ---------------------------------------------------------------------------------------------
# Tier 3: one update on Ray, with a notice, a kill without notice and a late report


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from roll_spotlight.runtime.ray_backend import RayClusterConfig, init_ray

    init_ray(RayClusterConfig(num_cpus=2, ondemand_workers=1, spot_pool_slots=4))
    yield ray
    ray.shutdown()


def _reference_step(cfg, work):
    """The one-trainer update of the same batch from the same weights: its adapters after the step."""
    from roll_spotlight.worker.policy_source import policy_setup, prepare_policy

    policy = prepare_policy(random_policy(cfg), policy_setup(cfg))
    trainer = FlowGRPOTrainer(policy, cfg.train)
    metrics = trainer.step(work.batch).metrics
    return policy.published_state(), metrics


@pytest.mark.ray
@pytest.mark.slow
def test_an_update_across_a_notice_a_kill_and_a_late_report_equals_the_one_trainer_update(tmp_path, ray_cluster):
    """Three spot workers each park after their first micro-batch (holding a second lease): one
    gets a notice (reports its finished micro-batch, hands the other back), one is killed without
    notice (its leases are requeued, its sum dies), one is declared lost while alive and reports
    late (refused). An on-demand worker started afterwards computes the rest."""
    import ray

    from roll_spotlight.dispatch import QueueConfig
    from roll_spotlight.dispatch.queue_actor import create_queue_actor
    from roll_spotlight.models import save_policy
    from roll_spotlight.worker.actor import RolloutWorker
    from roll_spotlight.worker.compute import ModelCompute
    from roll_spotlight.worker.faults import FaultPlan
    from roll_spotlight.worker.policy_source import policy_setup, policy_source, prepare_policy
    from roll_spotlight.runtime.queue_training import QueueTraining, create_inbox
    from roll_spotlight.weights import WeightStore

    torch.set_num_threads(1)
    cfg = lora_config()
    _, work = trainer_and_work(cfg)
    expected, expected_metrics = _reference_step(cfg, work)

    policy = prepare_policy(random_policy(cfg), policy_setup(cfg))
    base = tmp_path / "base.pt"
    save_policy(random_policy(cfg), base)
    source = policy_source(cfg.model, str(base), policy_setup(cfg))
    queue = create_queue_actor(QueueConfig(pull_batch=2, lease_s=600.0))
    inbox = create_inbox(queue)
    store = WeightStore.create()
    store.publish(0, policy.published_state())

    def worker(name, **kwargs):
        handle = RolloutWorker.options(name=None).remote(name, source, queue, store, inbox=inbox, **kwargs)
        return handle, handle.serve.remote()  # the actors start side by side

    spot = {name: worker(name, faults=FaultPlan(hold_at_micro_batch=1)) for name in ("spot-a", "spot-b", "spot-c")}
    trainer = FlowGRPOTrainer(policy, cfg.train)
    gradients = QueueTraining(queue, inbox, ModelCompute(policy, version=0), pulls=False).update(0, work.schedule)
    result: dict = {}
    update = threading.Thread(target=lambda: result.update(done=trainer.step(work.batch, gradients)))
    update.start()
    for handle, _ in spot.values():
        assert ray.get(handle.wait_held.remote(120.0)), "a spot worker never reached its first micro-batch"
    a, b, c = (spot[n][0] for n in ("spot-a", "spot-b", "spot-c"))
    a.notify_preemption.remote(30.0)
    counters_a = ray.get(spot["spot-a"][1])  # serve() returns after the notice's report
    ray.kill(b, no_restart=True)
    ray.get(queue.worker_lost.remote("spot-b"))
    ray.get(queue.worker_lost.remote("spot-c"))  # thought dead, but alive: its report comes late
    c.stop.remote()
    counters_c = ray.get(spot["spot-c"][1])
    od, od_serving = worker("od-0", heartbeat_s=0.5)
    update.join(timeout=300)
    assert not update.is_alive(), "the update never finished"
    od.stop.remote()
    counters_od = ray.get(od_serving)

    m = len(work.micro_batches)
    assert counters_a["micro_batches"] == 1 and counters_a["micro_batches_released"] == 1
    assert counters_c["micro_batches"] == 0 and counters_c["micro_batches_refused"] == 1
    assert counters_od["micro_batches"] == m - 1  # everything else, b's two leases included
    done = result["done"]
    assert {w: n for w, (n, _) in done.contributions.by_worker.items()} == {"spot-a": 1, "od-0": m - 1}
    assert done.contributions.refused == 1 and ray.get(inbox.stats.remote())["reports_refused"] == 1
    for name, tensor in policy.published_state().items():
        torch.testing.assert_close(tensor, expected[name], rtol=RTOL, atol=ATOL)
    assert done.metrics["trained_samples"] == expected_metrics["trained_samples"]
    assert done.metrics["loss"] == pytest.approx(expected_metrics["loss"], rel=RTOL, abs=ATOL)


def test_the_training_split_counts_spot_and_on_demand_micro_batches_and_the_time_spot_saved():
    """The one split both hosts report (`runtime.update_report.split_training`): spot work is valued at
    the on-demand participants' measured rate (here 4/2 + 2/1 = 4 micro-batches/s)."""
    from roll_spotlight.runtime.update_report import split_training
    from roll_spotlight.training.micro_batches import Contributions

    by_worker = {"trainer": (4, 2.0), "actor_infer-0": (2, 1.0), "spot-z/a": (3, 9.0), "gen0/spot/sp0": (3, 1.0)}
    split = split_training(Contributions(by_worker, refused=1, wall_s=3.0), lambda w: w.startswith(("spot-", "gen")))
    assert split.metrics() == {"train/micro_batches": 12.0, "train/micro_batches_spot": 6.0,
                               "train/micro_batches_ondemand": 6.0, "train/micro_batches_trainer": 4.0,
                               "train/workers": 4.0, "train/spot_workers": 2.0, "train/spot_saved_s": 1.5,
                               "train/reports_refused": 1.0, "train/queue_phase_s": 3.0}
    assert split_training(Contributions({"trainer": (8, 0.0)}), lambda worker: False).spot_saved_s == 0.0


def test_an_update_with_nothing_to_train_on_asks_its_source_for_nothing(update):
    """Every group zero-std: the trainer skips the step before any micro-batch exists, so the
    source is never called and the result carries no contributions (no split to report)."""
    trainer, work = update
    calls = []
    flat = dataclasses.replace(work.batch, rewards=np.zeros(len(work.batch.rewards)))
    result = trainer.step(flat, source=calls.append)
    assert result.metrics["skipped"] == 1.0 and result.contributions is None and calls == []


def test_a_source_gives_the_update_its_gradient_and_says_who_computed_it(update):
    """`FlowGRPOTrainer.step(batch, source)`: the source's sums become the update, equal to the
    one-trainer update within the tolerance; the trainer writes its own parameters' gradients."""
    from roll_spotlight.training.micro_batches import Contributions, UpdateSums

    trainer, work = update
    cfg = lora_config()
    params = named_trained(trainer)
    mbs = list(work.micro_batches)
    sums = [compute_sum(trainer.loss, params, work, mbs[0::2], "a"), compute_sum(trainer.loss, params, work, mbs[1::2], "b")]
    reference, _ = trainer_and_work(cfg)
    want = reference.step(work.batch).metrics
    mine, _ = trainer_and_work(cfg)
    got = mine.step(work.batch, source=lambda plan: UpdateSums(tuple(sums), Contributions.of(sums, 0, 1.0)))
    assert got.contributions.by_worker.keys() == {"a", "b"}
    assert got.metrics["loss"] == pytest.approx(want["loss"], rel=RTOL, abs=ATOL)
    for name, tensor in mine.policy.published_state().items():
        torch.testing.assert_close(tensor, reference.policy.published_state()[name], rtol=RTOL, atol=ATOL)


def test_spot_workers_that_cannot_hold_the_trainers_memory_plan_fail_at_start_up():
    from roll_spotlight.startup import check_startup, memory_plan_of

    cfg = tiny_config("spot.enabled=true", *LORA)
    need = memory_plan_of(cfg).total_gib("trainer")
    small = tiny_config("spot.enabled=true", *LORA, f"model.gpu_memory_gb={need / 2}")
    with pytest.raises(ConfigError, match=r"spot.training_phase.*model.gpu_memory_gb"):
        check_startup(small)
    check_startup(tiny_config("spot.enabled=true", *LORA, f"model.gpu_memory_gb={need * 2}"))
    explore = tiny_config("spot.enabled=true", *LORA, "spot.training_phase=explore", f"model.gpu_memory_gb={need / 2}")
    with pytest.raises(ValueError, match="the trainer needs"):  # the trainer itself still does not fit
        check_startup(explore)
