"""GPU check: the full-size Qwen-Image transformer (random bf16 weights, LoRA on) on one GPU, as JSON.

One command (under 8 minutes on one H200; nothing is downloaded):

    python benchmarks/gpu_check.py --out gpu_check.json

1. builds ``QwenImageTransformer2DModel`` from its config with parameters on the meta device
   (accelerate's ``init_empty_weights``; the RoPE tables are plain tensors and stay real), casts to
   ``--dtype``, allocates on the device with ``to_empty`` and fills random weights there;
2. adds flow_grpo's LoRA through peft (``LoraConfig`` + diffusers ``add_adapter``: r=64,
   alpha=128, gaussian init, its 12 target modules), adapters in ``--lora-dtype``, only they train;
3. for each resolution, with random text embeddings of ``--text-tokens`` tokens (no text encoder):
   (a) one guided denoising step: the conditional and the negative forward, combined with
       diffusers' true-CFG formula and its norm rescaling, no grad;
   (b) one training micro-step: the same guided velocity with grad (cond and negative batched, as
       flow_grpo's training log-prob does), gradient checkpointing, backward through the LoRA
       parameters; then (timed apart) one AdamW step;
   (c) the batch sweep: one guided step of B images with both CFG branches in one forward (2B
       rows), for each B of ``--batches`` (default 1-32 at 512 and below, 1-8 above), stopping at
       the first B that runs out of memory; the per-sample time is the step over B (the rollout
       cost per image against batch that the cost model's curve describes);
   (d) the peak of ``torch.cuda.max_memory_allocated`` during each (null on CPU);
   medians over ``--repeats`` after ``--warmup`` untimed runs;
4. (e) runs ``pytest -m gpu tests/`` and records the counts.

The JSON (schema ``roll_spotlight.gpu_check/1``) is what ``CostModel.load_calibration`` reads.
``--tiny`` runs the same code on a tiny config at small resolutions, so CI checks the script on CPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from roll_spotlight.models.memory_plan import (  # noqa: E402  (pure python, no torch)
    FLOW_GRPO_LORA_ALPHA,
    FLOW_GRPO_LORA_RANK,
    FLOW_GRPO_LORA_TARGETS,
    GIB,
    QWEN_IMAGE_TRANSFORMER_CONFIG,
    count_parameters,
    lora_parameters,
    memory_plan,
)

SCHEMA = "roll_spotlight.gpu_check/1"
TINY_CONFIG = {**QWEN_IMAGE_TRANSFORMER_CONFIG, "in_channels": 16, "out_channels": 4, "num_layers": 2,
               "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": 32,
               "axes_dims_rope": [8, 4, 4]}
TINY_RANK = 4
PHASES = ("guided_step", "train_micro_step")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="JSON file to write")
    p.add_argument("--tiny", action="store_true", help="tiny config at 32 and 64 pixels (runs on CPU)")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--lora-dtype", default="float32", choices=("bfloat16", "float32"))
    p.add_argument("--resolutions", default=None, help="comma-separated square sizes (default 512,1280; tiny 32,64)")
    p.add_argument("--text-tokens", type=int, default=128, help="text tokens per prompt (cost model's assumption)")
    p.add_argument("--guidance-scale", type=float, default=4.0, help="true CFG scale (flow_grpo: 4)")
    p.add_argument("--attention-backend", default="native", help="model.attention_backend to run with")
    p.add_argument("--batches", default=None,
                   help="comma-separated batch sizes of the sweep (default: 1,2,4,8,16,32 up to 512 pixels, "
                        "1,2,4,8 above; tiny 1,2,4); '' skips it")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tests", default="tests/", help="pytest path(s) for the gpu-marked tests; '' skips them")
    p.add_argument("--tests-timeout", type=float, default=240.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.resolutions is None:
        args.resolutions = "32,64" if args.tiny else "512,1280"
    args.resolutions = [int(r) for r in str(args.resolutions).split(",") if r]
    if any(r % 16 for r in args.resolutions):
        p.error(f"--resolutions must be multiples of 16, got {args.resolutions}")
    if args.repeats < 1 or args.warmup < 0:
        p.error("--repeats must be >= 1 and --warmup >= 0")
    try:
        args.batches = None if args.batches is None else [int(b) for b in str(args.batches).split(",") if b]
    except ValueError:
        p.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    if args.batches is not None and any(b < 1 for b in args.batches):
        p.error(f"--batches must be >= 1, got {args.batches}")
    return args


def sweep_batches(args: argparse.Namespace, resolution: int) -> list[int]:
    """The batch sizes swept at ``resolution`` (``--batches``, or the default for its size)."""
    if args.batches is not None:
        return sorted(set(args.batches))
    if args.tiny:
        return [1, 2, 4]
    return [1, 2, 4, 8, 16, 32] if resolution <= 512 else [1, 2, 4, 8]


# ------------------------------------------------------------------------------------ model
def build_transformer(config: dict[str, Any], device, dtype, seed: int):
    """Random-weight transformer on ``device``: meta-device parameters, ``to_empty``, then init there."""
    import torch
    from accelerate import init_empty_weights
    from diffusers import QwenImageTransformer2DModel

    with init_empty_weights():
        model = QwenImageTransformer2DModel(**config)
    model.to(dtype=dtype)
    model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.02, generator=gen)
            elif "norm" in name:
                param.fill_(1.0)
            else:
                param.zero_()
    return model


def add_lora(model, rank: int, lora_dtype) -> int:
    """flow_grpo's LoRA via peft + diffusers ``add_adapter``; only the adapters train. Returns their count."""
    import peft

    model.add_adapter(peft.LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights="gaussian",
                                      target_modules=list(FLOW_GRPO_LORA_TARGETS)))
    count = 0
    for name, param in model.named_parameters():
        is_lora = "lora_" in name
        param.requires_grad_(is_lora)
        if is_lora:
            param.data = param.data.to(lora_dtype)
            count += param.numel()
    return count


