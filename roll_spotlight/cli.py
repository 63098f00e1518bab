"""The `spotlight` command line: the standalone host of roll_spotlight.

Each subcommand imports what it needs when it runs, so `spotlight --help` stays fast.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def _set_loopback_env() -> None:
    """Ray binds to 127.0.0.1 only with these set (see the README's security notes)."""
    for key, value in LOOPBACK_ENV.items():
        os.environ.setdefault(key, value)


def _set_threads(n: int | None) -> None:
    """torch intra-op threads; 1 avoids oversubscription when other processes share the cores."""
    n = n if n is not None else int(os.environ.get("SPOTLIGHT_THREADS", "0") or 0)
    if n > 0:
        import torch

        torch.set_num_threads(n)


def _load_run_config(path: str, overrides: list[str]):
    from roll_spotlight.configuration import load_config
    from roll_spotlight.training.config import RunConfig

    return load_config(RunConfig, path, overrides)


def cmd_pretrain(args) -> int:
    from roll_spotlight.training.pretrain import base_path, load_or_pretrain

    cfg = _load_run_config(args.config, args.override)
    _set_threads(args.threads)
    policy, meta = load_or_pretrain(cfg, progress=not args.no_progress)
    print(json.dumps({"base_model": str(base_path(cfg))} | {k: v for k, v in meta.items() if k != "path"}, indent=2))
    return 0


def cmd_train(args) -> int:
    from roll_spotlight.training.loop import run_training

    cfg = _load_run_config(args.config, args.override)
    _set_threads(args.threads)
    run_dir = Path(args.run_dir or Path(cfg.output_dir) / cfg.exp_name)
    result = run_training(cfg, run_dir, progress=not args.no_progress)
    print(json.dumps(result.summary(), indent=2))
    return 0


def _add_config_args(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument("--config", required=default is None, default=default, help="YAML run config")
    p.add_argument("--override", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted), repeatable")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads in this process (default: $SPOTLIGHT_THREADS, else torch's default)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotlight", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pretrain", help="pretrain (or load from cache) the tiny base model")
    _add_config_args(p)
    p.set_defaults(func=cmd_pretrain)
    p = sub.add_parser("train", help="run Flow-GRPO training from a YAML config")
    _add_config_args(p)
    p.add_argument("--run-dir", help="run directory (default: output_dir/exp_name)")
    p.set_defaults(func=cmd_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    _set_loopback_env()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from roll_spotlight.configuration import ConfigError

    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"spotlight: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
