"""The one start-up path of a run: check, build the starting policy and the backend, run the loop.

`spotlight train` and `spotlight quickstart`, the benchmarks and the tests all start a run through
`start_run`; the ROLL pipeline builds its own clusters and backend and enters through
`check_startup` and `run_loop`. Order matters: everything that can fail on user input is checked
before anything is built or written, and the run directory is created only once the backend is up,
so a failed start leaves no half-written run behind (a crash after that is what `--resume` is for).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)


def set_threads(n: int | None) -> None:
    """torch intra-op threads (None: $SPOTLIGHT_THREADS, else torch's default); 1 avoids
    oversubscription when other processes share the cores."""
    n = n if n is not None else int(os.environ.get("SPOTLIGHT_THREADS", "0") or 0)
    if n > 0:
        import torch

        torch.set_num_threads(n)


@dataclass(frozen=True)
class HostWorkers:
    """The on-demand worker processes an emulated run starts on this machine, beside the spot
    raylets: how many, the memory (RSS, MB) each holds, and what a capacity error calls them."""

    count: int
    mb: float
    what: str = "on-demand GPUs"


@dataclass(frozen=True)
class WorkerPlacement:
    """Where the loop's workers run: in this process (`ray=False`) or on Ray actors.

    `address` joins an existing Ray cluster (None: a local one); `workers` on-demand rollout
    workers in SP groups of `sp_degree`. A run with spot workers always runs on Ray. `emulate`
    names a GPU type (`sim.gpus`): every worker's compute waits its calibrated duration on that
    GPU, divided by `time_scale`, instead of running the model (`worker.emulated`); spot nodes
    are then raylets of a local cluster that the spot trace starts, drains and kills.
    `host_workers`: the emulated run's on-demand processes when they are not the trainer and
    `workers` emulated worker actors (a ROLL host's: every role's ranks, `HostWorkers`).
    """

    ray: bool = False
    address: str | None = None
    workers: int = 2
    sp_degree: int = 1
    emulate: str | None = None
    time_scale: float = 1.0
    sp_min_degree: int | None = None
    host_workers: HostWorkers | None = None

    def on_ray(self, cfg) -> bool:
        return self.ray or self.address is not None or cfg.spot.enabled or self.emulate is not None


def check_startup(cfg, placement: WorkerPlacement | None = None, *, key: Callable[[str], str] = str) -> None:
    """What can fail at start-up, checked before anything is written (no run directory yet).

    The config dataclasses validated keys, types and values; this adds what needs the outside
    world or the placement: the model directory exists, the reward builds (name known, kwargs
    accepted, files it names readable), the spot trace parses, the SP degree fits the model.
    `key` renames RunConfig's keys in messages to a host's names (the ROLL recipes' `pretrain`).
    """
    from roll_spotlight.config import ConfigError

    placement = placement or WorkerPlacement()
    emulated = placement.emulate is not None
    if emulated:
        check_emulation(cfg, placement)
    if cfg.model.gpu_memory_gb is not None:  # the plan is computed from the model config alone
        from roll_spotlight.models.memory_plan import check_memory_plan

        plan = memory_plan_of(cfg, placement)
        if cfg.spot_trains() and not plan.fits("trainer"):
            raise ConfigError(f"spot.training_phase: spot workers that train hold the trainer's memory plan, "
                              f"{plan.total_gib('trainer'):.1f} GiB > model.gpu_memory_gb={cfg.model.gpu_memory_gb:g}; "
                              "set spot.training_phase: explore, or a smaller train.micro_batch_size")
        check_memory_plan(plan)
    if missing := missing_paths(cfg, key=key, models=not emulated):
        raise ConfigError("local files or directories this run needs are missing: " + "; ".join(missing))
    if cfg.spot.enabled and cfg.spot.trace:
        from roll_spotlight.spot.traces import load_trace

        load_trace(cfg.spot.trace)
    if cfg.task.name == "prompts":
        check_prompt_files(cfg)
    if not emulated:  # an emulated run loads neither the model nor the reward's
        check_model_and_reward(cfg, key)
    if placement.sp_degree != 1:
        from roll_spotlight.worker.sp_group import check_sp_degree, check_spot_placement

        if not placement.on_ray(cfg):
            raise ValueError(f"--sp-degree {placement.sp_degree}: SP rollout groups need Ray workers (add --ray)")
        check_sp_degree(cfg.model, placement.sp_degree, key="--sp-degree")
        if placement.workers % placement.sp_degree:
            raise ValueError(f"--sp-degree={placement.sp_degree} must divide --workers={placement.workers}")
        if cfg.spot.enabled:
            check_spot_placement(cfg.spot.gpus_per_node, placement.sp_degree, cfg.spot.max_workers,
                                 degree_key="--sp-degree")


def check_model_and_reward(cfg, key: Callable[[str], str] = str) -> None:
    """The model directory exists and the reward builds (name known, kwargs accepted, files it
    names readable)."""
    from roll_spotlight.config import ConfigError
    from roll_spotlight.rewards.configured import configured_reward

    if cfg.model.preset != "tiny" and not Path(cfg.model.path).is_dir():
        raise ConfigError(f"{key('model.path')}: model directory {cfg.model.path!r} does not exist "
                          f"(preset {cfg.model.preset!r} loads a local diffusers directory)")
    try:
        configured_reward(cfg.reward)
    except (ValueError, TypeError, OSError, ImportError) as err:
        kwargs = key("reward.weights" if cfg.reward.weights else "reward.kwargs")
        raise ConfigError(f"{key('reward')}: cannot build reward {cfg.reward.name!r} ({kwargs}={cfg.reward.kwargs!r}): "
                          f"{type(err).__name__}: {err}") from err


def check_emulation(cfg, placement: WorkerPlacement) -> None:
    """`--emulate GPU`, `--time-scale`: a known GPU, a time-scale > 0, a memory plan that fits the
    emulated GPU, and no more emulated GPUs than this machine holds. Errors name the option."""
    from roll_spotlight.models.memory_plan import fit_errors
    from roll_spotlight.spot_pool.emulated_nodes import check_capacity, emulated_gpus
    from roll_spotlight.sim.gpus import gpu_spec

    try:
        spec = gpu_spec(placement.emulate)
    except ValueError as err:
        raise ValueError(f"--emulate: {err}") from None
    if not placement.time_scale > 0:
        raise ValueError(f"--time-scale must be > 0, got {placement.time_scale!r}")
    if cfg.spot.enabled and cfg.spot.source == "cluster":
        raise ValueError("--emulate: spot.source=cluster names a real cluster's spot nodes; an emulated run "
                         "starts its own (spot.source: market, and spot.trace to replay)")
    fitted = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, gpu_memory_gb=spec.memory_gib))
    plan = memory_plan_of(fitted, placement)
    errors = fit_errors(plan)
    if cfg.spot_trains() and not plan.fits("trainer"):
        errors.append(f"spot workers that train hold the trainer's plan, {plan.total_gib('trainer'):.1f} GiB")
    if errors:
        raise ValueError(f"--emulate {placement.emulate}: the memory plan does not fit a {spec.name} "
                         f"({spec.memory_gib:g} GiB): {errors[0]}")
    ondemand, spot_nodes = emulated_gpus(cfg, placement.workers)
    host = placement.host_workers
    if host is None:
        check_capacity((ondemand, spot_nodes), cfg.spot.gpus_per_node)
    else:
        check_capacity((host.count, spot_nodes), cfg.spot.gpus_per_node, ondemand_mb=host.mb, ondemand=host.what)


MISSING_PREFIX = "/missing/"  # recipes default an unset ${oc.env:VAR} to /missing/VAR


def missing_paths(cfg, *, key: Callable[[str], str] = str, models: bool = True) -> list[str]:
    """Every local path the run names that does not exist, as "key=path" lines (with the
    environment variable to set when a recipe's placeholder stands in for it; `key` as in
    `check_startup`); ``models`` False leaves out the model and reward-model directories (an
    emulated run reads neither)."""
    wanted = []
    if cfg.model.preset != "tiny" and models:
        wanted.append(("model.path", cfg.model.path, "dir"))
    if cfg.task.name == "prompts":
        wanted += [("task.train_file", cfg.task.train_file, "file"), ("task.test_file", cfg.task.test_file, "file")]
    if models:
        wanted += [(f"reward.kwargs.{k}", v, "dir") for k, v in cfg.reward.kwargs.items()
                   if k.endswith(("_path", "_dir")) and isinstance(v, str)]
    lines = []
    for name, value, kind in wanted:
        path = Path(str(value))
        if not (path.is_dir() if kind == "dir" else path.is_file()):
            hint = ""
            if str(value).startswith(MISSING_PREFIX):
                hint = f" (set ${str(value)[len(MISSING_PREFIX):].split('/')[0]})"
            lines.append(f"{key(name)}={value}: no such {'directory' if kind == 'dir' else 'file'}{hint}")
    return lines


def memory_plan_of(cfg, placement: WorkerPlacement | None = None):
    """The run's memory plan per role (models.memory_plan), from the model's config alone: the
    transformer config of `model.path` for Qwen-Image (no weights read), the tiny model's own."""
    from roll_spotlight.models import memory_plan as mp

    model, train = cfg.model, cfg.train
    lora = train.lora
    settings = dict(height=model.image_size, width=model.image_size, dtype=model.dtype,
                    lora_rank=lora.rank if lora is not None else None,
                    lora_targets=tuple(lora.target_modules) if lora is not None else mp.FLOW_GRPO_LORA_TARGETS,
                    micro_batch=train.micro_batch_size, cfg=cfg.sampling.guidance_scale > 1.0,
                    rollout_batch=cfg.sampling.max_batch, explore_batch=cfg.sampling.max_batch,
                    cfg_batched=cfg.sampling.max_batch > 1,
                    text_tokens=model.max_sequence_length if model.preset == "qwen_image" else model.max_prompt_tokens,
                    gradient_checkpointing=model.gradient_checkpointing, sampling_steps=cfg.sampling.num_steps,
                    sp_degree=(placement or WorkerPlacement()).sp_degree, gpu_memory_gb=model.gpu_memory_gb)
    if model.preset == "qwen_image":  # an emulated recipe without its model: Qwen-Image's own config
        folder = Path(model.path) / "transformer"
        config = mp.transformer_config_from_dir(folder) if folder.is_dir() else None
        return mp.memory_plan(config, **settings)
    return mp.memory_plan(model.tiny_transformer(), **settings, vae_scale_factor=model.patch_size // 2,
                          vae_params=0, text_encoder_params=0)


def check_prompt_files(cfg) -> None:
    """Both prompt files parse (errors name file and line); an OCR reward needs a quoted target
    in every prompt."""
    from roll_spotlight.tasks.prompt_files import PromptFileTask

    task = PromptFileTask(cfg.task.train_file, cfg.task.test_file, cfg.task.format)
    task.train_records(), task.test_records()
    if cfg.reward.name == "ocr":
        from roll_spotlight.tasks.ocr_prompts import check_ocr_prompt_file

        check_ocr_prompt_file(cfg.task.train_file), check_ocr_prompt_file(cfg.task.test_file)


def starting_policy(cfg, *, progress: bool = True):
    """(policy, source): what a run starts from, and what its Ray workers load for it
    (`roll_spotlight.worker.policy_source`): the cached tiny base (pretrained first when missing) and its
    checkpoint path, or the real model loaded from `model.path` and its model section."""
    from roll_spotlight.worker.policy_source import policy_setup, policy_source, prepare_policy

    setup = policy_setup(cfg)  # LoRA, guidance, attention backend: after any pretraining
    if cfg.model.preset == "tiny":
        from roll_spotlight.training.pretrain import load_or_pretrain

        policy, meta = load_or_pretrain(cfg, progress=progress)
        return prepare_policy(policy, setup), policy_source(cfg.model, meta["path"], setup)
    from roll_spotlight.models import build_policy

    return prepare_policy(build_policy(cfg.model), setup), policy_source(cfg.model, None, setup)


def write_run_config(cfg, run_dir: Path) -> None:
    """The resolved config beside the run (what `--resume` reads back). Owner-only permissions."""
    from omegaconf import OmegaConf

    from roll_spotlight.config import to_dict

    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg))))


