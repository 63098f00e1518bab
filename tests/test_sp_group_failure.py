"""An SP group member that dies without notice: every other rank's collective fails within
moments, not after the group's timeout. Real processes, gloo, the group of emulated GPUs."""
from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback

import pytest

pytestmark = [pytest.mark.dist]

TIMEOUT_S = 60.0


def _rank(rank: int, size: int, address, results, release) -> None:
    import torch

    from roll_spotlight.elastic.rendezvous import SPMembership
    from roll_spotlight.worker.sp_group import SPRolloutGroup

    try:
        torch.set_num_threads(1)
        group = SPRolloutGroup(None, SPMembership(address, "gen0/spot/sp0", rank, size, TIMEOUT_S))
        group.any(False)
        if rank == size - 1:
            os._exit(0)  # preempted without notice: no goodbye on any connection
        time.sleep(0.5)  # the dead rank is gone before the others' next decision
        start = time.monotonic()
        try:
            while True:
                group.any(False)
        except RuntimeError as err:  # what a worker's serve() does on the way out
            group.abandon(err)
            results.put((rank, time.monotonic() - start, None))
        release.wait(2 * TIMEOUT_S)  # stay alive, as a worker does after a failed serve()
    except Exception:
        results.put((rank, None, traceback.format_exc()))


def test_a_member_dead_without_notice_fails_every_other_rank_at_once() -> None:
    """Rank 3 of 4 exits; gloo breaks only its neighbours' pairs, so without `abandon` the ranks
    blocked on a neighbour that raised wait out the 60-s timeout."""
    from roll_spotlight.elastic.rendezvous import RendezvousHost

    ctx = mp.get_context("spawn")
    host = RendezvousHost("127.0.0.1")
    results, release = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_rank, args=(r, 4, host.address, results, release), daemon=True) for r in range(4)]
    for p in procs:
        p.start()
    try:
        got = sorted(results.get(timeout=TIMEOUT_S / 2) for _ in range(3))
    finally:
        release.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        host.close()
    assert [error for _, _, error in got] == [None] * 3, [e for _, _, e in got if e]
    assert [rank for rank, _, _ in got] == [0, 1, 2]
    assert max(seconds for _, seconds, _ in got) < 10.0, got
