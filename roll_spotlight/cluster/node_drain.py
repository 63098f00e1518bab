"""Ray shell of the notice bridge: find this agent's Ray node and drain it for a preemption.

What ``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION`` does (a hidden CLI command of Ray
2.x), without joining the cluster as a driver: a ``GcsClient`` on the GCS address sends
``DrainNode`` with the reason and the deadline in epoch milliseconds. A preemption drain cannot be
rejected; the node keeps running what it runs, gets no new work, and shows up in the driver's
draining map with that deadline, which `spot_pool.ray_nodes.RayNodeWatcher` turns into NOTICE.
``GcsClient`` and ``autoscaler_pb2`` are Ray's private Python API (checked on Ray 2.60).

The node is found among the alive nodes by id, by ``NodeName`` (``ray start --node-name``, what
the local cluster harness sets: all its nodes share 127.0.0.1) or by the address its raylet
advertises (a pod's or VM's own IP: the default on a real cluster).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

DRAIN_REASON = "DRAIN_NODE_REASON_PREEMPTION"


@dataclass(frozen=True)
class NodeSelector:
    """Which Ray node is this agent's: exactly one of the three."""

    node_id: str | None = None
    node_name: str | None = None
    node_ip: str | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("node_id", "node_name", "node_ip") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"name the node by exactly one of --node-id, --node-name, --node-ip; got {given or 'none'}")

    def matches(self, node_id: str, name: str, ip: str) -> bool:
        if self.node_id:
            return node_id == self.node_id
        if self.node_name:
            return name == self.node_name
        return ip == self.node_ip

    def __str__(self) -> str:
        return next(f"{k}={getattr(self, k)}" for k in ("node_id", "node_name", "node_ip") if getattr(self, k))


class RayNodeDrainer:
    """Drains one node through the GCS at ``address`` (see the module docstring). Connecting
    blocks while the GCS is unreachable, so agents call ``find`` ahead of any notice."""

    def __init__(self, address: str, selector: NodeSelector, *, rpc_timeout_s: float = 5.0) -> None:
        self.address, self.selector, self.rpc_timeout_s = address, selector, rpc_timeout_s
        self._gcs = None

    def find(self) -> str | None:
        """The selected node's id (hex) if it is alive; None if it is not (yet) registered.
        Raises ``ray.exceptions.RpcError`` while the GCS cannot be reached."""
        from ray._raylet import GcsClient

        if self._gcs is None:
            self._gcs = GcsClient(address=self.address)
        for node_id, info in self._gcs.get_all_node_info(timeout=self.rpc_timeout_s).items():
            if info.state == 0 and self.selector.matches(node_id.hex(), info.node_name, info.node_manager_address):
                return node_id.hex()
        return None

    def drain(self, node_id: str, deadline_s: float, message: str) -> tuple[bool, str]:
        """Send the preemption drain; (accepted, why not)."""
        from ray.core.generated import autoscaler_pb2

        assert self._gcs is not None, "find() connects first"
        reason = autoscaler_pb2.DrainNodeReason.Value(DRAIN_REASON)
        args = (node_id, reason, message, int(deadline_s * 1000))
        try:
            accepted, why = self._gcs.drain_node(*args, timeout=self.rpc_timeout_s)
        except TypeError:  # Ray 2.48 (ROLL's pin) takes no timeout here
            accepted, why = self._gcs.drain_node(*args)
        return bool(accepted), str(why)


def rpc_errors() -> tuple[type[BaseException], ...]:
    """What a GCS call raises while the GCS is unreachable or slow (the agent retries on them)."""
    from ray.exceptions import GetTimeoutError, RpcError

    return (RpcError, GetTimeoutError, TimeoutError, ConnectionError)
