"""GPU memory plan per role (trainer, rollout worker, explorer) for a Qwen-Image transformer config.

Computed from the transformer's config.json alone, so it works for the full 20B model without its
weights (``spotlight train --check`` prints it). Pure python: torch and diffusers are imported only
inside :func:`count_parameters_meta`, which counts exactly by building the model on the meta device;
:func:`count_parameters` is the closed formula (tests check both agree on the tiny and full configs).

Rows (bytes, shown in GiB = 2**30 bytes; ``gpu_memory_gb`` is read in the same unit):

- base weights: frozen transformer weights in ``dtype`` (+ the VAE on rollout roles, + the text
  encoder only if ``text_encoder_on_gpu``: prompt embeddings are cached, so it can live off the GPU);
  the trainer's are divided over ``fsdp_shards`` (FSDP2 ``fully_shard`` shards frozen weights too).
- trainable parameters / gradients / optimizer states: LoRA adapters (or the whole transformer for
  full fine-tuning) in ``lora_dtype`` (peft keeps adapters in fp32 by default), gradients in the same
  dtype, AdamW m and v in fp32 (8 bytes/param) plus an fp32 master copy (4 bytes/param) when the
  trainable dtype is not fp32. Full fine-tuning in fp32 storage is 16 bytes/param. Rollout roles hold
  only the adapters of the current weight version; the KL reference is the same module with the
  adapters disabled, so it costs nothing.
- activations, trainer: ``tokens = (H/16)*(W/16)`` image tokens (VAE 8x down, 2x2 patches; the
  pixel-space tiny DiT has ``vae_scale_factor=1``, no VAE) ``+``
  ``text_tokens``. With gradient checkpointing diffusers saves each block's inputs (image and text
  hidden states, ``tokens*d`` elements per sample per layer), and during the backward one block is
  recomputed with its full activations: :data:`TRAIN_ELEMS_PER_TOKEN` ``*d`` elements per token
  (LayerNorm/modulation inputs, q/k before QK-norm and before RoPE, the joint q/k/v and output kept by
  SDPA, the MLP's 4d pre- and post-GELU, gate products; memory-efficient attention, no tokens^2
  matrix) plus, per LoRA-targeted linear, the input cast to the adapter dtype that peft saves, plus
  two ``tokens*d`` gradient buffers. Without checkpointing every layer keeps its full activations.
  With CFG the training log-prob uses the guided velocity, so the negative branch's activations are
  kept as well (its own row).
- activations, rollout/explorer (no grad), for ``rollout_batch`` (``explore_batch``) images: the
  larger of one block's working set, :data:`INFER_ELEMS_PER_TOKEN` ``*d`` elements per token on
  ``image_tokens/sp_degree + text_tokens`` tokens per row (Ulysses SP shards image tokens; weights
  are replicated), and the VAE decode of the batch (:data:`VAE_DECODE_TENSORS` tensors of
  ``base_dim`` channels at full resolution). With ``cfg_batched`` (both branches in one forward)
  the "CFG negative branch" row is what the negative rows add above that peak; one after the
  other (diffusers' pipeline), the kept conditional velocity. :func:`largest_batch` fits the GPU.
- inputs and buffers: latents, the trajectory (``sampling_steps + 1`` latents per image), prompt
  embeddings; runtime overhead: CUDA context and allocator slack, an assumption (``overhead_gb``).

These are estimates for planning; ``benchmarks/gpu_check.py`` measures the real peak of one guided
step and one training micro-step.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from roll_spotlight.models.lora import QWEN_IMAGE_TARGET_MODULES

GIB = float(2 ** 30)

#: Qwen-Image's transformer/config.json (equal to diffusers' QwenImageTransformer2DModel defaults).
QWEN_IMAGE_TRANSFORMER_CONFIG: dict[str, Any] = {
    "patch_size": 2,
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 60,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 3584,
    "guidance_embeds": False,
    "axes_dims_rope": [16, 56, 56],
    "zero_cond_t": False,
    "use_additional_t_cond": False,
    "use_layer3d_rope": False,
}
#: Qwen2.5-VL-7B (Qwen-Image's text encoder), counted on the meta device from its published config
#: (equals the model card's 8.29B).
QWEN25_VL_7B_PARAMS = 8_292_166_656
#: AutoencoderKLQwenImage with diffusers' defaults (base_dim 96, z_dim 16), counted on the meta device.
QWEN_IMAGE_VAE_PARAMS = 126_892_531
QWEN_IMAGE_VAE_BASE_DIM = 96
#: flow_grpo's Qwen-Image LoRA (scripts/train_qwenimage.py): r=64, lora_alpha=128, gaussian init.
FLOW_GRPO_LORA_RANK = 64
FLOW_GRPO_LORA_ALPHA = 128
FLOW_GRPO_LORA_TARGETS = QWEN_IMAGE_TARGET_MODULES

#: Elements of width d saved per token by one block's forward with grad (see the module docstring).
TRAIN_ELEMS_PER_TOKEN = 25
#: Elements of width d live per token at the peak of one block's forward without grad (residual,
#: modulated input, the MLP's 4d pre- and post-GELU).
INFER_ELEMS_PER_TOKEN = 10
#: Tensors of ``base_dim`` channels at full resolution live at the VAE decoder's peak.
VAE_DECODE_TENSORS = 8
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ROLES = ("trainer", "rollout", "explorer")
ROWS = ("base weights", "trainable parameters", "gradients", "optimizer states", "activations",
        "CFG negative branch", "inputs and buffers", "runtime overhead")


# ------------------------------------------------------------------------------------ parameters
def _cfg(config: Mapping[str, Any] | None) -> dict[str, Any]:
    merged = dict(QWEN_IMAGE_TRANSFORMER_CONFIG)
    if config:
        merged.update({k: v for k, v in config.items() if not k.startswith("_")})
    if merged.get("out_channels") is None:
        merged["out_channels"] = merged["in_channels"]
    return merged


def linear_layers(config: Mapping[str, Any] | None = None) -> Iterator[tuple[str, int, int]]:
    """Every ``nn.Linear`` of the transformer as (module name, in_features, out_features); all have a bias."""
    c = _cfg(config)
    d = c["num_attention_heads"] * c["attention_head_dim"]
    yield "time_text_embed.timestep_embedder.linear_1", 256, d
    yield "time_text_embed.timestep_embedder.linear_2", d, d
    yield "img_in", c["in_channels"], d
    yield "txt_in", c["joint_attention_dim"], d
    for i in range(c["num_layers"]):
        p = f"transformer_blocks.{i}."
        yield p + "img_mod.1", d, 6 * d
        yield p + "txt_mod.1", d, 6 * d
        for name in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"):
            yield p + "attn." + name, d, d
        for stream in ("img_mlp", "txt_mlp"):
            yield p + stream + ".net.0.proj", d, 4 * d
            yield p + stream + ".net.2", 4 * d, d
    yield "norm_out.linear", d, 2 * d
    yield "proj_out", d, c["patch_size"] ** 2 * c["out_channels"]


def count_parameters(config: Mapping[str, Any] | None = None) -> int:
    """Parameters of ``QwenImageTransformer2DModel(**config)`` by closed formula: the linears, the
    text RMSNorm (joint_attention_dim), four QK RMSNorms per block (head_dim each), and the extra
    timestep embedding when ``use_additional_t_cond``."""
    c = _cfg(config)
    d = c["num_attention_heads"] * c["attention_head_dim"]
    linears = sum(i * o + o for _, i, o in linear_layers(c))
    norms = c["joint_attention_dim"] + c["num_layers"] * 4 * c["attention_head_dim"]
    extra = 2 * d if c.get("use_additional_t_cond") else 0
    return linears + norms + extra


def count_parameters_meta(config: Mapping[str, Any] | None = None) -> int:
    """Exact count: build the diffusers model on the meta device (no memory, no weights)."""
    return _meta_count(json.dumps(_cfg(config), sort_keys=True))


@functools.lru_cache(maxsize=8)
def _meta_count(config_json: str) -> int:
    import torch
    from diffusers import QwenImageTransformer2DModel

    with torch.device("meta"):
        model = QwenImageTransformer2DModel(**json.loads(config_json))
    return sum(p.numel() for p in model.parameters())


def transformer_parameters(config: Mapping[str, Any] | None = None) -> tuple[int, str]:
    """(count, how it was counted): the meta-device count where torch and diffusers import, else the formula."""
    try:
        return count_parameters_meta(config), "meta-device instantiation"
    except ImportError:
        return count_parameters(config), "closed formula"


def lora_parameters(config: Mapping[str, Any] | None, rank: int, targets: tuple[str, ...] | list[str]) -> int:
    """Adapter parameters peft adds: r*(in+out) per targeted linear (peft's rule: a target matches a
    module whose name equals it or ends with "." + it). A target matching nothing is a ValueError."""
    if not isinstance(rank, int) or rank <= 0:
        raise ValueError(f"train.lora.rank must be a positive int, got {rank!r}")
    layers = list(linear_layers(config))
    unmatched = [t for t in targets if not any(n == t or n.endswith("." + t) for n, _, _ in layers)]
    if unmatched or not targets:
        examples = sorted({n.split(".", 2)[-1] for n, _, _ in layers if n.startswith("transformer_blocks.0.")})
        raise ValueError(f"train.lora.target_modules {unmatched or list(targets)} match no linear layer of the "
                         f"Qwen-Image transformer; per-block linears are {examples}")
    return sum(rank * (i + o) for n, i, o in layers if any(n == t or n.endswith("." + t) for t in targets))


def _lora_input_elems(config: Mapping[str, Any], targets: tuple[str, ...]) -> int:
    """Per token per block: input features of the LoRA-targeted block linears (each casts its own input)."""
    block = [(n, i) for n, i, _ in linear_layers({**config, "num_layers": 1}) if n.startswith("transformer_blocks.0.")]
    img = sum(i for n, i in block if "txt" not in n and "add_" not in n and "_mod" not in n
              and any(n.endswith("." + t) for t in targets))
    txt = sum(i for n, i in block if ("txt_mlp" in n or "add_" in n) and any(n.endswith("." + t) for t in targets))
    return max(img, txt)


def transformer_config_from_dir(path: str | Path) -> dict[str, Any]:
    """``<path>/transformer/config.json`` (a pipeline directory) or ``<path>/config.json`` as a dict."""
    root = Path(path)
    for candidate in (root / "transformer" / "config.json", root / "config.json"):
        if candidate.is_file():
            return json.loads(candidate.read_text())
    raise FileNotFoundError(f"no transformer config.json under {root}")


# ------------------------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class PlanSettings:
    """What the plan depends on besides the transformer config; errors name the run-config key."""

    height: int = 512
    width: int = 512
    dtype: str = "bfloat16"
    lora_rank: int | None = FLOW_GRPO_LORA_RANK   # None: full fine-tuning
    lora_targets: tuple[str, ...] = FLOW_GRPO_LORA_TARGETS
    lora_dtype: str = "float32"
    micro_batch: int = 1            # trainer samples per micro-step
    rollout_batch: int = 1          # images denoised together by a rollout worker
    explore_batch: int = 1          # images denoised together by an explorer
    cfg: bool = True
    cfg_batched: bool = False       # rollouts: cond + negative in one batch (else one after the other)
    text_tokens: int = 512
    gradient_checkpointing: bool = True
    text_encoder_params: int = QWEN25_VL_7B_PARAMS
    vae_params: int = QWEN_IMAGE_VAE_PARAMS
    vae_base_dim: int = QWEN_IMAGE_VAE_BASE_DIM
    vae_scale_factor: int = 8       # pixels per latent pixel (1: the pixel-space tiny DiT, no VAE)
    text_encoder_on_gpu: bool = False
    fsdp_shards: int = 1
    sp_degree: int = 1
    sampling_steps: int = 10
    gpu_memory_gb: float | None = None
    overhead_gb: float = 2.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        for key in ("height", "width"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"model.image_size ({key}) must be a positive int, got {value!r}")
        for key in ("dtype", "lora_dtype"):
            if getattr(self, key) not in DTYPE_BYTES:
                raise ValueError(f"memory plan: {key} must be one of {sorted(DTYPE_BYTES)}, got {getattr(self, key)!r}")
        for key in ("micro_batch", "rollout_batch", "explore_batch", "text_tokens", "fsdp_shards", "sp_degree",
                    "sampling_steps", "vae_scale_factor"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"memory plan: {key} must be a positive int, got {value!r}")
        for key in ("text_encoder_params", "vae_params", "vae_base_dim"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"memory plan: {key} must be an int >= 0, got {value!r}")
        if self.gpu_memory_gb is not None and not self.gpu_memory_gb > 0:
            raise ValueError(f"model.gpu_memory_gb must be > 0, got {self.gpu_memory_gb!r}")
        if not self.overhead_gb >= 0:
            raise ValueError(f"memory plan: overhead_gb must be >= 0, got {self.overhead_gb!r}")


@dataclass
class MemoryPlan:
    """Bytes per (role, row), the settings and the transformer sizes they came from."""

    settings: PlanSettings
    transformer_config: dict[str, Any]
    transformer_params: int
    params_source: str
    trainable_params: int
    image_tokens: int
    bytes: dict[str, dict[str, float]] = field(default_factory=dict)

    def total(self, role: str) -> float:
        return sum(self.bytes[role].values())

    def total_gib(self, role: str) -> float:
        return self.total(role) / GIB

    def fits(self, role: str) -> bool | None:
        """None when no ``gpu_memory_gb`` was given."""
        limit = self.settings.gpu_memory_gb
        return None if limit is None else self.total_gib(role) <= limit

    def to_dict(self) -> dict[str, Any]:
        return {"settings": dataclasses.asdict(self.settings), "transformer_params": self.transformer_params,
                "params_source": self.params_source, "trainable_params": self.trainable_params,
                "image_tokens": self.image_tokens,
                "gib": {r: {k: v / GIB for k, v in rows.items()} for r, rows in self.bytes.items()},
                "total_gib": {r: self.total_gib(r) for r in ROLES}, "fits": {r: self.fits(r) for r in ROLES}}


def memory_plan(transformer_config: Mapping[str, Any] | None = None, settings: PlanSettings | None = None,
                **overrides: Any) -> MemoryPlan:
    """The plan for ``transformer_config`` (None: full Qwen-Image) under ``settings`` (+ keyword overrides)."""
    s = dataclasses.replace(settings or PlanSettings(), **overrides)
    c = _cfg(transformer_config)
    heads = c["num_attention_heads"]
    d = heads * c["attention_head_dim"]
    if heads % s.sp_degree:
        raise ValueError(f"memory plan: sp_degree={s.sp_degree} must divide num_attention_heads={heads}")
    n_params, source = transformer_parameters(c)
    full_ft = s.lora_rank is None
    trainable = n_params if full_ft else lora_parameters(c, s.lora_rank, s.lora_targets)
    lora_input = 0 if full_ft or s.lora_dtype == s.dtype else _lora_input_elems(c, s.lora_targets)
    down = s.vae_scale_factor * c["patch_size"]
    if s.height % down or s.width % down:
        raise ValueError(f"model.image_size must be a multiple of {down} (VAE x{s.vae_scale_factor}, "
                         f"patch {c['patch_size']}), got {s.height}x{s.width}")
    img_tokens = (s.height // down) * (s.width // down)
    w, tw = DTYPE_BYTES[s.dtype], DTYPE_BYTES[s.lora_dtype]
    te = s.text_encoder_params * w if s.text_encoder_on_gpu else 0.0
    overhead = s.overhead_gb * GIB
    cfg_mult = 2 if s.cfg else 1
    tokens = img_tokens + s.text_tokens
    lat = img_tokens * c["in_channels"] * 4  # one packed fp32 latent
    emb = s.text_tokens * c["joint_attention_dim"] * w

    # trainer
    frozen = 0 if full_ft else n_params
    master = 4 if tw != 4 else 0
    layer_act = tokens * (TRAIN_ELEMS_PER_TOKEN * d * w + lora_input * tw)
    if s.gradient_checkpointing:
        act_one = s.micro_batch * (c["num_layers"] * tokens * d * w + layer_act + 2 * tokens * d * w)
    else:
        act_one = s.micro_batch * c["num_layers"] * layer_act
    gather = 0.0 if s.fsdp_shards == 1 else 2 * (count_parameters({**c, "num_layers": 1}) - count_parameters(
        {**c, "num_layers": 0})) * w  # two blocks' weights gathered (current + prefetch)
    trainer = {
        "base weights": frozen * w / s.fsdp_shards + gather + te,
        "trainable parameters": trainable * tw / s.fsdp_shards,
        "gradients": trainable * tw / s.fsdp_shards,
        "optimizer states": trainable * (8 + master) / s.fsdp_shards,
        "activations": act_one,
        "CFG negative branch": act_one if s.cfg else 0.0,
        "inputs and buffers": s.micro_batch * (3 * lat + cfg_mult * emb),
        "runtime overhead": overhead,
    }

    def rollout(batch: int) -> dict[str, float]:
        local = img_tokens // s.sp_degree + s.text_tokens
        working = batch * local * INFER_ELEMS_PER_TOKEN * d * w
        vae = batch * s.height * s.width * s.vae_base_dim * VAE_DECODE_TENSORS * w if s.vae_params else 0.0
        peak = max(working, vae)
        negative = max(2 * working, vae) - peak if s.cfg_batched else batch * lat
        return {
            "base weights": n_params * w + s.vae_params * w + te,
            "trainable parameters": 0.0 if full_ft else trainable * tw,
            "gradients": 0.0,
            "optimizer states": 0.0,
            "activations": peak,
            "CFG negative branch": negative if s.cfg else 0.0,
            "inputs and buffers": batch * ((s.sampling_steps + 2) * lat + cfg_mult * emb),
            "runtime overhead": overhead,
        }

    plan = MemoryPlan(settings=s, transformer_config=c, transformer_params=n_params, params_source=source,
                      trainable_params=trainable, image_tokens=img_tokens)
    plan.bytes = {"trainer": trainer, "rollout": rollout(s.rollout_batch), "explorer": rollout(s.explore_batch)}
    return plan


# ------------------------------------------------------------------------------------ fit check
def largest_batch(plan: MemoryPlan, role: str = "rollout", gpu_memory_gb: float | None = None,
                  most: int = 4096) -> int:
    """The most images ``role`` (rollout or explorer) can denoise together within ``gpu_memory_gb``
    (default the plan's), all else as planned; 0 when not even one fits."""
    limit = plan.settings.gpu_memory_gb if gpu_memory_gb is None else gpu_memory_gb
    assert limit is not None, "largest_batch needs a GPU memory"
    lo, hi = 0, most
    while lo < hi:                       # the plan grows with the batch: the last batch that fits
        mid = (lo + hi + 1) // 2
        key = "rollout_batch" if role == "rollout" else "explore_batch"
        fits = memory_plan(plan.transformer_config, plan.settings, **{key: mid}).total_gib(role) <= limit
        lo, hi = (mid, hi) if fits else (lo, mid - 1)
    return lo


def _alternatives(plan: MemoryPlan, role: str) -> Iterator[tuple[str, dict[str, Any]]]:
    s = plan.settings
    if s.text_encoder_on_gpu:
        yield "text encoder off the GPU (cached prompt embeddings)", {"text_encoder_on_gpu": False}
    if role == "trainer":
        if s.micro_batch > 1:
            yield "train.micro_batch=1", {"micro_batch": 1}
        if not s.gradient_checkpointing:
            yield "model.gradient_checkpointing=true", {"gradient_checkpointing": True}
        if s.lora_rank is None:
            yield f"LoRA (train.lora.rank={FLOW_GRPO_LORA_RANK})", {"lora_rank": FLOW_GRPO_LORA_RANK}
        for shards in (2, 4, 8, 16, 32):
            if shards > s.fsdp_shards:
                yield f"FSDP over {shards} data-parallel ranks", {"fsdp_shards": shards}
    else:
        key = "rollout_batch" if role == "rollout" else "explore_batch"
        if getattr(s, key) > 1 and (batch := largest_batch(plan, role)) >= 1:
            yield f"sampling.max_batch={batch}", {key: batch}
        if s.cfg and s.cfg_batched:
            yield "conditional and negative forwards one after the other", {"cfg_batched": False}
        heads = plan.transformer_config["num_attention_heads"]
        for degree in (2, 3, 4, 6, 8):
            if degree > s.sp_degree and heads % degree == 0 and plan.image_tokens % degree == 0:
                yield f"Ulysses SP degree {degree}", {"sp_degree": degree}


def fit_errors(plan: MemoryPlan) -> list[str]:
    """One message per role that exceeds ``gpu_memory_gb``, naming the key and what would fit."""
    limit = plan.settings.gpu_memory_gb
    errors = []
    for role in ROLES:
        if plan.fits(role) is not False or (role == "explorer" and plan.bytes["explorer"] == plan.bytes["rollout"]):
            continue  # an explorer planned as the rollout worker has its error
        tried = []
        fix = None
        for label, change in _alternatives(plan, role):
            alt = memory_plan(plan.transformer_config, plan.settings, **change)
            tried.append(f"{label}: {alt.total_gib(role):.1f} GiB")
            if alt.fits(role):
                fix = f"would fit with {label} ({alt.total_gib(role):.1f} GiB)"
                break
        errors.append(f"memory plan: the {role} needs {plan.total_gib(role):.1f} GiB > model.gpu_memory_gb={limit:g}; "
                      + (fix or ("nothing tried fits (" + "; ".join(tried) + ")" if tried else "nothing to try")))
    return errors


def check_memory_plan(plan: MemoryPlan) -> MemoryPlan:
    """The plan, or ValueError with every role's :func:`fit_errors` message."""
    errors = fit_errors(plan)
    if errors:
        raise ValueError("\n".join(errors))
    return plan


def format_memory_plan(plan: MemoryPlan) -> str:
    """A markdown table: one row per memory item, one column per role, GiB."""
    s = plan.settings
    lora = "full fine-tuning" if s.lora_rank is None else f"LoRA r={s.lora_rank} on {len(s.lora_targets)} module kinds"
    head = (f"Memory plan: {s.height}x{s.width}, {plan.image_tokens} image + {s.text_tokens} text tokens, {s.dtype}, "
            f"{lora} ({plan.trainable_params:,} trainable of {plan.transformer_params:,}, {plan.params_source}), "
            f"micro-batch {s.micro_batch}, rollout batch {s.rollout_batch}, CFG {'on' if s.cfg else 'off'}"
            f"{' (batched)' if s.cfg and s.cfg_batched else ''}, checkpointing {'on' if s.gradient_checkpointing else 'off'}, "
            f"FSDP shards {s.fsdp_shards}, SP degree {s.sp_degree}. GiB.")
    lines = [head, "", "| item | " + " | ".join(ROLES) + " |", "|---|" + "---:|" * len(ROLES)]
    for row in ROWS:
        lines.append(f"| {row} | " + " | ".join(f"{plan.bytes[r][row] / GIB:.2f}" for r in ROLES) + " |")
    lines.append("| **total** | " + " | ".join(f"**{plan.total_gib(r):.2f}**" for r in ROLES) + " |")
    if s.gpu_memory_gb is not None:
        marks = {True: "yes", False: "**no**"}
        lines.append(f"| fits {s.gpu_memory_gb:g} GiB | " + " | ".join(marks[plan.fits(r)] for r in ROLES) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m roll_spotlight.models.memory_plan [--resolution 1280] [--gpu-memory-gb 80] [--rollout-batch 16]``"""
    import argparse

    parser = argparse.ArgumentParser(description="Memory plan per role for Qwen-Image (GiB).")
    parser.add_argument("--config", default=None, help="pipeline or transformer directory (default: full Qwen-Image)")
    parser.add_argument("--resolution", type=int, action="append", default=None, help="repeatable; default 512 and 1280")
    parser.add_argument("--gpu-memory-gb", type=float, default=None)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--text-tokens", type=int, default=512)
    parser.add_argument("--full-finetune", action="store_true")
    parser.add_argument("--no-cfg", action="store_true")
    parser.add_argument("--rollout-batch", type=int, default=1, help="images denoised together (sampling.max_batch)")
    args = parser.parse_args(argv)
    config = transformer_config_from_dir(args.config) if args.config else None
    for res in args.resolution or [512, 1280]:
        degree = 4 if res >= 1024 else 1   # the recipes' rollout SP degree
        plan = memory_plan(config, height=res, width=res, gpu_memory_gb=args.gpu_memory_gb,
                           micro_batch=args.micro_batch, text_tokens=args.text_tokens, cfg=not args.no_cfg,
                           lora_rank=None if args.full_finetune else FLOW_GRPO_LORA_RANK,
                           rollout_batch=args.rollout_batch, explore_batch=args.rollout_batch,
                           cfg_batched=not args.no_cfg, sp_degree=degree)
        print(format_memory_plan(plan))
        print(f"largest rollout batch (sampling.max_batch) that fits {args.gpu_memory_gb or 80.0:g} GiB at SP "
              f"{degree}: {largest_batch(plan, 'rollout', args.gpu_memory_gb or 80.0)}\n")
        for error in fit_errors(plan):
            print(error)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
