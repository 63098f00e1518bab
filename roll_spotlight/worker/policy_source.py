"""What a run's workers start from, without Ray or torch at import: a *policy source* is either the
path of the tiny base checkpoint, or a model section (a dict of `ModelConfig` fields) for a real
model that every worker loads from its own disk, or an `worker.emulated.Emulation` (emulated GPUs:
no model at all). Weight versions then come from the weight store. Every host's workers (the Ray
actors, the ROLL workers) build their compute and trainer from a source here.
"""
from __future__ import annotations

from collections.abc import Mapping


def policy_setup(run_cfg) -> dict | None:
    """What every process applies to a freshly loaded policy, in `prepare_policy`'s order: LoRA
    adapters (`train.lora`), true CFG (`sampling.guidance_scale`, `negative_prompt`) and the
    attention backend (`model.attention_backend`); None when the run uses none of them."""
    from roll_spotlight.config.strict import to_dict

    setup = {"lora": to_dict(run_cfg.train.lora) if run_cfg.train.lora is not None else None,
             "guidance_scale": run_cfg.sampling.guidance_scale, "negative_prompt": run_cfg.sampling.negative_prompt,
             "attention_backend": run_cfg.model.attention_backend}
    plain = setup["lora"] is None and setup["guidance_scale"] == 1.0 and setup["attention_backend"] == "native"
    return None if plain else setup


def prepare_policy(policy, setup: Mapping | None):
    """`policy` with the run's setup applied (see `policy_setup`). LoRA comes first, so the
    weights a version publishes are the adapters; a tiny base must be pretrained before guidance
    is on, or its flow-matching loss would train the guided velocity."""
    if not setup:
        return policy
    if setup["lora"] is not None:
        from roll_spotlight.models.lora import LoraConfig

        policy.enable_lora(LoraConfig(**setup["lora"]))
    policy.set_guidance(setup["guidance_scale"], setup["negative_prompt"])
    if setup["attention_backend"] != "native":
        policy.set_attention_backend(setup["attention_backend"])
    return policy


def load_policy(source):
    """The policy a worker starts from. `source` is either the path of a checkpoint written by
    `roll_spotlight.models.save_policy` (the tiny base), or a model section as a dict of
    `ModelConfig` fields for a model each worker loads itself (Qwen-Image from `model.path`, a
    directory every GPU node has). Either way the worker then takes the weights of the version it
    is asked for from the weight store (`load_published_state`)."""
    from collections.abc import Mapping

    from roll_spotlight.models import ModelConfig, build_policy, load_tiny_policy

    if isinstance(source, Mapping) and "checkpoint" in source:  # a tiny base plus the run's setup
        policy, _ = load_tiny_policy(source["checkpoint"])
        return prepare_policy(policy, source["setup"])
    if isinstance(source, Mapping):
        source = dict(source)
        setup = source.pop("setup", None)
        from roll_spotlight.config.strict import from_dict

        cfg = from_dict(ModelConfig, dict(source), key="model")
        if cfg.preset == "tiny":
            raise ValueError("load_policy: a tiny policy starts from its base checkpoint; pass its path, "
                             "not a model section (the tiny preset has no pretrained directory)")
        return prepare_policy(build_policy(cfg), setup)
    policy, _ = load_tiny_policy(source)
    return policy


def policy_source(model_cfg, base_path: str | None, setup: Mapping | None = None):
    """What workers load (see `load_policy`): the tiny base checkpoint (with the run's `setup`, if
    any, as {"checkpoint", "setup"}), or the model section (plus a "setup" key)."""
    from roll_spotlight.config.strict import to_dict

    if model_cfg.preset == "tiny":
        if not base_path:
            raise ValueError("the tiny preset needs its pretrained base checkpoint path")
        return {"checkpoint": str(base_path), "setup": dict(setup)} if setup else str(base_path)
    return to_dict(model_cfg) | ({"setup": dict(setup)} if setup else {})


def worker_gpus(source) -> float:
    """GPUs a worker loading `source` asks Ray for besides its pool resource: one when the model
    section puts it on CUDA (Ray hides GPUs from actors that do not ask for any)."""
    device = source.get("device", "cpu") if isinstance(source, Mapping) else "cpu"
    return 1.0 if str(device).startswith("cuda") else 0.0


def is_emulation(source) -> bool:
    """Does ``source`` emulate GPUs (`worker.emulated.Emulation`) rather than load a policy?"""
    from roll_spotlight.worker.emulated import Emulation

    return isinstance(source, Emulation)


def worker_compute(source, store, commit_every: int = 0, max_batch: int = 1):
    """A rollout worker's `worker_loop.Compute` from its source: the policy loaded (every weight
    version, the base's included, then comes from `store`), or emulated GPUs; ``max_batch``
    requests denoised together (``sampling.max_batch``)."""
    if is_emulation(source):
        from roll_spotlight.worker.emulated import EmulatedCompute

        return EmulatedCompute(source, store, max_batch=max_batch)
    from roll_spotlight.worker.compute import ModelCompute

    return ModelCompute(load_policy(source), store, commit_every=commit_every, max_batch=max_batch)
