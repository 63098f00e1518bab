"""A tiny random Qwen-Image pipeline directory (same diffusers/transformers classes as the real
model, a few thousand parameters), for tests of the real-model code paths without a download."""
from __future__ import annotations

from pathlib import Path

import torch

TEXT_DIM = 16
Z_DIM = 4


def _byte_level_vocab() -> dict[str, int]:
    """GPT-2's byte -> printable-unicode table (transformers 5 no longer exports it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return {ch: i for i, ch in enumerate(chars.values())}


def tiny_qwen_components():
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

    torch.manual_seed(0)
    vocab = _byte_level_vocab()
    vocab["<|endoftext|>"] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, bos_token=None,
                               eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    te_cfg = Qwen2_5_VLConfig(
        text_config={"hidden_size": TEXT_DIM, "intermediate_size": 16, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 512, "rope_theta": 1e6,
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"}},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        hidden_size=TEXT_DIM, vocab_size=512, vision_end_token_id=500, vision_start_token_id=501, vision_token_id=502,
    )
    return dict(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=AutoencoderKLQwenImage(base_dim=24, z_dim=Z_DIM, dim_mult=[1, 2, 4], num_res_blocks=1,
                                   temperal_downsample=[False, True], latents_mean=[0.1, -0.2, 0.3, 0.0],
                                   latents_std=[2.0, 0.5, 1.5, 1.0]),
        text_encoder=Qwen2_5_VLForConditionalGeneration(te_cfg).eval(),
        tokenizer=tokenizer,
        transformer=QwenImageTransformer2DModel(patch_size=2, in_channels=4 * Z_DIM, out_channels=Z_DIM, num_layers=2,
                                                attention_head_dim=16, num_attention_heads=2,
                                                joint_attention_dim=TEXT_DIM, axes_dims_rope=(8, 4, 4)),
    )



def save_tiny_qwen(path: Path) -> Path:
    """Write the tiny pipeline to `path` (diffusers `save_pretrained` layout) and return it."""
    from diffusers import QwenImagePipeline

    QwenImagePipeline(**tiny_qwen_components()).save_pretrained(path)
    return path
