"""Start a Spotlight ROLL pipeline: ``python -m roll_spotlight.launch --config_path DIR --config_name NAME``.

The same steps as ROLL's ``examples/start_*.py``: Hydra compose -> dacite into `SpotlightConfig`
-> ROLL's ``init()`` (starts or joins the Ray cluster) -> ``SpotlightPipeline(...).run()``. The
differences: ``--config_path`` is relative to the working directory (ROLL's scripts resolve it
relative to the script file), extra ``key=value`` arguments are Hydra overrides, the patches named
in the recipe's ``patches`` list are applied before parsing, and the environment is checked first.

Without ROLL installed this exits with status 2 and says how to install it.
"""
from __future__ import annotations

import argparse
import logging
import sys

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m roll_spotlight.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--config_path", required=True, help="directory of the recipe (relative to the cwd)")
    parser.add_argument("--config_name", required=True, help="recipe file name without .yaml")
    parser.add_argument("--check", action="store_true", help="parse and validate the recipe, then exit")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from roll_spotlight.roll.environment import EnvironmentProblem, check_environment

    try:
        check_environment()
    except EnvironmentProblem as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return launch(args.config_path, args.config_name, args.overrides, check_only=args.check)


def launch(config_path: str, config_name: str, overrides: list[str], *, check_only: bool = False) -> int:
    from roll_spotlight.patches import apply_patches
    from roll_spotlight.roll.config import compose_mapping, from_mapping

    data = compose_mapping(config_path, config_name, overrides)
    apply_patches(data.get("patches") or [])
    cfg = from_mapping(data)
    if check_only:
        print(f"{config_name}: OK ({cfg.exp_name}, {cfg.max_steps} steps)")
        if summary := cfg.elastic.rollout_summary():
            print(summary)
        return 0
    from roll.distributed.scheduler.initialize import init

    from roll_spotlight import plugins

    init()
    pipeline_cls = plugins.resolve("pipelines", cfg.pipeline_cls)
    pipeline_cls(pipeline_config=cfg).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