def guided_velocity(model, latents, cond, negative, timestep, img_shapes, scale: float, batched: bool):
    """diffusers' true CFG: neg + s*(cond - neg), rescaled to the conditional prediction's norm."""
    import torch

    if batched:
        both = model(hidden_states=torch.cat([latents, latents]), encoder_hidden_states=torch.cat([cond, negative]),
                     encoder_hidden_states_mask=None, timestep=torch.cat([timestep, timestep]),
                     img_shapes=img_shapes * 2, return_dict=False)[0]
        v_cond, v_neg = both.chunk(2)
    else:
        kwargs = dict(hidden_states=latents, encoder_hidden_states_mask=None, timestep=timestep,
                      img_shapes=img_shapes, return_dict=False)
        v_cond = model(encoder_hidden_states=cond, **kwargs)[0]
        v_neg = model(encoder_hidden_states=negative, **kwargs)[0]
    combined = v_neg + scale * (v_cond - v_neg)
    return combined * (v_cond.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True))


# ------------------------------------------------------------------------------------ timing
def measure(fn: Callable[[], None], device, warmup: int, repeats: int) -> dict[str, Any]:
    """Median wall time over ``repeats`` after ``warmup`` runs, and the peak allocated memory."""
    import torch

    cuda = torch.device(device).type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        fn()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) / GIB if cuda else None
    return {"median_s": statistics.median(times), "times_s": times, "peak_gib": peak}


def step_inputs(config, args, resolution: int, batch: int, device, dtype) -> tuple:
    """Random latents, text embeddings (cond, negative), timesteps and image shapes of ``batch`` images."""
    import torch

    gen = torch.Generator(device=device).manual_seed(args.seed + resolution + 7919 * batch)
    grid = resolution // (8 * config["patch_size"])
    latents = torch.randn(batch, grid * grid, config["in_channels"], generator=gen, device=device).to(dtype)
    cond = torch.randn(batch, args.text_tokens, config["joint_attention_dim"], generator=gen, device=device).to(dtype)
    timestep = torch.full((batch,), 0.6, device=device, dtype=dtype)
    return latents, cond, torch.randn_like(cond), timestep, [[(1, grid, grid)]] * batch


