"""The emulated trainer and reward (`worker.emulated` holds the emulated GPUs and a worker's compute).

The trainer runs the real Flow-GRPO update path on stand-in adapters; the reward scores stand-in
images with the simulator's synthetic rewards of (prompt, seed, weight version), so validation
scores mean nothing here.
"""
from __future__ import annotations

import time

import numpy as np

from roll_spotlight.worker.emulated import (STAND_IN_PARAM, STAND_IN_WIDTH, EmulatedCompute, Emulation, mismatched,
                                            read_stand_in_image)


class EmulatedTrainerCore:
    """`runtime.trainer_core.TrainerCore`'s duties on stand-in adapters: the real Flow-GRPO update
    path (advantages, zero-std filter, micro-batch plan, a `GradientSource` or the trainer alone,
    the exactly-once `combine`, clip and Adam step) with every micro-batch's compute emulated.

    Given the trainer's role (``emulation.role == "trainer"``: a GPU of its own, as a ROLL
    actor_train rank) it pulls its updates' micro-batches with the others under queue training;
    given an on-demand worker's (the Ray backend's emulated GPUs) it is colocated with that
    worker, which pulls them."""

    def __init__(self, cfg, emulation: Emulation) -> None:
        import dataclasses

        import torch

        from roll_spotlight.flow_grpo import sigma_schedule
        from roll_spotlight.training.grpo import FlowGRPOTrainer

        torch.manual_seed(cfg.seed)
        self.colocated = emulation.role != "trainer"
        self.cfg, self.emulation = cfg, emulation.as_role("trainer")
        self.policy = StandInPolicy()
        self.trainer = FlowGRPOTrainer(self.policy, dataclasses.replace(cfg.train, trainable="all", kl_beta=0.0))
        self.sigmas = sigma_schedule(cfg.sampling.num_steps, 1)
        self.weight_version = 0
        self.compute = EmulatedCompute(self.emulation, version=0)

    def train(self, outputs: list, prompts: list[str], group_ids, rewards, baselines=None, *, queue=None):
        from roll_spotlight.dispatch.requests import Schedule
        from roll_spotlight.worker.engine import stack_outputs
        from roll_spotlight.training.grpo import ScoredBatch

        s = self.cfg.sampling
        traj = stack_outputs(outputs, self.sigmas, s.noise_level, s.kind)
        base = None if baselines is None else np.asarray(baselines, dtype=np.float64)
        schedule = Schedule(s.num_steps, s.noise_level, s.kind)
        source = (queue.update if queue is not None else self._alone)(self.weight_version, schedule)
        result = self.trainer.step(ScoredBatch(traj, list(prompts), group_ids, rewards, s.noise_level, s.kind,
                                               baselines=base), source)
        self.emulation.wait(self.emulation.durations.optimizer_step_s())
        self.weight_version += 1
        result.metrics["emulated/mismatched_outputs"] = float(sum(map(mismatched, outputs)))
        return result

    def _alone(self, version: int, schedule):
        """The trainer computing every micro-batch itself (no queue training)."""
        def source(plan):
            from roll_spotlight.training.micro_batches import Contributions, TrainWork, UpdateSums

            t0 = time.perf_counter()
            work = TrainWork.of(plan, version, schedule)
            _, total = self.compute.gradient_sum(work, plan.micro_batches, "trainer", lambda: False)
            return UpdateSums((total,), Contributions.of([total], 0, time.perf_counter() - t0))

        return source

    def queue_training(self, queue, inbox):
        """Queue training: a colocated trainer only adds the sums, steps and publishes (its GPU's
        worker pulls the micro-batches); one on a GPU of its own pulls them too."""
        from roll_spotlight.runtime.queue_training import QueueTraining

        return QueueTraining(queue, inbox, self.compute, pulls=not self.colocated)

    def evaluate(self):
        """Validation is not emulated: stand-in rewards of the validation pairs, at no cost."""
        from roll_spotlight.training.evaluate import Evaluation

        n = self.cfg.task.val_prompts
        rewards = np.array([stand_in_reward(self.cfg.seed, i, i, self.weight_version) for i in range(n)])
        return Evaluation(rewards, np.zeros(n))

    def save(self, path) -> None:
        import torch

        torch.save({"policy": self.policy.published_state(), "weight_version": self.weight_version}, path)

    def load(self, path) -> None:
        import torch

        state = torch.load(path, weights_only=True)
        self.policy.load_published_state(state["policy"])
        self.weight_version = int(state["weight_version"])


def StandInPolicy():
    """A module holding the stand-in adapters, with the policy methods the trainer calls."""
    import torch

    class _StandInPolicy(torch.nn.Module):
        lora = True  # trains adapters: the KL reference would be the adapters disabled

        def __init__(self) -> None:
            super().__init__()
            self.adapters = torch.nn.Parameter(torch.zeros(STAND_IN_WIDTH))

        @property
        def device(self):
            return self.adapters.device

        def trainable_parameters(self):
            return [self.adapters]

        def published_state(self) -> dict:
            return {STAND_IN_PARAM: self.adapters.detach().clone()}

        def load_published_state(self, state: dict) -> None:
            with torch.no_grad():
                self.adapters.copy_(state[STAND_IN_PARAM])

    return _StandInPolicy()


def stand_in_reward(run_seed: int, key: int, seed: int, version: int) -> float:
    """The simulator's synthetic reward of (prompt key, seed, weight version), no prompt all-equal."""
    from roll_spotlight.sim.synthetic_rewards import SyntheticRewardConfig, SyntheticRewards

    return SyntheticRewards(run_seed, SyntheticRewardConfig(zero_variance_fraction=0.0)).reward(key, seed, version)


class EmulatedReward:
    """The reward of stand-in images: a call of n images waits n x the reward model's time per
    image over ``slots`` concurrent scorers (the cost model's reward servers)."""

    def __init__(self, emulation: Emulation, slots: float = 1.0) -> None:
        self.emulation, self.slots = emulation, max(slots, 1.0)

    @classmethod
    def servers(cls, emulation: Emulation, world_size: int) -> EmulatedReward:
        """One of ``world_size`` reward servers sharing the cost model's reward slots."""
        return cls(emulation, emulation.durations.cost.reward_workers / world_size)

    def __call__(self, images: np.ndarray, prompts: list[str]):
        from roll_spotlight.rewards import RewardOutput

        self.emulation.wait(self.emulation.durations.reward_s(len(prompts)) / self.slots)
        rewards = [stand_in_reward(self.emulation.seed, key, seed, version)
                   for seed, version, key in map(read_stand_in_image, images)]
        return RewardOutput(np.asarray(rewards, dtype=np.float64))


