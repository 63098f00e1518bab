"""SP rollout groups (worker.sp_group): what a Flow-GRPO rollout costs and returns at SP 1, 2, 4.

Each degree runs in its own set of processes (one per rank, gloo over a file store on loopback,
one torch thread each): every rank loads the same policy, joins its group, and the group denoises
the same requests as one worker (the executor of the iteration loop, with the stop decision as an
all-reduce after each step, exactly as a rollout worker runs them). Reported per degree:

- ``rollout_median_s``: wall time of one request (prompt encoding cached), median over requests
  and repeats, measured on rank 0;
- ``max_abs_diff_latents`` / ``max_abs_diff_log_probs``: against the SP 1 outputs of the same
  requests (SP reorders the float sums inside attention; fp32).

Use it for the numerics and the protocol's overhead. On a 2-core machine SP cannot be faster than
one worker per image (the ranks share the cores); the speed case is a 1280x1280 image on GPUs.

Usage: ``python benchmarks/sp_rollout.py [--json] [--image-size 32] [--requests 4] [--repeats 3]``
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--degrees", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--image-size", type=int, default=32, help="tiny preset image side (tokens = (side/2)^2)")
    parser.add_argument("--steps", type=int, default=10, help="denoising steps per request")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.degrees[0] != 1:
        parser.error("--degrees must start with 1 (the reference)")
    for key in ("image_size", "steps", "requests", "repeats"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1")
    return args


def _config(image_size: int):
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.config.run import RunConfig

    root = Path(__file__).resolve().parents[1]
    return load_config(RunConfig, root / "configs" / "tiny_shapes.yaml", [f"model.image_size={image_size}"])


def _leases(n: int, steps: int):
    from roll_spotlight.dispatch import RequestKind, RequestSpec, Schedule
    from roll_spotlight.dispatch.requests import Lease, Request

    prompts = ["three blue squares", "a red circle left of a green triangle", "two yellow circles", "a square"]
    specs = [RequestSpec(i, prompts[i % len(prompts)], 1000 + i, Schedule(num_steps=steps, noise_level=0.7), 0,
                         RequestKind.ROLLOUT, 0) for i in range(n)]
    return [Lease(i, Request.from_spec(i, s), "bench", float("inf"), None, 1) for i, s in enumerate(specs)]


def _roll_out(engine, lease, group, decode: bool):
    """One lease to the end with the group's stop decision (an all-reduce) after every step, as
    the worker loop takes it."""
    outputs = []

    def at_boundary(report):
        outputs.extend(finished.output for _, finished in report.finished)
        return None if group is not None and group.any(False) else []

    engine.denoise_batch([lease], at_boundary, decode=decode)
    return outputs[0]


def _rank_main(rank: int, degree: int, rendezvous, policy_file: str, args_dict: dict, out) -> None:
    import torch

    from roll_spotlight.elastic.rendezvous import SPMembership
    from roll_spotlight.worker.engine import RolloutEngine
    from roll_spotlight.worker.policy_source import load_policy
    from roll_spotlight.worker.sp_group import SPRolloutGroup

    torch.set_num_threads(1)
    policy = load_policy(policy_file)
    group = SPRolloutGroup(policy, SPMembership(rendezvous, f"bench-sp{degree}", rank, degree)) if degree > 1 else None
    seen: list[int] = []  # image tokens this rank's transformer actually processes
    policy.transformer.img_in.register_forward_hook(lambda mod, inp, outp: seen.append(inp[0].shape[1]))
    engine = RolloutEngine(policy)
    leases = _leases(args_dict["requests"], args_dict["steps"])
    for lease in leases:  # warm-up: prompt encodings cached, first collectives paid
        _roll_out(engine, lease, group, decode=rank == 0)
    times, outputs = [], []
    for _ in range(args_dict["repeats"]):
        for lease in leases:
            start = time.perf_counter()
            outputs.append(_roll_out(engine, lease, group, decode=rank == 0))
            times.append(time.perf_counter() - start)
    if group is not None:
        group.any(False)  # every rank is past its last collective before any leaves
    if rank == 0:
        out.put({"times": times, "tokens_per_rank": sorted(set(seen)), "latents": [o.latents for o in outputs[:len(leases)]],
                 "log_probs": [o.log_probs for o in outputs[:len(leases)]]})
        out.close()
        out.join_thread()  # flushed before the hard exit
    # skip the interpreter's teardown: gloo's and the store's threads aborted it in about 1 run of 5
    # ("terminate called without an active exception", exit -6) once the work was done
    os._exit(0)


def run_degree(degree: int, policy_file: str, args: argparse.Namespace) -> dict:
    from roll_spotlight.elastic.rendezvous import RendezvousHost

    ctx = mp.get_context("spawn")
    host = RendezvousHost("127.0.0.1")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, degree, host.address, policy_file, vars(args), out))
             for r in range(degree)]
    for p in procs:
        p.start()
    result = out.get(timeout=1800)
    for p in procs:
        p.join(60)
    host.close()
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"SP {degree}: a rank failed (exit codes {[p.exitcode for p in procs]})")
    return result


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    from roll_spotlight.models import build_policy, save_policy
    from roll_spotlight.worker.sp_group import check_sp_degree
    from roll_spotlight.training.prompt_pools import task_vocab

    args = parse_args(argv)
    cfg = _config(args.image_size)
    for degree in args.degrees:
        check_sp_degree(cfg.model, degree, key="--degrees")
    import torch

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        policy_file = str(Path(tmp) / "policy.pt")
        save_policy(build_policy(cfg.model, vocab=task_vocab(cfg.task)), policy_file)
        runs = {d: run_degree(d, policy_file, args) for d in args.degrees}
    ref = runs[1]
    result = {"image_size": args.image_size, "image_tokens": (args.image_size // 2) ** 2, "steps": args.steps,
              "requests": args.requests, "repeats": args.repeats, "measured_on": "CPU (gloo, 1 thread per rank)",
              "degrees": {}}
    for degree, run in runs.items():
        result["degrees"][str(degree)] = {
            "rollout_median_s": round(statistics.median(run["times"]), 4),
            "image_tokens_per_rank": run["tokens_per_rank"],
            "max_abs_diff_latents": float(max(np.abs(a - b).max() for a, b in zip(run["latents"], ref["latents"]))),
            "max_abs_diff_log_probs": float(max(np.abs(a - b).max() for a, b in zip(run["log_probs"], ref["log_probs"]))),
        }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"SP rollouts, tiny preset {args.image_size}x{args.image_size} ({result['image_tokens']} image tokens), "
          f"{args.steps} steps, measured on {result['measured_on']}")
    for degree, row in result["degrees"].items():
        print(f"  SP {degree}: {row['rollout_median_s']:.4f} s/request, {row['image_tokens_per_rank']} image tokens "
              f"per rank, max |diff| vs SP 1: latents "
              f"{row['max_abs_diff_latents']:.2e}, log-probs {row['max_abs_diff_log_probs']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
