"""The `spotlight` command line: the standalone host of roll_spotlight.

Each subcommand imports what it needs when it runs, so `spotlight --help` stays fast.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

from roll_spotlight.loopback import set_loopback_env
from roll_spotlight.startup import WorkerPlacement, set_threads


def _load_run_config(path: str, overrides: list[str]):
    """The run config of `path`, with what this host cannot run refused: its workers always pull
    (static shares are the ROLL host's vanilla baseline) from the queue the scheduler names."""
    from roll_spotlight import plugins
    from roll_spotlight.config.strict import ConfigError, load_config
    from roll_spotlight.config.run import RunConfig

    cfg = load_config(RunConfig, path, overrides)
    if cfg.dispatch.mode != "pull":
        raise ConfigError(f"dispatch.mode={cfg.dispatch.mode!r} in {path}: spotlight train's workers pull from the "
                          "queue (static shares are the ROLL host's vanilla baseline); set dispatch.mode: pull")
    plugins.resolve("schedulers", cfg.dispatch.scheduler)  # fails now, naming the known schedulers
    return cfg


def cmd_pretrain(args) -> int:
    from roll_spotlight.training.pretrain import base_path, load_or_pretrain

    cfg = _load_run_config(args.config, args.override)
    set_threads(args.threads)
    policy, meta = load_or_pretrain(cfg, progress=not args.no_progress)
    print(json.dumps({"base_model": str(base_path(cfg))} | {k: v for k, v in meta.items() if k != "path"}, indent=2))
    return 0


def _check_resumable(run_dir: Path) -> None:
    """A run directory with at least one complete checkpoint (half-written ones end in .tmp);
    which one is used is decided at resume (the newest that verifies, see Coordinator.resume_latest)."""
    ckpts = [p for p in (run_dir / "checkpoints").glob("iter-*") if not p.name.endswith(".tmp")]
    if not ckpts:
        raise FileNotFoundError(f"no checkpoint under {run_dir / 'checkpoints'}: nothing to resume")


def cmd_train(args) -> int:
    if args.resume:
        run_dir = Path(args.resume)
        cfg = _load_run_config(str(run_dir / "config.yaml"), args.override)
    elif args.config:
        cfg = _load_run_config(args.config, args.override)
        run_dir = Path(args.run_dir or Path(cfg.output_dir) / cfg.exp_name)
    else:
        raise ValueError("spotlight train needs --config FILE or --resume RUN_DIR")
    if args.resume:
        _check_resumable(run_dir)
    cfg = _with_trace(cfg, args.trace)
    if args.iterations is not None:
        if args.iterations < 1:
            raise ValueError(f"--iterations must be >= 1, got {args.iterations}")
        cfg = dataclasses.replace(cfg, max_steps=args.iterations)
    if args.check:
        return _check_only(cfg, args)
    set_threads(args.threads)
    result = _train(cfg, run_dir, args, resume=bool(args.resume))
    print(json.dumps(result.summary(), indent=2))
    return 0


def _with_trace(cfg, trace: str | None):
    """`--trace FILE`: spot workers on, the market replays FILE instead of the configured one."""
    if trace is None:
        return cfg
    if not Path(trace).exists():
        raise FileNotFoundError(f"--trace {trace}: no such file or folder")
    return dataclasses.replace(cfg, spot=dataclasses.replace(cfg.spot, enabled=True, trace=trace))


def _train(cfg, run_dir: Path, args, resume: bool = False):
    """`spotlight train` and `quickstart`: the one start-up path (`roll_spotlight.startup`)."""
    from roll_spotlight.startup import start_run

    return start_run(cfg, run_dir, placement=_placement(args), progress=not args.no_progress, resume=resume)


def _placement(args) -> WorkerPlacement:
    return WorkerPlacement(ray=bool(getattr(args, "ray", False)), address=getattr(args, "address", None),
                           workers=args.workers, sp_degree=getattr(args, "sp_degree", 1),
                           emulate=getattr(args, "emulate", None), time_scale=getattr(args, "time_scale", 1.0))


def _check_only(cfg, args) -> int:
    """`--check`: every start-up check, nothing built or written; prints what the run would be."""
    from roll_spotlight.models.memory_plan import check_memory_plan, format_memory_plan, largest_batch
    from roll_spotlight.startup import check_startup, memory_plan_of

    plan = memory_plan_of(cfg, _placement(args))   # from the config alone: shown even if a check fails below
    print(f"memory plan ({cfg.model.preset}, {cfg.model.image_size}x{cfg.model.image_size}, estimates):")
    print(format_memory_plan(plan))
    gib, batch = cfg.model.gpu_memory_gb, cfg.sampling.max_batch
    most, gpu = largest_batch(plan, "rollout", gib or 80.0), f"model.gpu_memory_gb={gib:g}" if gib else "80 GiB"
    print(f"sampling.max_batch={batch}; the largest that fits {gpu}: {most}"
          f"{'' if most >= batch else ' (too small: lower sampling.max_batch)'}")
    check_startup(cfg, _placement(args))
    check_memory_plan(plan)
    lora = cfg.train.lora
    print(json.dumps({"config": "ok", "exp_name": cfg.exp_name, "model": cfg.model.preset,
                      "on_ray": _placement(args).on_ray(cfg), "reward": cfg.reward.name,
                      "lora": None if lora is None else {"rank": lora.rank, "alpha": lora.alpha},
                      "guidance_scale": cfg.sampling.guidance_scale}, indent=2))
    return 0


# Minutes on 2 quiet cores for configs/quickstart.yaml as it ships (docs/measurements.md, "The
# quickstart": estimated from CPU seconds measured beside the quiet 2 x 2-patch run): pretraining
# the base, and the Ray run (start-up, iterations, validations, report).
QUICKSTART_MINUTES = {"pretrain": 2, "run": 11}


def _say(line: str) -> None:
    print(f"spotlight quickstart: {line}", file=sys.stderr, flush=True)


def cmd_quickstart(args) -> int:
    """Pretrain (or load) the tiny base, train on Ray with the quickstart config, write the report."""
    from roll_spotlight.run_report import write_report
    from roll_spotlight.training.pretrain import base_path, load_or_pretrain

    config = args.config or "configs/quickstart.yaml"
    cfg = _with_trace(_load_run_config(config, args.override), args.trace)
    set_threads(args.threads)  # on a first run the driver alone pretrains the base: every core
    run_dir = Path(args.run_dir or Path(cfg.output_dir) / cfg.exp_name)
    args.ray, args.address = True, None
    shipped = not args.config and not args.override  # the minutes were measured for it alone
    about = {part: f", about {m} min on 2 cores" if shipped else "" for part, m in QUICKSTART_MINUTES.items()}
    if cfg.model.preset == "tiny" and not base_path(cfg).is_file():
        _say(f"pretraining the tiny base ({cfg.pretrain.steps} steps, first run only{about['pretrain']}; "
             f"cached in {base_path(cfg).parent}) ...")
        load_or_pretrain(cfg, progress=not args.no_progress)
    _say(f"{cfg.max_steps} iterations of Flow-GRPO on a local Ray cluster"
         f"{' with spot workers' if cfg.spot.enabled else ''}{about['run']}: "
         f"starting Ray and validating the base on {cfg.task.val_prompts} prompt/seed pairs first ...")
    result = _train(cfg, run_dir, args, None)
    report = write_report(run_dir)
    print(json.dumps(result.summary(), indent=2))
    print(f"report: {report}")
    return 0


def cmd_report(args) -> int:
    from roll_spotlight.run_report import write_report

    print(write_report(Path(args.run_dir)))
    return 0


def cmd_prompts(args) -> int:
    """`spotlight prompts ocr --out DIR`: the shipped OCR prompt set, as train.txt and test.txt."""
    from roll_spotlight.tasks.ocr_prompts import write_ocr_prompts

    train, test = write_ocr_prompts(args.out, args.train, args.test, args.seed)
    print(json.dumps({"train": str(train), "test": str(test), "n_train": args.train, "n_test": args.test}))
    return 0


def cmd_make_tiny_qwen(args) -> int:
    """A tiny randomly initialised Qwen-Image pipeline directory (real classes, a few MB), for
    trying the Qwen-Image path end to end on a CPU."""
    from roll_spotlight.models.tiny_qwen import make_tiny_qwen

    print(make_tiny_qwen(args.dir, seed=args.seed))
    return 0


def cmd_traces(args) -> int:
    from roll_spotlight.spot import summarize_shipped_traces
    from roll_spotlight.spot.traces import traces_root

    print(json.dumps(summarize_shipped_traces(Path(args.root) if args.root else traces_root()), indent=2))
    return 0


def _add_config_args(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument("--config", required=default is None, default=default, help="YAML run config")
    p.add_argument("--override", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted), repeatable")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads in this process (default: $SPOTLIGHT_THREADS, else torch's default)")


def _add_trace_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", metavar="FILE", default=None,
                   help="spot trace (file or folder) the spot workers follow; enables spot (implies --ray)")


