"""Queue actor throughput, and the queue's share of a rollout's time.

Measures, side by side in one run (docs/design.md section 6: ratios from one run, medians over repeats):

1. ``pulls_per_s``: 8 concurrent worker actors, each looping "pull 1, complete it", against one
   ``QueueActor``; completed pulls / wall time, median over ``--repeats``.
2. ``pull_complete_roundtrip_ms``: one pull + one complete from an otherwise idle client (the
   steady state of a real run, where workers spend their time denoising), median over many.
3. ``denoise_step_ms``: one no_grad forward of the tiny Qwen-like ``QwenImageTransformer2DModel``
   (ENV.md section 2: 2 layers, 4 heads x 32, 256 image tokens, 32 text tokens, B=1), median of 20;
   ``rollout_ms``: a 10-step Euler rollout of the same model (no VAE decode, no reward).
4. ``queue_share_of_rollout`` = roundtrip / (roundtrip + rollout): the fraction of a worker's time
   spent talking to the queue when it pulls one request per rollout (and ``queue_share_of_step``
   for the worst case of one queue round trip per denoising step).

Usage: ``python benchmarks/queue_throughput.py [--json] [--repeats 5]`` (a table, or one JSON line).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

TINY_QWEN = dict(
    patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=32,
    num_attention_heads=4, joint_attention_dim=64, guidance_embeds=False, axes_dims_rope=(8, 12, 12),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--repeats", type=int, default=5, help="throughput repeats (median)")
    parser.add_argument("--workers", type=int, default=8, help="concurrent worker actors")
    parser.add_argument("--pulls-per-worker", type=int, default=100)
    parser.add_argument("--roundtrips", type=int, default=200, help="idle round trips (median)")
    parser.add_argument("--step-calls", type=int, default=20, help="denoise step calls (median)")
    parser.add_argument("--rollouts", type=int, default=5, help="10-step rollouts (median)")
    parser.add_argument(
        "--torch-threads", type=int, default=1,
        help="intra-op threads for the model timing; 1 by default because on a shared, busy "
        "machine OpenMP threads waiting on each other made steps 10-40x slower",
    )
    args = parser.parse_args(argv)
    for key in ("repeats", "workers", "pulls_per_worker", "roundtrips", "step_calls", "rollouts",
                "torch_threads"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    return args


# ------------------------------------------------------------------------- model timing
def tiny_transformer_inputs(tokens: int = 256, text_tokens: int = 32):
    import torch
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(**TINY_QWEN).eval()
    side = int(tokens**0.5)
    inputs = dict(
        hidden_states=torch.randn(1, tokens, TINY_QWEN["in_channels"]),
        encoder_hidden_states=torch.randn(1, text_tokens, TINY_QWEN["joint_attention_dim"]),
        encoder_hidden_states_mask=torch.ones(1, text_tokens, dtype=torch.long),
        img_shapes=[[(1, side, side)]],
    )
    return model, inputs


def time_denoise_step_ms(model, inputs, calls: int) -> float:
    import torch

    times = []
    with torch.no_grad():
        model(**inputs, timestep=torch.tensor([0.5]), return_dict=False)  # warm-up
        for _ in range(calls):
            start = time.perf_counter()
            model(**inputs, timestep=torch.tensor([0.5]), return_dict=False)
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def time_rollout_ms(model, inputs, rollouts: int, steps: int = 10) -> float:
    import torch

    sigmas = torch.linspace(1.0, 0.0, steps + 1)
    times = []
    with torch.no_grad():
        for _ in range(rollouts):
            x = torch.randn_like(inputs["hidden_states"])
            start = time.perf_counter()
            for k in range(steps):
                step_inputs = {**inputs, "hidden_states": x}
                (v,) = model(**step_inputs, timestep=sigmas[k : k + 1], return_dict=False)
                x = x + (sigmas[k + 1] - sigmas[k]) * v
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


# ------------------------------------------------------------------------- queue timing
def make_specs(count: int):
    from roll_spotlight.dispatch import RequestKind, RequestSpec, Schedule

    schedule = Schedule(num_steps=10, noise_level=0.7, window_end=3)
    return [RequestSpec(i % 64, f"p{i % 64}", i, schedule, 0, RequestKind.ROLLOUT, 0) for i in range(count)]


def start_workers(count: int) -> list:
    """``count`` worker actors, started and ready (started once, reused across repeats)."""
    import ray

    from roll_spotlight.dispatch.actor import QueueClient

    @ray.remote(num_cpus=0)
    class PullCompleteWorker:
        def __init__(self, name: str) -> None:
            self.name = name

        def ready(self) -> bool:
            return True

        def run(self, queue, count: int) -> list[float]:
            """``count`` pull+complete loops against ``queue``; returns each loop's seconds."""
            client, times = QueueClient(queue, self.name), []
            for _ in range(count):
                start = time.perf_counter()
                (lease,) = client.pull(1)
                assert client.complete(lease, None)
                times.append(time.perf_counter() - start)
            return times

    actors = [PullCompleteWorker.remote(f"w{i}") for i in range(count)]
    ray.get([a.ready.remote() for a in actors])
    return actors