def run_loop(cfg, backend, run_dir: Path, *, progress: bool = True, resume: Path | bool = False):
    """The Coordinator's iterations over `backend`; `resume`: a checkpoint, or True for the newest."""
    from roll_spotlight.runtime.coordinator import Coordinator

    coordinator = Coordinator(cfg, backend, Path(run_dir), progress=progress)
    if resume is True:
        coordinator.resume_latest(Path(run_dir))
    elif resume:
        coordinator.resume(Path(resume))
    return coordinator.train()


def start_run(cfg, run_dir: Path, *, placement: WorkerPlacement | None = None, policy=None, progress: bool = True,
              resume: Path | bool = False, write_config: bool = True):
    """Check, build and run; returns the Coordinator's RunResult. `policy` replaces the starting
    policy (tests pass a random one; in process only)."""
    placement = placement or WorkerPlacement()
    run_dir = Path(run_dir)
    check_startup(cfg, placement)
    on_ray = placement.on_ray(cfg)
    cluster = ray_cluster_config(placement) if on_ray else None  # validated before a base is built
    nodes = spot_nodes(cfg, placement)  # from the spot section as written (its trace drives emulated nodes)
    if placement.emulate is not None:
        cfg, source = emulated_run(cfg, placement)
    elif policy is None:
        policy, source = starting_policy(cfg, progress=progress)
    elif on_ray:
        raise ValueError("start_run: a given policy runs in process only; Ray workers load a policy source")
    with nodes:
        nodes.add_fleet()  # before the backend: its spot pool starts the fleet's workers
        if on_ray:
            from roll_spotlight.runtime.ray_backend import RayBackend

            set_threads(1)  # the Ray actors share the cores from here; the driver only coordinates
            cluster = dataclasses.replace(cluster, address=nodes.address)
            backend = RayBackend(cfg, source, cluster, run_dir=run_dir)  # run_dir: the queue's journal
        else:
            from roll_spotlight.runtime.local import LocalBackend

            backend = LocalBackend(cfg, policy)
        try:
            if write_config:
                write_run_config(cfg, run_dir)
            if placement.emulate is not None:
                write_emulation(cfg, placement, source, run_dir, placement.workers)  # the trainer is colocated
            nodes.start()
            result = run_loop(cfg, backend, run_dir, progress=progress, resume=resume)
            nodes.write_stats(run_dir)
            return result
        finally:
            backend.close()


