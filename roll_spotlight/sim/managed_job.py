"""The baseline users pick for cost (``managed_spot``): the whole job on spot GPUs, checkpointed,
restarted after each preemption, as SkyPilot's managed jobs run it.

Vanilla Flow-GRPO on ``gpus`` spot GPUs (iterations of the simulated vanilla's length) writes a
checkpoint every ``checkpoint_every`` iterations in the background. A reclaimed node kills the job
(its collectives span every GPU; the notice is unused): billing stops, the job waits until the
trace holds ``gpus`` spot GPUs again, relaunches (``restart_s``) and redoes the iterations since
its last durable checkpoint. Without a preemption it is vanilla at the spot price, exactly. Pure:
one pass over the spot feed, no event loop.
"""
from __future__ import annotations

import bisect
import math

from roll_spotlight.sim.costmodel import CostModel
from roll_spotlight.sim.spotfeed import SpotFeed
from roll_spotlight.spot.ledger import CostLedger
from roll_spotlight.spot.market import EventKind

ADAM_STATES_PER_PARAM = 2   # m and v, each the adapters' size
MANAGED_SPOT = "managed_spot"   # its name among a simulation's baselines
# SkyPilot leaves the period to the job; every iteration is this baseline's best case (the recipes save every 30)
CHECKPOINT_EVERY = 1


def checkpoint_bytes(cost: CostModel) -> float:
    """The trainable state a restart needs: the adapters and AdamW's two moments of them."""
    return cost.adapter_bytes() * (1 + ADAM_STATES_PER_PARAM)


def restart_s(cost: CostModel) -> float:
    """A relaunch: node boot, process start, NCCL, base weights and the checkpoint from storage."""
    return cost.cold_join_s() + cost.storage_s(checkpoint_bytes(cost))


def _capacity(feed: SpotFeed) -> tuple[list[float], list[dict[str, str]]]:
    """The feed's event times and, at each, the spot nodes up once all its events applied (node ->
    zone, in the order they came up), from time 0."""
    times, ups, up = [0.0], [{}], {}
    for e in feed.events:
        if e.kind is EventKind.NOTICE:
            continue
        if e.kind is EventKind.NODE_UP:
            up[e.node_id] = e.zone
        else:
            up.pop(e.node_id, None)
        if e.time_s > times[-1]:
            times.append(e.time_s)
            ups.append({})
        ups[-1] = dict(up)
    return times, ups


def simulate_managed_job(feed: SpotFeed, cost: CostModel, *, gpus: int, gpus_per_node: int, iteration_s: float,
                         iterations: int, checkpoint_every: int = CHECKPOINT_EVERY,
                         max_sim_s: float = 90 * 24 * 3600.0) -> dict:
    """The managed job for ``iterations`` iterations of ``iteration_s`` on ``gpus`` spot GPUs of the
    feed (SIMULATED); the dict has the keys of a simulated baseline (``system.BaselineResult``)
    that apply, and ``restarts``, ``redone_iterations``, ``waiting_s``, ``restarting_s``."""
    if gpus < 1 or gpus % gpus_per_node:
        raise ValueError(f"managed job: gpus={gpus} must be a positive multiple of gpus_per_node={gpus_per_node}")
    if type(checkpoint_every) is not int or checkpoint_every < 1:
        raise ValueError(f"managed job: checkpoint_every must be an integer >= 1, got {checkpoint_every!r}")
    (times, ups), ledger = _capacity(feed), CostLedger(feed.prices)
    down_at = {e.node_id: e.time_s for e in feed.events if e.kind is EventKind.NODE_DOWN}
    tally = {"preemptions": 0, "lost_gpu_s": 0.0, "redone_iterations": 0, "waiting_s": 0.0, "restarting_s": 0.0}
    saved, now = 0, 0.0
    save_s, relaunch_s = cost.storage_s(checkpoint_bytes(cost)), restart_s(cost)
    while True:
        at = next((i for i in range(bisect.bisect_right(times, now) - 1, len(times))
                   if len(ups[i]) >= gpus // gpus_per_node), None)
        granted = None if at is None else max(now, times[at])
        if granted is None or granted > max_sim_s:
            raise RuntimeError(f"{MANAGED_SPOT}: {saved} of {iterations} iterations done when the feed ran out of "
                               f"{gpus} spot GPUs (t={now:.0f} s)")
        tally["waiting_s"] += granted - now
        held = list(ups[at].items())[:gpus // gpus_per_node]
        for node, zone in held:
            ledger.start(node, f"spot/{zone}", granted, gpus=gpus_per_node)
        start = granted + (relaunch_s if granted > 0 else 0.0)   # nodes up at 0: started, like vanilla
        down = min(down_at.get(node, math.inf) for node, _ in held)
        tally["restarting_s"] += min(start, down) - granted
        finish = start + (iterations - saved) * iteration_s
        now = finish if finish <= down else max(down, granted)
        for node, _ in held:
            ledger.stop(node, now)
        if finish <= down:
            break
        done = max(0, math.floor((now - start) / iteration_s + 1e-9)) if now > start else 0
        durable = [k for k in range(1, done + 1)
                   if (saved + k) % checkpoint_every == 0 and start + k * iteration_s + save_s <= now]
        kept = durable[-1] if durable else 0
        tally["lost_gpu_s"] += max(0.0, now - (start + kept * iteration_s)) * gpus
        tally["redone_iterations"] += done - kept
        tally["preemptions"] += 1
        saved += kept
    report = ledger.report(now=now)
    spot_usd = sum(p.usd for p in report.pools)
    billed_s = sum(p.gpu_hours for p in report.pools) * 3600.0
    return {"kind": "simulated", "name": MANAGED_SPOT, "system": "managed_job", "ondemand_gpus": 0, "spot_gpus": gpus,
            "checkpoint_every": checkpoint_every, "iterations": iterations, "iteration_s": iteration_s,
            "time_per_iteration_s": now / iterations, "sim_end_s": now,
            "cost_per_iteration_usd": spot_usd / iterations, "ondemand_usd": 0.0, "spot_usd": spot_usd,
            "ondemand_gpu_hours": 0.0, "spot_gpu_hours": billed_s / 3600.0, "ondemand_idle_fraction": 0.0,
            "spot_idle_fraction": 1.0 - iterations * iteration_s * gpus / billed_s if billed_s else 0.0,
            "spot_lost_work_fraction": tally["lost_gpu_s"] / billed_s if billed_s else None,
            "notices": 0, "regroups": 0, "cold_restarts": tally["preemptions"], "commits": 0,
            "restarts": tally["preemptions"], **tally, "restart_s": relaunch_s, "checkpoint_save_s": save_s,
            "explored_seeds_per_iteration": 0.0, "mean_train_phase_s": 0.0, "train": None}
