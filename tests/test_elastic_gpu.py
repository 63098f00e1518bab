"""GPU path of elastic SP: NCCL groups, Ulysses on CUDA, device-to-device weight broadcast.

Marked ``gpu`` (skipped without CUDA); the two-rank tests also need two devices. Ranks are started
with the ``spawn`` method because CUDA cannot be used in a forked child.
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import traceback
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

if not torch.cuda.is_available():  # skip before importing diffusers-backed modules
    pytest.skip("CUDA is not available", allow_module_level=True)

from roll_spotlight.elastic.comm import make_process_group  # noqa: E402
from roll_spotlight.elastic.transfer import broadcast_weights, weights_checksum  # noqa: E402
from roll_spotlight.elastic.ulysses import apply_ulysses  # noqa: E402

pytestmark = pytest.mark.gpu


@dataclasses.dataclass(frozen=True)
class _Spec:
    """A small ``QwenImageTransformer2DModel`` (4 heads) with seeded random weights."""

    init_seed: int = 0

    def build(self, device: str = "cpu") -> torch.nn.Module:
        from diffusers import QwenImageTransformer2DModel

        torch.manual_seed(self.init_seed)
        return QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=2,
                                           attention_head_dim=32, num_attention_heads=4, joint_attention_dim=64,
                                           axes_dims_rope=(8, 12, 12)).to(device).eval().requires_grad_(False)


SPEC = _Spec()
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


def _inputs(device: str) -> dict:
    g = torch.Generator().manual_seed(1)
    return dict(
        hidden_states=torch.randn(1, 64, 64, generator=g).to(device),
        encoder_hidden_states=torch.randn(1, 8, 64, generator=g).to(device),
        encoder_hidden_states_mask=torch.ones(1, 8, dtype=torch.long, device=device),
        timestep=torch.tensor([0.5], device=device),
        img_shapes=[[(1, 8, 8)]],
        return_dict=False,
    )


def _exact_fp32() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _ulysses_rank(rank: int, port: int, queue) -> None:
    try:
        _exact_fp32()
        torch.cuda.set_device(rank)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        group = make_process_group(store, "gen0/sp", rank, 2, backend="nccl")
        model = apply_ulysses(SPEC.build(f"cuda:{rank}"), group)
        with torch.no_grad():
            queue.put((rank, model(**_inputs(f"cuda:{rank}"))[0].cpu().numpy(), None))
    except Exception:  # forwarded to the test process, which fails with it
        queue.put((rank, None, traceback.format_exc()))


def _broadcast_rank(rank: int, port: int, queue) -> None:
    try:
        torch.cuda.set_device(rank)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        group = make_process_group(store, "gen0/xfer", rank, 2, backend="nccl")
        model = dataclasses.replace(SPEC, init_seed=rank).build(f"cuda:{rank}")
        broadcast_weights(model, group, src=0)
        queue.put((rank, weights_checksum(model), None))
    except Exception:  # forwarded to the test process, which fails with it
        queue.put((rank, None, traceback.format_exc()))


def _run_spawned(target, world: int) -> dict:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, store.port, queue), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = {rank: (value, err) for rank, value, err in (queue.get(timeout=300) for _ in procs)}
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    errors = [err for _, err in results.values() if err]
    assert not errors, errors[0]
    return {rank: value for rank, (value, _) in results.items()}


def test_single_rank_nccl_group_matches_plain_cuda_forward() -> None:
    _exact_fp32()
    model = SPEC.build("cuda")
    with torch.no_grad():
        reference = model(**_inputs("cuda"))[0]
    group = make_process_group(dist.HashStore(), "gen0/solo", 0, 1, backend="nccl")
    apply_ulysses(model, group)
    with torch.no_grad():
        # Same math; kernels may still pick other tilings for the re-laid-out q/k/v on a GPU.
        assert float((model(**_inputs("cuda"))[0] - reference).abs().max()) < 1e-6


@two_gpus
def test_ulysses_over_two_gpus_equals_one_gpu() -> None:
    _exact_fp32()
    with torch.no_grad():
        reference = SPEC.build("cuda:0")(**_inputs("cuda:0"))[0].cpu().numpy()
    outputs = _run_spawned(_ulysses_rank, 2)
    diff = max(float(np.abs(out - reference).max()) for out in outputs.values())
    print(f"ulysses NCCL degree=2 max abs diff {diff:.3e}")
    assert diff < 1e-4


@two_gpus
def test_device_to_device_broadcast_copies_peer_weights() -> None:
    checksums = _run_spawned(_broadcast_rank, 2)
    assert checksums[0] == checksums[1] == pytest.approx(weights_checksum(SPEC.build()), rel=1e-9)


def test_a_cuda_policy_takes_published_arrays_onto_the_device() -> None:
    """A newcomer on a GPU copies a peer's published arrays to its device (no sharing there)."""
    from roll_spotlight.elastic.transfer import load_numpy_state, published_arrays
    from tests.runtime_helpers import random_policy, tiny_config

    cfg = tiny_config()
    peer, newcomer = random_policy(cfg, seed=1), random_policy(cfg, seed=2).to("cuda")
    load_numpy_state(newcomer, published_arrays(peer))
    assert all(t.is_cuda for t in newcomer.state_dict().values())
    assert abs(weights_checksum(newcomer) - weights_checksum(peer)) < 1e-3
