"""Diffusers strategies: what a ROLL worker runs for a DiT role, built by the worker itself.

ROLL picks a worker's strategy in ``create_strategy``, a closed if/elif over a ``Literal`` of LLM
back-ends (vLLM, SGLang, Megatron, FSDP2). Our workers build their strategy in ``initialize()``
instead, by a name in the ``roll_spotlight.strategies`` group (``strategy_config.strategy``), so
``strategy_args.strategy_name`` stays one of ROLL's literals (patches/LEDGER.md has the opt-in
patch that lets it name ours). These classes need torch and diffusers but not ROLL: they wrap the
runtime's host-independent parts, so a ROLL worker computes exactly what the in-process backend
computes.

- `DiffusersRolloutStrategy`: runs rollout requests one by one with the runtime's
  ``RolloutExecutor`` (batch size 1: a rollout is a pure function of weights, prompt, seed and
  schedule on every worker), taking its share of a batch through a worker-local queue.
- `DiffusersTrainStrategy`: the runtime's ``TrainerCore`` (Flow-GRPO update, validation, state).
"""
from __future__ import annotations

from pathlib import Path

from roll_spotlight.training.config import RunConfig

LOCAL_WORKER = "roll-rank"


def build_base_policy(cfg: RunConfig, base_path: str | None):
    """The starting policy: the pretrained tiny base at `base_path`, or Qwen-Image from model.path."""
    from roll_spotlight.models import build_policy, load_tiny_policy

    if cfg.model.preset == "tiny":
        if not base_path or not Path(base_path).is_file():
            raise ValueError(f"the tiny preset starts from a pretrained base checkpoint; got {base_path!r} "
                             "(the pipeline pretrains it once on the driver)")
        policy, _ = load_tiny_policy(base_path, device=cfg.model.device)
        return policy
    return build_policy(cfg.model)


class DiffusersRolloutStrategy:
    """Rollouts of request specs with the weights of `weight_version`."""

    def __init__(self, cfg: RunConfig, policy) -> None:
        from roll_spotlight.dispatch.queue import QueueConfig, RequestQueue
        from roll_spotlight.runtime.executor import RolloutExecutor

        self.cfg, self.policy = cfg, policy
        self.executor = RolloutExecutor(policy)
        self.queue = RequestQueue(QueueConfig())
        self.weight_version = 0

    @classmethod
    def build(cls, cfg: RunConfig, base_path: str | None) -> "DiffusersRolloutStrategy":
        return cls(cfg, build_base_policy(cfg, base_path))

    def rollouts(self, specs: list) -> list:
        """Outputs (runtime ``RolloutOutput``) in the order of `specs`."""
        from roll_spotlight.runtime.executor import Finished

        ids = self.queue.submit(specs)
        while leases := self.queue.pull(LOCAL_WORKER, 1):
            outcome = self.executor.run(leases[0])
            assert isinstance(outcome, Finished), "a static ROLL rank is never asked to stop"
            self.queue.complete(leases[0].result(outcome.output))
        done = {c.request.request_id: c.output for c in self.queue.take_results()}
        self.queue.forget_finished()
        return [done[i] for i in ids]

    def load_weights(self, state_dict: dict, version: int) -> None:
        if version < self.weight_version:
            raise ValueError(f"weight version {version} is older than the loaded {self.weight_version}")
        self.policy.load_state_dict(state_dict)
        self.executor.invalidate()
        self.weight_version = version


class DiffusersTrainStrategy:
    """One Flow-GRPO update per iteration on rollout outputs; owns optimiser and validation."""

    def __init__(self, cfg: RunConfig, policy) -> None:
        from roll_spotlight.runtime.trainer_core import TrainerCore

        self.core = TrainerCore(cfg, policy)

    @classmethod
    def build(cls, cfg: RunConfig, base_path: str | None) -> "DiffusersTrainStrategy":
        return cls(cfg, build_base_policy(cfg, base_path))

    @property
    def weight_version(self) -> int:
        return self.core.weight_version

    def train(self, outputs: list, prompts: list[str], group_ids, rewards) -> dict:
        return self.core.train(outputs, prompts, group_ids, rewards)

    def weights(self) -> tuple[dict, int]:
        """A CPU copy of the policy weights and their version (what rollout ranks load)."""
        state = {k: v.detach().to("cpu", copy=True) for k, v in self.core.policy.state_dict().items()}
        return state, self.core.weight_version

    def evaluate(self):
        return self.core.evaluate()

    def save(self, path: str) -> None:
        self.core.save(Path(path))

    def load(self, path: str) -> None:
        self.core.load(Path(path))
