"""Notice bridge latency: from the provider's answer changing to the drain being visible to the driver.

For each provider, a local cluster (``roll_spotlight.cluster.local_cluster``: a head and
``--repeats`` spot raylets, each kept busy by an actor so a drain does not end it at once, each with
its notice agent at the agent's default poll interval) and a driver whose ``RayNodeWatcher`` polls
every ``--watch-s``. One node per repeat (a drained node cannot be undrained): at a random phase
of the agent's poll cycle the node's metadata answer flips (aws, gcp, azure: the loopback stub
answers as the provider documents; k8s: the agent gets SIGTERM), and the time until the watcher
reports NOTICE for that node is one sample. Medians and maxima per provider; target <= 2 s.

What is in a sample: the agent's wait for its next poll (0 for gcp's hanging GET and k8s's
signal), the HTTP answer, one DrainNode to the GCS, and the driver's next read of the draining
map. A training run's pool reads it every ``BACKGROUND_POLL_S`` (0.2 s) instead of ``--watch-s``.

Usage: ``python benchmarks/bridge_latency.py [--providers aws,gcp,azure,k8s] [--repeats 5] [--json]
[--out FILE]``. The 1-minute load average at the end is recorded.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--providers", default="aws,gcp,azure,k8s", help="comma-separated providers")
    p.add_argument("--repeats", type=int, default=5, help="notices (and spot raylets) per provider")
    p.add_argument("--watch-s", type=float, default=0.05, help="how often the driver reads the draining map")
    p.add_argument("--timeout-s", type=float, default=30.0, help="a notice not seen by then counts as missed")
    p.add_argument("--seed", type=int, default=0, help="seeds the poll-cycle phases")
    p.add_argument("--json", action="store_true", help="print only the JSON result")
    p.add_argument("--out", help="also write the JSON result to this file")
    return p.parse_args(argv)


def measure(provider: str, repeats: int, watch_s: float, timeout_s: float, rng: random.Random) -> dict:
    import ray

    from roll_spotlight.cluster.local_cluster import LocalCluster, LocalClusterConfig
    from roll_spotlight.config.run import SPOT_RESOURCE
    from roll_spotlight.spot_pool.ray_nodes import RayNodeWatcher, has_spot_resource
    from roll_spotlight.spot.market import EventKind
    from roll_spotlight.spot.notices import ProviderConfig

    poll_s = ProviderConfig().poll_s  # the agent's default, as deployed
    config = LocalClusterConfig(gpus_per_node=1, provider=provider, notice_s=60.0, agent_poll_s=poll_s)
    names = [f"spot-{i}" for i in range(repeats)]
    samples, missed = [], 0
    with LocalCluster(config) as cluster:
        for name in names:
            cluster.add_spot_node(name)
        cluster.wait_registered(names)
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            ids = cluster.node_ids()
            busy = [_busy_on(ids[name], SPOT_RESOURCE) for name in names]
            ray.get([b.ping.remote() for b in busy])
            watcher = RayNodeWatcher(is_spot=has_spot_resource)
            watcher.due(0.0)
            time.sleep(2 * poll_s)  # every agent found its node and is polling
            for name in names:
                time.sleep(rng.uniform(0.0, poll_s))  # a random phase of the agent's poll cycle
                start = time.monotonic()
                cluster.notice(name, time.time() + 60.0)
                seen = _wait_notice(watcher, ids[name], start, watch_s, timeout_s, EventKind.NOTICE)
                if seen is None:
                    missed += 1
                else:
                    samples.append(seen)
        finally:
            ray.shutdown()
    return {"provider": provider, "agent_poll_s": poll_s, "samples_s": [round(s, 4) for s in samples],
            "median_s": statistics.median(samples) if samples else None, "max_s": max(samples, default=None),
            "missed": missed}


def _busy_on(node_id: str, resource: str):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, resources={resource: 1})
    class Busy:
        """Keeps its node from being idle: a drained idle raylet exits at once."""

        def ping(self) -> int:
            return 1

    return Busy.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()


def _wait_notice(watcher, node_id: str, start: float, watch_s: float, timeout_s: float, notice_kind) -> float | None:
    while time.monotonic() - start < timeout_s:
        now = time.monotonic() - start
        if any(e.kind is notice_kind and e.node_id == node_id for e in watcher.due(now)):
            return time.monotonic() - start
        time.sleep(watch_s)
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    rng = random.Random(args.seed)
    results = [measure(p.strip(), args.repeats, args.watch_s, args.timeout_s, rng) for p in args.providers.split(",")]
    every = [s for r in results for s in r["samples_s"]]
    out = {"kind": "measured", "target_s": 2.0, "watch_s": args.watch_s, "repeats": args.repeats,
           "providers": results, "median_s": statistics.median(every) if every else None,
           "max_s": max(every, default=None), "missed": sum(r["missed"] for r in results),
           "load_1min": round(os.getloadavg()[0], 2)}
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    if args.json:
        print(json.dumps(out))
    else:
        for r in results:
            print(f"{r['provider']:6s} median {r['median_s']} s  max {r['max_s']} s  missed {r['missed']}  "
                  f"(agent poll {r['agent_poll_s']} s)")
        print(f"all    median {out['median_s']} s  max {out['max_s']} s  (target <= 2 s; load {out['load_1min']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
