"""Does the tiny base read the shape word? Swap costs of the base against an ideal denoiser, as JSON.

    python benchmarks/base_diagnostics.py --config configs/tiny_shapes.yaml --out benchmarks/results

The base is the cached one for the config (pretrained first when missing), or ``--model`` (a saved
tiny policy). For each noise level: the base's x_0 error with the true prompt, with the shape word
swapped and with the colour word swapped (measured), and the same three errors of the posterior
mean over ``--bank`` renders of the conditioning prompt (computed; see
``roll_spotlight.training.diagnostics``). A swap cost near 1 means the word is ignored.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def run(config: str, overrides: list[str], model: str | None, per_prompt: int, bank: int,
        sigmas: list[float]) -> dict:
    from roll_spotlight.config.strict import load_config
    from roll_spotlight.models import load_tiny_policy
    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.training.diagnostics import model_errors, posterior_errors, probe_set, swap_costs
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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
