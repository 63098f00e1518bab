"""Ulysses SP on the diffusers Qwen-Image DiT: SP output equals the SP=1 output.

The multi-process tests fork ranks from this process (the model is built once here, so every rank
holds identical weights) and host the TCPStore here, as the elastic controller does.
"""
from __future__ import annotations

import queue as queue_mod

import multiprocessing as mp
import traceback
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

from roll_spotlight.elastic.comm import make_process_group
from roll_spotlight.elastic.ulysses import (
    UlyssesQwenAttnProcessor,
    apply_ulysses,
    is_ulysses_applied,
    remove_ulysses,
)

QwenImageTransformer2DModel = pytest.importorskip(
    "diffusers.models.transformers.transformer_qwenimage"
).QwenImageTransformer2DModel


def _tiny_qwen() -> torch.nn.Module:
    torch.manual_seed(0)
    return QwenImageTransformer2DModel(
        patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=32,
        num_attention_heads=4, joint_attention_dim=64, guidance_embeds=False, axes_dims_rope=(8, 12, 12),
    ).eval()


def _inputs(grid: tuple[int, int] = (8, 8), masked: bool = True) -> dict:
    """Batch of 2, 8 text tokens (padding in the second prompt unless ``masked`` is False, which
    passes no mask at all), ``grid`` image-token layout."""
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    mask = mask if masked else None
    return dict(
        hidden_states=torch.randn(2, grid[0] * grid[1], 64, generator=g),
        encoder_hidden_states=torch.randn(2, 8, 64, generator=g),
        encoder_hidden_states_mask=mask,
        timestep=torch.tensor([0.5, 0.3]),
        img_shapes=[[(1, *grid)]] * 2,
        return_dict=False,
    )


class _FakeGroup:
    """Stands in for a process group where no collective is reached."""

    def __init__(self, size: int, rank: int = 0) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def _rank_main(rank: int, size: int, masked: bool, port: int, model: torch.nn.Module, queue) -> None:
    try:
        torch.set_num_threads(1)  # forked from a process that used OpenMP: one thread avoids a libgomp hang
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        group = make_process_group(store, f"gen0/ulysses{size}{masked}", rank, size, backend="gloo")
        apply_ulysses(model, group)
        local_tokens = []
        model.transformer_blocks[0].register_forward_hook(lambda m, a, out: local_tokens.append(out[1].shape[1]))
        with torch.no_grad():
            out = model(**_inputs(masked=masked))[0]
        queue.put((rank, out.numpy(), local_tokens[0], None))
    except Exception:  # forwarded to the test process, which fails with it
        queue.put((rank, None, None, traceback.format_exc()))


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


@pytest.fixture(scope="module")
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


@pytest.mark.dist
@pytest.mark.parametrize("degree, masked", [(2, True), (2, False), (4, True)])
def test_sp_output_equals_single_process(store, degree: int, masked: bool) -> None:
    model = _tiny_qwen()
    with torch.no_grad():
        reference = model(**_inputs(masked=masked))[0].numpy()
    try:
        results = _run_forked(_rank_main, degree, degree, masked, store.port, model)
    except queue_mod.Empty:
        # a rank forked while another thread of this pytest process held a lock can hang before it
        # reaches the store (seen once in CI); retry once with fresh processes and a fresh store
        fresh = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        results = _run_forked(_rank_main, degree, degree, masked, fresh.port, model)
    errors = [err for *_, err in results if err]
    assert not errors, errors[0]
    diffs = {rank: float(np.abs(out - reference).max()) for rank, out, _, _ in results}
    print(f"ulysses degree={degree} masked={masked} max_abs_diff per rank: {diffs}")
    assert max(diffs.values()) < 1e-5
    assert {tokens for *_, tokens, _ in results} == {64 // degree}, "blocks did not see the local shard"


def test_single_rank_group_is_exact_and_removable() -> None:
    model = _tiny_qwen()
    with torch.no_grad():
        reference = model(**_inputs())[0]
    group = make_process_group(dist.HashStore(), "gen0/solo", 0, 1, backend="gloo")
    apply_ulysses(model, group)
    assert is_ulysses_applied(model)
    assert all(isinstance(p, UlyssesQwenAttnProcessor) for p in model.attn_processors.values())
    with torch.no_grad():
        assert torch.equal(model(**_inputs())[0], reference)
    remove_ulysses(model)
    assert not is_ulysses_applied(model)
    assert not any(isinstance(p, UlyssesQwenAttnProcessor) for p in model.attn_processors.values())
    assert not model._forward_pre_hooks and not model.proj_out._forward_hooks
    with torch.no_grad():
        assert torch.equal(model(**_inputs())[0], reference)


def test_degree_must_divide_head_count() -> None:
    with pytest.raises(ValueError, match="SP degree 3 must divide .*num_heads=4"):
        apply_ulysses(_tiny_qwen(), _FakeGroup(3))


def test_degree_must_divide_image_tokens() -> None:
    model = apply_ulysses(_tiny_qwen(), _FakeGroup(2))
    with torch.no_grad(), pytest.raises(ValueError, match="SP degree 2 must divide the image-token count 63"):
        model(**_inputs(grid=(7, 9)))


def test_grad_enabled_forward_is_refused() -> None:
    model = apply_ulysses(_tiny_qwen(), _FakeGroup(2))
    with pytest.raises(RuntimeError, match="rollout-only"):
        model(**_inputs())
