"""A tiny random Qwen-Image pipeline directory: the same diffusers/transformers classes as the real
model (transformer, VAE, Qwen2.5-VL text encoder, byte-level tokenizer, Qwen-Image's scheduler
config) at a few thousand parameters, so the real-model code path runs end to end on a CPU with
nothing downloaded. `spotlight make-tiny-qwen DIR` writes one; tests build theirs the same way.
"""
from __future__ import annotations

from pathlib import Path

TEXT_DIM = 16
Z_DIM = 4
#: Qwen-Image's published scheduler config (what `roll_spotlight.flow_grpo.sigma_schedule` rebuilds).
QWEN_IMAGE_SCHEDULER = dict(
    use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256, max_image_seq_len=8192,
    shift=1.0, shift_terminal=0.02, time_shift_type="exponential", num_train_timesteps=1000,
)


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


def tiny_qwen_components(seed: int = 0) -> dict:
    """The pipeline's components with weights drawn from `seed` (keyword arguments of `QwenImagePipeline`)."""
    import torch
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

    torch.manual_seed(seed)
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
        scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER),
        vae=AutoencoderKLQwenImage(base_dim=24, z_dim=Z_DIM, dim_mult=[1, 2, 4], num_res_blocks=1,
                                   temperal_downsample=[False, True], latents_mean=[0.1, -0.2, 0.3, 0.0],
                                   latents_std=[2.0, 0.5, 1.5, 1.0]),
        text_encoder=Qwen2_5_VLForConditionalGeneration(te_cfg).eval(),
        tokenizer=tokenizer,
        transformer=QwenImageTransformer2DModel(patch_size=2, in_channels=4 * Z_DIM, out_channels=Z_DIM, num_layers=2,
                                                attention_head_dim=16, num_attention_heads=2,
                                                joint_attention_dim=TEXT_DIM, axes_dims_rope=(8, 4, 4)),
    )


def make_tiny_qwen(directory: str | Path, seed: int = 0) -> Path:
    """Write the tiny pipeline to `directory` (diffusers `save_pretrained` layout, loadable as
    `model.path` with `model.image_size` a multiple of 16) and return it as a Path."""
    from diffusers import QwenImagePipeline

    directory = Path(directory)
    QwenImagePipeline(**tiny_qwen_components(seed)).save_pretrained(directory)
    return directory
