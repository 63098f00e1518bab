"""`model.attention_backend` through diffusers' dispatcher, on the tiny Qwen-Image transformer, and
Ulysses SP running on top of the chosen backend."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("diffusers")
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry  # noqa: E402

from roll_spotlight.models.attention import (  # noqa: E402
    BackendCheck,
    apply_attention_backend,
    backend_names,
    normalize_backend,
    probe_backend,
    text_mask_for_backend,
)


@pytest.fixture(autouse=True)
def restore_active_backend():
    """set_attention_backend changes diffusers' process-wide default: put it back after each test."""
    saved = _AttentionBackendRegistry._active_backend
    yield
    _AttentionBackendRegistry._active_backend = saved


def tiny_transformer() -> torch.nn.Module:
    from tests.qwen_helpers import tiny_qwen_components

    return tiny_qwen_components()["transformer"].eval()


def inputs(masked: bool = True) -> dict:
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    return dict(hidden_states=torch.randn(2, 16, 16, generator=g), encoder_hidden_states=torch.randn(2, 6, 16, generator=g),
                encoder_hidden_states_mask=mask if masked else None, timestep=torch.tensor([0.7, 0.2]),
                img_shapes=[[(1, 4, 4)]] * 2, return_dict=False)


class CountCalls:
    """Wraps a registered backend function and counts the calls that reach it."""

    def __init__(self, name: str) -> None:
        self.key = AttentionBackendName(name)
        self.fn = _AttentionBackendRegistry._backends[self.key]
        self.calls = 0

    def __enter__(self) -> CountCalls:
        def counted(**kwargs):
            self.calls += 1
            return self.fn(**kwargs)
        _AttentionBackendRegistry._backends[self.key] = counted
        return self

    def __exit__(self, *exc) -> None:
        _AttentionBackendRegistry._backends[self.key] = self.fn


def test_native_backend_equals_the_default():
    model = tiny_transformer()
    with torch.no_grad():
        reference = model(**inputs())[0]
    check = apply_attention_backend(model, "sdpa")
    assert check == BackendCheck("native", True, True)
    assert {p._attention_backend for p in model.attn_processors.values()} == {AttentionBackendName.NATIVE}
    with CountCalls("native") as counter, torch.no_grad():
        out = model(**inputs())[0]
    assert counter.calls == model.config.num_layers
    assert torch.equal(out, reference)


def test_another_backend_is_dispatched_and_agrees():
    model = tiny_transformer()
    with torch.no_grad():
        reference = model(**inputs())[0]
    apply_attention_backend(model, "_native_math")
    with CountCalls("_native_math") as counter, torch.no_grad():
        out = model(**inputs())[0]
    assert counter.calls == model.config.num_layers
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


def test_unknown_hub_and_uninstalled_backends_are_clear_errors():
    model = tiny_transformer()
    with pytest.raises(ValueError, match=r"model.attention_backend='fast' is not a diffusers attention backend.*native"):
        apply_attention_backend(model, "fast")
    with pytest.raises(ValueError, match="downloads its kernel from the Hugging Face Hub"):
        normalize_backend("flash_hub")
    assert not any(name.endswith("_hub") for name in backend_names())
    if probe_backend("flash").usable:
        pytest.skip("flash-attn is installed here")
    with pytest.raises(ValueError, match=r"model.attention_backend='flash' cannot run here .*usable on cpu .*'native'"):
        apply_attention_backend(model, "flash")


def test_flash_kernels_take_no_mask_and_unpadded_batches_pass_none():
    native = probe_backend("native")
    flash = probe_backend("_native_flash", "cpu", torch.float32)  # torch has a CPU flash kernel
    assert native.accepts_mask and not flash.accepts_mask
    full = torch.ones(2, 5, dtype=torch.long)
    padded = full.clone()
    padded[0, -1] = 0
    assert text_mask_for_backend(full, flash) is None
    assert text_mask_for_backend(padded, native) is padded
    with pytest.raises(ValueError, match="takes no attention mask"):
        text_mask_for_backend(padded, flash)
    model = tiny_transformer()
    with torch.no_grad():
        reference = model(**inputs(masked=False))[0]
    apply_attention_backend(model, "_native_flash")
    with CountCalls("_native_flash") as counter, torch.no_grad():
        out = model(**inputs(masked=False))[0]
    assert counter.calls == model.config.num_layers
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


def test_ulysses_runs_on_the_chosen_backend():
    from roll_spotlight.elastic.comm import make_process_group
    from roll_spotlight.elastic.ulysses import apply_ulysses, remove_ulysses

    model = tiny_transformer()
    apply_attention_backend(model, "_native_math")
    with torch.no_grad():
        reference = model(**inputs())[0]
    group = make_process_group(dist.HashStore(), "gen0/attn-backend", 0, 1, backend="gloo")
    apply_ulysses(model, group)  # backend set before SP: carried over
    with CountCalls("_native_math") as counter, torch.no_grad():
        out = model(**inputs())[0]
    assert counter.calls == model.config.num_layers
    torch.testing.assert_close(out, reference, rtol=1e-6, atol=1e-6)
    apply_attention_backend(model, "native")  # backend set while SP is on: reaches the SP processor
    with CountCalls("native") as counter, torch.no_grad():
        model(**inputs())
    assert counter.calls == model.config.num_layers
    remove_ulysses(model)  # and stays after SP is removed
    assert {p._attention_backend for p in model.attn_processors.values()} == {AttentionBackendName.NATIVE}
