"""Shared tiny settings for runtime tests: a run small enough for seconds on 2 cores."""
from pathlib import Path

from roll_spotlight.config.strict import load_config
from roll_spotlight.config.run import RunConfig

REPO = Path(__file__).resolve().parents[1]
TINY_OVERRIDES = [
    "max_steps=2", "eval_steps=1", "rollout_batch_size=2", "train.group_size=3", "task.val_prompts=6",
    "sampling.num_steps=4", "sampling.sde_window=2", "sampling.window_range=[0,2]", "sampling.eval_num_steps=3",
    "model.num_layers=1", "model.attention_head_dim=16", "model.axes_dims_rope=[4,6,6]",
    "model.joint_attention_dim=32", "model.image_size=16", "train.learning_rate=1e-3", "train.clip_range=0.2",
    # the whole prompt mix, as these runtime tests were written for: on the configs' narrower tags a
    # random policy's groups can all score alike, leaving nothing to train on
    "task.tags=null",
]


def tiny_config(*extra: str) -> RunConfig:
    return load_config(RunConfig, REPO / "configs" / "tiny_shapes.yaml", [*TINY_OVERRIDES, *extra])


def random_policy(cfg: RunConfig, seed: int = 0):
    import torch

    from roll_spotlight.models import build_policy
    from roll_spotlight.training.prompt_pools import task_vocab

    torch.manual_seed(seed)
    return build_policy(cfg.model, vocab=task_vocab(cfg.task))


def save_random_policy(cfg: RunConfig, path: Path, seed: int = 0) -> Path:
    from roll_spotlight.models import save_policy

    save_policy(random_policy(cfg, seed), path)
    return path


def end_rank(dist) -> None:
    """End a spawned gloo rank whose work is saved: a barrier, so no peer still uses its
    connections, then exit without the interpreter's teardown, which gloo's threads abort now and
    then (SIGABRT, "terminate called without an active exception") after a passing run."""
    import os

    dist.barrier()
    os._exit(0)



def denoise_lease(compute, lease, should_stop=lambda: False, on_checkpoint=None, *, decode: bool = True):
    """One lease alone on ``compute`` (a `RolloutEngine` or a `worker.loop.Compute`), asking
    ``should_stop()`` after every step but the last: its outcome, committed if it stopped early."""
    finished = []

    def at_boundary(report):
        finished.extend(outcome for _, outcome in report.finished)
        return None if report.running and should_stop() else []

    committed = compute.denoise_batch([lease], at_boundary, on_checkpoint, decode=decode)
    return committed[0][1] if committed else finished[0]
