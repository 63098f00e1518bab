"""Warm regroup vs cold restart of an SP group, measured on the live rollout workers.

The workers are `worker.actor.RolloutWorker` Ray actors serving the request queue in an SP group
of degree 2 (gloo on CPU), driven by `elastic.groups.ElasticGroups`: the classes training runs.
Each repeat preempts one member in the middle of a rollout and times what the preemption costs:

- **warm**: the member gets a notice while the group is parked after step 2 of 4 (deterministic
  injection, `worker.faults`); the group commits the lease, the survivor and a standby newcomer on
  the same node (a started worker, its pipeline loaded from disk, as on a node whose worker is
  kept for recovery) re-form a group under a fresh generation prefix (the newcomer maps the
  survivor's weights from the node's shared memory, zero-copy; the survivor published them once
  per weight version, off the critical path, timed apart as ``publish_s``) and resume the
  committed lease.
- **cold**: the same notice, then the whole group is replaced by new processes: spawn, ``import``
  of torch and diffusers, ``from_pretrained`` of the pipeline, the weight version from the weight
  store, group formation, and the same resume. Ray may hand an idle pre-started Python worker to
  an actor, which saves the ``import ray`` part only.

Both end with the same two denoising steps (and the decode and completion of the lease), work an
uninterrupted rollout does too (two, not one: Qwen-Image's schedule needs at least two steps).
Each repeat therefore runs a two-step request once more on the recovered group (``steady_step_s``,
the lease's own duration on the leader), and the figures are
the **time lost**: from the notice to the end of the resumed lease, minus that steady step.
``warm_total_median_s`` / ``cold_total_median_s`` / ``speedup_including_step`` keep the step in.

The model: a Qwen-Image pipeline directory whose transformer is a real
``QwenImageTransformer2DModel`` with Qwen-Image's head_dim 128, rope axes and text width (3584),
8 heads and as many layers as ``model_mb`` asks (2 layers = 316 MB fp32); the text encoder is a
one-layer Qwen2.5-VL of that width and the VAE a small one of Qwen-Image's class. Images are
32x32 (a 4x4 token grid) so compute does not drown the regroup on a CPU. ``sp_max_abs_diff``
compares every resumed output with the same request run on one process (SP 1).
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

log = logging.getLogger(__name__)

__all__ = ["main", "run_regroup_bench"]

HEADS, HEAD_DIM, TEXT_DIM, AXES = 8, 128, 3584, (16, 56, 56)
IMAGE_SIZE, PROMPT, SEED = 32, "a red cube on a blue sphere", 11
DEGREE = 2
HOLD = 2  # the preempted request has 2 * HOLD steps and is parked after HOLD of them


# ---- the model ----

def transformer_mb(num_layers: int) -> float:
    """fp32 size of the bench's transformer: per block 36 d^2 (attention, MLPs, modulation), plus
    the input/output projections, timestep MLP and output norm."""
    d, in_channels = HEADS * HEAD_DIM, 64
    fixed = d * (2 * in_channels + TEXT_DIM + 256) + 3 * d * d
    return (num_layers * 36 * d * d + fixed) * 4 / 2**20


def layers_for(model_mb: float) -> int:
    per_layer = transformer_mb(2) - transformer_mb(1)
    return max(1, round((model_mb - (transformer_mb(1) - per_layer)) / per_layer))


def write_pipeline(directory: Path, num_layers: int, seed: int = 0) -> Path:
    """A Qwen-Image pipeline directory (diffusers layout) around the bench's transformer."""
    import torch
    from diffusers import AutoencoderKLQwenImage, QwenImagePipeline, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from roll_spotlight.models.tiny_qwen import tiny_qwen_components

    small = tiny_qwen_components(seed)  # tokenizer and Qwen-Image's scheduler config
    torch.manual_seed(seed)
    text = Qwen2_5_VLConfig(
        text_config={"hidden_size": TEXT_DIM, "intermediate_size": 16, "num_hidden_layers": 1,
                     "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 512, "rope_theta": 1e6,
                     "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"}},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": TEXT_DIM},
        hidden_size=TEXT_DIM, vocab_size=512, vision_end_token_id=500, vision_start_token_id=501, vision_token_id=502,
    )
    pipe = QwenImagePipeline(
        scheduler=small["scheduler"], tokenizer=small["tokenizer"],
        text_encoder=Qwen2_5_VLForConditionalGeneration(text).eval(),
        vae=AutoencoderKLQwenImage(base_dim=24, z_dim=16, dim_mult=[1, 2, 4], num_res_blocks=1,
                                   temperal_downsample=[False, True], latents_mean=[0.0] * 16,
                                   latents_std=[1.0] * 16),
        transformer=QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=num_layers,
                                                attention_head_dim=HEAD_DIM, num_attention_heads=HEADS,
                                                joint_attention_dim=TEXT_DIM, axes_dims_rope=AXES),
    )
    pipe.save_pretrained(directory)
    return directory


