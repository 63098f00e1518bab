"""Emulated GPUs: the live runtime with every compute phase replaced by its calibrated duration.

A dress rehearsal of a recipe on one machine, and the way the claim's cluster shapes run through the
real control plane without a GPU cluster. Every compute phase of a worker - a denoising step of an
SP group, a training micro-batch, a reward call, a weight load - waits the duration the cost model
gives for the emulated GPU and the recipe's shape (`sim.workload.WorkerDurations`), divided by
``time_scale``, instead of running the model. Transfers wait the modelled time of their real
byte counts (a weight version and a gradient sum are the LoRA adapters: `adapter_bytes`).

What actually moves is small: outputs are deterministic stand-ins (`StandIn`) with the fields
of real ones, whose latent chain is carried through commits and resumes, so commit-on-notice,
resume, the gradient sums and the exactly-once checks run as they do for real and a resume that
lost or repeated a step would change the output. The emulated trainer and reward (the driver's
side) are `runtime.emulated_trainer`.

Everything else is the production code: the queue actor, the worker loop, queue training and
its inbox, the elastic SP groups (real process groups, no Ulysses), the spot pool following
real raylets, the weight store, the coordinator.
"""
from __future__ import annotations

import threading
import time
import zlib
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from roll_spotlight.dispatch.requests import InFlightState, MicroBatch, check_one_shape
from roll_spotlight.worker.outputs import Committed, Finished, RolloutOutput, StepReport
from roll_spotlight.sim.workload import Workload, WorkerDurations

STAND_IN_WIDTH = 4  # floats of a stand-in latent, and of the stand-in adapters
STAND_IN_PARAM = "adapters"
ROLES = ("trainer", "ondemand", "spot")


@dataclass(frozen=True)
class Emulation:
    """What every emulated process needs (pickled to each actor): the GPU, the recipe's shape, the
    time-scale, the real size of a weight version, the run seed (stand-in rewards) and the role of
    the process: the trainer, an on-demand worker on the trainer's node, or a spot worker on a
    spot node of ``gpus_per_node`` GPUs (what a weight fetch or a gradient report crosses)."""

    gpu: str
    workload: Workload
    time_scale: float = 1.0
    adapter_bytes: float = 1.70e9
    seed: int = 0
    role: str = "ondemand"
    gpus_per_node: int = 1
    durations: WorkerDurations = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise ValueError(f"--time-scale must be > 0, got {self.time_scale!r}")
        if self.role not in ROLES:
            raise ValueError(f"Emulation.role must be one of {ROLES}, got {self.role!r}")
        object.__setattr__(self, "durations", self.workload.durations(self.gpu))

    def as_role(self, role: str, gpus_per_node: int | None = None) -> Emulation:
        return replace(self, role=role, gpus_per_node=gpus_per_node or self.gpus_per_node)

    def sp_shape(self) -> tuple[int, int]:
        """(attention heads, image tokens) that an SP degree must divide (Qwen-Image's tokens:
        16x16 pixels each)."""
        return self.workload.num_heads, (self.workload.resolution // 16) ** 2

    def wait(self, modelled_s: float) -> None:
        """Spend ``modelled_s`` GPU seconds: that, divided by the time-scale, of wall time."""
        if modelled_s > 0:
            time.sleep(modelled_s / self.time_scale)

    def pacer(self) -> Pacer:
        """A clock for one lease's phases: each ends at its modelled time from the lease's start,
        so the worker's own overhead between steps does not add up (it would on a GPU too: the
        host runs ahead of the device)."""
        return Pacer(self.time_scale)

    def fetch_s(self) -> float:
        """A new weight version reaching this process: on the trainer's node the trainer-to-engine
        sync, on a spot node the adapters over the network."""
        cost = self.durations.cost
        if self.role == "trainer":
            return 0.0
        return cost.local_weight_sync_s if self.role == "ondemand" else self.durations.publish_s(self.adapter_bytes)

    def report_s(self, degree: int = 1) -> float:
        """A gradient sum reaching the trainer (none for the trainer's own)."""
        if self.role == "trainer":
            return 0.0
        return self.durations.gradient_report_s(self.adapter_bytes, self.role == "spot", degree)


class Pacer:
    """Waits until the running total of modelled seconds, on the wall clock from its creation."""

    def __init__(self, time_scale: float) -> None:
        self.time_scale, self.due = time_scale, time.monotonic()

    def wait(self, modelled_s: float) -> None:
        self.due += modelled_s / self.time_scale
        time.sleep(max(0.0, self.due - time.monotonic()))


# ---------------------------------------------------------------------------------------------
# stand-ins: deterministic, small, with the fields of real outputs


_MIX = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F)[:STAND_IN_WIDTH]


