"""Weight-transfer policy and helpers (elastic.transfer): what a newcomer's weights come from and
how they are copied or shared."""
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

@dataclasses.dataclass(frozen=True)
class _Spec:
    """A small ``QwenImageTransformer2DModel`` with seeded random weights."""

    init_seed: int = 0

    def build(self, device: str = "cpu") -> torch.nn.Module:
        from diffusers import QwenImageTransformer2DModel

        torch.manual_seed(self.init_seed)
        return QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=1,
                                           attention_head_dim=32, num_attention_heads=4, joint_attention_dim=64,
                                           axes_dims_rope=(8, 12, 12)).to(device).eval().requires_grad_(False)


SPEC = _Spec()


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


def _broadcast_rank(rank: int, port: int, spec: _Spec, queue) -> None:
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


# a policy's published state (what a live RolloutWorker shares with newcomers)

def test_a_policy_adopts_published_arrays_zero_copy_and_owns_them_before_a_version_load() -> None:
    """A newcomer's policy maps a peer's published state (read-only, as from the object store)
    without copying; before the next weight version is loaded in place it owns private copies,
    so the shared arrays never change."""
    from roll_spotlight.elastic.transfer import published_arrays, share_published
    from tests.runtime_helpers import random_policy, tiny_config

    cfg = tiny_config()
    peer, newcomer, later = (random_policy(cfg, seed=s) for s in (1, 2, 3))
    arrays = published_arrays(peer)
    originals = {k: v.copy() for k, v in arrays.items()}
    for array in arrays.values():
        array.setflags(write=False)
    share_published(newcomer, arrays)
    state = newcomer.state_dict()
    assert all(state[k].data_ptr() == arrays[k].ctypes.data for k in arrays), "views, not copies"
    assert weights_checksum(newcomer) == weights_checksum(peer)
    own_weights(newcomer)
    newcomer.load_published_state(later.published_state())
    assert weights_checksum(newcomer) == weights_checksum(later)
    assert all(np.array_equal(arrays[k], originals[k]) for k in arrays), "shared arrays untouched"
    with pytest.raises(ValueError, match="state keys differ"):
        share_published(newcomer, {k: v for k, v in list(arrays.items())[1:]})
