"""What a run's workers start from, without Ray or torch at import: a *policy source* is either the
path of the tiny base checkpoint, or a model section (a dict of `ModelConfig` fields) for a real
model that every worker loads from its own disk. Weight versions then come from the weight store.
"""
from __future__ import annotations

from collections.abc import Mapping


def load_policy(source):
    """The policy a worker starts from. `source` is either the path of a checkpoint written by
    `roll_spotlight.models.save_policy` (the tiny base), or a model section as a dict of
    `ModelConfig` fields for a model each worker loads itself (Qwen-Image from `model.path`, a
    directory every GPU node has). Either way the worker then takes the weights of the version it
    is asked for from the weight store (`load_published_state`)."""
    from collections.abc import Mapping

    from roll_spotlight.models import ModelConfig, build_policy, load_tiny_policy

    if isinstance(source, Mapping):
        from roll_spotlight.config.strict import from_dict

        cfg = from_dict(ModelConfig, dict(source), key="model")
        if cfg.preset == "tiny":
            raise ValueError("load_policy: a tiny policy starts from its base checkpoint; pass its path, "
                             "not a model section (the tiny preset has no pretrained directory)")
        return build_policy(cfg)
    policy, _ = load_tiny_policy(source)
    return policy


def policy_source(model_cfg, base_path: str | None):
    """What workers load (see `load_policy`): the tiny base checkpoint, or the model section."""
    from roll_spotlight.config.strict import to_dict

    if model_cfg.preset == "tiny":
        if not base_path:
            raise ValueError("the tiny preset needs its pretrained base checkpoint path")
        return str(base_path)
    return to_dict(model_cfg)


def worker_gpus(source) -> float:
    """GPUs a worker loading `source` asks Ray for besides its pool resource: one when the model
    section puts it on CUDA (Ray hides GPUs from actors that do not ask for any)."""
    device = source.get("device", "cpu") if isinstance(source, Mapping) else "cpu"
    return 1.0 if str(device).startswith("cuda") else 0.0
