"""Weight-transfer policy and helpers, the resumable rollout loop, and controller validation."""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import traceback
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

from roll_spotlight.elastic.comm import make_process_group
from roll_spotlight.elastic.model_spec import QwenModelSpec
from roll_spotlight.elastic.rollout import (
    RolloutRequest,
    denoise,
    initial_noise,
    sde_step,
    start_state,
    step_noise,
)
from roll_spotlight.elastic.transfer import (
    TransferMethod,
    TransferPlan,
    TransferSource,
    broadcast_weights,
    choose_method,
    choose_source,
    load_numpy_state,
    load_weights_file,
    numpy_state,
    own_weights,
    save_weights_file,
    share_numpy_state,
    weights_checksum,
)

SPEC = QwenModelSpec(num_layers=1)


def _request(num_steps: int = 4) -> RolloutRequest:
    rng = np.random.default_rng(0)
    return RolloutRequest("r", seed=7, prompt_embeds=rng.standard_normal((4, 64)).astype(np.float32),
                          prompt_mask=np.ones(4), grid=(4, 4), channels=64, num_steps=num_steps)


# source policy

def test_same_node_peer_wins_then_remote_then_storage() -> None:
    peers = {"a:1": "a", "b:0": "b", "a:0": "a"}
    assert choose_source("a", peers, True) == TransferPlan(TransferSource.SAME_NODE_PEER, "a:0")
    assert choose_source("c", peers, True) == TransferPlan(TransferSource.REMOTE_PEER, "a:0")
    assert choose_source("c", {}, True) == TransferPlan(TransferSource.STORAGE, None)
    with pytest.raises(ValueError, match="no source of weights .* 'c'"):
        choose_source("c", {}, False)


def test_method_follows_device_and_source() -> None:
    peer = TransferPlan(TransferSource.SAME_NODE_PEER, "a:0")
    assert choose_method(peer, cuda_available=False) is TransferMethod.OBJECT_STORE
    assert choose_method(peer, cuda_available=True) is TransferMethod.COLLECTIVE
    assert choose_method(TransferPlan(TransferSource.STORAGE, None), True) is TransferMethod.FILE


# state helpers

def test_numpy_state_round_trip_into_differently_initialised_model() -> None:
    source, target = SPEC.build(), dataclasses.replace(SPEC, init_seed=5).build()
    assert weights_checksum(source) != weights_checksum(target)
    arrays = numpy_state(source)
    for array in arrays.values():
        array.setflags(write=False)  # as mapped from the object store
    load_numpy_state(target, arrays)
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))


def test_shared_state_is_used_in_place_and_owned_again_on_demand() -> None:
    source, target = SPEC.build(), dataclasses.replace(SPEC, init_seed=5).build()
    arrays = numpy_state(source)
    originals = {k: v.copy() for k, v in arrays.items()}
    for array in arrays.values():
        array.setflags(write=False)  # as mapped from the object store
    share_numpy_state(target, arrays)
    assert all(t.data_ptr() == arrays[k].ctypes.data for k, t in target.state_dict().items()), "views, not copies"
    assert weights_checksum(target) == weights_checksum(source)
    own_weights(target)
    assert all(t.data_ptr() != arrays[k].ctypes.data for k, t in target.state_dict().items())
    assert weights_checksum(target) == weights_checksum(source)
    with torch.no_grad():
        for tensor in target.state_dict().values():
            tensor.add_(1.0)  # private memory now: the shared arrays must not change
    assert all(np.array_equal(arrays[k], originals[k]) for k in arrays)


def test_share_rejects_wrong_keys_shapes_and_leaves_the_model_untouched() -> None:
    target = SPEC.build()
    before = weights_checksum(target)
    arrays = numpy_state(dataclasses.replace(SPEC, init_seed=5).build())
    key = next(iter(arrays))
    with pytest.raises(ValueError, match="state keys differ"):
        share_numpy_state(target, {k: v for k, v in arrays.items() if k != key})
    last = sorted(arrays)[-1]
    bad = dict(arrays, **{last: arrays[last].astype(np.float64)})
    with pytest.raises(ValueError, match=last.replace(".", r"\.")):
        share_numpy_state(target, bad)
    assert weights_checksum(target) == before


def test_numpy_state_with_wrong_keys_is_rejected() -> None:
    arrays = numpy_state(SPEC.build())
    arrays.pop(next(iter(arrays)))
    with pytest.raises(ValueError, match="state keys differ"):
        load_numpy_state(SPEC.build(), arrays)


def test_safetensors_file_round_trip(tmp_path) -> None:
    source, target = SPEC.build(), dataclasses.replace(SPEC, init_seed=5).build()
    load_weights_file(target, save_weights_file(source, tmp_path / "w.safetensors"))
    assert weights_checksum(target) == weights_checksum(source)


