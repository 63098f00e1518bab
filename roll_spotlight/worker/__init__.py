"""The worker: what a rollout worker runs, whatever hosts it (a Ray actor, a ROLL rank, the trainer).

- `loop`:          the one worker loop between two leases (`WorkerLoop`).
- `compute`:       a policy's work (`ModelCompute`): rollouts through `engine`, training micro-batches.
- `engine`:        leases of one shape denoised together, one forward per step, each resumable (no Ray).
- `sp_group`:      an SP rollout group of several workers denoising one image.
- `emulated`:      emulated GPUs: a worker's compute waiting calibrated durations.
- `actor`:         the rollout worker as a Ray actor; `policy_source`: what a worker loads.
- `outputs`, `faults`: what a rollout returns; deterministic failure injection for tests.
"""