def _spec(num_steps: int):
    from roll_spotlight.dispatch import RequestKind, RequestSpec, Schedule

    return RequestSpec(0, PROMPT, SEED, Schedule(num_steps=num_steps, noise_level=0.7), 0, RequestKind.ROLLOUT, 0)


# ---- one bench session: a queue, a weight store, a pool of live workers ----

class _Session:
    """The live system the bench drives: queue, weight store, rendezvous, `ElasticGroups`."""

    def __init__(self, source: dict) -> None:
        from roll_spotlight.dispatch import QueueConfig
        from roll_spotlight.dispatch.queue_actor import create_queue_actor
        from roll_spotlight.elastic.groups import ElasticGroups, ElasticGroupsConfig
        from roll_spotlight.elastic.rendezvous import RendezvousHost
        from roll_spotlight.worker.engine import RolloutEngine
        from roll_spotlight.worker.loop import roll_out
        from roll_spotlight.worker.policy_source import load_policy
        from roll_spotlight.weights import WeightStore

        self.source = source
        policy = load_policy(source)
        self.store = WeightStore.create(keep=1)
        self.store.publish(0, policy.published_state())
        self.reference = roll_out(RolloutEngine(policy), [_lease(_spec(2 * HOLD))])[0]  # SP 1, in this process
        del policy
        self.queue = create_queue_actor(QueueConfig(lease_s=600.0))
        self.host = RendezvousHost("127.0.0.1")
        self.groups = ElasticGroups(ElasticGroupsConfig(num_heads=HEADS, preferred_degree=DEGREE, timeout_s=300.0,
                                                        name="bench"), self.host, self.queue)
        self._gpus = iter(range(10**6))

    def worker(self, hold: bool):
        """A started worker (pipeline loaded, object store mapped), parked after step 2 if ``hold``
        (a two-step lease never parks: a worker polls after every step but the last)."""
        import ray

        from roll_spotlight.worker.actor import RolloutWorker
        from roll_spotlight.worker.faults import FaultPlan

        gpu = next(self._gpus)
        handle = RolloutWorker.remote(f"bench-{gpu}", self.source, self.queue, self.store,
                                      faults=FaultPlan(hold_at_step=HOLD) if hold else None)
        ray.get(handle.prepare_standby.remote())
        return ("node", gpu), handle

    def run(self, num_steps: int) -> object:
        """Submit one request and wait for its completion."""
        import ray

        ray.get(self.queue.submit.remote([_spec(num_steps)]))
        return self.completion()

    def completion(self, timeout_s: float = 900.0):
        import ray

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if done := ray.get(self.queue.take_results.remote()):
                return done[0]
            ended, _ = ray.wait(list(self.groups.serving.values()), timeout=0)
            if ended:
                raise RuntimeError(f"a worker stopped serving: {ray.get(ended[0])}")  # or raises its error
            time.sleep(0.01)
        raise TimeoutError(f"no completion within {timeout_s} s")

    def last_lease(self, after: float) -> tuple[dict, dict]:
        """The leader's last group join and its last lease that started after ``after`` (waits:
        the leader records a lease just after the queue took its result)."""
        import ray

        (group,) = self.groups.plan.groups
        leader = self.groups.workers[group.members[0]]
        for _ in range(1000):
            events = ray.get(leader.timeline.remote())
            join = [e for e in events if e["phase"] == "sp_join"][-1]
            if events[-1]["phase"] == "rollout" and events[-1]["start"] > max(after, join["end"]):
                return join, events[-1]
            time.sleep(0.01)
        raise TimeoutError("the leader recorded no lease")

    def preempt(self, victims: list, newcomers: dict) -> tuple[float, object]:
        """Submit a 4-step request, wait until the group holds it after step 2 (the follower
        with the hold is among ``victims``), give the notice (time 0) to ``victims``, regroup
        with ``newcomers``; returns (time 0, the regroup report)."""
        import ray

        ray.get(self.queue.submit.remote([_spec(2 * HOLD)]))
        holder = self.groups.workers[max(self.groups.workers)]  # the follower, parked after step 2
        assert ray.get(holder.wait_held.remote(600)), f"the group never reached step {HOLD}"
        handles = [self.groups.workers[m] for m in victims]
        t0 = time.time()
        self.groups.notice(victims, 30.0)
        report = self.groups.regroup(lost=victims, newcomers=newcomers)
        for handle in handles:
            ray.kill(handle, no_restart=True)
        return t0, report

    def close(self) -> None:
        import ray

        for handle in self.groups.workers.values():
            ray.kill(handle, no_restart=True)
        self.host.close()


