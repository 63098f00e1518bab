"""The rollout engine's CPU cost per sample against its batch (`sampling.max_batch`), MEASURED.

What a quickstart rollout worker does with its leases: `RolloutEngine.roll_out` on the quickstart's
tiny policy (configs/quickstart.yaml's model, random weights: the FLOPs do not depend on them) over
the first ``--requests`` requests of its first iteration (10 steps, its SDE window), prompt
encodings cached, images decoded. For each thread count and each batch size it reports, median
over ``--repeats`` (the batch sizes interleaved within a repeat, so load drifts hit all alike):

- ``cpu_ms_per_sample``: process CPU time per request (every thread's), the cost a shared machine pays;
- ``wall_ms_per_sample``: wall time per request;
- ``ratio_cpu_vs_batch_1``: side by side in the same run;
- ``max_abs_diff_final`` / ``max_abs_diff_log_probs``: against batch 1 (a batched GEMM sums in
  another order; the noise is each request's own, so nothing else moves).

Usage: ``python -m benchmarks.rollout_batch [--json] [--batches 1 2 4 8 16 32] [--threads 1 2]
[--requests 64] [--repeats 5] [--out FILE]``

``--runs DIR...``: instead, the rollout CPU time that each run's workers spent per denoising step
of one sample, and per sample of ``--steps`` steps (the ``cpu_s`` and ``row_steps`` of the rollout
and explore phases in each run's ``timeline.json``: each worker process's CPU time while it
denoised, decode included), and each run's ratio to the first.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--requests", type=int, default=64, help="requests per measurement (a multiple of each batch)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--config", default=str(ROOT / "configs" / "quickstart.yaml"))
    parser.add_argument("--out", help="also write the JSON result here")
    parser.add_argument("--runs", nargs="+", metavar="DIR", help="read these runs' timelines instead")
    parser.add_argument("--steps", type=int, default=10, help="with --runs: denoising steps of one sample")
    args = parser.parse_args(argv)
    if args.batches[0] != 1 or min(args.batches) < 1 or min(args.threads) < 1 or args.repeats < 1:
        parser.error("--batches must start with 1 (the reference); batches, threads and repeats >= 1")
    return args


def leases(cfg, n: int) -> list:
    """The first ``n`` rollout requests of the config's first iteration, as leases."""
    from roll_spotlight.dispatch.requests import Lease, Request
    from roll_spotlight.runtime.coordinator import iteration_specs
    from roll_spotlight.training.prompt_pools import train_pool

    specs = iteration_specs(cfg, train_pool(cfg.task), 1, 0)
    if n > len(specs):
        raise SystemExit(f"--requests {n}: the config's iteration has {len(specs)} requests")
    return [Lease(i, Request.from_spec(i, s), "bench", float("inf"), None, 1) for i, s in enumerate(specs[:n])]


def measure(policy, batch: int, work: list) -> tuple[float, float, list]:
    """(CPU seconds, wall seconds, outputs) of the engine rolling ``work`` out at ``batch``."""
    from roll_spotlight.worker.engine import RolloutEngine
    from roll_spotlight.worker.loop import roll_out

    engine = RolloutEngine(policy, max_batch=batch)
    roll_out(engine, work[:batch])  # prompt encodings cached, allocator warm
    cpu, wall = time.process_time(), time.perf_counter()
    outputs = roll_out(engine, work)
    return time.process_time() - cpu, time.perf_counter() - wall, outputs


def curve(policy, work: list, batches: list[int], repeats: int) -> dict:
    import numpy as np

    cpu = {b: [] for b in batches}
    wall = {b: [] for b in batches}
    outputs = {}
    for _ in range(repeats):
        for b in batches:
            c, w, outputs[b] = measure(policy, b, work)
            cpu[b].append(c / len(work))
            wall[b].append(w / len(work))
    ref, base = outputs[1], statistics.median(cpu[1])
    rows = {}
    for b in batches:
        rows[str(b)] = {
            "cpu_ms_per_sample": round(1e3 * statistics.median(cpu[b]), 2),
            "wall_ms_per_sample": round(1e3 * statistics.median(wall[b]), 2),
            "ratio_cpu_vs_batch_1": round(statistics.median(cpu[b]) / base, 3),
            "max_abs_diff_final": float(max(np.abs(o.latents[-1] - r.latents[-1]).max() for o, r in zip(outputs[b], ref))),
            "max_abs_diff_log_probs": float(max(np.nanmax(np.abs(o.log_probs - r.log_probs))
                                                for o, r in zip(outputs[b], ref))),
        }
    return rows


def run_cost(run_dir: Path, steps: int) -> dict:
    """Rollout CPU time per sample in a run's workers (`run_report.rollout_cpu` of its timeline)."""
    from roll_spotlight.run_report import rollout_cpu

    cost = rollout_cpu(json.loads((Path(run_dir) / "timeline.json").read_text()))
    if cost is None:
        raise SystemExit(f"{run_dir}: no rollout phase with cpu_s in timeline.json")
    return {"run": str(run_dir), "row_steps": cost[1], "cpu_s": round(cost[0], 1),
            "cpu_ms_per_sample": round(1e3 * cost[0] / cost[1] * steps, 2)}


def compare_runs(run_dirs: list[str], steps: int) -> dict:
    rows = [run_cost(Path(d), steps) for d in run_dirs]
    for row in rows:
        row["ratio_vs_first"] = round(row["cpu_ms_per_sample"] / rows[0]["cpu_ms_per_sample"], 3)
    return {"label": "MEASURED (CPU, the runs' workers)", "steps_per_sample": steps, "runs": rows}


def main(argv: list[str] | None = None) -> int:
    import torch

    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.models import build_policy
    from roll_spotlight.training.prompt_pools import task_vocab

    args = parse_args(argv)
    if args.runs:
        print(json.dumps(compare_runs(args.runs, args.steps), indent=None if args.json else 2))
        return 0
    cfg = load_config(RunConfig, Path(args.config), [])
    torch.manual_seed(0)
    policy = build_policy(cfg.model, vocab=task_vocab(cfg.task))
    work = leases(cfg, args.requests)
    result = {"config": Path(args.config).name, "requests": args.requests, "steps": cfg.sampling.num_steps,
              "image_tokens": policy.image_seq_len, "repeats": args.repeats, "label": "MEASURED (CPU)", "threads": {}}
    for threads in args.threads:
        torch.set_num_threads(threads)
        result["threads"][str(threads)] = curve(policy, work, args.batches, args.repeats)
    text = json.dumps(result)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        print(text)
        return 0
    print(f"Rollout engine on {result['config']}'s policy ({result['image_tokens']} image tokens, {result['steps']} "
          f"steps, decode included), {args.requests} requests, median of {args.repeats}, MEASURED on CPU")
    for threads, rows in result["threads"].items():
        for b, row in rows.items():
            print(f"  {threads} thread(s), batch {b:>2}: {row['cpu_ms_per_sample']:7.2f} CPU ms/sample "
                  f"({row['ratio_cpu_vs_batch_1']:.3f}x batch 1), {row['wall_ms_per_sample']:7.2f} wall ms/sample, "
                  f"max |diff| vs batch 1: final {row['max_abs_diff_final']:.1e}, "
                  f"log-probs {row['max_abs_diff_log_probs']:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
