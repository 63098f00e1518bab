"""What runs on the machines of a spot cluster beside Ray, and a whole such cluster on one machine.

- ``notice_agent``: `spotlight notice-agent`, the process a deployer runs on every spot node (a
  systemd unit, a KubeRay sidecar): it turns the cloud's preemption notice into a Ray drain.
- ``node_drain``: the agent's Ray shell, which finds its node and drains it with the deadline.
- ``local_cluster``: a head and spot raylets on one host that a spot trace brings and takes away,
  each with its notice agent answering a ``metadata_stub`` (tests, `python -m benchmarks.cluster_soak`).

Importing this package imports nothing; Ray is imported by the modules that need it.
"""