def _lease(spec):
    from roll_spotlight.dispatch.requests import Lease, Request

    return Lease(0, Request.from_spec(0, spec), "bench", float("inf"), None, 1)


def _measure(session: _Session, t0: float, completion) -> dict[str, Any]:
    """Time lost of one recovery: the resumed lease's end (leader's clock = this host's) minus
    the notice, minus a steady two-step lease on the same group."""
    import numpy as np

    join, resumed = session.last_lease(t0)
    session.run(2)
    _, steady = session.last_lease(resumed["end"])
    steady_s = steady["end"] - steady["start"]
    total = resumed["end"] - t0
    out, ref = completion.output, session.reference
    diff = max(float(np.abs(out.latents - ref.latents).max()), float(np.abs(out.log_probs - ref.log_probs).max()))
    assert out.resumed_from == HOLD, out.resumed_from
    return {"total_s": total, "steady_step_s": steady_s, "lost_s": total - steady_s, "diff": diff,
            "regroup_s": join["end"] - join["start"], "step_s": resumed["end"] - join["end"]}


def _warm_once(session: _Session) -> dict[str, Any]:
    victim = max(session.groups.workers)  # the follower; the leader (node, 0) survives
    newcomer = session.worker(hold=True)  # started and loaded outside the timing
    t0, report = session.preempt([victim], dict([newcomer]))
    sample = _measure(session, t0, session.completion())
    return sample | {"transfer_s": report.transfer_s, "leave_s": report.leave_s,
                     "source": [s.value for s in report.sources.values()]}


def _cold_once(session: _Session) -> dict[str, Any]:
    from roll_spotlight.worker.actor import RolloutWorker
    from roll_spotlight.worker.faults import FaultPlan

    t0, _ = session.preempt(sorted(session.groups.workers), {})  # the group commits; nobody is left
    fresh = {}
    for hold in (False, True):  # new processes: imports, from_pretrained, weights from the store
        gpu = next(session._gpus)
        fresh[("node", gpu)] = RolloutWorker.remote(f"bench-{gpu}", session.source, session.queue, session.store,
                                                    faults=FaultPlan(hold_at_step=HOLD) if hold else None)
    session.groups.regroup(newcomers=fresh)  # no peer holds weights: each fetches from the store
    return _measure(session, t0, session.completion())


# ---- the benchmark ----

def run_regroup_bench(repeats: int = 5, model_mb: float = 256.0) -> dict[str, Any]:
    """Measure warm regroup and cold restart on the live workers (module docstring)."""
    if repeats < 1 or model_mb <= 0:
        raise ValueError(f"repeats={repeats} must be >= 1 and model_mb={model_mb} > 0")
    import ray

    from roll_spotlight.loopback import set_loopback_env

    set_loopback_env()
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        with tempfile.TemporaryDirectory(prefix="spotlight-regroup-") as directory:
            layers = layers_for(model_mb)
            path = write_pipeline(Path(directory) / "pipeline", layers)
            return _bench(repeats, {"preset": "qwen_image", "path": str(path), "image_size": IMAGE_SIZE}, layers)
    finally:
        if started_ray:
            ray.shutdown()


