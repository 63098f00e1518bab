"""Tiny random reward-model directories (same transformers classes as the real ones, a few hundred
thousand parameters) for the geneval and pickscore tests; nothing is downloaded."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from roll_spotlight.tasks.prompt_files import GENEVAL_CLASSES

# Some labels under the names other COCO checkpoints use, to exercise the alias table.
HF_STYLE_NAMES = {"motorcycle": "motorbike", "computer mouse": "mouse", "tv remote": "remote", "couch": "sofa"}


def _byte_chars() -> list[str]:
    """The 256 printable characters byte-level BPE tokenizers map bytes to (GPT-2's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _pil_image_processor(name: str):
    """The PIL (torchvision-free) image processor class: `<name>Pil` in transformers 5, `<name>` before."""
    import transformers

    return getattr(transformers, name + "Pil", None) or getattr(transformers, name)


def save_tiny_clip(path: Path, image_size: int = 32, with_processor: bool = True) -> Path:
    """CLIPModel + CLIPProcessor (byte-level tokenizer without merges, PIL image processor)."""
    from transformers import CLIPConfig, CLIPModel, CLIPProcessor, CLIPTokenizer

    image_processor_class = _pil_image_processor("CLIPImageProcessor")

    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    byte_chars = _byte_chars()
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    vocab.update({ch + "</w>": len(byte_chars) + i for i, ch in enumerate(byte_chars)})
    vocab.update({"<|startoftext|>": len(vocab), "<|endoftext|>": len(vocab) + 1})
    (path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    tokenizer = CLIPTokenizer(str(path / "vocab.json"), str(path / "merges.txt"))
    config = CLIPConfig(
        text_config={"vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                         "num_attention_heads": 2, "max_position_embeddings": 77,
                         "bos_token_id": vocab["<|startoftext|>"], "eos_token_id": vocab["<|endoftext|>"]},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                           "image_size": image_size, "patch_size": 8},
        projection_dim=16)
    CLIPModel(config).save_pretrained(path)
    if with_processor:
        processor = image_processor_class(size={"shortest_edge": image_size},
                                          crop_size={"height": image_size, "width": image_size})
        CLIPProcessor(image_processor=processor, tokenizer=tokenizer).save_pretrained(path)
    else:  # a model-only directory, as PickScore_v1 ships
        (path / "vocab.json").unlink()
        (path / "merges.txt").unlink()
    return path


def save_tiny_mask2former(path: Path, labels=None, favourite: str | None = None, image_size: int = 64) -> Path:
    """Mask2FormerForUniversalSegmentation (tiny Swin backbone) + its image processor. `favourite`
    gets a large class bias, so every query predicts it with a probability near 1."""
    from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation

    labels = list(labels or [HF_STYLE_NAMES.get(name, name) for name in GENEVAL_CLASSES])
    torch.manual_seed(0)
    config = Mask2FormerConfig(
        backbone_config={"model_type": "swin", "embed_dim": 16, "depths": [1, 1, 1, 1], "num_heads": [1, 1, 1, 1],
                             "window_size": 4, "image_size": image_size,
                             "out_features": ["stage1", "stage2", "stage3", "stage4"]},
        feature_size=32, mask_feature_size=32, hidden_dim=32, encoder_feedforward_dim=64, dim_feedforward=64,
        encoder_layers=1, decoder_layers=2, num_attention_heads=2, num_queries=10,
        num_labels=len(labels), id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    model = Mask2FormerForUniversalSegmentation(config)
    if favourite is not None:
        with torch.no_grad():
            model.class_predictor.bias[labels.index(favourite)] = 20.0
    model.save_pretrained(path)
    _pil_image_processor("Mask2FormerImageProcessor")(size={"shortest_edge": image_size, "longest_edge": image_size}).save_pretrained(path)
    return path
