"""The one driver-side dispatch loop over the request queue actor: submit, poll, collect.

Every host waits for rollouts the same way: each round it runs `tick` (apply due spot-market events,
restart ROLL rollout drains, top up a replay's backlog), takes the queue's completed results and
hands them on, then sleeps `poll_s` until `done()`. Workers pull; nothing is pushed. Used by the Ray
backend (`ray_backend.RayBackend.rollouts`), the ROLL host (`roll.loop.PullDispatch`) and
`spotlight replay` (`tools.replay`).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import ray


def pump(queue, *, done: Callable[[], bool], on_completions: Callable[[list], None],
         tick: Callable[[], None] = lambda: None, poll_s: float = 0.01) -> None:
    """Rounds of tick -> take results -> `on_completions(results)` until `done()` after a round."""
    while True:
        tick()
        on_completions(ray.get(queue.take_results.remote()))
        if done():
            return
        time.sleep(poll_s)


def collect(queue, specs: Sequence, *, tick: Callable[[], None] = lambda: None,
            on_completion: Callable[[object], None] = lambda completion: None, poll_s: float = 0.01) -> list:
    """Submit `specs` and wait for all of them; their outputs in the order of `specs`.

    Outputs are collected by request id, so they do not depend on which worker ran what (or on a
    preemption that moved a request to another worker halfway).
    """
    ids = ray.get(queue.submit.remote(list(specs)))
    done: dict[int, object] = {}

    def take(completions: list) -> None:
        for completion in completions:
            done[completion.request.request_id] = completion.output
            on_completion(completion)

    pump(queue, done=lambda: len(done) >= len(ids), on_completions=take, tick=tick, poll_s=poll_s)
    return [done[i] for i in ids]