def _bench(repeats: int, source: dict, layers: int) -> dict[str, Any]:
    import ray

    session = _Session(source)
    try:
        session.groups.add(dict([session.worker(hold=False), session.worker(hold=True)]))
        session.groups.regroup()
        session.run(2)  # the first lease: weights from the store, first-touch costs (not measured)
        start = time.perf_counter()
        ray.get([w.publish_weights.remote() for w in session.groups.workers.values()])
        publish_s = time.perf_counter() - start
        warm = [_warm_once(session) for _ in range(repeats)]
        cold = [_cold_once(session) for _ in range(repeats)]
    finally:
        session.close()
    return _summary({"layers": layers, "model_mb": transformer_mb(layers), "publish_s": publish_s}, warm, cold)


def _median(samples: list[dict[str, Any]], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def _summary(meta: dict[str, Any], warm: list[dict], cold: list[dict]) -> dict[str, Any]:
    warm_lost_s, cold_lost_s = _median(warm, "lost_s"), _median(cold, "lost_s")
    warm_total_s, cold_total_s = _median(warm, "total_s"), _median(cold, "total_s")
    return {
        "warm_regroup_median_s": warm_lost_s,
        "cold_restart_median_s": cold_lost_s,
        "speedup": cold_lost_s / warm_lost_s if warm_lost_s > 0 else None,
        "sp_max_abs_diff": max(s["diff"] for s in warm + cold),
        "definition": "time lost to a member's preemption: from the notice to the end of the resumed lease "
                      "minus a two-step lease on the recovered group (steady_step_s), median over repeats",
        "path": "live: worker.actor.RolloutWorker SP groups driven by elastic.groups.ElasticGroups",
        "warm_parts_median_s": {k: _median(warm, k) for k in ("leave_s", "transfer_s", "regroup_s", "step_s")},
        "cold_parts_median_s": {k: _median(cold, k) for k in ("regroup_s", "step_s")},
        "steady_step_median_s": _median(warm, "steady_step_s"),
        "cold_steady_step_median_s": _median(cold, "steady_step_s"),
        "warm_total_median_s": warm_total_s,
        "cold_total_median_s": cold_total_s,
        "speedup_including_step": cold_total_s / warm_total_s,
        "publish_s": meta["publish_s"],
        "newcomer_weight_sources": sorted({src for s in warm for src in s.get("source", [])}),
        "warm_samples_s": [s["lost_s"] for s in warm],
        "cold_samples_s": [s["lost_s"] for s in cold],
        "warm_total_samples_s": [s["total_s"] for s in warm],
        "cold_total_samples_s": [s["total_s"] for s in cold],
        "repeats": len(warm),
        "model_mb": meta["model_mb"],
        "model": f"QwenImageTransformer2DModel layers={meta['layers']} heads={HEADS}x{HEAD_DIM} "
                 f"joint_dim={TEXT_DIM} fp32",
        "sp_degree": DEGREE,
        "step_tokens": {"image": (IMAGE_SIZE // 8) ** 2},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.regroup [--repeats N] [--model-mb MB] [--json]``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.regroup", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model-mb", type=float, default=256.0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = run_regroup_bench(repeats=args.repeats, model_mb=args.model_mb)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"time lost: warm regroup {result['warm_regroup_median_s']:.3f}s, cold restart "
              f"{result['cold_restart_median_s']:.2f}s, speedup {result['speedup']:.1f}x, "
              f"SP max abs diff {result['sp_max_abs_diff']:.2e} ({result['model']}, {result['model_mb']:.0f} MB); "
              f"with the first step included: warm {result['warm_total_median_s']:.3f}s, cold "
              f"{result['cold_total_median_s']:.2f}s, {result['speedup_including_step']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