def _broadcast_rank(rank: int, port: int, spec: QwenModelSpec, queue) -> None:
    try:
        torch.set_num_threads(1)  # forked from a process that used OpenMP: one thread avoids a libgomp hang
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        group = make_process_group(store, "gen0/xfer", rank, 2, backend="gloo")
        model = dataclasses.replace(spec, init_seed=rank).build()
        broadcast_weights(model, group, src=0)
        queue.put((rank, weights_checksum(model), None))
    except Exception:  # forwarded to the test process, which fails with it
        queue.put((rank, None, traceback.format_exc()))


def _run_forked(target, world: int, *args) -> list:
    """Fork ``world`` ranks of ``target(rank, *args, queue)`` and collect one result per rank.
    Daemon processes, terminated on the way out, so a hung rank fails the test instead of the run."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, *args, queue), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    try:
        return [queue.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()


@pytest.mark.dist
def test_collective_broadcast_copies_the_peer_weights() -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results = {rank: (checksum, err) for rank, checksum, err in _run_forked(_broadcast_rank, 2, store.port, SPEC)}
    assert not any(err for _, err in results.values()), results
    assert results[0][0] == results[1][0] == weights_checksum(SPEC.build())


# rollout loop

def test_noise_is_a_pure_function_of_seed_and_step() -> None:
    assert torch.equal(step_noise([3], 2, (5,)), step_noise([3], 2, (5,)))
    assert not torch.equal(step_noise([3], 2, (5,)), step_noise([3], 3, (5,)))
    assert not torch.equal(step_noise([3], 0, (5,)), initial_noise([3], (5,)))
    assert torch.equal(step_noise([3, 4], 1, (5,))[1], step_noise([4], 1, (5,))[0]), "batch-independent"


def test_last_step_adds_no_noise() -> None:
    x, v, eps = torch.ones(3), torch.full((3,), 2.0), torch.full((3,), 9.0)
    assert torch.equal(sde_step(x, v, 0.25, 0.0, eps, 0.7), x - 0.5)
    assert not torch.equal(sde_step(x, v, 0.5, 0.25, eps, 0.7), x - 0.5)


def test_resuming_at_any_step_matches_the_uninterrupted_rollout() -> None:
    model, request = SPEC.build(), _request()
    full = denoise(model, request, start_state(request), request.num_steps)
    for k in range(1, request.num_steps):
        part = denoise(model, request, start_state(request), k)
        resumed = denoise(SPEC.build(), request, part, request.num_steps)
        assert resumed.step == request.num_steps
        assert np.array_equal(resumed.latent, full.latent)


def test_request_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="num_steps=0"):
        dataclasses.replace(_request(), num_steps=0)
    with pytest.raises(ValueError, match="prompt_mask"):
        dataclasses.replace(_request(), prompt_mask=np.ones(3))


def test_model_spec_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="axes_dims_rope=.* attention_head_dim=32"):
        QwenModelSpec(axes_dims_rope=(8, 8, 8))
    assert abs(QwenModelSpec.sized(300).approx_mb - 315.5) < 1.0


# controller configuration (no Ray cluster needed)

def test_elastic_config_validation() -> None:
    from roll_spotlight.elastic.controller import ControllerConfig

    with pytest.raises(ValueError, match="preferred_degree=3 must divide num_heads=4"):
        ControllerConfig(num_heads=4, preferred_degree=3)
    with pytest.raises(ValueError, match="transfer_method='nvlink'"):
        ControllerConfig(num_heads=4, preferred_degree=2, transfer_method="nvlink")


def test_worker_lifecycle_rejects_skipped_states() -> None:
    from roll_spotlight.elastic.controller import ControllerConfig, ElasticController

    controller = ElasticController(ControllerConfig(num_heads=4, preferred_degree=2))
    with pytest.raises(AssertionError, match="None -> WorkerState.DRAINING"):
        controller.notify_preemption([("a", 0)])


def test_worker_adopts_shared_weights_and_owns_them_before_a_file_load(tmp_path) -> None:
    """In-process SPWorker (no Ray): adopting is zero-copy; a later in-place load (from a file)
    writes private memory, never the shared arrays."""
    from roll_spotlight.elastic.workers import SPWorker, WorkerConfig

    worker = SPWorker(WorkerConfig(gpu=0, model=SPEC, node="a", device="cpu"))
    peer = dataclasses.replace(SPEC, init_seed=5).build()
    arrays = numpy_state(peer)
    originals = {k: v.copy() for k, v in arrays.items()}
    for array in arrays.values():
        array.setflags(write=False)
    worker.adopt_weights(arrays)
    assert all(t.data_ptr() == arrays[k].ctypes.data for k, t in worker.model.state_dict().items())
    assert worker.checksum() == weights_checksum(peer)
    other = dataclasses.replace(SPEC, init_seed=9).build()
    worker.load_weights_from_file(str(save_weights_file(other, tmp_path / "w.safetensors")))
    assert worker.checksum() == weights_checksum(other)
    assert all(np.array_equal(arrays[k], originals[k]) for k in arrays), "shared arrays untouched"
