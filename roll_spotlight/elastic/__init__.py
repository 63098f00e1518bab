"""Elastic Ulysses sequence parallelism for Qwen-Image DiT rollouts on preemptible GPUs.

Modules (import them directly; this package imports nothing heavy so the pure planner stays cheap):

- ``group_plan``: pure mapping of live GPUs to SP groups of valid degrees with the fewest moves.
- ``ulysses``: Ulysses attention processor + hooks for diffusers' ``QwenImageTransformer2DModel``.
- ``comm``: collectives on an explicit (possibly raw) process group; generation-prefixed groups.
- ``rendezvous``: where and how group members meet (a private file store on one host, TCP across
  hosts; each member's ``SPMembership``).
- ``transfer``: where a newcomer's weights come from (same-node peer, remote peer, the weight
  store) and how (zero-copy shared memory on CPU, device to device on GPUs).
- ``groups``: the driver of regroups over the live rollout workers (`worker.actor.RolloutWorker`
  in `worker.sp_group` groups): survivors re-form under a fresh generation prefix with their
  weights in memory, newcomers copy from a peer, the committed lease resumes at any degree.
"""
