"""Ray actors of the runtime: trainer, rollout workers, reward workers.

Simulated GPUs are Ray custom resources: on-demand actors ask for `ondemand_gpu`, spot actors for
`spot_gpu` (both fractional-capable). On a real GPU cluster the same code runs with those
resources declared on the GPU nodes (see deploy/kuberay). Every actor pins torch to
`threads` intra-op threads: on small CPU machines oversubscription makes a denoising step 20-40x
slower (measured: 28 ms with 1 thread vs 0.7-1.3 s with 2 threads on 2 busy cores).
"""
from __future__ import annotations

import logging
import threading
import time

import ray

from roll_spotlight.models.source import load_policy

log = logging.getLogger(__name__)
ONDEMAND, SPOT = "ondemand_gpu", "spot_gpu"


def _torch_setup(threads: int) -> None:
    import torch

    if threads > 0:
        torch.set_num_threads(threads)


@ray.remote(num_cpus=0)
class TrainerActor:
    """Policy, optimiser, reference and validation; publishes each new weight version."""

    def __init__(self, cfg_data: dict, policy_path: str, store, threads: int = 1):
        from roll_spotlight.config.strict import from_dict
        from roll_spotlight.runtime.trainer_core import TrainerCore
        from roll_spotlight.config.run import RunConfig

        _torch_setup(threads)
        self.core = TrainerCore(from_dict(RunConfig, cfg_data), load_policy(policy_path))
        self.store = store
        self.events: list[dict] = []
        self.publish()

    def _record(self, phase: str, start: float) -> None:
        self.events.append({"worker": "trainer", "phase": phase, "start": start, "end": time.time()})

    def publish(self) -> int:
        self.store.publish(self.core.weight_version, self.core.policy.published_state())
        return self.core.weight_version

    def use_queue_training(self, queue, inbox, poll_s: float = 0.002) -> None:
        """Train each update through the queue: the rollout workers pull its micro-batches too."""
        from roll_spotlight.runtime.queue_training import QueueMicroBatches

        self.core.use_queue(QueueMicroBatches(queue, inbox, poll_s=poll_s))

    def train(self, outputs, prompts, group_ids, rewards, baselines=None) -> dict:
        t0 = time.time()
        metrics = self.core.train(outputs, prompts, group_ids, rewards, baselines)
        self.publish()
        self._record("train", t0)
        return metrics

    def evaluate(self):
        t0 = time.time()
        result = self.core.evaluate()
        self._record("validate", t0)
        return result

    def weight_version(self) -> int:
        return self.core.weight_version

    def save(self, path: str) -> None:
        self.core.save(path)

    def load(self, path: str) -> int:
        self.core.load(path)
        return self.publish()

    def timeline(self) -> list[dict]:
        return list(self.events)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=3)
class RewardActor:
    """Batched reward scoring (the configured reward behind SafeReward).

    Crash recovery: Ray restarts the actor when its process dies and re-sends the call that was
    running, so the driver's `score` simply returns later with the right rewards (a reward is a
    pure function of images and prompts, so the retried batch scores the same). A crash is not a
    reward error: the batch is retried, not given SafeReward's fallback. A batch that kills the
    process on every try (a native crash on some input) is retried 3 times, then the driver gets
    the RayActorError instead of a restart loop (the run stops; `--resume` continues it).

    No double counting: a call carrying a `batch_id` already scored in this life returns the
    stored result without scoring or counting again (a driver that retries on its own, or a retry
    of a call whose reply was lost). `counters` count each batch once per life of the actor.

    `crash_at_batch` is deterministic failure injection for tests: the first life of the actor
    dies (os._exit) when its crash_at_batch-th batch arrives, before scoring it.
    """

    KEEP_RESULTS = 256  # recent batch results kept for repeated batch ids (streamed batches are small)

    def __init__(self, cfg_data: dict, crash_at_batch: int | None = None):
        from roll_spotlight.config.strict import from_dict
        from roll_spotlight.config.run import RunConfig
        from roll_spotlight.rewards.configured import configured_reward

        self.reward_fn = configured_reward(from_dict(RunConfig, cfg_data).reward)
        self.events: list[dict] = []
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self._crash_at = None if self.restarted else crash_at_batch
        self._results: dict = {}
        self.counters = {"batches": 0, "samples": 0, "repeats": 0}

    def score(self, images, prompts, batch_id=None):
        if batch_id is not None and batch_id in self._results:
            self.counters["repeats"] += 1
            return self._results[batch_id]
        if self._crash_at is not None and self.counters["batches"] + 1 == self._crash_at:
            import os

            log.warning("reward actor: injected crash at batch %d", self._crash_at)
            os._exit(1)
        t0 = time.time()
        out = self.reward_fn(images, list(prompts))
        self.counters["batches"] += 1
        self.counters["samples"] += len(prompts)
        self.events.append({"worker": "reward", "phase": "reward", "start": t0, "end": time.time()})
        if batch_id is not None:
            self._results[batch_id] = out
            while len(self._results) > self.KEEP_RESULTS:
                self._results.pop(next(iter(self._results)))
        return out

    def stats(self) -> dict:
        return dict(self.counters) | {"restarted": self.restarted}

    def timeline(self) -> list[dict]:
        return list(self.events)


