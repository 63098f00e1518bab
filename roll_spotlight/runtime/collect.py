"""The one driver-side dispatch loop over the request queue actor: submit, poll, collect.

Every host waits for rollouts the same way: each round it runs `tick` (apply due spot-market events,
restart ROLL rollout drains, top up a replay's backlog), takes the queue's completed results and
hands them on, then sleeps `poll_s` until `done()`. Workers pull; nothing is pushed. Used by the Ray
backend (`ray_backend.RayBackend.rollouts`), the ROLL host (`roll.cluster_backend.PullDispatch`) and
`python -m benchmarks.replay` (`benchmarks.replay`).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import ray


def pump(queue, *, done: Callable[[], bool], on_completions: Callable[[list], None],
         tick: Callable[[], None] = lambda: None, poll_s: float = 0.01) -> None:
    """Rounds of tick -> take results -> `on_completions(results)` until `done()` after a round.
    A round that takes nothing doubles the wait before the next (up to 8 x `poll_s`), so a long
    phase is not a stream of empty calls on the queue actor and the driver."""
    wait = poll_s
    while True:
        tick()
        results = ray.get(queue.take_results.remote())
        on_completions(results)
        if done():
            return
        wait = poll_s if results else min(2 * wait, 8 * poll_s)
        time.sleep(wait)


def collect(queue, specs: Sequence, *, tick: Callable[[], None] = lambda: None,
            on_completion: Callable[[object], None] = lambda completion: None, poll_s: float = 0.01) -> list:
    """Submit `specs` and wait for all of them; their completions (`dispatch.requests.Completion`)
    in the order of `specs`.

    Completions are collected by request id, so they do not depend on which worker ran what (or on
    a preemption that moved a request to another worker halfway).
    """
    ids = ray.get(queue.submit.remote(list(specs)))
    done: dict[int, object] = {}

    def take(completions: list) -> None:
        for completion in completions:
            done.setdefault(completion.request.request_id, completion)
            on_completion(completion)  # every one, repeats too: the spot pool counts repeats

    pump(queue, done=lambda: len(done) >= len(ids), on_completions=take, tick=tick, poll_s=poll_s)
    return [done[i] for i in ids]


class StreamingScorer:
    """Scores rollouts as they complete, so a slow reward overlaps the rollouts still running.

    Completed images are buffered and sent in batches of `batch_size` to the reward actors in
    turn (`score.remote`, with a batch id so a retried call is answered from the actor's memory);
    `result(ids)` sends what is left and gathers one `RewardOutput` in the order of `ids`. A repeated
    completion of a request (the queue promises none) is scored once.
    """

    def __init__(self, actors: Sequence, batch_ids, batch_size: int) -> None:
        assert actors and batch_size >= 1
        self.actors, self.batch_ids, self.batch_size = list(actors), batch_ids, batch_size
        self._buffer: list = []
        self._seen: set[int] = set()
        self._sent: list[tuple[list[int], object]] = []  # (request ids, ObjectRef of a RewardOutput)

    def add(self, request_id: int, prompt: str, image) -> None:
        if request_id in self._seen:
            return
        self._seen.add(request_id)
        self._buffer.append((request_id, prompt, image))
        if len(self._buffer) >= self.batch_size:
            self._send()

    def _send(self) -> None:
        if not self._buffer:
            return
        import numpy as np

        batch, self._buffer = self._buffer, []
        actor = self.actors[len(self._sent) % len(self.actors)]
        ref = actor.score.remote(np.stack([image for _, _, image in batch]), [prompt for _, prompt, _ in batch],
                                 batch_id=self.batch_ids.next())
        self._sent.append(([rid for rid, _, _ in batch], ref))

    def result(self, ids: Sequence[int]):
        import numpy as np

        from roll_spotlight.rewards import RewardOutput

        self._send()
        rows: dict[int, tuple[float, dict]] = {}
        for rids, out in zip((r for r, _ in self._sent), ray.get([ref for _, ref in self._sent])):
            for i, rid in enumerate(rids):
                rows[rid] = (float(out.rewards[i]), {k: v[i] for k, v in out.info.items()})
        keys = sorted({k for _, info in rows.values() for k in info})
        return RewardOutput(np.array([rows[i][0] for i in ids], dtype=np.float64),
                            {k: np.array([rows[i][1].get(k, np.nan) for i in ids]) for k in keys})
