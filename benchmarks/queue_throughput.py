"""Queue actor throughput, and the queue's share of a rollout's time.

Measures, side by side in one run (docs/design.md section 6: ratios from one run, medians over repeats):

1. ``requests_per_s``: ``--workers`` concurrent pullers (threads, spread over ``--processes``
   processes) against one ``QueueActor``, each leasing and completing ``--pulls-per-worker``
   requests; requests completed / wall time, median over ``--repeats``. With ``--pull-batch`` B > 1
   (``dispatch.pull_batch``) a puller leases B at a time and completes each batch with the next
   pull (``complete_and_pull``: one round trip a batch); B = 1 is the old loop, "pull 1, complete
   it" (two round trips a request). ``pulls_per_s_median`` is the same number (its old name).
2. ``pull_complete_roundtrip_ms``: one pull + one complete from an otherwise idle client (the
   steady state of a real run, where workers spend their time denoising), median over many;
   ``batch_roundtrip_ms``: one ``complete_and_pull`` of B requests the same way, and
   ``queue_ms_per_request`` = batch round trip / B.
3. ``denoise_step_ms``: one no_grad forward of the tiny Qwen-like ``QwenImageTransformer2DModel``
   (ENV.md section 2: 2 layers, 4 heads x 32, 256 image tokens, 32 text tokens, B=1), median of 20;
   ``rollout_ms``: a 10-step Euler rollout of the same model (no VAE decode, no reward).
4. ``queue_share_of_rollout`` = queue ms per request / (that + rollout): the fraction of a worker's
   time spent talking to the queue, with the batch (``queue_share_of_rollout_single``: the same
   with one request per pull; ``queue_share_of_step``: the worst case of one queue round trip per
   denoising step).

``--journal`` journals the queue (as training runs do) in a temporary directory. The machine's
1-minute load average at the end is recorded: the numbers are only comparable at similar loads.

Usage: ``python benchmarks/queue_throughput.py [--json] [--repeats 5] [--workers 64] [--out FILE]``
(a table, or one JSON line; ``--out`` also writes the JSON to FILE).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

DEFAULT_PULL_BATCH = 16
TINY_QWEN = dict(
    patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=32,
    num_attention_heads=4, joint_attention_dim=64, guidance_embeds=False, axes_dims_rope=(8, 12, 12),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--repeats", type=int, default=5, help="throughput repeats (median)")
    parser.add_argument("--workers", type=int, default=8, help="concurrent pullers (threads)")
    parser.add_argument("--processes", type=int, default=4,
                        help="processes the pullers are spread over (at most --workers)")
    parser.add_argument("--pull-batch", type=int, default=DEFAULT_PULL_BATCH,
                        help="requests per pull (dispatch.pull_batch); 1 runs today's pull-1/complete loop")
    parser.add_argument("--pulls-per-worker", type=int, default=200, help="requests each puller completes")
    parser.add_argument("--journal", action="store_true", help="journal the queue (in a temporary directory)")
    parser.add_argument("--out", help="also write the JSON result to this file")
    parser.add_argument("--roundtrips", type=int, default=200, help="idle round trips (median)")
    parser.add_argument("--step-calls", type=int, default=20, help="denoise step calls (median)")
    parser.add_argument("--rollouts", type=int, default=5, help="10-step rollouts (median)")
    parser.add_argument(
        "--torch-threads", type=int, default=1,
        help="intra-op threads for the model timing; 1 by default because on a shared, busy "
        "machine OpenMP threads waiting on each other made steps 10-40x slower",
    )
    args = parser.parse_args(argv)
    for key in ("repeats", "workers", "processes", "pull_batch", "pulls_per_worker", "roundtrips",
                "step_calls", "rollouts", "torch_threads"):
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


def puller_names(workers: int, processes: int) -> list[list[str]]:
    """Puller names ``w0..w{workers-1}``, dealt round robin to ``processes`` processes."""
    return [[f"w{i}" for i in range(p, workers, processes)] for p in range(processes)]


def pull_loop(client, quota: int, batch: int) -> list[float]:
    """One puller: lease and complete ``quota`` requests; returns the seconds of each loop.
    ``batch`` 1 is the old loop (pull 1, complete it: two round trips a request, timed as one
    loop); more leases ``batch`` at a time and completes each batch with the next pull (one
    round trip, and one loop, a batch)."""
    times = []
    if batch == 1:
        for _ in range(quota):
            start = time.perf_counter()
            (lease,) = client.pull(1)
            assert client.complete(lease, None)
            times.append(time.perf_counter() - start)
        return times
    start = time.perf_counter()
    leases = client.pull_batch(min(batch, quota))
    left = quota - len(leases)
    while leases:
        times.append(time.perf_counter() - start)
        start = time.perf_counter()
        done = [(lease, None) for lease in leases]
        if left:
            accepted, leases = client.complete_and_pull(done, min(batch, left))
        else:
            accepted, leases = client.complete_many(done), []
        assert all(accepted)
        left -= len(leases)
    times.append(time.perf_counter() - start)
    assert left == 0, f"{client.worker} leased {quota - left} of its {quota}"
    return times


def start_workers(count: int, processes: int) -> list:
    """``processes`` puller processes running ``count`` pullers (threads) between them, started
    and ready (started once, reused across repeats)."""
    import ray

    @ray.remote(num_cpus=0)
    class PullerProcess:
        def __init__(self, names: list[str]) -> None:
            self.names = names

        def ready(self) -> bool:
            return True

        def run(self, queue, quota: int, batch: int) -> list[float]:
            """Each puller (a thread) runs ``pull_loop``; returns every round trip's seconds."""
            from concurrent.futures import ThreadPoolExecutor

            from roll_spotlight.dispatch.queue_actor import QueueClient

            with ThreadPoolExecutor(len(self.names)) as pool:
                loops = pool.map(lambda name: pull_loop(QueueClient(queue, name), quota, batch), self.names)
                return [t for ts in loops for t in ts]

    actors = [PullerProcess.remote(names) for names in puller_names(count, processes)]
    ray.get([a.ready.remote() for a in actors])
    return actors