def batch_sweep(model, config, args, resolution: int, device, dtype) -> dict[str, Any]:
    """Per batch size: one guided step of ``batch`` images, both CFG branches in one forward (no grad);
    ``per_sample_s`` = median / batch. Stops at the first batch that runs out of device memory."""
    import torch

    out: dict[str, Any] = {}
    for batch in sweep_batches(args, resolution):
        latents, cond, negative, timestep, img_shapes = step_inputs(config, args, resolution, batch, device, dtype)

        def step() -> None:
            with torch.no_grad():
                guided_velocity(model, latents, cond, negative, timestep, img_shapes, args.guidance_scale,
                                batched=True)
        try:
            m = measure(step, device, args.warmup, args.repeats)
        except torch.cuda.OutOfMemoryError:
            out[str(batch)] = {"oom": True}
            break
        finally:
            del latents, cond, negative, timestep
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
        out[str(batch)] = {**m, "oom": False, "rows": 2 * batch, "per_sample_s": m["median_s"] / batch}
    return out


def run_resolution(model, params, config, args, resolution: int, device, dtype, optimizer) -> dict[str, Any]:
    import torch

    latents, cond, negative, timestep, img_shapes = step_inputs(config, args, resolution, 1, device, dtype)
    grid = resolution // (8 * config["patch_size"])

    def guided_step() -> None:
        with torch.no_grad():
            guided_velocity(model, latents, cond, negative, timestep, img_shapes, args.guidance_scale, batched=False)

    def train_micro_step() -> None:
        velocity = guided_velocity(model, latents, cond, negative, timestep, img_shapes, args.guidance_scale,
                                   batched=True)
        velocity.float().pow(2).mean().backward()

    def optimizer_step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    model.eval()
    out = {"image_tokens": grid * grid, "guided_step": measure(guided_step, device, args.warmup, args.repeats),
           "batch_sweep": batch_sweep(model, config, args, resolution, device, dtype)}
    model.train()
    train_micro_step()  # gradients exist, so the first AdamW step allocates its states before timing
    optimizer_step()
    out["train_micro_step"] = measure(train_micro_step, device, args.warmup, args.repeats)
    out["optimizer_step"] = measure(optimizer_step, device, 0, args.repeats)
    optimizer.zero_grad(set_to_none=False)
    plan = memory_plan(config, height=resolution, width=resolution, dtype=args.dtype, lora_dtype=args.lora_dtype,
                       lora_rank=TINY_RANK if args.tiny else FLOW_GRPO_LORA_RANK, text_tokens=args.text_tokens,
                       overhead_gb=0.0, vae_params=1, vae_base_dim=1)  # no VAE runs here
    rows = plan.to_dict()["gib"]
    out["memory_plan_gib"] = {"trainer": rows["trainer"], "rollout": rows["rollout"],
                              "note": "the estimate for this shape, without VAE and runtime overhead"}
    return out


# ------------------------------------------------------------------------------------ gpu tests
COUNT_RE = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")


def parse_pytest_summary(text: str) -> dict[str, int]:
    """Counts from pytest's last summary line ("3 passed, 1 skipped, 40 deselected in 2.1s")."""
    lines = [line for line in text.strip().splitlines() if COUNT_RE.search(line)]
    counts = {"passed": 0, "failed": 0, "skipped": 0, "deselected": 0, "errors": 0, "xfailed": 0, "xpassed": 0}
    for number, kind in COUNT_RE.findall(lines[-1] if lines else ""):
        counts["errors" if kind.startswith("error") else kind] += int(number)
    return counts


def run_gpu_tests(paths: str, timeout: float) -> dict[str, Any]:
    if not paths.strip():
        return {"ran": False}
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *paths.split()]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        tail = out[-2000:]
        return {"ran": True, "timed_out": True, "returncode": None, "command": " ".join(cmd[1:]),
                **parse_pytest_summary(tail), "tail": tail, "elapsed_s": time.perf_counter() - start}
    tail = (proc.stdout + proc.stderr)[-2000:]
    return {"ran": True, "timed_out": False, "returncode": proc.returncode, "command": " ".join(cmd[1:]),
            **parse_pytest_summary(proc.stdout), "tail": tail, "elapsed_s": time.perf_counter() - start}


