"""Does the tiny base read the shape word? Swap costs of the base against an ideal denoiser, as JSON.

    python -m benchmarks.base_diagnostics --config configs/tiny_shapes.yaml --out benchmarks/results

The base is the cached one for the config (pretrained first when missing), or ``--model`` (a saved
tiny policy); the base's errors are MEASURED, the reference's computed.

For one-object scenes ("a red circle") rendered at fixed seeds, noised to ``sigma`` with a fixed
draw, the base predicts the clean image (x_0 = x_sigma - sigma * v) three times: conditioned on the
true prompt, on the prompt with the shape word swapped, and on the prompt with the colour word
swapped. A model that uses a word pays for the swap; one that ignores it does not.

The reference is the posterior mean of x_0 over ``bank`` renders of the conditioning prompt
(every render equally likely a priori, weights from the Gaussian likelihood of x_sigma): what an
ideal denoiser of the rendered world predicts. It is computed, not learnt, and shows how much a
swap *should* cost at each noise level.

Images are in the model's latent scale ([-1, 1] per channel); errors are mean squared errors over
every pixel and channel.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from roll_spotlight.tasks.shapes.spec import COLORS as PALETTE
from roll_spotlight.tasks.shapes.spec import SHAPES

COLORS = tuple(PALETTE)
SWAPS = ("true", "shape_swapped", "color_swapped")


@dataclass(frozen=True)
class ProbeSet:
    """One-object prompts, their fixed seeds and the two swapped variants of each prompt."""

    prompts: tuple[str, ...]
    seeds: tuple[int, ...]
    shape_swapped: tuple[str, ...]
    color_swapped: tuple[str, ...]

    def variant(self, swap: str) -> tuple[str, ...]:
        return {"true": self.prompts, "shape_swapped": self.shape_swapped, "color_swapped": self.color_swapped}[swap]


def probe_set(per_prompt: int, colors: Sequence[str] = COLORS, seed_base: int = 20_000_000) -> ProbeSet:
    """``per_prompt`` seeds of every (colour, shape); swaps go to the next shape / colour in order."""
    if per_prompt < 1:
        raise ValueError(f"per_prompt must be >= 1, got {per_prompt!r}")
    unknown = [c for c in colors if c not in COLORS]
    if unknown or len(colors) < 2:
        raise ValueError(f"colors must be >= 2 of {COLORS}, got {list(colors)}")
    prompts, seeds, shape_sw, color_sw = [], [], [], []
    for ci, color in enumerate(colors):
        for si, shape in enumerate(SHAPES):
            for k in range(per_prompt):
                prompts.append(f"a {color} {shape}")
                seeds.append(seed_base + len(seeds))
                shape_sw.append(f"a {color} {SHAPES[(si + 1) % len(SHAPES)]}")
                color_sw.append(f"a {colors[(ci + 1) % len(colors)]} {shape}")
    return ProbeSet(tuple(prompts), tuple(seeds), tuple(shape_sw), tuple(color_sw))


def rendered(prompts: Sequence[str], seeds: Sequence[int], size: int, layout: str = "free") -> np.ndarray:
    """float32 (B, H, W, 3) renders in [-1, 1] (`layout`: the renderer's style, see `render.layout`)."""
    from roll_spotlight.tasks.shapes import parse_prompt, render

    images = np.stack([render(parse_prompt(p), int(s), size=size, style=layout) for p, s in zip(prompts, seeds)])
    return images.astype(np.float32) / 127.5 - 1.0


def _noise(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 0xD1A6]).standard_normal(shape).astype(np.float32)


def model_errors(policy, probes: ProbeSet, sigmas: Sequence[float], noise_seed: int = 0,
                 layout: str = "free") -> dict:
    """{sigma: {swap: x_0 MSE}} of ``policy`` (a tiny DiT policy) on the probe set."""
    import torch

    size = policy.cfg.image_size
    x0_img = rendered(probes.prompts, probes.seeds, size, layout)
    x0 = policy.encode_images(torch.from_numpy(x0_img).permute(0, 3, 1, 2) * 0.5 + 0.5)
    eps = torch.from_numpy(_noise(tuple(x0.shape), noise_seed))
    conds = {swap: policy.encode_prompts(list(probes.variant(swap))) for swap in SWAPS}
    out = {}
    was_training = policy.training
    policy.eval()
    try:
        with torch.no_grad():
            for sigma in sigmas:
                s = torch.full((x0.shape[0],), float(sigma))
                xt = (1 - sigma) * x0 + sigma * eps
                out[float(sigma)] = {swap: float(((xt - sigma * policy.velocity(xt, s, conds[swap]) - x0) ** 2).mean())
                                     for swap in SWAPS}
    finally:
        policy.train(was_training)
    return out