def make_queue(args: argparse.Namespace, journal_dir: str | None, tag: str):
    from roll_spotlight.dispatch.queue import QueueConfig
    from roll_spotlight.dispatch.queue_actor import create_queue_actor

    journal = None if journal_dir is None else os.path.join(journal_dir, tag)
    return create_queue_actor(QueueConfig(pull_batch=args.pull_batch), journal=journal)


def time_throughput(actors: list, args: argparse.Namespace, journal_dir: str | None, tag: str) -> tuple[float, float, float]:
    """(requests per second, queue calls per second, median ms of a puller's loop under load: a
    pull and a complete at batch 1, one batch call otherwise) for one repeat, on a fresh queue actor."""
    import ray

    queue = make_queue(args, journal_dir, tag)
    total = args.workers * args.pulls_per_worker
    ray.get(queue.submit.remote(make_specs(total)))
    start = time.perf_counter()
    loops = ray.get([a.run.remote(queue, args.pulls_per_worker, args.pull_batch) for a in actors])
    elapsed = time.perf_counter() - start
    stats = ray.get(queue.stats.remote())
    assert stats.completed == total and stats.duplicate_completions == 0
    ray.kill(queue)
    trips = [t for ts in loops for t in ts]
    calls = len(trips) * (2 if args.pull_batch == 1 else 1)  # batch 1 times a pull and a complete together
    return total / elapsed, calls / elapsed, 1e3 * statistics.median(trips)


def time_idle_roundtrip_ms(calls: int, batch: int) -> float:
    """Median ms of one steady-state round trip from an otherwise idle client: pull 1 + complete
    it (two calls) at ``batch`` 1, else one ``complete_and_pull`` of ``batch`` requests."""
    import ray

    from roll_spotlight.dispatch.queue_actor import QueueClient, create_queue_actor

    queue = create_queue_actor()
    ray.get(queue.submit.remote(make_specs(batch * (calls + 11))))
    client = QueueClient(queue, "driver")
    leases = client.pull_batch(batch) if batch > 1 else []
    times = []
    for i in range(calls + 10):
        start = time.perf_counter()
        if batch == 1:
            (lease,) = client.pull(1)
            client.complete(lease, None)
        else:
            _, leases = client.complete_and_pull([(lease, None) for lease in leases], batch)
        if i >= 10:  # first calls warm the actor up
            times.append(time.perf_counter() - start)
    ray.kill(queue)
    return 1e3 * statistics.median(times)


# ------------------------------------------------------------------------- main
def run(args: argparse.Namespace) -> dict:
    import tempfile

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
    processes = min(args.processes, args.workers)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory(prefix="queue-journal-") as tmp:
            journal_dir = tmp if args.journal else None
            actors = start_workers(args.workers, processes)
            repeats = [time_throughput(actors, args, journal_dir, f"q{i}") for i in range(args.repeats)]
        single_ms = time_idle_roundtrip_ms(args.roundtrips, 1)
        batch_ms = single_ms if args.pull_batch == 1 else time_idle_roundtrip_ms(args.roundtrips, args.pull_batch)
    finally:
        ray.shutdown()
    per_request_ms = batch_ms / args.pull_batch
    return {
        "requests_per_s_median": statistics.median(r[0] for r in repeats),
        "requests_per_s_repeats": [round(r[0], 1) for r in repeats],
        "pulls_per_s_median": statistics.median(r[0] for r in repeats),  # old key: requests leased+completed /s
        "queue_calls_per_s_median": statistics.median(r[1] for r in repeats),
        "loop_ms_under_load_median": statistics.median(r[2] for r in repeats),
        "pull_complete_roundtrip_ms_median": single_ms,
        "batch_roundtrip_ms_median": batch_ms,
        "queue_ms_per_request": per_request_ms,
        "denoise_step_ms_median": step_ms,
        "rollout_10_steps_ms_median": rollout_ms,
        "queue_share_of_rollout": per_request_ms / (per_request_ms + rollout_ms),
        "queue_share_of_step": per_request_ms / (per_request_ms + step_ms),
        "queue_share_of_rollout_single": single_ms / (single_ms + rollout_ms),
        "workers": args.workers,
        "processes": processes,
        "pull_batch": args.pull_batch,
        "journal": args.journal,
        "pulls_per_worker": args.pulls_per_worker,
        "repeats": args.repeats,
        "image_tokens": 256,
        "torch_threads": args.torch_threads,
        "cpu_count": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = run(args)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
    if args.json:
        print(json.dumps(result))
        return result
    for key, value in result.items():
        print(f"{key:36s} {value:.4g}" if isinstance(value, float) else f"{key:36s} {value}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
