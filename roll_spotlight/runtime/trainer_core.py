"""The trainer's state and duties, independent of where it runs (in process or in a Ray actor).

Holds the policy, the optimiser (and reference, when KL is on), the validation set and the reward
used for validation. Rollout outputs arrive per request; they are stacked into one trajectory in
request-id order, so the update does not depend on which worker produced what.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from roll_spotlight.dispatch.requests import Schedule
from roll_spotlight.flow_grpo import sigma_schedule
from roll_spotlight.worker.engine import stack_outputs
from roll_spotlight.config.run import RunConfig
from roll_spotlight.training.averaging import WeightAverage
from roll_spotlight.training.evaluate import Evaluation, evaluate, score_validation
from roll_spotlight.training.grpo import FlowGRPOTrainer, ScoredBatch, UpdateResult

if TYPE_CHECKING:
    from roll_spotlight.runtime.queue_training import QueueTraining


class TrainerCore:
    def __init__(self, cfg: RunConfig, policy):
        from roll_spotlight.rewards.configured import configured_reward, strict_scorer
        from roll_spotlight.training.prompt_pools import validation_set

        torch.manual_seed(cfg.seed)
        self.cfg, self.policy = cfg, policy
        self.trainer = FlowGRPOTrainer(policy, cfg.train)
        self.val = validation_set(cfg.task)
        self.reward_fn = configured_reward(cfg.reward)
        # strict accuracy: the shapes task's detector; on prompt files, the reward's own "strict" (if any)
        self.strict_fn = strict_scorer() if cfg.task.name == "shapes" else None
        self.artefact_fn = None
        if cfg.task.name == "shapes":  # a black background: what the reward cannot see there
            import functools

            from roll_spotlight.tasks.shapes.artefacts import background_artefacts

            self.artefact_fn = functools.partial(background_artefacts, patch=cfg.model.patch_size)
        self.sigmas = sigma_schedule(cfg.sampling.num_steps, policy.image_seq_len)
        self.weight_version = 0
        self.ema = WeightAverage(policy, cfg.train.ema_decay) if cfg.train.ema_decay > 0 else None

    def train(self, outputs: list, prompts: list[str], group_ids: np.ndarray, rewards: np.ndarray,
              baselines: np.ndarray | None = None, *, queue: QueueTraining | None = None) -> UpdateResult:
        """One update. `baselines`: (N, 2) per-sample (mean, std) of the whole batch to normalise
        advantages by (`exploration.baseline: pool`); None: each group's own statistics. `queue`:
        train through the request queue (its micro-batches pulled by this trainer and the run's
        workers); None: every micro-batch here."""
        s = self.cfg.sampling
        traj = stack_outputs(outputs, self.sigmas, s.noise_level, s.kind)
        base = None if baselines is None else np.asarray(baselines, dtype=np.float64)
        source = None if queue is None else queue.update(self.weight_version,
                                                         Schedule(s.num_steps, s.noise_level, s.kind))
        result = self.trainer.step(ScoredBatch(traj, list(prompts), group_ids, rewards, s.noise_level, s.kind,
                                               baselines=base), source)
        self.weight_version += 1
        if self.ema is not None:
            self.ema.update(self.policy)
        return result

    def queue_training(self, queue, inbox) -> QueueTraining:
        """This trainer's side of queue training: it pulls its updates' micro-batches too."""
        from roll_spotlight.worker.compute import ModelCompute
        from roll_spotlight.runtime.queue_training import QueueTraining

        return QueueTraining(queue, inbox, ModelCompute(self.policy, version=self.weight_version))

    def evaluate(self) -> Evaluation:
        """Validation of the policy, or of its weight average when `train.ema_decay` > 0 (rollouts
        always use the live weights; the average is what a run delivers)."""
        if self.ema is None:
            return evaluate(self.policy, self.val, self.reward_fn, self.cfg.sampling, self.strict_fn, self.artefact_fn)
        with self.ema.swapped_into(self.policy):
            return evaluate(self.policy, self.val, self.reward_fn, self.cfg.sampling, self.strict_fn, self.artefact_fn)

    def score_validation(self, images: np.ndarray) -> Evaluation:
        """The validation pairs' images, generated elsewhere (the rollout workers), scored here."""
        return score_validation(images, self.val, self.reward_fn, self.strict_fn, self.artefact_fn)

    def state_dict(self) -> dict:
        """With LoRA the policy's part is its adapters only (the frozen base is `model.path`'s)."""
        weights = self.policy.published_state() if self.policy.lora is not None else self.policy.state_dict()
        state = {"policy": weights, "trainer": self.trainer.state_dict(), "weight_version": self.weight_version}
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if self.policy.lora is not None:
            self.policy.load_published_state(state["policy"])
        else:
            self.policy.load_state_dict(state["policy"])
        self.trainer.load_state_dict(state["trainer"])
        self.weight_version = int(state["weight_version"])
        if self.ema is not None:
            if "ema" not in state:
                raise KeyError("checkpoint has no weight average but train.ema_decay > 0")
            self.ema.load_state_dict(state["ema"])

    def save(self, path: Path) -> None:
        """The trainer's state at `path`; with LoRA also the adapters as diffusers LoRA weights in
        `lora/` beside it, which `QwenImagePipeline.load_lora_weights` loads as they are."""
        tmp = Path(path).with_suffix(".tmp")
        torch.save(self.state_dict(), tmp)
        tmp.replace(path)
        if self.policy.lora is not None:
            self.policy.save_lora(Path(path).parent / "lora")

    def load(self, path: Path) -> None:
        self.load_state_dict(torch.load(path, weights_only=True))


def build_trainer_core(cfg: RunConfig, source):
    """The trainer's core from its source (`worker.policy_source`): `TrainerCore` on the loaded
    policy, or `runtime.emulated_trainer.EmulatedTrainerCore` (the same duties on stand-in adapters)."""
    from roll_spotlight.worker.policy_source import is_emulation, load_policy

    if is_emulation(source):
        from roll_spotlight.runtime.emulated_trainer import EmulatedTrainerCore

        return EmulatedTrainerCore(cfg, source)
    return TrainerCore(cfg, load_policy(source))