def time_throughput(actors: list, per_worker: int) -> tuple[float, float]:
    """(pulls per second, median loop ms under load) for one repeat, on a fresh queue actor."""
    import ray

    from roll_spotlight.dispatch.actor import create_queue_actor

    queue = create_queue_actor()
    ray.get(queue.submit.remote(make_specs(len(actors) * per_worker)))
    start = time.perf_counter()
    loops = ray.get([a.run.remote(queue, per_worker) for a in actors])
    elapsed = time.perf_counter() - start
    stats = ray.get(queue.stats.remote())
    assert stats.completed == len(actors) * per_worker and stats.duplicate_completions == 0
    ray.kill(queue)
    return len(actors) * per_worker / elapsed, 1e3 * statistics.median(t for ts in loops for t in ts)


def time_idle_roundtrip_ms(calls: int) -> float:
    import ray

    from roll_spotlight.dispatch.actor import QueueClient, create_queue_actor

    queue = create_queue_actor()
    ray.get(queue.submit.remote(make_specs(calls + 10)))
    client = QueueClient(queue, "driver")
    times = []
    for i in range(calls + 10):
        start = time.perf_counter()
        (lease,) = client.pull(1)
        client.complete(lease, None)
        if i >= 10:  # first calls warm the actor up
            times.append(time.perf_counter() - start)
    ray.kill(queue)
    return 1e3 * statistics.median(times)


# ------------------------------------------------------------------------- main
def run(args: argparse.Namespace) -> dict:
    import ray

    import torch

    torch.set_num_threads(args.torch_threads)
    model, inputs = tiny_transformer_inputs()
    step_ms = time_denoise_step_ms(model, inputs, args.step_calls)
    rollout_ms = time_rollout_ms(model, inputs, args.rollouts)
    del model
    for key, value in (("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0"), ("RAY_AUTH_MODE", "disabled"),
                       ("RAY_USAGE_STATS_ENABLED", "0")):
        os.environ.setdefault(key, value)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actors = start_workers(args.workers)
        repeats = [time_throughput(actors, args.pulls_per_worker) for _ in range(args.repeats)]
        roundtrip_ms = time_idle_roundtrip_ms(args.roundtrips)
    finally:
        ray.shutdown()
    return {
        "pulls_per_s_median": statistics.median(r[0] for r in repeats),
        "pulls_per_s_repeats": [round(r[0], 1) for r in repeats],
        "loop_ms_under_load_median": statistics.median(r[1] for r in repeats),
        "pull_complete_roundtrip_ms_median": roundtrip_ms,
        "denoise_step_ms_median": step_ms,
        "rollout_10_steps_ms_median": rollout_ms,
        "queue_share_of_rollout": roundtrip_ms / (roundtrip_ms + rollout_ms),
        "queue_share_of_step": roundtrip_ms / (roundtrip_ms + step_ms),
        "workers": args.workers,
        "pulls_per_worker": args.pulls_per_worker,
        "repeats": args.repeats,
        "image_tokens": 256,
        "torch_threads": args.torch_threads,
        "cpu_count": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result))
        return result
    for key, value in result.items():
        print(f"{key:36s} {value:.4g}" if isinstance(value, float) else f"{key:36s} {value}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