def posterior_errors(probes: ProbeSet, sigmas: Sequence[float], size: int, bank: int,
                     noise_seed: int = 0, bank_seed_base: int = 30_000_000, layout: str = "free") -> dict:
    """{sigma: {swap: x_0 MSE}} of the posterior mean over ``bank`` renders of the conditioning prompt."""
    if bank < 2:
        raise ValueError(f"bank must be >= 2, got {bank!r}")
    bad = [s for s in sigmas if not 0 < s < 1]
    if bad:
        raise ValueError(f"sigmas must be in (0, 1), got {bad}")
    x0 = rendered(probes.prompts, probes.seeds, size, layout)
    eps = _noise((len(probes.prompts), size, size, 3), noise_seed + 1)
    banks: dict[str, np.ndarray] = {}
    needed = {p for swap in SWAPS for p in probes.variant(swap)}
    for prompt in sorted(needed):
        banks[prompt] = rendered([prompt] * bank, range(bank_seed_base, bank_seed_base + bank), size, layout)
    out = {}
    for sigma in sigmas:
        xt = (1 - sigma) * x0 + sigma * eps
        row = {}
        for swap in SWAPS:
            errs = []
            for i, prompt in enumerate(probes.variant(swap)):
                candidates = banks[prompt]
                loglik = -((xt[i] - (1 - sigma) * candidates) ** 2).sum(axis=(1, 2, 3)) / (2 * sigma * sigma)
                w = np.exp(loglik - loglik.max())
                mean = np.tensordot(w / w.sum(), candidates, axes=1)
                errs.append(float(((mean - x0[i]) ** 2).mean()))
            row[swap] = float(np.mean(errs))
        out[float(sigma)] = row
    return out


def swap_costs(errors: dict) -> dict:
    """{sigma: {"shape": ratio, "color": ratio}}: swapped MSE over true MSE (1 = the word is ignored)."""
    return {sigma: {"shape": row["shape_swapped"] / max(row["true"], 1e-12),
                    "color": row["color_swapped"] / max(row["true"], 1e-12)}
            for sigma, row in errors.items()}


def run(config: str, overrides: list[str], model: str | None, per_prompt: int, bank: int,
        sigmas: list[float]) -> dict:
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.models import load_tiny_policy
    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.training.pretrain import load_or_pretrain

    cfg = load_config(RunConfig, config, overrides)
    if model:
        policy, meta = load_tiny_policy(model)
        meta = meta | {"path": model}
    else:
        policy, meta = load_or_pretrain(cfg)
    probes = probe_set(per_prompt)
    t0 = time.monotonic()
    measured = model_errors(policy, probes, sigmas, layout=cfg.task.layout)
    t1 = time.monotonic()
    reference = posterior_errors(probes, sigmas, policy.cfg.image_size, bank, layout=cfg.task.layout)
    return {
        "kind": "base: measured on this machine; reference: computed (posterior mean over renders)",
        "config": config, "overrides": overrides, "layout": cfg.task.layout, "base": Path(meta["path"]).name if meta.get("path") else None,
        "base_val_strict": meta.get("base_val_strict"), "probe_images": len(probes.prompts), "bank": bank,
        "base_x0_mse": measured, "reference_x0_mse": reference,
        "base_swap_cost": swap_costs(measured), "reference_swap_cost": swap_costs(reference),
        "seconds": {"base": t1 - t0, "reference": time.monotonic() - t1},
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.base_diagnostics", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny_shapes.yaml")
    p.add_argument("-o", "--override", action="append", default=[], help="config override key=value")
    p.add_argument("--model", help="a saved tiny policy instead of the config's cached base")
    p.add_argument("--per-prompt", type=int, default=8, help="seeds per (colour, shape) prompt")
    p.add_argument("--bank", type=int, default=3000, help="renders per prompt for the reference")
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.4, 0.6, 0.8, 0.9])
    p.add_argument("--out", type=Path, help="directory for base_diagnostics.json")
    args = p.parse_args(argv)
    report = run(args.config, args.override, args.model, args.per_prompt, args.bank, args.sigmas)
    print(json.dumps({k: report[k] for k in ("base_swap_cost", "reference_swap_cost")}, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "base_diagnostics.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
