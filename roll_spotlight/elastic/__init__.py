"""Elastic sequence parallelism for Qwen-Image DiT rollouts on preemptible GPUs.

Modules (import them directly; this package imports nothing heavy so the pure planner stays cheap):

- ``planner``: pure mapping of live GPUs to SP groups of valid degrees with the fewest moves.
- ``ulysses``: Ulysses attention processor + hooks for diffusers' ``QwenImageTransformer2DModel``.
- ``comm``: collectives on an explicit (possibly raw) process group; generation-prefixed groups.
- ``rollout``: seeded, resumable denoising loop (state at step boundaries).
- ``transfer``: weight sources for newcomers (same-node peer, remote peer, storage).
- ``workers`` / ``controller``: persistent Ray SP workers and the controller that drives regroups.
"""
