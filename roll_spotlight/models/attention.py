"""`model.attention_backend`: which attention kernel the Qwen-Image transformer runs, through
diffusers' attention dispatcher (`ModelMixin.set_attention_backend`).

Names are diffusers' `AttentionBackendName` values ("native" = torch SDPA, the default; "flash" =
the flash-attn package; "_native_flash", "_native_cudnn", "_native_efficient", "_native_math",
"flex", "sage", "xformers", ...), plus the aliases "sdpa" -> "native" and "flash-attn" -> "flash".
Backends whose name ends in "_hub" download a kernel from the Hugging Face Hub at first use, and this
project never downloads anything at run time, so they are refused.

A backend is accepted only if it actually runs here: :func:`probe_backend` calls it once on a tiny
input of the transformer's device and dtype, with and without a text padding mask, so the error for
an unusable choice lists the backends that do run. Flash kernels ("flash", "_native_flash",
"_flash_3", sage, ...) take no attention mask, and Qwen-Image builds one from the text mask whenever
`encoder_hidden_states_mask` is passed: callers pass :func:`text_mask_for_backend` instead (None
when no prompt in the batch is padded, as `QwenImagePipeline.encode_prompt` does). Note that
"flash_varlen" assumes the valid keys come first, which is wrong for Qwen-Image's [text, image]
joint sequence with padded text; it is refused when the text is padded for the same reason.

Ulysses SP (`elastic.ulysses`) calls the same dispatcher with the backend of the processors it
replaces, so it runs on top of whichever backend is set here (before or after `apply_ulysses`).
`set_attention_backend` also sets diffusers' process-wide active backend.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_BACKEND = "native"
ALIASES = {"sdpa": "native", "default": "native", "flash-attn": "flash", "flash_attn": "flash"}


@dataclass(frozen=True)
class BackendCheck:
    """Whether ``name`` ran on a tiny input here, whether it took a padding mask, and why not."""

    name: str
    usable: bool
    accepts_mask: bool
    reason: str | None = None


def backend_names() -> list[str]:
    """Every backend name diffusers knows, minus the Hub-downloading ones."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    return [b.value for b in AttentionBackendName if not b.value.endswith("_hub")]


def normalize_backend(name: str | None) -> str:
    """The diffusers name for a config value; ValueError naming ``model.attention_backend`` if unknown."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    if name is None or name == "":
        return DEFAULT_BACKEND
    key = ALIASES.get(str(name).lower(), str(name).lower())
    known = {b.value for b in AttentionBackendName}
    if key not in known:
        raise ValueError(f"model.attention_backend={name!r} is not a diffusers attention backend; "
                         f"choose one of {sorted(ALIASES)} or {backend_names()}")
    if key.endswith("_hub"):
        raise ValueError(f"model.attention_backend={name!r} downloads its kernel from the Hugging Face Hub at "
                         f"first use and nothing is downloaded at run time; install the package instead "
                         f"(e.g. 'flash' with flash-attn) and choose one of {backend_names()}")
    return key


def probe_backend(name: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16) -> BackendCheck:
    """Run backend ``name`` once on a (1, 8, 2, 16) q/k/v of ``device`` and ``dtype``, then with a padding mask."""
    from diffusers.models.attention_dispatch import (
        AttentionBackendName,
        _check_attention_backend_requirements,
        dispatch_attention_fn,
    )

    backend = AttentionBackendName(normalize_backend(name))
    try:
        _check_attention_backend_requirements(backend)
    except (RuntimeError, ImportError) as exc:
        return BackendCheck(backend.value, False, False, str(exc))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 2, 16, generator=gen).to(device, dtype) for _ in range(3))
    mask = torch.ones(1, 1, 1, 8, dtype=torch.bool, device=device)
    mask[..., 2] = False  # a padded text position before the image tokens, as in Qwen-Image
    try:
        dispatch_attention_fn(q, k, v, backend=backend)
    except Exception as exc:  # any failure means "not usable here"; the reason is reported
        return BackendCheck(backend.value, False, False, f"{type(exc).__name__}: {exc}")
    if backend == AttentionBackendName.FLASH_VARLEN:
        return BackendCheck(backend.value, True, False, "flash_varlen keeps the first valid keys, not Qwen's [text, image]")
    try:
        dispatch_attention_fn(q, k, v, attn_mask=mask, backend=backend)
    except Exception as exc:
        return BackendCheck(backend.value, True, False, f"{type(exc).__name__}: {exc}")
    return BackendCheck(backend.value, True, True)


def usable_backends(device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16) -> list[BackendCheck]:
    """The backends that run on ``device`` in ``dtype`` here."""
    return [c for c in (probe_backend(n, device, dtype) for n in backend_names()) if c.usable]


def apply_attention_backend(transformer: torch.nn.Module, name: str | None) -> BackendCheck:
    """Set ``model.attention_backend`` on a diffusers transformer (in place) after checking it runs on
    the transformer's device and dtype; ValueError listing the usable backends otherwise."""
    check = probe_backend(name or DEFAULT_BACKEND, transformer.device, transformer.dtype)
    if not check.usable:
        usable = [c.name for c in usable_backends(transformer.device, transformer.dtype)]
        raise ValueError(f"model.attention_backend={name!r} cannot run here ({check.reason}); usable on "
                         f"{transformer.device} in {transformer.dtype}: {usable}")
    transformer.set_attention_backend(check.name)
    return check


def text_mask_for_backend(mask: torch.Tensor | None, check: BackendCheck) -> torch.Tensor | None:
    """The text mask to pass as ``encoder_hidden_states_mask``: None when nothing is padded (every
    backend then runs), the mask when the backend takes one, else ValueError."""
    if mask is None or bool(mask.bool().all()):
        return None
    if check.accepts_mask:
        return mask
    raise ValueError(f"model.attention_backend={check.name!r} takes no attention mask, and this batch has padded "
                     f"prompts; use 'native' (SDPA) or batch prompts of equal token length")
