"""How much of one Flow-GRPO batch gradient is signal? Agreement of gradients of independent batches.

    python -m benchmarks.gradient_signal --config configs/tiny_shapes.yaml --batches 8

At the cached base's weights, each of `--batches` batches is what one training iteration would roll
out; its loss gradient is computed and nothing is updated (MEASURED on this machine, CPU).
Overrides (-o key=value) change the config as in `spotlight train`.

At fixed weights, the gradient of batch b is g_b = s + n_b: s is the expected (policy) gradient,
n_b this batch's noise, independent across batches drawn independently (other prompts, other seeds).
Then, over pairs of batches,

- ``signal_fraction`` = mean(g_i . g_j) / mean(|g_b|^2) estimates |s|^2 / (|s|^2 + E|n|^2): the share
  of a batch gradient's energy that is signal. It weights parameters by their gradient energy, so a
  few large ones (often the output projection) dominate it.
- ``sign_agreement``: the fraction of entries, nonzero in both, whose signs agree. For Gaussian
  noise P(agree) = 1/2 + arcsin(rho) / pi, rho being the per-entry correlation s^2 / (s^2 + var n)
  between the two batches; ``correlation`` inverts that, pooling all entries equally. This is the
  view of a sign-like optimiser such as Adam early on, which moves every parameter about the same.

With no signal both are 0 (agreement 0.5) up to sampling noise; the standard errors are
leave-one-batch-out jackknife estimates (pairs sharing a batch are not independent). A run's
update after T steps accumulates about T |s|^2 of signal energy against T E|n|^2 of noise energy
(with T correlated signals adding coherently, noises not): with a fraction f per batch, T steps
give a signal-to-noise ratio of about sqrt(T f / (1 - f)).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class Agreement:
    batches: int
    pairs: int
    signal_fraction: float
    signal_fraction_se: float
    sign_agreement: float
    sign_agreement_se: float
    correlation: float
    cosine_mean: float

    def summary(self) -> dict:
        return asdict(self)


def _pair_stats(grads: Sequence[torch.Tensor], batches: Sequence[int]) -> tuple[float, float, float, int]:
    """(signal fraction, sign agreement, mean cosine, pairs) over the pairs of the given batches."""
    dots, agree, cosines = [], [], []
    for a, i in enumerate(batches):
        for j in batches[a + 1:]:
            gi, gj = grads[i], grads[j]
            dots.append(float(gi @ gj))
            cosines.append(float(gi @ gj) / max(float(gi.norm() * gj.norm()), 1e-300))
            both = (gi != 0) & (gj != 0)
            agree.append(float((torch.sign(gi[both]) == torch.sign(gj[both])).double().mean()) if bool(both.any())
                         else 0.5)
    energy = float(np.mean([float(grads[b] @ grads[b]) for b in batches]))
    fraction = float(np.mean(dots)) / energy if energy > 0 else 0.0
    return fraction, float(np.mean(agree)), float(np.mean(cosines)), len(dots)


def _jackknife_se(values: Sequence[float]) -> float:
    v = np.asarray(values, dtype=float)
    return float(math.sqrt((len(v) - 1) / len(v) * ((v - v.mean()) ** 2).sum()))


def agreement(grads: Sequence[torch.Tensor]) -> Agreement:
    """Pairwise agreement of flat gradients of independent batches (at least 3, for the jackknife)."""
    if len(grads) < 3:
        raise ValueError(f"need gradients of at least 3 batches, got {len(grads)}")
    flat = [g.detach().reshape(-1).double() for g in grads]
    if len({g.numel() for g in flat}) != 1:
        raise ValueError(f"gradients differ in size: {sorted({g.numel() for g in flat})}")
    every = list(range(len(flat)))
    fraction, agree, cosine, pairs = _pair_stats(flat, every)
    leave_out = [_pair_stats(flat, [b for b in every if b != out]) for out in every]
    return Agreement(
        batches=len(flat), pairs=pairs,
        signal_fraction=fraction, signal_fraction_se=_jackknife_se([s[0] for s in leave_out]),
        sign_agreement=agree, sign_agreement_se=_jackknife_se([s[1] for s in leave_out]),
        correlation=math.sin(math.pi * (agree - 0.5)), cosine_mean=cosine,
    )


def flatten(grads: Mapping[str, torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    """One flat vector over `names`, in that order."""
    missing = [n for n in names if n not in grads]
    if missing:
        raise ValueError(f"no gradient for {missing[:3]}{' ...' if len(missing) > 3 else ''} in this batch")
    return torch.cat([grads[n].reshape(-1) for n in names])


def common_names(grads: Sequence[Mapping[str, torch.Tensor]]) -> list[str]:
    """The parameters every batch has a gradient for (a batch with none raises)."""
    for b, g in enumerate(grads):
        if not g:
            raise ValueError(f"batch {b} produced no gradient (every group zero-std)")
    return [n for n in grads[0] if all(n in g for g in grads)]


def by_parameter(grads: Sequence[Mapping[str, torch.Tensor]], top: int = 10) -> list[dict]:
    """The `top` parameters by gradient energy: their share of it and their own agreement."""
    names = common_names(grads)
    energy = {n: float(np.mean([float(g[n].double().pow(2).sum()) for g in grads])) for n in names}
    total = sum(energy.values()) or 1.0
    rows = []
    for name in sorted(names, key=lambda n: -energy[n])[:top]:
        a = agreement([g[name] for g in grads])
        rows.append({"parameter": name, "numel": int(grads[0][name].numel()), "energy_share": energy[name] / total,
                     "signal_fraction": a.signal_fraction, "signal_fraction_se": a.signal_fraction_se,
                     "sign_agreement": a.sign_agreement, "sign_agreement_se": a.sign_agreement_se})
    return rows


def measure(cfg, policy, batches: int, *, first_iteration: int = 100_000, progress=None) -> dict:
    """Gradients of `batches` independent training batches at the policy's current weights.

    Each batch is what iteration ``first_iteration + b`` of a run with `cfg` would roll out (the
    coordinator's `iteration_specs`: its prompts, seeds and SDE window), generated in one batched call
    here (the run's workers roll out one request at a time; the last bits differ, the statistics do
    not). Nothing is updated.
    """
    from roll_spotlight.runtime.coordinator import iteration_specs
    from roll_spotlight.training.grpo import FlowGRPOTrainer, ScoredBatch
    from roll_spotlight.rewards.configured import configured_reward
    from roll_spotlight.training.sampling import generate, to_uint8_images, train_spec
    from roll_spotlight.training.prompt_pools import train_pool

    trainer = FlowGRPOTrainer(policy, cfg.train)
    pool, reward = train_pool(cfg.task), configured_reward(cfg.reward)
    g, p = cfg.train.group_size, cfg.rollout_batch_size
    grads, rows = [], []
    for b in range(batches):
        t0 = time.monotonic()
        it = first_iteration + b
        specs = iteration_specs(cfg, pool, it, weight_version=0)
        prompts, seeds = [s.prompt for s in specs], [s.seed for s in specs]
        window = specs[0].schedule.window
        traj = generate(policy, prompts, seeds, train_spec(cfg.sampling, window))
        rewards = np.asarray(reward(to_uint8_images(policy, traj.final), prompts).rewards, dtype=float)
        batch = ScoredBatch(traj, prompts, np.repeat(np.arange(p), g), rewards, cfg.sampling.noise_level,
                            cfg.sampling.kind)
        grads.append(trainer.gradient(batch))
        within = float(np.mean([rewards[i * g:(i + 1) * g].std() for i in range(p)]))
        rows.append({"iteration": it, "window": list(window), "reward_mean": float(rewards.mean()),
                     "within_group_std": within, "seconds": time.monotonic() - t0})
        if progress:
            progress(rows[-1])
    names = common_names(grads)
    overall = agreement([flatten(gr, names) for gr in grads])
    return {"batches": rows, "overall": overall.summary(), "by_parameter": by_parameter(grads),
            "parameters_compared": int(sum(grads[0][n].numel() for n in names)),
            "samples_per_batch": p * g}


def run_setting(config: str, batches: int, overrides: list[str], label: str | None) -> dict:
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.startup import check_startup, starting_policy

    cfg = load_config(RunConfig, config, overrides)
    check_startup(cfg)
    policy, source = starting_policy(cfg)
    t0 = time.monotonic()
    report = measure(cfg, policy, batches, progress=lambda row: print(json.dumps(row), flush=True))
    base = Path(source).name if isinstance(source, (str, Path)) else str(source)  # no local paths in results
    return {"kind": "measured", "label": label, "config": config, "overrides": overrides, "policy": base,
            "reward": cfg.reward.name, "reward_kwargs": dict(cfg.reward.kwargs),
            "wall_s": time.monotonic() - t0, **report}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gradient_signal", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny_shapes.yaml")
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--override", "-o", action="append", default=[])
    p.add_argument("--label", default=None, help="a name for this setting in the JSON")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/gradient_signal.json"),
                   help="JSON file; a run appends its setting to the list already there")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: $SPOTLIGHT_THREADS, else torch's default)")
    args = p.parse_args(argv)
    if args.batches < 3:
        p.error(f"--batches must be >= 3 (pairs for the jackknife), got {args.batches}")
    from roll_spotlight.startup import set_threads

    set_threads(args.threads)
    result = run_setting(args.config, args.batches, args.override, args.label)
    print(json.dumps(result["overall"], indent=1))
    runs = json.loads(args.out.read_text())["runs"] if args.out.exists() else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"kind": "measured", "runs": [*runs, result]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