def _unit(*keys: int) -> np.ndarray:
    """STAND_IN_WIDTH deterministic floats in [-1, 1) from integer keys: a hash, not a generator,
    so checking every output's chain costs the trainer microseconds, not GPU-like time."""
    h = zlib.crc32(b"".join(int(k).to_bytes(8, "little", signed=True) for k in keys)) | 1
    return np.array([((h * m) & 0xFFFFFFFF) / 2.0**31 - 1.0 for m in _MIX], dtype=np.float32)


def next_latent(latent: np.ndarray, seed: int, version: int, step: int) -> np.ndarray:
    """One stand-in denoising step: a chain, so a resume from a wrong state changes the end."""
    return (0.5 * latent + _unit(seed, version, step)).astype(np.float32)


def mismatched(output: RolloutOutput) -> bool:
    """Does a stand-in output differ from its uninterrupted rollout (a resume from a wrong state,
    a lost or repeated step, a wrong weight version)?"""
    want = [_unit(output.seed, 0, -1)]
    for k in range(len(output.latents) - 1):
        want.append(next_latent(want[-1], output.seed, output.weight_version, k))
    return not np.array_equal(np.stack(want), output.latents[:, 0, :])


def prompt_key(prompt: str) -> int:
    return zlib.crc32(prompt.encode())


def stand_in_image(seed: int, version: int, prompt: str) -> np.ndarray:
    """The stand-in image: what the stand-in reward reads (seed, weight version, prompt key)."""
    return np.array([seed, version, prompt_key(prompt)], dtype=np.int64).view(np.uint8).reshape(1, 8, 3)


def read_stand_in_image(image: np.ndarray) -> tuple[int, int, int]:
    seed, version, key = np.ascontiguousarray(image).reshape(-1).view(np.int64)[:3]
    return int(seed), int(version), int(key)


# ---------------------------------------------------------------------------------------------
# a worker's compute


