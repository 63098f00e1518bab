"""Emulated GPUs (`worker.emulated`): the live runtime with every compute phase waiting its
calibrated duration.

Tier 1: stand-in rollouts commit and resume like real ones (a resume from the committed state ends
where an uninterrupted rollout ends; a resume from a wrong state is caught), stand-in gradient sums
cover their micro-batches once, the recipe's shape reaches the cost model, and bad input stops
start-up naming the option. Tier 3 (`ray`, `slow`): a Qwen-Image recipe on emulated H100s with one
spot raylet that the trace starts, notices through the bridge and kills mid-run, spot training on.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from roll_spotlight.config.run import RunConfig
from roll_spotlight.config.strict import load_config
from roll_spotlight.dispatch.requests import Lease, Request, RequestKind, RequestSpec, Schedule
from roll_spotlight.worker.emulated import EmulatedCompute, Emulation, mismatched, workload_of
from tests.runtime_helpers import REPO, denoise_lease

RECIPE = REPO / "configs" / "qwen_image_ocr_512.yaml"


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    from roll_spotlight.tasks.ocr_prompts import write_ocr_prompts

    folder = tmp_path_factory.mktemp("prompts")
    write_ocr_prompts(folder, 200, 20, 0)
    return folder


def recipe(prompts: Path, *overrides: str) -> RunConfig:
    return load_config(RunConfig, RECIPE, [f"task.train_file={prompts / 'train.txt'}",
                                           f"task.test_file={prompts / 'test.txt'}", "task.val_prompts=8", *overrides])


def emulation(prompts: Path, time_scale: float = 1e6) -> Emulation:
    return Emulation("h100", workload_of(recipe(prompts)), time_scale)


def lease(seed: int = 7, version: int = 3, resume=None) -> Lease:
    spec = RequestSpec(1, "a sign that says 'ok'", seed, Schedule(10, 1.2, "sde", 0, 2), version, RequestKind.ROLLOUT, 4)
    return Lease(1, Request.from_spec(5, spec), "w", float("inf"), resume, 1)


def test_a_committed_stand_in_rollout_resumes_to_the_uninterrupted_output(prompts):
    compute = EmulatedCompute(emulation(prompts))
    whole = denoise_lease(compute, lease()).output
    calls = []
    stopped = denoise_lease(compute, lease(), should_stop=lambda: calls.append(1) or len(calls) == 4)
    assert stopped.state.step_index == 4 and stopped.steps_run == 4
    resumed = denoise_lease(compute, lease(resume=stopped.state)).output
    assert resumed.resumed_from == 4 and np.array_equal(resumed.latents, whole.latents)
    assert not mismatched(whole) and not mismatched(resumed)
    wrong = stopped.state.latent["latents"].copy()
    wrong[-1] += 1.0  # a resume from another state ends elsewhere, and the check sees it
    corrupt = denoise_lease(compute, lease(resume=type(stopped.state)(5, 4, {"latents": wrong}, 7, 3))).output
    assert mismatched(corrupt)


def test_stand_in_gradient_sums_cover_their_micro_batches_once(prompts):
    import torch

    from roll_spotlight.dispatch.requests import plan_micro_batches
    from roll_spotlight.training.micro_batches import TrainWork, combine

    plan = plan_micro_batches(list(range(8)), [0, 1], 2)
    work = TrainWork(0, None, torch.linspace(-1, 1, 8), 16, tuple(plan), recipe(prompts).train, Schedule(10, 1.2))
    compute = EmulatedCompute(emulation(prompts))
    ran, first = compute.gradient_sum(work, plan[:3], "a", lambda: False)
    _, second = compute.gradient_sum(work, plan[3:], "b", lambda: False)
    _, whole = compute.gradient_sum(work, plan, "c", lambda: False)
    split, _ = combine([second, first], [mb.index for mb in plan], torch.device("cpu"))
    alone, _ = combine([whole], [mb.index for mb in plan], torch.device("cpu"))
    assert ran == 3 and first.indices == (0, 1, 2)
    torch.testing.assert_close(split["adapters"], alone["adapters"])
    with pytest.raises(AssertionError, match="cover"):
        combine([first, whole], [mb.index for mb in plan], torch.device("cpu"))


def test_the_recipes_shape_reaches_the_cost_model(prompts):
    cfg = recipe(prompts, "model.image_size=1280")
    workload = workload_of(cfg)
    assert (workload.resolution, workload.num_steps, workload.cfg_forwards, workload.trained_steps) == (1280, 10, 2, 2)
    assert (workload.group_size, workload.prompts_per_iteration, workload.micro_batch_images) == (16, 32, 4)
    durations = workload.durations("h100")
    assert durations.denoise_step_s(4) < durations.denoise_step_s(1) < workload.durations("a100").denoise_step_s(1)


def test_the_simulator_and_the_emulated_workers_model_one_workload(prompts):
    from roll_spotlight.sim.workload import Workload
    from benchmarks.emulate import ROWS, EmulateBenchConfig, row_cost_model

    for row in ROWS:
        workload = workload_of(recipe(prompts, f"model.image_size={row.resolution}"))
        assert Workload.of(row_cost_model(EmulateBenchConfig(), row), row.resolution) == workload
    # max_sequence_length caps a prompt's tokens; it is not the prompt's length
    assert workload.text_tokens == 128
    assert workload_of(recipe(prompts, "model.max_sequence_length=64")).text_tokens == 64


def test_a_gradient_sum_covers_as_many_micro_batches_on_both_sides(prompts):
    """The emulated workers lease ``dispatch.pull_batch`` TRAIN micro-batches a pull whatever their
    rollout slots (`dispatch.queue_actor.QueueServer.pull_batch`); the simulator's workers lease
    ``train_lease_micro_batches`` per GPU: one number, or the two update phases differ."""
    from benchmarks.emulate import ROWS, EmulateBenchConfig, row_cost_model, run_config

    bench = EmulateBenchConfig()
    for row in ROWS:
        cfg = run_config(bench, row, "spotlight_train", prompts, 0.0)
        assert cfg.sampling.max_batch > cfg.dispatch.pull_batch  # batching workers: slots are not the lease
        assert cfg.dispatch.pull_batch == row_cost_model(bench, row).train_lease_micro_batches


def test_the_bench_window_starts_with_a_full_fleet_and_holds_a_notice_then_a_preemption():
    from roll_spotlight.spot.market import EventKind, MarketConfig, SpotMarket
    from roll_spotlight.spot.traces import load_trace, traces_root
    from benchmarks.emulate import GPUS_PER_SPOT_NODE, ROWS, TRACE, EmulateBenchConfig, trace_window

    trace, row = load_trace(traces_root() / TRACE), ROWS[0]
    start = trace_window(trace, row, EmulateBenchConfig())
    cap = row.spot // GPUS_PER_SPOT_NODE
    market = SpotMarket(trace, MarketConfig(cap_nodes=cap, start_s=start))
    assert len(market.alive_at(0.0)) == cap
    kinds = [ev.kind for ev in market.events_between(1e-9, 1_000.0) if ev.kind is not EventKind.NODE_UP]
    assert kinds[:2] == [EventKind.NOTICE, EventKind.NODE_DOWN]


@pytest.mark.parametrize("flags, message", [
    (["--emulate", "tpu"], "--emulate: unknown GPU 'tpu'; known GPUs"),
    (["--emulate", "h100", "--time-scale", "0"], "--time-scale must be > 0"),
    (["--emulate", "h100", "-o", "train.use_lora=false", "-o", "model.image_size=1280"],
     "--emulate h100: the memory plan does not fit"),
    (["--emulate", "h100", "-o", "spot.max_workers=100000"],
     "--emulate: spot.max_workers 100000 x spot.gpus_per_node 1 and 9 on-demand GPUs need"),
])
def test_bad_emulation_input_is_one_line_exit_2_before_anything_starts(prompts, tmp_path, capsys, flags, message):
    from roll_spotlight.cli import main

    run_dir = tmp_path / "run"
    code = main(["train", "--config", str(RECIPE), "--workers", "8", "--run-dir", str(run_dir), "-o",
                 f"task.train_file={prompts / 'train.txt'}", "-o", f"task.test_file={prompts / 'test.txt'}", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and err.count("\n") == 0, err
    assert not run_dir.exists()


@pytest.mark.ray
@pytest.mark.slow
def test_capacity_counts_each_worker_process_at_its_host_size():
    """A ROLL host's workers are larger processes than the runtime's actors: the same count that
    fits as actors may not fit as ROLL workers, and the error says how many spot nodes would."""
    from roll_spotlight.cluster.local_cluster import HEAD_MB, NODE_BASE_MB
    from roll_spotlight.spot_pool.emulated_nodes import EMULATED_WORKER_MB, ROLL_WORKER_MB, check_capacity

    available = HEAD_MB + 12 * EMULATED_WORKER_MB + 2 * (NODE_BASE_MB + EMULATED_WORKER_MB)
    check_capacity((12, 2), 1, available)  # fits exactly as runtime actors
    with pytest.raises(ValueError, match=r"--emulate: spot.max_workers 2 x spot.gpus_per_node 1 and 12 ROLL workers "
                                         r"need .* at most spot.max_workers 0 here"):
        check_capacity((12, 2), 1, available, ondemand_mb=ROLL_WORKER_MB, ondemand="ROLL workers")


def test_an_emulated_run_follows_a_spot_raylet_through_notice_and_kill(prompts, tmp_path):
    """Two on-demand GPUs and one spot node of two on emulated H100s, four iterations at
    time-scale 4, spot training on: the trace notices the node 2 s ahead (through its notice agent)
    and kills it 5 s into the run. Every update and rollout completes, nothing mismatches. Batches
    of 2 (an iteration is 16 requests): at the recipe's 16 one worker would denoise the whole
    iteration in one batch, and the first update would train after the node is gone."""
    from roll_spotlight.startup import WorkerPlacement, start_run

    trace = tmp_path / "aws-trace.csv"
    trace.write_text("0,add,a\n20000,remove,a\n36000000,add,b\n")  # Bamboo's format: ms, event, node
    cfg = recipe(prompts, "rollout_batch_size=4", "train.group_size=4", "max_steps=4", "eval_steps=0",
                 "exploration.mode=off", "spot.training_phase=train", f"spot.trace={trace}", "spot.max_workers=1",
                 "spot.gpus_per_node=2", "spot.notice_s=2.0", "dispatch.pull_batch=2", "train.colocated=true",
                 "sampling.max_batch=2")
    run_dir = tmp_path / "run"
    start_run(cfg, run_dir, placement=WorkerPlacement(workers=2, emulate="h100", time_scale=4.0), progress=False)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]
    last = rows[-1]
    assert len(rows) == 4 and last["spot/preemptions"] == 1 and last["spot/notices"] == 1, last
    assert sum(r["train/micro_batches_spot"] for r in rows) > 0
    assert all(r["train/micro_batches"] == 8 and r["emulated/mismatched_outputs"] == 0 for r in rows)
    assert last["spot/duplicate_completions"] == 0 and last["spot/requests_failed"] == 0
    assert last["cost/bill_scale"] == 4.0
    # what `python -m benchmarks.emulate` reads of a run: scaled-back times, the control plane's shares
    from benchmarks.emulate import Row, figures

    fig = figures(run_dir, Row("2+2 512", 2, 2, 512, 1, 4.0), "spotlight_train")
    steady = [r["iteration_s"] * 4.0 for r in rows[1:]]
    assert fig["time_per_iteration_s"] == pytest.approx(sum(steady) / len(steady))
    shares = fig["control_plane"]["shares"]
    # a weight fetch and a commit's queue call lie inside their rollout's phase and are counted in
    # both, so the shares other than idle may pass 1 by that much (a few percent at most)
    assert 0 < shares["compute"] <= 1 and shares["idle"] >= 0
    assert sum(v for k, v in shares.items() if k != "idle") <= 1.05
    assert fig["counters"]["spot/preemptions"] == 1 and fig["counters"]["mismatched_outputs"] == 0
    # and what the trace did to the raylets: the one node killed at its deadline, after its notice
    assert (fig["counters"]["raylets_killed_after_notice"], fig["counters"]["raylets_killed_without_notice"]) == (1, 0)


def test_each_step_waits_one_batched_step_of_the_rows_in_flight(prompts, monkeypatch):
    """max_batch 4: a step of four rows waits the cost model's step of a batch of four (one
    forward of 4 x CFG rows), not four steps of one; once the resumed row finishes, three."""
    from roll_spotlight.worker.emulated import Pacer

    compute = EmulatedCompute(emulation(prompts), max_batch=4)
    stopped = denoise_lease(compute, lease(seed=3), should_stop=lambda: True)  # committed after step 1
    spec = lambda seed: RequestSpec(1, "a sign that says 'ok'", seed, Schedule(10, 1.2, "sde", 0, 2), 3,  # noqa: E731
                                    RequestKind.ROLLOUT, 4)
    leases = [Lease(3, Request.from_spec(5, spec(3)), "w", float("inf"), stopped.state, 1)]
    leases += [Lease(i, Request.from_spec(i + 10, spec(i)), "w", float("inf"), None, 1) for i in range(3)]
    waits = []
    monkeypatch.setattr(Pacer, "wait", lambda self, modelled_s: waits.append(modelled_s))
    finished = []
    assert compute.denoise_batch(leases, lambda report: finished.extend(report.finished) or []) == []
    step = compute.emulation.durations.denoise_step_s
    assert waits == [step(1, False, 4)] * 9 + [step(1, False, 3)]
    assert step(1, False, 4) < 4 * step(1, False, 1) and len(finished) == 4
    assert not any(mismatched(outcome.output) for _, outcome in finished)