# subcommands that parse their own options (and --help): name -> (module with `main(argv)`, summary)
PASSTHROUGH = {
    "simulate": ("roll_spotlight.sim.api", "simulate time and cost per iteration for the four baselines"),
    "notice-agent": ("roll_spotlight.cluster.notice_agent", "drain this Ray node on its cloud's preemption notice"),
    "compare": ("roll_spotlight.compare", "two run directories side by side (markdown, PNG, JSON); a CI gate"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotlight", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pretrain", help="pretrain (or load from cache) the tiny base model")
    _add_config_args(p)
    p.set_defaults(func=cmd_pretrain)
    p = sub.add_parser("train", help="run Flow-GRPO training from a YAML config")
    _add_config_args(p, default="")
    p.add_argument("--run-dir", help="run directory (default: output_dir/exp_name)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its newest checkpoint")
    p.add_argument("--check", action="store_true", help="run every start-up check, print the plan, start nothing")
    p.add_argument("--ray", action="store_true", help="run on Ray actors (local cluster unless --address)")
    p.add_argument("--address", help="join an existing Ray cluster (implies --ray)")
    p.add_argument("--workers", type=int, default=2, help="on-demand rollout workers with --ray")
    p.add_argument("--sp-degree", type=int, default=1,
                   help="with --ray: rollout workers per SP group (Ulysses; must divide --workers and the head count)")
    p.add_argument("--emulate", metavar="GPU", help="a dry run on emulated GPUs (h100, h800, h200, a100): every "
                   "compute phase waits its calibrated duration; spot nodes are local raylets the trace drives")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="with --emulate: modelled seconds per wall second (the trace runs as fast)")
    p.add_argument("--iterations", type=int, help="run this many iterations (max_steps)")
    _add_trace_arg(p)
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("quickstart", help="the embedded default: tiny task on a local Ray, with a report")
    _add_config_args(p, default="")
    p.add_argument("--run-dir")
    p.add_argument("--workers", type=int, default=2)
    _add_trace_arg(p)
    p.set_defaults(func=cmd_quickstart)
    p = sub.add_parser("report", help="write RUN_DIR/report.md with PNG plots")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_report)
    for name, (_, summary) in PASSTHROUGH.items():  # listed in --help; `main` hands them their arguments
        sub.add_parser(name, help=summary, add_help=False).add_argument("rest", nargs=argparse.REMAINDER)
    p = sub.add_parser("prompts", help="write a shipped prompt set: `prompts ocr --out DIR`")
    p.add_argument("kind", choices=["ocr"])
    p.add_argument("--out", required=True, help="folder for train.txt and test.txt")
    p.add_argument("--train", type=int, default=20000, help="training prompts")
    p.add_argument("--test", type=int, default=1000, help="test prompts (targets disjoint from training)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_prompts)
    p = sub.add_parser("make-tiny-qwen", help="write a tiny random Qwen-Image pipeline directory to DIR")
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_make_tiny_qwen)
    p = sub.add_parser("traces", help="statistics of the spot traces in a folder")
    p.add_argument("root", nargs="?", default=None, help="default: the traces shipped in the package")
    p.set_defaults(func=cmd_traces)
    return parser


def main(argv: list[str] | None = None) -> int:
    set_loopback_env()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in PASSTHROUGH:  # these parse their own options (and --help)
        import importlib

        return importlib.import_module(PASSTHROUGH[argv[0]][0]).main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from roll_spotlight.config.strict import ConfigError

    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"spotlight: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