class EmulatedCompute:
    """`worker_loop.Compute` that waits instead of computing (module docstring); the weight-copy
    side of `worker.compute.ModelCompute` too, so the elastic pool's newcomers copy from peers."""

    def __init__(self, emulation: Emulation, store=None, *, version: int | None = None, max_batch: int = 1) -> None:
        self.emulation, self.store, self.version, self.max_batch = emulation, store, version, max_batch
        self.lock = threading.Lock()
        self.published = None
        self.counters = {"weight_fetches": 0, "peer_weight_copies": 0}
        self.degree, self.cross_node = 1, False

    # ---- weights
    def hold_version(self, version: int) -> None:
        if version == self.version:
            return
        with self.lock:
            self.emulation.wait(self.emulation.fetch_s())
            if self.store is not None:
                self.store.fetch(version)  # the stand-in adapters: what really moves
            self.version, self.published = version, None
            self.counters["weight_fetches"] += 1

    def warm_up(self) -> None:
        """A new process loads the frozen base from storage."""
        self.emulation.wait(self.emulation.durations.weight_load_s())

    def publish_weights(self) -> tuple[int | None, list]:
        return self.version, [None]

    def adopt_weights(self, published) -> float:
        """A newcomer copies the adapters from a peer on its node (NVLink)."""
        start = time.perf_counter()
        with self.lock:
            self.emulation.wait(self.emulation.durations.peer_copy_s(self.emulation.adapter_bytes))
            self.version = published[0]
            self.counters["peer_weight_copies"] += 1
        return time.perf_counter() - start

    # ---- rollouts
    def join_group(self, membership):
        """An SP group of emulated GPUs: the real process group and collectives, no model."""
        from roll_spotlight.worker.sp_group import SPRolloutGroup

        self.degree = membership.size
        self.cross_node = membership.size > self.emulation.gpus_per_node
        return SPRolloutGroup(None, membership)

    def denoise_batch(self, leases, at_boundary, on_checkpoint=None, *, decode: bool = True):
        """`worker.loop.Compute.denoise_batch` with a stand-in chain per row: each step waits one
        batched step of the rows in flight (the cost model's forward of rows x CFG branches),
        then reports to ``at_boundary`` like the engine. Checkpoints are not emulated."""
        shape = check_one_shape(leases)
        rows = {lease.lease_id: (lease, *self._resume(lease)) for lease in leases}
        step_s, pacer = self.emulation.durations.denoise_step_s, self.emulation.pacer()
        while rows:
            pacer.wait(step_s(self.degree, self.cross_node, len(rows)))
            for lease, start, latents in rows.values():
                r = lease.request
                latents.append(next_latent(latents[-1], r.seed, r.weight_version, len(latents) - 1))
            finished = [rows.pop(i) for i, (lease, _, chain) in list(rows.items())
                        if len(chain) - 1 == lease.request.schedule.num_steps]
            report = StepReport([(lease, Finished(self._output(lease.request, np.stack(chain), start) if decode
                                                  else None, len(chain) - 1 - start)) for lease, start, chain in finished],
                                {lease.request.request_id: len(chain) - 1 for lease, _, chain in rows.values()},
                                self.max_batch - len(rows))
            refills = at_boundary(report)
            if refills is None:
                return [(lease, self._commit(lease, start, chain)) for lease, start, chain in rows.values()]
            if refills:
                check_one_shape(refills, shape)
            rows.update((lease.lease_id, (lease, *self._resume(lease))) for lease in refills)
        return []

    @staticmethod
    def _commit(lease, start: int, chain: list) -> Committed:
        r, step = lease.request, len(chain) - 1
        return Committed(InFlightState(r.request_id, step, {"latents": np.stack(chain)}, r.seed, r.weight_version),
                         step - start)

    @staticmethod
    def _resume(lease) -> tuple[int, list[np.ndarray]]:
        if lease.resume is None:
            return 0, [_unit(lease.request.seed, 0, -1)]
        chain = np.asarray(lease.resume.latent["latents"])
        return lease.resume.step_index, list(chain)

    @staticmethod
    def _output(request, latents: np.ndarray, start: int) -> RolloutOutput:
        s = request.schedule
        lo, hi = s.window
        noised = np.zeros(s.num_steps, dtype=bool)
        noised[lo:hi] = s.kind != "ode"
        log_probs = np.where(noised, latents[1:, 0], 0.0).astype(np.float32)
        return RolloutOutput(request.request_id, request.seed, latents[:, None, :], log_probs, noised,
                             stand_in_image(request.seed, request.weight_version, request.prompt),
                             request.weight_version, start)

    # ---- training micro-batches
    def gradient_sum(self, work, micro_batches: Sequence[MicroBatch], worker: str, should_stop: Callable[[], bool],
                     group=None):
        """Micro-batches one after another (an SP group's ranks in rounds, data-parallel), each the
        modelled time of its images at one trained step; then the sum's report to the trainer."""
        degree = 1 if group is None else group.size
        rank = 0 if group is None else group.rank
        start, done, pacer = time.perf_counter(), 0, self.emulation.pacer()
        rounds = -(-len(micro_batches) // degree)
        for r in range(rounds):
            mine = r * degree + rank
            if mine < len(micro_batches):
                pacer.wait(self.emulation.durations.train_micro_batch_s(len(micro_batches[mine].rows)))
            done = min(len(micro_batches), (r + 1) * degree)
            stop = should_stop() if group is None else group.any(should_stop())
            if stop and r + 1 < rounds:
                break
        if group is not None and not group.leader:
            return done, None
        pacer.wait(self.emulation.report_s(degree))
        return done, stand_in_sum(work, micro_batches[:done], worker, time.perf_counter() - start)


def stand_in_gradient(work, mb: MicroBatch) -> np.ndarray:
    """A micro-batch's stand-in gradient: its rows' advantages at its trained step, spread over
    the stand-in adapters (so the update depends on the rewards, as a real one does)."""
    advantage = float(sum(float(work.advantages[r]) for r in mb.rows)) / work.norm
    return (advantage * _unit(mb.index, mb.step, work.weight_version)).astype(np.float32)


def stand_in_sum(work, micro_batches: Sequence[MicroBatch], worker: str, seconds: float):
    from roll_spotlight.training.micro_batches import LOSS_TOTALS, GradientSum

    grad = np.zeros(STAND_IN_WIDTH, dtype=np.float32)
    for mb in micro_batches:
        grad += stand_in_gradient(work, mb)
    totals = dict.fromkeys(LOSS_TOTALS, 0.0) | {"loss": float(-grad.sum())}
    return GradientSum(worker, tuple(mb.index for mb in micro_batches), {STAND_IN_PARAM: grad}, totals, seconds,
                       {STAND_IN_PARAM: "float32"})


# ---------------------------------------------------------------------------------------------
# from a recipe


def workload_of(cfg) -> Workload:
    """The cost model's view of a run config: its resolution, schedule, batch and model shape
    (Qwen-Image's transformer unless the tiny preset's)."""
    from roll_spotlight.sim.costmodel import CostModel
    from roll_spotlight.sim.workload import cfg_forwards

    model, s = cfg.model, cfg.sampling
    if model.preset == "tiny":
        from roll_spotlight.models.memory_plan import count_parameters

        shape = {"params_b": count_parameters(model.tiny_transformer()) / 1e9, "num_layers": model.num_layers,
                 "hidden_dim": model.num_attention_heads * model.attention_head_dim,
                 "num_heads": model.num_attention_heads, "text_tokens": model.max_prompt_tokens}
    else:
        qwen = Workload.of(CostModel(), model.image_size)
        shape = {k: getattr(qwen, k) for k in ("params_b", "num_layers", "hidden_dim", "num_heads")}
        # max_sequence_length caps a prompt's tokens; a prompt is as long as the cost model's typical one
        shape["text_tokens"] = min(model.max_sequence_length, qwen.text_tokens)
    return Workload(resolution=model.image_size, num_steps=s.num_steps, cfg_forwards=cfg_forwards(s.guidance_scale),
                    trained_steps=max(1, s.sde_window), group_size=cfg.train.group_size,
                    prompts_per_iteration=cfg.rollout_batch_size, micro_batch_images=cfg.train.micro_batch_size,
                    **shape)


def emulation_of(cfg, gpu: str, time_scale: float, adapter_bytes: float) -> Emulation:
    """The emulation of ``cfg`` on ``gpu`` GPUs at ``time_scale`` (errors name the option)."""
    from roll_spotlight.sim.gpus import gpu_spec

    try:
        gpu_spec(gpu)
    except ValueError as err:
        raise ValueError(f"--emulate: {err}") from None
    return Emulation(gpu, workload_of(cfg), time_scale, adapter_bytes, seed=cfg.seed,
                     gpus_per_node=cfg.spot.gpus_per_node)
