"""Ulysses sequence parallelism for the diffusers Qwen-Image DiT (``QwenImageTransformer2DModel``).

Layout: image tokens are sharded contiguously along the sequence over the SP group (rank ``r`` of
``P`` holds tokens ``[r*N/P, (r+1)*N/P)``); text tokens are replicated. Every per-token op (input
projection, modulation, norms, MLPs, output projection) runs on the local shard. Around attention,
one all-to-all turns ``[B, N/P, H, D]`` image q/k/v into ``[B, N, H/P, D]``; each rank attends with
the full text for its ``H/P`` heads (text q/k/v are sliced by head locally, no communication), then
a reverse all-to-all brings image outputs back to ``[B, N/P, H, D]`` and an all-gather over heads
rebuilds the replicated text output. Attention per head is unchanged, so SP output equals the SP=1
output up to float reordering (< 1e-5 in fp32, measured in the tests).

Installation is by hooks, not by editing diffusers (the same idea as diffusers' ``_cp_plan``, but
with an explicit process-group object instead of a device mesh, so raw regroup groups work):

- root pre-hook: shard ``hidden_states`` (the packed latent tokens) before ``img_in``;
- ``pos_embed`` hook: slice the image rotary frequencies to the local shard (text freqs stay whole);
- block pre-hooks: slice ``modulate_index`` (only used with ``zero_cond_t``);
- ``proj_out`` hook: all-gather the output tokens, so every rank returns the full prediction;
- every attention processor is replaced by :class:`UlyssesQwenAttnProcessor`, which calls diffusers'
  attention dispatcher with the backend the replaced processors had (``model.attention_backend``).

Constraints: the degree must divide the head count (checked at install) and the image-token count
(checked every forward; no padding, so pick a degree with ``planner.degree_for_resolution``).
Rollout-only: the collectives carry no autograd, so a forward with grad enabled raises.
``controlnet_block_samples`` is not supported.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

from roll_spotlight.elastic.comm import all_gather_cat, all_to_all_chunks

__all__ = ["UlyssesQwenAttnProcessor", "apply_ulysses", "is_ulysses_applied", "remove_ulysses"]

_STATE_ATTR = "_spotlight_ulysses"


def _check_degree(num_heads: int, degree: int) -> None:
    if degree < 1 or num_heads % degree:
        raise ValueError(f"SP degree {degree} must divide the attention head count num_heads={num_heads}")


def _check_tokens(num_tokens: int, degree: int) -> None:
    if num_tokens % degree:
        raise ValueError(
            f"SP degree {degree} must divide the image-token count {num_tokens} (no padding; "
            "choose a degree with planner.degree_for_resolution)"
        )


def _seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``[..., B, n, H, D]`` local tokens, all heads -> ``[..., B, n*P, H/P, D]`` all tokens, my heads."""
    p = group.size()
    *lead, b, n, h, d = x.shape
    chunks = x.reshape(*lead, b, n, p, h // p, d).movedim(-3, 0)
    got = all_to_all_chunks(chunks, group)  # [P(src), ..., B, n, H/P, D]
    return got.movedim(0, -4).reshape(*lead, b, p * n, h // p, d)


def _heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Inverse of :func:`_seq_to_heads`: ``[B, N, H/P, D]`` -> ``[B, N/P, H, D]``."""
    p = group.size()
    b, n_all, h_local, d = x.shape
    chunks = x.reshape(b, p, n_all // p, h_local, d).movedim(1, 0)
    got = all_to_all_chunks(chunks, group)  # [P(src heads), B, n, H/P, D]
    return got.movedim(0, 2).reshape(b, n_all // p, p * h_local, d)


def _project(attn: Any, x: torch.Tensor, names: tuple[str, str, str], norms: tuple[Any, Any]) -> list:
    """q, k, v of one stream as ``[B, S, H, D]`` with QK-norm applied."""
    head_dim = attn.inner_dim // attn.heads
    q, k, v = (getattr(attn, n)(x).unflatten(-1, (-1, head_dim)) for n in names)
    q = norms[0](q) if norms[0] is not None else q
    k = norms[1](k) if norms[1] is not None else k
    return [q, k, v]


class UlyssesQwenAttnProcessor:
    """Joint text+image attention with Ulysses head/sequence all-to-all over ``group``.

    Same inputs and outputs as diffusers' ``QwenDoubleStreamAttnProcessor2_0``, except that
    ``hidden_states`` and the image rotary freqs are the local image shard.
    """

    _attention_backend = None
    _parallel_config = None

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_hidden_states_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if encoder_hidden_states is None or attention_mask is not None:
            raise ValueError("Ulysses Qwen attention needs encoder_hidden_states and no attention_mask")
        img = _project(attn, hidden_states, ("to_q", "to_k", "to_v"), (attn.norm_q, attn.norm_k))
        txt = _project(attn, encoder_hidden_states, ("add_q_proj", "add_k_proj", "add_v_proj"),
                       (attn.norm_added_q, attn.norm_added_k))
        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb
            img[:2] = [apply_rotary_emb_qwen(t, img_freqs, use_real=False) for t in img[:2]]
            txt[:2] = [apply_rotary_emb_qwen(t, txt_freqs, use_real=False) for t in txt[:2]]
        out = self._joint_attention(img, txt, encoder_hidden_states_mask)
        seq_txt = encoder_hidden_states.shape[1]
        img_out = _heads_to_seq(out[:, seq_txt:], self.group).flatten(2, 3).to(hidden_states.dtype)
        txt_out = all_gather_cat(out[:, :seq_txt], 2, self.group).flatten(2, 3).to(hidden_states.dtype)
        img_out = attn.to_out[0](img_out.contiguous())
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)
        return img_out, attn.to_add_out(txt_out.contiguous())

    def _joint_attention(self, img: list, txt: list, txt_mask: torch.Tensor | None) -> torch.Tensor:
        """Attention over [text, all image tokens] for this rank's heads: ``[B, T+N, H/P, D]``."""
        group = self.group
        heads = img[0].shape[2] // group.size()
        lo = group.rank() * heads
        img_q, img_k, img_v = _seq_to_heads(torch.stack(img), group).unbind(0)
        txt_q, txt_k, txt_v = (t[:, :, lo : lo + heads] for t in txt)
        mask = None
        if txt_mask is not None:
            image_mask = torch.ones(img_q.shape[:2], dtype=torch.bool, device=img_q.device)
            mask = torch.cat([txt_mask.to(torch.bool), image_mask], dim=1)[:, None, None, :]
        out = dispatch_attention_fn(
            torch.cat([txt_q, img_q], dim=1),
            torch.cat([txt_k, img_k], dim=1),
            torch.cat([txt_v, img_v], dim=1),
            attn_mask=mask,
            dropout_p=0.0,
            is_causal=False,
            backend=self._attention_backend,
        )
        return out.to(img_q.dtype)


@dataclass
class _UlyssesState:
    group: dist.ProcessGroup
    processors: dict[str, Any]
    handles: list[Any] = field(default_factory=list)


def _local_slice(num_tokens: int, group: dist.ProcessGroup) -> slice:
    _check_tokens(num_tokens, group.size())
    n = num_tokens // group.size()
    return slice(group.rank() * n, (group.rank() + 1) * n)


def _shard_inputs(group: dist.ProcessGroup):
    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if torch.is_grad_enabled():
            raise RuntimeError("Ulysses SP is rollout-only: run the transformer under torch.no_grad()")
        if kwargs.get("controlnet_block_samples") is not None:
            raise ValueError("controlnet_block_samples is not supported with Ulysses SP")
        if args:
            x = args[0]
            return (x[:, _local_slice(x.shape[1], group)],) + tuple(args[1:]), kwargs
        x = kwargs["hidden_states"]
        return args, {**kwargs, "hidden_states": x[:, _local_slice(x.shape[1], group)]}
    return hook


def _shard_image_freqs(group: dist.ProcessGroup):
    def hook(module: torch.nn.Module, args: tuple, output: tuple) -> tuple:
        img_freqs, txt_freqs = output
        return img_freqs[_local_slice(img_freqs.shape[0], group)], txt_freqs
    return hook


def _shard_modulate_index(group: dist.ProcessGroup):
    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        index = kwargs.get("modulate_index")
        if index is None:
            return args, kwargs
        return args, {**kwargs, "modulate_index": index[:, _local_slice(index.shape[1], group)]}
    return hook


def _gather_output(group: dist.ProcessGroup):
    def hook(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return all_gather_cat(output, 1, group)
    return hook


def apply_ulysses(transformer: torch.nn.Module, group: dist.ProcessGroup) -> torch.nn.Module:
    """Install Ulysses SP over ``group`` on a ``QwenImageTransformer2DModel`` (in place).

    Re-applying (e.g. after a regroup) first removes the previous installation, so the new group
    fully replaces the old one. Every rank of ``group`` must call the model with identical inputs.
    """
    _check_degree(transformer.config.num_attention_heads, group.size())
    remove_ulysses(transformer)
    state = _UlyssesState(group=group, processors=dict(transformer.attn_processors))
    processor = UlyssesQwenAttnProcessor(group)
    # run on the attention backend the replaced processors were set to (models.attention)
    processor._attention_backend = next(
        (getattr(p, "_attention_backend", None) for p in state.processors.values()), None)
    transformer.set_attn_processor(processor)
    state.handles = [
        transformer.register_forward_pre_hook(_shard_inputs(group), with_kwargs=True),
        transformer.pos_embed.register_forward_hook(_shard_image_freqs(group)),
        transformer.proj_out.register_forward_hook(_gather_output(group)),
    ] + [
        block.register_forward_pre_hook(_shard_modulate_index(group), with_kwargs=True)
        for block in transformer.transformer_blocks
    ]
    setattr(transformer, _STATE_ATTR, state)
    return transformer


def remove_ulysses(transformer: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`apply_ulysses`: original processors back, hooks removed. No-op if not applied."""
    state: _UlyssesState | None = getattr(transformer, _STATE_ATTR, None)
    if state is None:
        return transformer
    for handle in state.handles:
        handle.remove()
    backend = next(iter(transformer.attn_processors.values()))._attention_backend  # set while applied, maybe
    for processor in state.processors.values():
        processor._attention_backend = backend
    transformer.set_attn_processor(state.processors)
    delattr(transformer, _STATE_ATTR)
    return transformer


def is_ulysses_applied(transformer: torch.nn.Module) -> bool:
    return getattr(transformer, _STATE_ATTR, None) is not None
