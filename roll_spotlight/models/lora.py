"""LoRA adapters on the DiT transformer (through peft), and what a weight version weighs with them.

`LoraConfig` is the `train.lora` section; it imports no torch, so configs validate anywhere. The
functions below import torch, peft and diffusers lazily.

Defaults are what flow_grpo's Qwen-Image recipes start from (its `train_qwenimage.py`): rank 64,
alpha 128, Gaussian init (A ~ N(0, 1/r), B = 0, so the adapted model starts equal to the base),
no dropout, on the attention projections of both streams and both streams' MLPs of every block.
With adapters on, only the adapter tensors train and travel in a weight version; the frozen base
is loaded once per worker, and the KL reference is the same module with its adapters disabled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from roll_spotlight.checks import require, require_choice, require_int, require_number

#: flow_grpo's Qwen-Image target modules (names relative to a `QwenImageTransformerBlock`).
QWEN_IMAGE_TARGET_MODULES: tuple[str, ...] = (
    "attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0",
    "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
    "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2",
)
LORA_INITS = ("gaussian", "default")  # peft's init_lora_weights: "gaussian" or True (Kaiming A); B = 0 either way
ADAPTER_NAME = "default"
_BLOCK_PREFIX = re.compile(r"^transformer_blocks\.\d+\.")
_ADAPTER_LAYER = re.compile(rf"\.lora_[AB]\.{ADAPTER_NAME}$")


@dataclass
class LoraConfig:
    """The `train.lora` section: low-rank adapters on `target_modules` of the transformer.

    `alpha / rank` scales the adapter's output (peft's `lora_alpha`). A target names a Linear layer
    by its full name or by a dotted suffix of it ("attn.to_q" matches it in every block), as peft
    matches them. `dropout` > 0 makes the training forward differ from the rollout's (eval) one, so
    the first importance ratio is no longer exactly 1; flow_grpo uses 0.
    """

    rank: int = 64
    alpha: float = 128.0
    target_modules: tuple[str, ...] = field(default_factory=lambda: QWEN_IMAGE_TARGET_MODULES)
    dropout: float = 0.0
    init: str = "gaussian"

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, str):
            self.target_modules = (self.target_modules,)
        self.target_modules = tuple(str(t) for t in self.target_modules)
        require_int("train.lora.rank", self.rank)
        require_number("train.lora.alpha", self.alpha)
        require(bool(self.target_modules) and all(self.target_modules), "train.lora.target_modules",
                list(self.target_modules), f"must be a non-empty list of module names (Qwen-Image: "
                f"{list(QWEN_IMAGE_TARGET_MODULES)})")
        require_number("train.lora.dropout", self.dropout, "[0, 1)")
        require_choice("train.lora.init", self.init, LORA_INITS)
        self.alpha, self.dropout = float(self.alpha), float(self.dropout)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def for_preset(cls, preset: str) -> LoraConfig:
        """flow_grpo's values for `qwen_image`; for `tiny` (hidden size 128) rank 8, alpha 16, same targets."""
        if preset == "qwen_image":
            return cls()
        if preset == "tiny":
            return cls(rank=8, alpha=16.0)
        raise ValueError(f"model.preset must be 'tiny' or 'qwen_image', got {preset!r}")

    def to_peft(self):
        """The equivalent `peft.LoraConfig`."""
        from peft import LoraConfig as PeftLoraConfig

        return PeftLoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
                              init_lora_weights=True if self.init == "default" else self.init,
                              target_modules=list(self.target_modules))


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def target_names(transformer) -> list[str]:
    """Names a target may use: every Linear layer, block-relative inside `transformer_blocks`."""
    import torch

    names = {_BLOCK_PREFIX.sub("", n) for n, m in transformer.named_modules() if isinstance(m, torch.nn.Linear)}
    return sorted(names)


def matched_modules(transformer, target_modules: Iterable[str]) -> dict[str, object]:
    """{full name: Linear} of the layers `target_modules` select; ValueError naming
    `train.lora.target_modules` when a target selects nothing or a layer that is not Linear."""
    import torch

    modules = dict(transformer.named_modules())
    out: dict[str, object] = {}
    for target in target_modules:
        hits = {n: m for n, m in modules.items() if n and _matches(n, target)}
        bad = sorted(n for n, m in hits.items() if not isinstance(m, torch.nn.Linear))
        if not hits or bad:
            why = f"selects non-Linear modules {bad[:3]}" if bad else "matches no module"
            raise ValueError(f"train.lora.target_modules: {target!r} {why} of {type(transformer).__name__}; "
                             f"names that would fit: {target_names(transformer)}")
        out.update(hits)
    return out


def apply_lora(transformer, cfg: LoraConfig) -> None:
    """Inject adapter `default` into `transformer` (diffusers' `add_adapter`; only adapters require
    grad). The adapters are float32 whatever the base dtype: AdamW steps of ~lr x 1e-2 would round
    away in a bf16 weight (flow_grpo also keeps float32 trainable weights); peft casts activations
    to the adapter's dtype and the sum back to the base layer's."""
    import torch

    matched_modules(transformer, cfg.target_modules)
    transformer.add_adapter(cfg.to_peft(), adapter_name=ADAPTER_NAME)
    for name, module in transformer.named_modules():
        if isinstance(module, torch.nn.Linear) and _ADAPTER_LAYER.search(name):
            module.float()


def is_lora_key(key: str) -> bool:
    """Whether a state-dict key is an adapter tensor (peft's `lora_A` / `lora_B` weights)."""
    return ".lora_A." in key or ".lora_B." in key


def adapter_parameter_count(transformer, cfg: LoraConfig) -> int:
    """Parameters the adapters of `cfg` add to `transformer`: rank * (in + out) per targeted Linear."""
    return sum(cfg.rank * (m.in_features + m.out_features)
               for m in matched_modules(transformer, cfg.target_modules).values())


_BYTES = {"float32": 4, "bfloat16": 2}


def meta_transformer(transformer_config: Mapping):
    """A `QwenImageTransformer2DModel` of `transformer_config` on the meta device (no memory, no weights)."""
    import torch
    from diffusers import QwenImageTransformer2DModel

    keys = {k: v for k, v in dict(transformer_config).items() if not k.startswith("_")}
    with torch.device("meta"):
        return QwenImageTransformer2DModel(**keys)


def weight_version_bytes(transformer_config: Mapping, lora: LoraConfig | None = None,
                         dtype: str = "bfloat16", adapter_dtype: str = "float32") -> int:
    """Bytes one weight version of the transformer carries, from its config alone: the whole state
    dict in `dtype` without LoRA; the adapter tensors in `adapter_dtype` with it (`apply_lora` keeps
    them in float32)."""
    if dtype not in _BYTES or adapter_dtype not in _BYTES:
        raise ValueError(f"dtype and adapter_dtype must be one of {tuple(_BYTES)}, got {dtype!r}, {adapter_dtype!r}")
    model = meta_transformer(transformer_config)
    if lora is None:
        return sum(t.numel() for t in model.state_dict().values()) * _BYTES[dtype]
    return adapter_parameter_count(model, lora) * _BYTES[adapter_dtype]
