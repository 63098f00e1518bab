"""Cost model of Flow-GRPO on Qwen-Image: every time the simulator uses comes from here.

One table, :data:`CONSTANTS`, holds each constant with its unit and its source: a published number
(model card, datasheet, Flow-GRPO's released config), a measurement of this project's mechanisms, or
an explicit ``assumption``. :class:`CostModel` carries the values (overridable from a dict, and
calibratable with measured regroup times) and derives phase times from them:

- a denoising step of ``batch`` images is one forward of ``batch x cfg_forwards`` rows (serial
  mode: ``cfg_forwards`` forwards of one row). Qwen-Image's two streams: an image token passes only
  the image stream's linears, a text token only the text stream's (QKV + out 4 d^2, MLP 8 d^2:
  ``12*hidden^2*layers`` parameters per token), and the modulation linears (the other third of the
  20B) run once per image; joint attention adds ``4*layers*tokens^2*hidden`` (QK^T and AV). That is
  verl-omni's FLOP counter for Qwen-Image (docs/perf/diffusion_mfu.md at ``VERL_OMNI``). A forward
  takes :func:`forward_time_s` at rate ``peak*rollout_mfu``; an SP group of degree d splits the
  FLOPs at efficiency ``1/(1 + overhead*(d-1))`` (the Ulysses all-to-all grows with d);
- a trained step costs ``train_flops_multiplier`` (forward + backward ~ 3x) times that, and only
  the SDE-window steps are trained;
- restarts and joins are sums of process start, NCCL init and weight transfer (bytes / bandwidth);
- with spot training the update is micro-batches of ``train_micro_batch_images``
  samples at one trained step, each on one GPU (``train_micro_batch_s``); a worker reports one
  gradient sum per lease batch (the LoRA adapters' bytes, ``gradient_report_s``) and the trainer
  then clips and steps (``optimizer_step_s``). A weight version is the adapters only
  (``publish_s``): every Qwen-Image config here trains flow_grpo's LoRA.

The rollout curve is fitted to published batching times and ``train_mfu`` calibrated on
verl-omni's published LoRA step (``benchmarks.batching_fit``, ``benchmarks.sim_reference``).
``with_gpu(name)`` swaps another GPU's datasheet figures (``sim.gpus``), keeping MFUs and floor.
Numbers derived from this model are *simulated*; convergence is not modelled
(``api.time_to_target``). ``with_calibration(path, resolution)`` takes the rollout curve and
``train_mfu`` from a ``benchmarks/gpu_check.py`` JSON instead (:func:`load_calibration`); the
``calibration`` field names which: ``PUBLISHED_CALIBRATION`` or the file.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from roll_spotlight.sim.gpus import GPUS, gpu_spec

SOURCE_FLOW_GRPO = "Flow-GRPO released config (yifan123/flow_grpo config/grpo.py, pickscore_qwenimage)"
SOURCE_QWEN_ARCH = "Qwen-Image transformer config (diffusers QwenImageTransformer2DModel defaults)"
VERL_OMNI = "verl-project/verl-omni@a1139bafffb5b9711f0a6b6edff8ecaa60bfff30"
SOURCE_VERL_OMNI_PERF = (f"{VERL_OMNI} docs/algo/performance.md, FlowGRPO LoRA on Qwen-Image OCR: 4 x H800, "
                         "32 prompts x 16 images, 420 s per step (sync reward), 360 s with the reward on a 5th GPU")
SOURCE_VERL_OMNI_BATCHING = (f"{VERL_OMNI} docs/start/rollout_batching.md, 'Expected performance': Qwen-Image "
                             "LoRA, 32x16, 512^2, serial (max_num_seqs=1) 226.4 s vs request-level "
                             "(max_num_seqs=32) 107.9 s generation per step")
# as benchmarks.batching_fit and benchmarks.sim_reference derive them (their tests pin them)
FITTED_KNEE_P = 4.051
FITTED_ROLLOUT_FLOOR_S = 0.08733
FITTED_ROLLOUT_MFU = 0.3994
CALIBRATED_TRAIN_MFU = 0.2653
PUBLISHED_CALIBRATION = "published: verl-omni Qwen-Image LoRA on 4 x H800, 420 s per step"


@dataclass(frozen=True)
class Constant:
    """A cost-model constant: ``value`` in ``unit``, and where the number comes from."""

    value: float
    unit: str
    source: str


CONSTANTS: dict[str, Constant] = {
    # --- model (Qwen-Image) ---
    "params_b": Constant(20.0, "1e9 parameters", "Qwen-Image technical report / model card: 20B MMDiT"),
    "num_layers": Constant(60, "layers", SOURCE_QWEN_ARCH + ": num_layers=60"),
    "hidden_dim": Constant(3072, "features", SOURCE_QWEN_ARCH + ": 24 heads x 128 head dim"),
    "num_heads": Constant(24, "heads", SOURCE_QWEN_ARCH + ": num_attention_heads=24"),
    "pixels_per_token": Constant(16, "pixels per token side",
                                 "Qwen-Image VAE 8x downsampling x 2x2 patches: 512^2 -> 1,024 tokens, "
                                 "1280^2 -> 6,400 tokens"),
    "text_tokens": Constant(128, "tokens", "assumption: typical OCR/GenEval prompt length after templating"),
    "bytes_per_param": Constant(2, "bytes", "bf16 weights (Flow-GRPO mixed_precision=bf16)"),
    # --- hardware ---
    "gpu_peak_tflops": Constant(GPUS["h100"].peak_bf16_tflops, "TFLOP/s", GPUS["h100"].source),
    "rollout_mfu": Constant(FITTED_ROLLOUT_MFU, "fraction of peak",
                            f"fitted: a saturated forward's MFU in {SOURCE_VERL_OMNI_BATCHING}, assumed on 4 x "
                            "H800 and the same fraction of every GPU's peak"),
    "rollout_floor_s": Constant(FITTED_ROLLOUT_FLOOR_S, "s per forward", "fitted with rollout_mfu: the least "
                                f"a forward takes, however few rows, in {SOURCE_VERL_OMNI_BATCHING} (every GPU alike)"),
    "batch_knee_p": Constant(FITTED_KNEE_P, "exponent", "fitted to sgl-project/sglang PR #22183 (comment "
                             "2026-04-10, Qwen-Image-2512 on one H200, guidance 4.0): time per step at batch "
                             "1-16 (512^2) and 1-3 (1024^2)"),
    "train_mfu": Constant(CALIBRATED_TRAIN_MFU, "fraction of peak",
                          f"calibrated: {SOURCE_VERL_OMNI_PERF}; the simulator's vanilla of that run (serial "
                          "rollouts, offloads and weight sync apart) takes the published 420 s; its full-"
                          "fine-tuning twin (4 x H200, 250 s) is then predicted at +6.6%"),
    "sp_overhead_per_rank": Constant(0.04, "fraction per extra rank",
                                     "assumption: Ulysses all-to-all cost inside one NVLink node"),
    "sp_cross_node_factor": Constant(4.0, "x", "assumption: all-to-all over the network instead of NVLink"),
    "nvlink_copy_gb_s": Constant(150.0, "GB/s", "assumption: effective GPU-to-GPU copy on one node, 1/6 "
                                                "of the NVLink peak (H100: 900 GB/s, datasheet); "
                                                "with_gpu keeps the fraction"),
    "network_gb_s": Constant(12.5, "GB/s", "assumption: 100 Gbit/s between nodes"),
    "storage_gb_s": Constant(1.0, "GB/s", "assumption: checkpoint read from cloud object storage / disk"),
    # --- Flow-GRPO workload ---
    "sampling_steps": Constant(10, "denoising steps", SOURCE_FLOW_GRPO + ": sample.num_steps=10"),
    "cfg_forwards": Constant(2, "forwards per step", SOURCE_FLOW_GRPO + ": guidance_scale=4 (true CFG: "
                                                                          "conditional + unconditional)"),
    "group_size": Constant(16, "images per prompt", SOURCE_FLOW_GRPO + ": num_image_per_prompt=16"),
    "prompts_per_iteration": Constant(32, "prompts", SOURCE_FLOW_GRPO + ": 32 GPUs x 4 images x 4 batches "
                                                                         "/ 16 per prompt"),
    "trained_steps": Constant(2, "steps per image", SOURCE_FLOW_GRPO + ": sde_window_size=2"),
    "noise_level": Constant(1.2, "a", SOURCE_FLOW_GRPO + ": noise_level=1.2 (does not change step time)"),
    "train_flops_multiplier": Constant(3.0, "x forward", "LoRA with activation checkpointing (the Qwen-Image "
                                                         "recipes): forward + recomputed forward + the "
                                                         "input-gradient backward (frozen weights get no "
                                                         "weight gradient) ~ 3 forwards"),
    "explore_steps": Constant(10, "denoising steps", "assumption: explore with the rollout schedule, so "
                                                     "a seed's trajectory is the one regenerated"),
    "explore_seeds_critical": Constant(16, "seeds per prompt", "assumption: exploration on the critical "
                                                               "path rolls out 16 extra candidates per "
                                                               "prompt (32 -> train on 16)"),
    "preferred_sp_512": Constant(1, "degree", "assumption: 1,152 tokens fit one H100; no SP needed"),
    "preferred_sp_1280": Constant(4, "degree", "assumption: the paper runs 1280^2 with SP; 4 GPUs per "
                                               "image (elastic.group_plan.degree_for_resolution's 4,096-"
                                               "token rule would give 2)"),
    "max_batch_512": Constant(16, "images", "configs/qwen_image_*_512.yaml sampling.max_batch"),
    "max_batch_1280": Constant(4, "images", "configs/qwen_image_geneval_1280.yaml sampling.max_batch"),
    # --- rewards ---
    "reward_s_ocr": Constant(0.05, "s per image", "assumption: PaddleOCR on a GPU reward server (our CPU "
                                                  "rapidocr measured 0.23-0.32 s per 512^2 image, ENV.md)"),
    "reward_s_geneval": Constant(0.10, "s per image", "assumption: Mask2Former detector on a GPU reward "
                                                      "server"),
    "reward_workers": Constant(8, "concurrent scorers", "assumption: reward servers, not priced (same for "
                                                        "every baseline)"),
    # --- weights and restarts ---
    "local_weight_sync_s": Constant(2.0, "s", "assumption: trainer -> colocated rollout engine reshard"),
    "lora_adapter_gb": Constant(1.70, "GB", "memory plan (roll_spotlight/models/memory_plan.py; README "
                                            "'Qwen-Image'): flow_grpo's LoRA r=64, 424,673,280 trainable "
                                            "parameters in fp32 (peft default) = 1.70 GB; a weight version "
                                            "and a gradient sum each weigh this much"),
    # --- spot training: the update as micro-batches through the queue ---
    "train_micro_batch_images": Constant(4, "samples per micro-batch", SOURCE_FLOW_GRPO + ": train.batch_size "
                                                                       "= sample.train_batch_size = 4 (at one "
                                                                       "trained step; configs/qwen_image_*.yaml: "
                                                                       "train.micro_batch_size 4)"),
    "train_lease_micro_batches": Constant(4, "micro-batches per GPU per report",
                                          "assumption: a training worker leases this many micro-batches per "
                                          "GPU and reports their gradient sum once (a kill without notice "
                                          "loses at most these)"),
    "optimizer_step_s": Constant(1.0, "s", "assumption: trainer adds the last accepted sum, clips and takes "
                                           "an Adam step over the 0.42B adapter parameters with the optimizer "
                                           "state on CPU (flow_grpo fsdp_optimizer_offload=True)"),
    "warm_regroup_s": Constant(0.5, "s", "paper abstract: sub-second SP recovery (our gloo re-form: "
                                         "10-50 ms, ENV.md); calibrate() replaces it with measurements"),
    "process_start_s": Constant(30.0, "s", "assumption: Python + torch + CUDA context + diffusers import"),
    "nccl_init_s": Constant(10.0, "s", "assumption: NCCL communicator init for a small group"),
    "node_boot_s": Constant(60.0, "s", "assumption: VM boot + container start after a spot node is granted"),
    # --- market ---
    "notice_aws_s": Constant(120.0, "s", "AWS EC2 docs: Spot Instance interruption notice, 2 minutes"),
    "notice_gcp_s": Constant(30.0, "s", "GCP Compute Engine docs: Spot VM preemption, 30 s"),
    "notice_azure_s": Constant(30.0, "s", "Azure docs: Scheduled Events Preempt, >= 30 s"),
    # --- prices (used when the trace brings none) ---
    "ondemand_usd_gpu_h": Constant(10.3157, "USD per GPU-hour", "GCP a3-highgpu-8g us-central1 on-demand "
                                                                 "$82.5254/h / 8 (spot/data/skynomad-gcp-h100/"
                                                                 "zones.csv)"),
    "spot_usd_gpu_h": Constant(2.3724, "USD per GPU-hour", "GCP a3-highgpu-8g us-central1 spot $18.979/h "
                                                           "/ 8 (same file)"),
}

RESOLUTIONS = (512, 1280)
_INT_KEYS = frozenset({"num_layers", "hidden_dim", "num_heads", "pixels_per_token", "text_tokens",
                       "bytes_per_param", "sampling_steps", "cfg_forwards", "group_size",
                       "prompts_per_iteration", "trained_steps", "explore_steps",
                       "explore_seeds_critical", "preferred_sp_512", "preferred_sp_1280", "max_batch_512",
                       "max_batch_1280", "reward_workers", "train_micro_batch_images", "train_lease_micro_batches"})


def _defaults() -> dict[str, float]:
    return {name: (int(c.value) if name in _INT_KEYS else float(c.value)) for name, c in CONSTANTS.items()}


def _default_sources() -> dict[str, str]:
    return {name: c.source for name, c in CONSTANTS.items()}


@dataclass(frozen=True)
class CostModel:
    """The constants in force, and the phase times derived from them.

    ``values`` maps every name of :data:`CONSTANTS` to a number; ``sources`` says where each one
    comes from now (a published number, ``"override"`` or ``"measured: ..."``); ``gpu`` names the
    GPU type whose datasheet figures are in force (``sim.gpus``). Derived times are methods, so an
    override of one constant moves every time that depends on it.
    """

    values: Mapping[str, float] = field(default_factory=_defaults)
    sources: Mapping[str, str] = field(default_factory=_default_sources)
    reward: str = "ocr"
    calibration: str = PUBLISHED_CALIBRATION   # or the gpu_check JSON the per-step GPU times come from
    gpu: str = "h100"

    def __post_init__(self) -> None:
        missing = sorted(set(CONSTANTS) - set(self.values))
        unknown = sorted(set(self.values) - set(CONSTANTS))
        if missing or unknown:
            raise ValueError(f"CostModel.values: missing {missing}, unknown {unknown}")
        for name, value in self.values.items():
            if not value > 0:
                raise ValueError(f"CostModel.{name} must be > 0, got {value!r}")
        if self.reward not in ("ocr", "geneval"):
            raise ValueError(f"CostModel.reward must be 'ocr' or 'geneval', got {self.reward!r}")
        gpu_spec(self.gpu)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(name)

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, overrides: Mapping[str, Any] | None = None) -> CostModel:
        """The default model with ``overrides`` (name -> number; ``reward`` -> 'ocr'|'geneval')."""
        return cls().with_overrides(overrides or {})

    def with_overrides(self, overrides: Mapping[str, Any], source: str = "override") -> CostModel:
        """A copy with some constants replaced; unknown names raise ValueError listing known ones."""
        overrides = dict(overrides)
        reward = overrides.pop("reward", self.reward)
        unknown = sorted(set(overrides) - set(CONSTANTS))
        if unknown:
            raise ValueError(f"unknown cost-model key {unknown[0]!r}; known keys: {sorted(CONSTANTS)}")
        values = dict(self.values)
        sources = dict(self.sources)
        for name, value in overrides.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"cost-model key {name!r}: expected a number, got {value!r}")
            values[name] = int(value) if name in _INT_KEYS else float(value)
            sources[name] = source
        return dataclasses.replace(self, values=values, sources=sources, reward=reward)

    def calibrate(self, measured: Mapping[str, float], note: str = "project benchmark") -> CostModel:
        """Replace constants with measured numbers, e.g. ``{"warm_regroup_s": 0.04}``.

        ``cold_restart_s``, when given, makes the modelled cold restart equal to it: the surplus over
        NCCL init + weight load becomes ``process_start_s``; a measurement below those two (a small
        benchmark model) scales all three parts by the same factor.
        """
        measured = dict(measured)
        cold = measured.pop("cold_restart_s", None)
        model = self.with_overrides(measured, source=f"measured: {note}")
        if cold is None:
            return model
        if not cold > 0:
            raise ValueError(f"measured cold_restart_s must be > 0, got {cold!r}")
        rest = model.nccl_init_s + model.weight_load_storage_s()
        if cold > rest:
            parts = {"process_start_s": cold - rest}
        else:
            f = cold / model.cold_restart_s()
            parts = {"process_start_s": model.process_start_s * f, "nccl_init_s": model.nccl_init_s * f,
                     "storage_gb_s": model.storage_gb_s / f}
        return model.with_overrides(parts, source=f"measured: {note} (cold_restart_s={cold})")

    def with_gpu(self, name: str) -> CostModel:
        """A copy on GPU ``name`` (``sim.gpus``; unknown: ValueError listing the known ones): its dense
        peak, and the NVLink copy rate scaled by its NVLink bandwidth. The MFUs are kept (calibrated on
        H800: the same fraction of another peak is an assumption)."""
        spec, now = gpu_spec(name), gpu_spec(self.gpu)
        nvlink = self.nvlink_copy_gb_s * spec.nvlink_gb_s / now.nvlink_gb_s
        model = self.with_overrides({"gpu_peak_tflops": spec.peak_bf16_tflops}, source=spec.source)
        model = model.with_overrides({"nvlink_copy_gb_s": nvlink},
                                     source=f"{self.sources['nvlink_copy_gb_s']}; scaled to {spec.name}")
        return dataclasses.replace(model, gpu=name.strip().lower())

    def with_calibration(self, path: str | Path, resolution: int | None = None, *,
                         allow_tiny: bool = False) -> CostModel:
        """A copy whose rollout curve and ``train_mfu`` come from a gpu_check JSON (see
        :func:`load_calibration`), with ``calibration`` naming the file."""
        measured, note = _calibration(self, path, resolution, allow_tiny)
        model = self.with_overrides(measured, source=f"measured: {note}")
        return dataclasses.replace(model, calibration=str(path))

    def table(self) -> list[dict[str, Any]]:
        """The constants in force with unit and source, for reports."""
        return [{"name": n, "value": self.values[n], "unit": CONSTANTS[n].unit, "source": self.sources[n]}
                for n in CONSTANTS]

    # ---- model geometry ----------------------------------------------------------------------
    def image_tokens(self, resolution: int) -> int:
        """Image tokens of one ``resolution`` x ``resolution`` image (512 -> 1,024; 1280 -> 6,400)."""
        side = resolution // int(self.pixels_per_token)
        return side * side

    def token_params(self) -> float:
        """Parameters one token passes: its stream's attention projections and MLP in every block
        (4 + 8 hidden^2), the per-image modulation weighs the same once per image."""
        return 12.0 * self.hidden_dim ** 2 * self.num_layers

    def forward_flops(self, resolution: int) -> float:
        """FLOPs of one transformer forward on one image: each token through its own stream, the
        modulation once, joint attention over image + text tokens."""
        tokens = self.image_tokens(resolution) + self.text_tokens
        dense = 2.0 * self.token_params() * (tokens + 1)
        attention = 4.0 * self.num_layers * tokens * tokens * self.hidden_dim
        return dense + attention

    def model_bytes(self) -> float:
        return self.params_b * 1e9 * self.bytes_per_param

    def preferred_sp(self, resolution: int) -> int:
        return int(self.preferred_sp_1280 if resolution >= 1024 else self.preferred_sp_512)

    def max_batch(self, resolution: int) -> int:   # the recipes' sampling.max_batch
        return int(self.max_batch_1280 if resolution >= 1024 else self.max_batch_512)

    # ---- compute phases ----------------------------------------------------------------------
    def sp_efficiency(self, degree: int, cross_node: bool = False) -> float:
        overhead = self.sp_overhead_per_rank * (self.sp_cross_node_factor if cross_node else 1.0)
        return 1.0 / (1.0 + overhead * (degree - 1))

    def step_s(self, resolution: int, degree: int = 1, cross_node: bool = False, batch: int = 1,
               serial: bool = False) -> float:
        """One denoising step of ``batch`` images, both CFG branches in one forward, on an SP group of
        ``degree`` GPUs; ``serial``: one image, the branches one after the other (batch 1 before)."""
        assert degree >= 1 and batch >= 1 and not (serial and batch != 1), (degree, batch, serial)
        rows, forwards = (1, self.cfg_forwards) if serial else (batch * int(self.cfg_forwards), 1)
        flops = rows * self.forward_flops(resolution) / (degree * self.sp_efficiency(degree, cross_node))
        rate = self.gpu_peak_tflops * 1e12 * self.rollout_mfu
        return forwards * forward_time_s(flops, self.rollout_floor_s, rate, self.batch_knee_p)

    def rollout_s(self, resolution: int, degree: int = 1, steps: int | None = None,
                  cross_node: bool = False, batch: int = 1, serial: bool = False) -> float:
        """One whole rollout of ``batch`` images (``steps`` steps, default the sampling steps; see ``step_s``)."""
        steps = self.sampling_steps if steps is None else steps
        return steps * self.step_s(resolution, degree, cross_node, batch, serial)

    def train_image_step_flops(self, resolution: int) -> float:
        """FLOPs of training one image at one trained step (forward + backward of both CFG branches)."""
        return self.cfg_forwards * self.train_flops_multiplier * self.forward_flops(resolution)

    def train_s(self, images: int, resolution: int, gpus: int) -> float:
        """Training time of one iteration on ``gpus`` data-parallel GPUs (FSDP)."""
        assert gpus >= 1, gpus
        flops = images * self.trained_steps * self.train_image_step_flops(resolution)
        return flops / (gpus * self.gpu_peak_tflops * 1e12 * self.train_mfu)

    def train_micro_batches(self, images: int) -> int:
        """Micro-batches of one update: chunks of ``train_micro_batch_images`` rows, each at every
        trained step (the update's gradient is their sum)."""
        return math.ceil(images / self.train_micro_batch_images) * int(self.trained_steps)

    def train_micro_batch_s(self, resolution: int, images: int | None = None) -> float:
        """One micro-batch of ``images`` samples (default a full one) at one trained step on one GPU:
        the same FLOPs per sample and MFU as ``train_s``."""
        images = self.train_micro_batch_images if images is None else images
        flops = images * self.train_image_step_flops(resolution)
        return flops / (self.gpu_peak_tflops * 1e12 * self.train_mfu)

    def reward_s(self) -> float:
        """Scoring time of one image on one reward worker."""
        return self.reward_s_ocr if self.reward == "ocr" else self.reward_s_geneval

    # ---- transfers of a given size ------------------------------------------------------------
    def network_s(self, nbytes: float) -> float:
        """``nbytes`` between nodes (a weight publish or fetch, a spot worker's gradient sum)."""
        return nbytes / (self.network_gb_s * 1e9)

    def nvlink_s(self, nbytes: float) -> float:
        """``nbytes`` between two GPUs of one node (a peer weight copy, an SP group's gradient sum)."""
        return nbytes / (self.nvlink_copy_gb_s * 1e9)

    def storage_s(self, nbytes: float) -> float:
        """``nbytes`` read from checkpoint storage."""
        return nbytes / (self.storage_gb_s * 1e9)

    # ---- weights, restarts, joins -------------------------------------------------------------
    def weight_load_storage_s(self) -> float:
        return self.storage_s(self.model_bytes())

    def weight_copy_nvlink_s(self) -> float:
        return self.nvlink_s(self.model_bytes())

    def weight_copy_network_s(self) -> float:
        return self.network_s(self.model_bytes())

    def adapter_bytes(self) -> float:
        """A weight version, and a gradient sum: the LoRA adapters (same shape and dtype)."""
        return self.lora_adapter_gb * 1e9

    def publish_s(self) -> float:
        """A new weight version from the trainer to the spot workers: the adapters over the network
        (the frozen base is already on every worker)."""
        return self.network_s(self.adapter_bytes())

    def gradient_report_s(self, over_network: bool, degree: int = 1, nbytes: float | None = None) -> float:
        """One gradient sum of ``nbytes`` (default the adapters) reaching the trainer: an SP group
        first sums its members' over NVLink, then the sum crosses the network (a spot worker) or
        NVLink (on the trainer's node)."""
        assert degree >= 1, degree
        nbytes = self.adapter_bytes() if nbytes is None else nbytes
        link_s = self.network_s(nbytes) if over_network else self.nvlink_s(nbytes)
        return (self.nvlink_s(nbytes) if degree > 1 else 0.0) + link_s

    def cold_restart_s(self) -> float:
        """A broken SP group restarted the naive way: new processes, NCCL init, weights from storage."""
        return self.process_start_s + self.nccl_init_s + self.weight_load_storage_s()

    def cold_join_s(self) -> float:
        """A newly granted spot node joining the naive way: boot, then a cold restart."""
        return self.node_boot_s + self.cold_restart_s()

    def warm_join_s(self, peer_on_node: bool) -> float:
        """A new node joining Spotlight: boot and a process start are unavoidable, then weights are
        copied from a peer on the same node (NVLink) or from a remote peer (network)."""
        copy = self.weight_copy_nvlink_s() if peer_on_node else self.weight_copy_network_s()
        return self.node_boot_s + self.process_start_s + copy + self.warm_regroup_s

    def notice_s(self, provider: str) -> float:
        key = f"notice_{provider.lower()}_s"
        if key not in self.values:
            raise ValueError(f"unknown provider {provider!r}; known: aws, gcp, azure")
        return self.values[key]

    # ---- whole phases (used by tests and the analytic checks) ---------------------------------
    def images_per_iteration(self) -> int:
        return int(self.group_size * self.prompts_per_iteration)


# ---- calibration from benchmarks/gpu_check.py ---------------------------------------------------
CALIBRATION_SCHEMA = "roll_spotlight.gpu_check/1"


def load_calibration(path: str | Path, resolution: int | None = None, *, allow_tiny: bool = False,
                     base: CostModel | None = None) -> dict[str, float]:
    """The constants a gpu_check JSON replaces: ``{"rollout_mfu", "rollout_floor_s", "train_mfu"}``.

    The measured times are turned back into the constants the cost model needs to reproduce them
    (with the measurement's own text-token count; ``base``'s other constants, default
    ``CostModel()``): the rollout curve through the serial guided step and the largest batch of the
    sweep that ran (:func:`fit_floor_rate`, the knee kept), else the fitted curve stretched in time
    to the serial step; a training micro-step is the cond + negative forward and backward of one
    image, so ``train_mfu = cfg_forwards * train_flops_multiplier * forward_flops /
    (peak * micro_step_s)`` (one GPU: no FSDP communication, no optimizer step). With two or more
    resolutions measured and none asked for, the one closest to ``resolution`` is used (the largest
    if None). A ``--tiny`` file is refused unless ``allow_tiny`` (its times are not the 20B model's).
    """
    return _calibration(base or CostModel(), path, resolution, allow_tiny)[0]


def _calibration(base: CostModel, path: str | Path, resolution: int | None,
                 allow_tiny: bool) -> tuple[dict[str, float], str]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--calibration {path}: cannot read a gpu_check JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("schema") != CALIBRATION_SCHEMA:
        raise ValueError(f"--calibration {path}: schema must be {CALIBRATION_SCHEMA!r} "
                         f"(written by benchmarks/gpu_check.py), got {data.get('schema') if isinstance(data, dict) else data!r}")
    tiny = bool(data.get("config", {}).get("tiny"))
    if tiny and not allow_tiny:
        raise ValueError(f"--calibration {path}: written with --tiny (a tiny model's times); run "
                         "benchmarks/gpu_check.py without --tiny on a GPU")
    measured = {int(r): v for r, v in data.get("resolutions", {}).items()}
    if not measured:
        raise ValueError(f"--calibration {path}: no resolutions measured")
    res = max(measured) if resolution is None else min(measured, key=lambda r: (abs(r - resolution), -r))
    entry = measured[res]
    try:
        step_s = float(entry["guided_step"]["median_s"])
        micro_s = float(entry["train_micro_step"]["median_s"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"--calibration {path}: resolution {res} lacks guided_step/train_micro_step "
                         f"median_s ({exc})") from exc
    if not (step_s > 0 and micro_s > 0):
        raise ValueError(f"--calibration {path}: measured times must be > 0, got {step_s}, {micro_s}")
    text_tokens = data.get("config", {}).get("text_tokens", base.text_tokens)
    shaped = base.with_overrides({"text_tokens": text_tokens})
    peak = shaped.gpu_peak_tflops * 1e12
    flops = shaped.forward_flops(res)
    curve, swept = _rollout_curve(shaped, res, step_s, entry.get("batch_sweep") or {})
    values = {**curve, "train_mfu": shaped.cfg_forwards * shaped.train_flops_multiplier * flops / (peak * micro_s)}
    if not tiny:
        high = {k: v for k, v in values.items() if k.endswith("_mfu") and v > 1.0}
        if high:
            raise ValueError(f"--calibration {path}: the measured times imply {high} > 1 of "
                             f"gpu_peak_tflops={shaped.gpu_peak_tflops}: not the cost model's transformer")
    device = data.get("device", {}).get("name", "unknown device")
    note = (f"{path} ({device}, {res}x{res}: guided step {step_s:.3g} s, training micro-step {micro_s:.3g} s, "
            f"{'' if swept else 'no '}batch sweep{'; tiny model' if tiny else ''})")
    return values, note


def _rollout_curve(model: CostModel, resolution: int, serial_step_s: float,
                   sweep: Mapping[str, Any]) -> tuple[dict[str, float], bool]:
    """The rollout curve's constants (:func:`load_calibration`) and whether the sweep gave them."""
    ran = {int(b): float(m["median_s"]) for b, m in sweep.items()
           if isinstance(m, Mapping) and not m.get("oom") and m.get("median_s") and int(b) > 1}
    batch, cfg = max(ran, default=1), int(model.cfg_forwards)
    found = fit_floor_rate(serial_step_s / cfg, ran.get(batch, 0.0), batch * cfg, model.forward_flops(resolution),
                           model.batch_knee_p)
    if found is not None:
        return {"rollout_mfu": found[1] / (model.gpu_peak_tflops * 1e12), "rollout_floor_s": found[0]}, True
    stretch = serial_step_s / model.step_s(resolution, serial=True)
    return {"rollout_mfu": model.rollout_mfu / stretch, "rollout_floor_s": model.rollout_floor_s * stretch}, False


def forward_time_s(flops, floor_s: float, rate: float, p: float):
    """Seconds of a forward of ``flops`` (float or array) on one GPU: ``floor_s`` below the knee, ``flops /
    rate`` above it, ``p`` how sharp the knee is."""
    return (floor_s ** p + (flops / rate) ** p) ** (1.0 / p)


def fit_floor_rate(t1: float, tb: float, rows: int, row_flops: float, p: float) -> tuple[float, float] | None:
    """``(floor_s, rate)`` of the curve of knee ``p`` through a forward of one row in ``t1`` s and of
    ``rows`` rows in ``tb`` s (t^p = floor^p + (rows w)^p, w = row_flops / rate); None if none does."""
    w = ((tb ** p - t1 ** p) / (rows ** p - 1.0)) ** (1.0 / p) if tb > t1 and rows > 1 else 0.0
    if not (w > 0 and t1 > w):
        return None
    return (t1 ** p - w ** p) ** (1.0 / p), row_flops / w
