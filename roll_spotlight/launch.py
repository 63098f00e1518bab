"""Start a Spotlight ROLL pipeline: ``python -m roll_spotlight.launch --config_path DIR --config_name NAME``.

The same steps as ROLL's ``examples/start_*.py``: Hydra compose -> dacite into `SpotlightConfig`
-> ROLL's ``init()`` (starts or joins the Ray cluster) -> ``SpotlightPipeline(...).run()``. The
differences: ``--config_path`` is relative to the working directory (ROLL's scripts resolve it
relative to the script file), extra ``key=value`` arguments are Hydra overrides, the patches named
in the recipe's ``patches`` list are applied before parsing, and the environment is checked first.
The recipe is parsed and passes ``spotlight train --check``'s start-up checks (model, prompt and
reward-model paths, reward, trace) before ROLL's ``init()`` starts any cluster.

A recipe error (a `ConfigError`: unknown or renamed key, wrong value, missing path) is one line on
stderr naming the key and the recipe file, and exit status 2; ``--debug`` shows its traceback.

``--emulate GPU --time-scale S`` is a dry run of the recipe on emulated GPUs, as ``spotlight train
--emulate``: every role keeps its ranks, as CPU-only ROLL workers whose compute waits the cost
model's duration on that GPU divided by S (`worker.emulated`), and the spot nodes are raylets of a
local cluster that the recipe's trace (``spot.source: market``) starts, notices and kills. That
cluster is started before ROLL's ``init()``, which joins it (``RAY_ADDRESS``) and so neither starts
nor stops a Ray cluster; its spot nodes join once ROLL placed the on-demand workers on the head.
The run directory gets ``emulation.json`` and, as every launch, ``report.md``.

Without ROLL installed this exits with status 2 and says how to install it. ROLL's ``init()`` shells
out to the ``ray`` command (``ray status``, ``ray start``); when it is not on ``PATH`` (a virtual
environment used without activating it) the launcher exits with status 2 before starting anything
and says which ``bin`` directory to put on ``PATH``.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys

logger = logging.getLogger(__name__)
PROG = "python -m roll_spotlight.launch"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--config_path", required=True, help="directory of the recipe (relative to the cwd)")
    parser.add_argument("--config_name", required=True, help="recipe file name without .yaml")
    parser.add_argument("--check", action="store_true",
                        help="parse the recipe and run the start-up checks (paths, reward), then exit")
    parser.add_argument("--debug", action="store_true", help="show the traceback of a recipe error")
    parser.add_argument("--emulate", metavar="GPU", help="a dry run on emulated GPUs (h100, h800, h200, a100): "
                        "every compute phase waits its modelled duration instead of running the model")
    parser.add_argument("--time-scale", type=float, default=1.0, metavar="S",
                        help="with --emulate: modelled seconds per wall second (the trace runs as fast)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides")
    return parser


def missing_ray_command(path: str | None = None) -> str | None:
    """None when the ``ray`` executable is on PATH, else a message saying how to fix it."""
    if shutil.which("ray", path=path) is not None:
        return None
    here = os.path.dirname(sys.executable)
    hint = (f"it is in {here}: run  export PATH={here}:$PATH  (or activate the virtual environment)"
            if os.path.exists(os.path.join(here, "ray")) else "install Ray (ROLL's requirements_common.txt pins ray 2.48.0)")
    return ("the 'ray' command is not on PATH; ROLL's init() runs 'ray status' and 'ray start' to start or join "
            f"the Ray cluster, so the run would stop with 'ray: not found'. {hint}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from roll_spotlight.roll.environment import EnvironmentProblem, check_environment

    try:
        check_environment()
    except EnvironmentProblem as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if not args.check and (problem := missing_ray_command()):
        print(problem, file=sys.stderr)
        return 2
    from roll_spotlight.config.strict import ConfigError

    emulate = {"gpu": args.emulate, "time_scale": args.time_scale} if args.emulate else None
    try:
        cfg = load_recipe(args.config_path, args.config_name, args.overrides, emulate=emulate)
        if args.check:
            print(f"{cfg.source}: OK ({cfg.exp_name}, {cfg.max_steps} steps)")
            if summary := cfg.elastic.rollout_summary():
                print(summary)
            if fallback := cfg.spot_training_summary():
                print(f"warning: {fallback}")
            return 0
        return launch(cfg)
    except ConfigError as exc:
        if args.debug:
            raise
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


def load_recipe(config_path: str, config_name: str, overrides: list[str], emulate: dict | None = None):
    """The recipe composed (Hydra), its patches applied, parsed into `SpotlightConfig` (with
    ``emulate``: {gpu, time_scale}) and checked for start-up; every recipe error is a
    `ConfigError` naming the key and the file."""
    from roll_spotlight.config.strict import ConfigError
    from roll_spotlight.patches import apply_patches
    from roll_spotlight.roll.spotlight_config import compose_mapping, from_mapping, recipe_path

    source = recipe_path(config_path, config_name)
    data = compose_mapping(config_path, config_name, overrides)
    try:
        apply_patches(data.get("patches") or [])
    except ValueError as exc:
        raise ConfigError(f"patches: {exc} in {source}") from exc
    cfg = from_mapping(data | ({"emulate": emulate} if emulate else {}), source=source)
    cfg.check_startup()
    return cfg


def launch(cfg) -> int:
    """ROLL's ``init()`` (starts or joins the Ray cluster), then the recipe's pipeline; with
    emulated GPUs, inside the local cluster of the emulated spot nodes (module docstring), where
    the pipeline starts its spot pool once the fleet joined (`SpotlightPipeline.start_spot`)."""
    from pathlib import Path

    from roll.distributed.scheduler.initialize import init

    from roll_spotlight import plugins
    from roll_spotlight.config.strict import ConfigError
    from roll_spotlight.roll.pipeline import SpotlightPipeline
    from roll_spotlight.run_report import write_report
    from roll_spotlight.startup import spot_nodes

    pipeline_cls = plugins.resolve("pipelines", cfg.pipeline_cls)
    if cfg.emulate and not issubclass(pipeline_cls, SpotlightPipeline):
        raise ConfigError(f"{cfg.source}: pipeline_cls={cfg.pipeline_cls!r}: --emulate runs SpotlightPipeline "
                          "and its subclasses (their start_spot follows the emulated fleet)")
    with spot_nodes(cfg.to_run_config(), cfg.placement()) as nodes:  # nothing to start unless emulated
        if nodes.address is not None:
            os.environ["RAY_ADDRESS"] = nodes.address  # ROLL's `ray status` and ray.init() join it
        init()
        pipeline = pipeline_cls(pipeline_config=cfg)
        nodes.add_fleet()
        if cfg.emulate:  # the pool follows the fleet that just joined; then the trace's clock starts
            pipeline.start_spot()
        nodes.start()
        pipeline.run()
        nodes.write_stats(Path(cfg.output_dir) / cfg.exp_name)
    print(write_report(Path(cfg.output_dir) / cfg.exp_name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