@ray.remote(num_cpus=0, max_concurrency=4)
class RolloutWorker:
    """Pulls requests from the queue and runs them; never pushed to.

    `serve()` runs the pull loop (in one of the actor's threads) until `stop()`, or until a
    preemption notice arrives: then the worker finishes the denoising step it is in, commits the
    in-flight state to the queue (another worker resumes it) and returns.

    `unsaved_steps()` says how many denoising steps of the lease in hand are not yet in the queue
    (neither committed nor checkpointed): what a kill right now would throw away. The spot pool
    reads it just before it kills a worker, to count lost work.

    `hold_at_step` is deterministic failure injection for tests (as torchft's `fail_at`): a lease
    that reaches that step index parks the worker after the step until `notify_preemption()` or
    `stop()` (or a kill), and `wait_held()` returns once it is parked.

    Batched leases (`dispatch.pull_batch` = B, the queue's `QueueConfig.pull_batch`): one pull
    leases up to B requests; the worker runs them one after another and reports the finished ones
    with the next pull (`complete_and_pull`: one queue call a batch, not two a request, which is
    what lets one queue actor serve thousands of workers). Before each lease after a batch's first
    it heartbeats (one call extends them all) once `heartbeat_s` has passed since the queue last
    extended them, so the unstarted ones do not expire while it works. A notice, `leave_group()`
    or `stop()` ends the batch between leases: the finished ones are completed, the one in flight
    is committed (after a notice or leave; a stop lets it finish), and the unstarted ones are
    released (handed back, not a failure), so nothing is lost and nothing runs twice. B = 1 is the
    old loop: pull one, run it, report it.

    `sp` (a `runtime.sp_group.SPMembership`) makes the worker one rank of an SP rollout group
    (`runtime.sp_group`): `serve()` first joins the group, then the group serves as one worker.
    `group_name` is the name the group is known by in the queue: its leader's (rank 0) name.

    Regroups (driven by `elastic.groups.ElasticGroups`): `leave_group()` makes the worker's group
    commit after the step in hand and return from `serve()` like a notice does, but the worker
    stays (the queue is not told it goes away); `serve(sp=...)` then joins the next group with
    the weights in memory. A newcomer takes the current weights from a peer instead of the weight
    store: `publish_weights()` on the peer and `adopt_weights()` on the newcomer (CPU: the
    newcomer's parameters become views of the peer's object in the node's shared memory), or
    `send_weights()` / `receive_weights()` (GPU: a device-to-device broadcast).
    """

    def __init__(self, name: str, policy_path, queue, store, *, threads: int = 1,
                 commit_every: int = 0, kinds=None, hold_at_step: int | None = None,
                 sp=None, group_name: str | None = None, heartbeat_s: float = 5.0, inbox=None,
                 hold_at_micro_batch: int | None = None):
        from roll_spotlight.dispatch.actor import QueueClient
        from roll_spotlight.runtime.executor import RolloutExecutor

        _torch_setup(threads)
        self.name, self.store, self.kinds = name, store, kinds
        self.client = QueueClient(queue, name)
        self.counters = {"completed": 0, "committed": 0, "steps": 0, "weight_fetches": 0,
                         "groups_joined": 0, "peer_weight_copies": 0, "micro_batches": 0,
                         "micro_batches_refused": 0, "micro_batches_released": 0}
        self.sp, self.leader = None, True
        if sp is not None:
            self._set_group(sp, group_name)
        self.executor = RolloutExecutor(load_policy(policy_path), commit_every=commit_every)
        self.training = None
        if inbox is not None:  # queue training: this worker computes micro-batches of updates too
            from roll_spotlight.runtime.queue_training import WorkerTraining

            self.training = WorkerTraining(self.executor.policy, inbox)
        self._hold_at_mb = hold_at_micro_batch
        self._micro_run = 0  # micro-batches computed in this worker's life (for the hold)
        self.version: int | None = None
        self._stop = threading.Event()
        self._notice = threading.Event()
        self._leave = threading.Event()
        self._weights_lock = threading.Lock()  # a version change and a publish never interleave
        self._published = None  # (version, [ObjectRef]) of publish_weights
        self._shared_weights = False  # parameters are read-only views of a peer's object
        self._hold_at = hold_at_step
        self._held = threading.Event()
        self._release = threading.Event()
        self._progress: tuple[int, int] | None = None  # (steps reached, last step the queue holds)
        self._unreported = 0  # steps of finished leases whose results are not yet with the queue
        self.heartbeat_s = heartbeat_s  # keep well under the queue's lease_s (30 s by default)
        self._extended = 0.0  # time.monotonic() when the queue last extended this worker's leases
        self._last_call_s = 0.0
        self._queue_use = {"calls": 0, "queue_s": 0.0, "run_s": 0.0, "empty_pulls": 0, "idle_s": 0.0}
        self.events: list[dict] = []

    def _ensure_version(self, version: int) -> None:
        if version != self.version:
            with self._weights_lock:
                self._own_weights()
                self.executor.policy.load_published_state(self.store.fetch(version))
                self.executor.invalidate()
                self.version, self._published = version, None
                self.counters["weight_fetches"] += 1

    def _own_weights(self) -> None:
        """Before writing weights in place: views of a peer's read-only object become private."""
        if self._shared_weights:
            from roll_spotlight.elastic.transfer import own_weights

            own_weights(self.executor.policy)
            self._shared_weights = False

    def serve(self, sp=None, group_name: str | None = None) -> dict:
        """The pull loop; returns the worker's counters when it stops or is preempted.

        ``sp`` (with ``group_name``) joins a new SP rollout group for this call, replacing the one
        given at construction: after a group member's notice made the group commit and return,
        its surviving workers re-form a group under a fresh prefix with their weights still in
        memory (no new process, no reload), and the committed lease resumes on it. Give the new
        group a fresh ``group_name`` too: the queue keeps refusing leases to a name that had a
        notice (the old group's)."""
        self._leave.clear()  # a leave_group() or its hold release belonged to the last serve()
        if not (self._notice.is_set() or self._stop.is_set()):
            self._release.clear()
        if sp is not None:
            self._set_group(sp, group_name)
        if self.sp is not None:
            return self._serve_group()
        done, idle = [], 0.002
        while not self._ending():
            leases, done = self._lease(done), []
            if not leases:
                time.sleep(idle)
                idle = min(idle * 2, 0.05)
                continue
            idle = 0.002
            done = self._run_batch(leases)
        self._report(done)
        return dict(self.counters)

    def _ending(self) -> bool:
        """This serve() ends: a stop, a notice or a leave_group() (this worker's own flags)."""
        return self._stop.is_set() or self._notice.is_set() or self._leave.is_set()

    def _queue_call(self, method: str, *args, **kwargs):
        """``self.client.<method>(...)``, its time counted in `queue_use()`."""
        start = time.perf_counter()
        try:
            return getattr(self.client, method)(*args, **kwargs)
        finally:
            self._last_call_s = time.perf_counter() - start
            self._queue_use["calls"] += 1
            self._queue_use["queue_s"] += self._last_call_s

    def _lease(self, done: list) -> list:
        """Report the finished ``(lease, output)`` pairs of the last batch and lease the next one
        in one round trip (the queue's ``dispatch.pull_batch`` requests at most)."""
        kinds = self._pull_kinds()
        if done:
            _, leases = self._queue_call("complete_and_pull", done, kinds=kinds)
            self._unreported = 0
        else:
            leases = self._queue_call("pull_batch", kinds=kinds)
        if leases:
            self._extended = time.monotonic()
        else:  # idle polling: time with nothing to do, not the queue's cost
            self._queue_use["empty_pulls"] += 1
            self._queue_use["idle_s"] += self._last_call_s
            self._queue_use["queue_s"] -= self._last_call_s
        return leases

    def _pull_kinds(self):
        """What this worker leases: its ``kinds``, less training micro-batches when it has no inbox.
        An SP group trains too: its ranks data-parallel (`runtime.queue_training.group_sum`)."""
        from roll_spotlight.dispatch.requests import RequestKind

        if self.training is not None:
            return self.kinds
        return tuple(k for k in (self.kinds or RequestKind) if k is not RequestKind.TRAIN)

    def _group_lease(self, done: list) -> list:
        """The leader's pull for its SP group: a TRAIN batch gets one pull's worth per rank."""
        from roll_spotlight.runtime.queue_training import TRAIN_ONLY, group_batch

        return group_batch(self._lease(done), self.sp.size, lambda n: self._queue_call("pull", n, kinds=TRAIN_ONLY))

    def _train_batch(self, leases: list, group=None) -> None:
        """Compute a batch of TRAIN leases into one gradient sum and report it (queue training;
        in an SP group every rank computes its share and the leader reports the group's sum).
        Between micro-batches (rounds, in a group) a stop, notice or leave ends the sum: what
        finished is reported, the rest handed back. A refused report (a lease revoked meanwhile)
        has the queue requeue it."""
        t0 = time.time()
        self._ensure_version(leases[0].request.weight_version)
        ran, accepted = self.training.run(self.client.worker, leases, self._between_micro_batches, group)
        if self.leader:
            self.counters["micro_batches" if accepted else "micro_batches_refused"] += ran
            if ran < len(leases):
                self.counters["micro_batches_released"] += self._queue_call("release")
        self.events.append({"worker": self.name, "phase": "train", "start": t0, "end": time.time(),
                            "micro_batches": ran, "accepted": accepted})

    def _between_micro_batches(self) -> bool:
        """Called after each micro-batch of a sum (each round, in an SP group): keeps the batch's
        leases alive, honours a hold (`hold_at_micro_batch`: parks after that many micro-batches,
        or rounds, of this worker's life), and says whether the sum must end here."""
        self._micro_run += 1
        if self._micro_run == self._hold_at_mb:
            self._held.set()
            self._release.wait()
        if self.leader:
            self._keep_leases()
        return self._ending()

    def _report(self, done: list) -> None:
        """Complete finished ``(lease, output)`` pairs without leasing more (the serve is ending)."""
        if done:
            self._queue_call("complete_many", done)
            self._unreported = 0

    def _run_batch(self, leases: list, group=None) -> list:
        """Run ``leases`` in order; returns the finished ``(lease, output)`` pairs for the next pull
        to report (a follower's list stays empty). Between leases a stop, notice or leave (on any
        rank of a group) ends the batch: the leader completes what finished, its commit of the
        lease in flight is already in, and it releases the leases not started; returns []."""
        from roll_spotlight.dispatch.requests import RequestKind
        from roll_spotlight.runtime.executor import Finished

        if leases[0].request.kind is RequestKind.TRAIN:  # a batch of TRAIN leases has no other kind
            self._train_batch(leases, group)
            return []
        done, started = [], 0
        for lease in leases:
            if started and (self._ending() if group is None else group.any(self._ending())):
                break
            if started and self.leader:
                self._keep_leases()
            started += 1
            outcome = self._run(lease, group)
            if not isinstance(outcome, Finished):
                break  # committed (a notice or leave in flight)
            if self.leader:
                done.append((lease, outcome.output))
        else:
            return done
        if self.leader:
            self._report(done)
            if started < len(leases):
                self._queue_call("release")  # the unstarted ones: every lease still held
        return []

    def _keep_leases(self) -> None:
        """Extend the batch's unstarted leases (one heartbeat for all) when ``heartbeat_s`` has
        passed since the queue last did: a batch outlives one lease otherwise."""
        if time.monotonic() - self._extended >= self.heartbeat_s:
            self._queue_call("heartbeat")
            self._extended = time.monotonic()

    def _set_group(self, sp, group_name: str | None) -> None:
        from roll_spotlight.dispatch.actor import QueueClient

        self.sp, self.leader = sp, sp.rank == 0
        self.client = QueueClient(self.client.handle, group_name or self.name)
        self.counters["sp_size"] = sp.size

    def _serve_group(self) -> dict:
        """The pull loop of an SP group member (protocol in `runtime.sp_group`): the leader pulls,
        every rank runs the lease, stop decisions are collective."""
        from roll_spotlight.runtime.sp_group import SPRolloutGroup

        t0 = time.time()
        group = SPRolloutGroup(self.executor.policy, self.sp)
        self.counters["groups_joined"] += 1
        self.events.append({"worker": self.name, "phase": "sp_join", "start": t0, "end": time.time(),
                            "prefix": self.sp.prefix, "size": self.sp.size})
        done, idle = [], 0.002
        try:
            while not group.any(self._ending()):
                leases = group.lead(lambda: self._group_lease(done))  # the batch, on every rank
                done = []
                if not leases:
                    if group.leader:  # the others wait in the next collective
                        time.sleep(idle)
                        idle = min(idle * 2, 0.05)
                    continue
                idle = 0.002
                done = self._run_batch(leases, group)
            if self.leader:
                self._report(done)
        finally:
            group.close()
        return dict(self.counters)

    def _run(self, lease, group=None):
        """Run one lease; the leader commits it if it stopped early. Returns the outcome (a
        finished one is reported with the batch)."""
        from roll_spotlight.runtime.executor import Finished

        t0 = time.time()
        start = lease.resume.step_index if lease.resume is not None else 0
        self._progress = (start, start)
        self._ensure_version(lease.request.weight_version)
        should_stop = self._should_stop if group is None else (lambda: group.any(self._should_stop()))
        outcome = self.executor.run(lease, should_stop, on_checkpoint=self._checkpoint if self.leader else None,
                                    decode=self.leader)
        self._progress = (start + outcome.steps_run, self._progress[1])
        self.counters["steps"] += outcome.steps_run
        self._queue_use["run_s"] += time.time() - t0
        if not self.leader:  # the leader hands the result or the state to the queue
            self._progress = None
            self.events.append({"worker": self.name, "phase": lease.request.kind.value, "start": t0, "end": time.time()})
            return outcome
        if isinstance(outcome, Finished):
            self._unreported += outcome.steps_run  # lost if killed before the batch is reported
            self.counters["completed"] += 1
        else:
            self._queue_call("commit", outcome.state)
            self.counters["committed"] += 1
        self._progress = None
        now = time.time()
        self.events.append({"worker": self.name, "phase": lease.request.kind.value, "start": t0, "end": now})
        if not isinstance(outcome, Finished):
            self.events.append({"worker": self.name, "phase": "commit", "start": now, "end": now})
        return outcome

    def _should_stop(self) -> bool:
        """Polled by the executor after every step but the last: counts progress, honours a hold."""
        step, durable = self._progress
        self._progress = (step + 1, durable)
        if step + 1 == self._hold_at:
            self._held.set()
            self._release.wait()
        return self._notice.is_set() or self._leave.is_set()

    def _checkpoint(self, state) -> None:
        self._queue_call("checkpoint", state)
        self._progress = (self._progress[0], state.step_index)

    def notify_preemption(self, seconds_left: float) -> None:
        """A preemption notice: stop after the current step and commit (see `serve`). The queue
        hears of it under the name it knows: the worker's, or its SP group's."""
        self.client.handle.notify_preemption.remote(self.client.worker, seconds_left)
        now = time.time()
        self.events.append({"worker": self.name, "phase": "notice", "start": now, "end": now})
        self._notice.set()
        self._release.set()

    def stop(self) -> None:
        self._stop.set()
        self._release.set()

    def leave_group(self) -> None:
        """End this `serve()` for a regroup: the group commits after the step in hand (collective,
        as on a notice) and returns; the worker keeps its weights for its next group."""
        self._leave.set()
        self._release.set()

    # ---- newcomer weights from a peer (elastic.transfer) ----

    def weight_version(self) -> int | None:
        return self.version

    def prepare_standby(self) -> int:
        """Pay a new process's first-use costs before it is on a critical path: map the node's
        shared-memory object store (about 60 ms for a first read of a large object) and run one
        two-step rollout of the empty prompt, discarded (a process's first forward pass costs
        about half a step more than later ones: allocator and kernel set-up). The spot launcher
        admits a node's workers into SP groups only after this. Returns the process id."""
        import os

        import numpy as np
        import ray

        from roll_spotlight.dispatch import RequestKind, RequestSpec, Schedule
        from roll_spotlight.dispatch.requests import Lease, Request

        ray.get(ray.put(np.zeros(1 << 18, dtype=np.uint8)))  # above Ray's inline limit: a store object
        spec = RequestSpec(0, "", 0, Schedule(num_steps=2, noise_level=0.7), 0, RequestKind.ROLLOUT, 0)
        self.executor.run(Lease(0, Request.from_spec(0, spec), self.name, float("inf"), None, 1))
        self.executor.invalidate()  # the warm-up's prompt encoding is not kept
        return os.getpid()

    def publish_weights(self) -> tuple[int | None, list]:
        """This worker's weight version and a boxed reference to its published state in the
        node's object store (put once per version): what a newcomer adopts."""
        import ray

        from roll_spotlight.elastic.transfer import published_arrays

        with self._weights_lock:
            if self._published is None or self._published[0] != self.version:
                self._published = (self.version, [ray.put(published_arrays(self.executor.policy))])
            return self._published

    def adopt_weights(self, published: tuple[int, list]) -> float:
        """Take a peer's `publish_weights()`: on CPU the parameters become views of the object
        (zero copy; the node holds one copy for every worker that adopted it), on a GPU they are
        copied to the device. Returns the seconds spent."""
        import ray

        from roll_spotlight.elastic.transfer import load_numpy_state, share_published

        start = time.perf_counter()
        version, (ref,) = published
        state = ray.get(ref)
        with self._weights_lock:
            policy = self.executor.policy
            if policy.device.type == "cpu":
                share_published(policy, state)
                self._shared_weights = True
                self._adopted(version, published)  # a later newcomer can adopt the same object
            else:
                self._own_weights()
                load_numpy_state(policy, state)
                self._adopted(version)
        return time.perf_counter() - start

    def send_weights(self, rendezvous, prefix: str, timeout_s: float) -> int | None:
        """The peer's side of a device-to-device copy (GPU): rank 0 of a two-member group
        ``prefix``; returns the version sent."""
        self._broadcast_weights(rendezvous, prefix, 0, timeout_s)
        return self.version

    def receive_weights(self, rendezvous, prefix: str, version: int, timeout_s: float) -> float:
        """The newcomer's side of :meth:`send_weights` (rank 1); returns the seconds spent."""
        start = time.perf_counter()
        self._broadcast_weights(rendezvous, prefix, 1, timeout_s)
        self._adopted(version)
        return time.perf_counter() - start

    def _broadcast_weights(self, rendezvous, prefix: str, rank: int, timeout_s: float) -> None:
        from roll_spotlight.elastic.comm import make_process_group
        from roll_spotlight.elastic.transfer import broadcast_state

        policy = self.executor.policy
        backend = "nccl" if policy.device.type == "cuda" else "gloo"
        store = rendezvous.connect(timeout_s)
        group = make_process_group(store, prefix, rank, 2, backend=backend, timeout_s=timeout_s,
                                   loopback=rendezvous.loopback)
        with self._weights_lock:
            if rank == 1:
                self._own_weights()
            state = policy.state_dict()
            broadcast_state({k: state[k] for k in policy.published_state()}, group, 0)

    def _adopted(self, version: int | None, published=None) -> None:
        self.executor.invalidate()
        self.version, self._published = version, published
        self.counters["peer_weight_copies"] += 1

    def unsaved_steps(self) -> int:
        if not self.leader:  # an SP follower holds no lease; its leader reports the group's steps
            return 0
        progress = self._progress
        return self._unreported + (0 if progress is None else progress[0] - progress[1])

    def queue_use(self) -> dict:
        """The worker's time with the queue: ``calls`` (every pull, report, commit, checkpoint,
        heartbeat and release), ``queue_s`` their round trips but for the ``empty_pulls`` (pulls
        that leased nothing: idle polling, their ``idle_s`` apart), beside ``run_s`` (running
        leases); ``queue_s / (queue_s + run_s)`` is the queue's share of a busy worker's time."""
        return dict(self._queue_use)

    def wait_held(self, timeout_s: float) -> bool:
        return self._held.wait(timeout_s)

    def stats(self) -> dict:
        return dict(self.counters)

    def timeline(self) -> list[dict]:
        return list(self.events)
