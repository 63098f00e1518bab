"""The runtime: one iteration loop (the coordinator) over pluggable backends.

- `executor`:    runs one leased request on a policy, one denoising step at a time, committing its
                 in-flight state when told to stop (pure torch; no Ray).
- `coordinator`: the iteration loop shared by every host (standalone CLI and ROLL).
- `local`:       an in-process backend (no Ray): the reference the distributed one must match.
- `ray_backend`: Ray actors for trainer, rollout workers and reward workers, a queue actor and a
                 versioned weight store; simulated GPUs are the custom resources
                 `ondemand_gpu` and `spot_gpu`.
"""