def ray_cluster_config(placement: WorkerPlacement):
    """How the run uses Ray (`config.ray_cluster.RayClusterConfig`): its workers and SP degree."""
    from roll_spotlight.config.elastic import ElasticConfig
    from roll_spotlight.config.ray_cluster import SP_TIMEOUT_S, RayClusterConfig

    sp = ElasticConfig(placement.sp_degree, placement.sp_min_degree or 1, group_timeout_s=SP_TIMEOUT_S)
    return RayClusterConfig(address=placement.address, ondemand_workers=placement.workers, elastic=sp)


def emulated_run(cfg, placement: WorkerPlacement):
    """(the run config as emulated, the `Emulation` its workers run): spot workers follow the
    real membership of a local cluster's raylets (`emulated_spot`; `spot_nodes` replays the trace
    on them)."""
    if cfg.spot.enabled:
        cfg = dataclasses.replace(cfg, spot=emulated_spot(cfg.spot))
    return cfg, emulation_for(cfg, placement.emulate, placement.time_scale)


def emulated_spot(spot):
    """The spot section of an emulated run: its pool follows the raylets that replay the trace
    (``spot.source: cluster``), billed at the H100 prices unless the recipe names its GPUs."""
    return dataclasses.replace(spot, source="cluster", trace=None, gpu_type=spot.gpu_type or "H100")


