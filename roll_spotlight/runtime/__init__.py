"""The runtime: one iteration loop (the coordinator) over pluggable backends, and the trainer side.

- `coordinator`: the iteration loop shared by every host (standalone CLI and ROLL).
- `local`:       an in-process backend (no Ray): the reference the distributed one must match.
- `ray_backend`: Ray actors for the trainer and reward workers (`actors`), the rollout workers
                 (`worker.actor`), a queue actor and a versioned weight store; simulated GPUs are
                 the custom resources `ondemand_gpu` and `spot_gpu`.
- `trainer_core`, `queue_training`, `emulated_trainer`: the trainer's duties, its updates through
                 the queue, and its emulated twin. The worker's side is `roll_spotlight.worker`.
"""
