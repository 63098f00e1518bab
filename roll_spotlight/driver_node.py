"""Where the driver's own actors go on a multi-node cluster: the driver's node.

The request queue, the weight store and the reward actors ask Ray for no resource, so Ray may
place them on any node, a spot node included, where a preemption would take the run's queue or
weights with it; a *soft* affinity to the driver's node does not prevent that (docs/cluster.md).
They are pinned with a hard affinity to the node of the process creating them: the driver, which
runs on the on-demand head (``ray job submit``, KubeRay's head pod, or a driver attached to its
host's head). They need no resource, so that node can always take them; if it dies the run is
over anyway.
"""
from __future__ import annotations


def on_driver_node() -> dict:
    """Ray actor options pinning the actor to the calling process's node (Ray must be up)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)}