def emulation_for(cfg, gpu: str, time_scale: float):
    """The `worker.emulated.Emulation` of ``cfg`` on ``gpu`` GPUs at ``time_scale``; a weight
    version is as large as the run's trained parameters (the LoRA adapters) in fp32."""
    from roll_spotlight.models import memory_plan as mp
    from roll_spotlight.worker.emulated import emulation_of

    lora = cfg.train.lora
    config = None if cfg.model.preset != "tiny" else cfg.model.tiny_transformer()
    params = mp.lora_parameters(config, lora.rank, tuple(lora.target_modules)) if lora else mp.count_parameters(config)
    return emulation_of(cfg, gpu, time_scale, adapter_bytes=4.0 * params)


def write_emulation(cfg, placement: WorkerPlacement, emulation, run_dir: Path, ondemand_gpus: int) -> None:
    """``emulation.json`` beside an emulated run, for its report: the GPU, the time-scale, the
    workload the durations come from, the memory plan on that GPU (GiB per role), and the
    on-demand GPUs and their price (what `spotlight compare` bills a run without a spot pool)."""
    import json

    from roll_spotlight.sim.gpus import gpu_spec
    from roll_spotlight.spot.prices import default_prices

    spec = gpu_spec(placement.emulate)
    fitted = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, gpu_memory_gb=spec.memory_gib))
    plan = memory_plan_of(fitted, placement)
    roles = {role: round(plan.total_gib(role), 2) for role in ("trainer", "rollout")}
    price = default_prices(cfg.spot.gpu_type or "H100").price("ondemand").usd_per_gpu_hour
    payload = {"gpu": spec.name, "gpu_memory_gib": spec.memory_gib, "time_scale": placement.time_scale,
               "workload": dataclasses.asdict(emulation.workload), "adapter_bytes": emulation.adapter_bytes,
               "memory_plan_gib": roles, "ondemand_gpus": ondemand_gpus,
               "ondemand_usd_per_gpu_hour": price}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "emulation.json").write_text(json.dumps(payload, indent=2))


def spot_nodes(cfg, placement: WorkerPlacement):
    """An emulated run's spot raylets (`spot_pool.emulated_nodes.TraceRaylets`), else nothing to start:
    the run joins `placement.address` (or a local Ray)."""
    if placement.emulate is None or not cfg.spot.enabled:
        return _NoNodes(placement.address)
    from roll_spotlight.spot_pool.emulated_nodes import TraceRaylets

    return TraceRaylets(cfg.spot, ondemand_gpus=placement.workers + 1, time_scale=placement.time_scale)


@dataclass(frozen=True)
class _NoNodes:
    address: str | None

    def __enter__(self) -> _NoNodes:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def add_fleet(self) -> None:
        pass

    def start(self) -> None:
        pass

    def write_stats(self, run_dir: Path) -> None:
        pass