# ------------------------------------------------------------------------------------ main
def device_info(device) -> dict[str, Any]:
    import diffusers
    import peft
    import torch

    info = {"type": torch.device(device).type, "name": platform.processor() or platform.machine(),
            "total_memory_gib": None, "torch": torch.__version__, "cuda": torch.version.cuda,
            "diffusers": diffusers.__version__, "peft": peft.__version__}
    if info["type"] == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, total_memory_gib=props.total_memory / GIB)
    return info


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from roll_spotlight.models.attention import apply_attention_backend

    started = time.perf_counter()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype, lora_dtype = getattr(torch, args.dtype), getattr(torch, args.lora_dtype)
    config = dict(TINY_CONFIG if args.tiny else QWEN_IMAGE_TRANSFORMER_CONFIG)
    rank = TINY_RANK if args.tiny else FLOW_GRPO_LORA_RANK
    torch.manual_seed(args.seed)

    t0 = time.perf_counter()
    model = build_transformer(config, device, dtype, args.seed)
    n_lora = add_lora(model, rank, lora_dtype)
    model.enable_gradient_checkpointing()
    backend = apply_attention_backend(model, args.attention_backend)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    build_s = time.perf_counter() - t0
    weights_gib = torch.cuda.memory_allocated(device) / GIB if device.type == "cuda" else None
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)

    result: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": "measured",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device_info(device),
        "config": {
            "tiny": args.tiny, "transformer": config, "params": count_parameters(config), "dtype": args.dtype,
            "lora": {"rank": rank, "alpha": 2 * rank if args.tiny else FLOW_GRPO_LORA_ALPHA,
                     "targets": list(FLOW_GRPO_LORA_TARGETS), "params": n_lora,
                     "params_formula": lora_parameters(config, rank, FLOW_GRPO_LORA_TARGETS),
                     "dtype": args.lora_dtype},
            "attention_backend": backend.name, "text_tokens": args.text_tokens,
            "guidance_scale": args.guidance_scale, "gradient_checkpointing": True, "micro_batch": 1,
            "guided_step": "two forwards (cond, negative), no grad",
            "batch_sweep": "one forward of 2B rows (B images, cond and negative), no grad; per_sample_s = step / B",
            "train_micro_step": "one batched cond+negative forward with grad, backward; AdamW step apart",
            "warmup": args.warmup, "repeats": args.repeats, "seed": args.seed,
        },
        "load": {"build_s": build_s, "weights_gib": weights_gib},
        "resolutions": {},
    }
    for resolution in args.resolutions:
        result["resolutions"][str(resolution)] = run_resolution(model, params, config, args, resolution, device,
                                                                dtype, optimizer)
    del model, optimizer, params
    if device.type == "cuda":
        torch.cuda.empty_cache()
    result["gpu_tests"] = run_gpu_tests(args.tests, args.tests_timeout)
    result["elapsed_s"] = time.perf_counter() - started
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for res, r in result["resolutions"].items():
        peak = lambda phase: "-" if r[phase]["peak_gib"] is None else f"{r[phase]['peak_gib']:.1f} GiB"  # noqa: E731
        print(f"{res}x{res}: guided step {r['guided_step']['median_s']:.3f} s (peak {peak('guided_step')}), "
              f"train micro-step {r['train_micro_step']['median_s']:.3f} s (peak {peak('train_micro_step')})")
        sweep = ", ".join("OOM" if m["oom"] else f"B={b}: {m['per_sample_s']:.4f} s/sample"
                          for b, m in r["batch_sweep"].items())
        print(f"  batch sweep (one guided step, CFG in one forward): {sweep or 'skipped'}")
    tests = result["gpu_tests"]
    if tests.get("ran"):
        print(f"gpu tests: {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped, "
              f"{tests['errors']} errors (rc {tests['returncode']})")
    print(f"wrote {args.out} in {result['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
