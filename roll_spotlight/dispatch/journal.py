"""A write-ahead journal that makes the request queue survive a crash of its process.

The queue is a pure state machine whose every method is deterministic given its arguments and
``now`` (see :mod:`roll_spotlight.dispatch.queue`). So instead of saving the whole state after
every call, the server appends each *mutating* call, with the ``now`` it used, to a log; a
restarted server loads the last compacted state and replays the log, which rebuilds exactly the
same queue, live leases included, so a worker that was running a lease when the queue died
completes it normally afterwards::

    QUEUE.state   (pickle of the queue's fields + the sequence number it includes)
    QUEUE.log     (pickled records: (seq, method, kwargs), appended and flushed per call)

    call --> apply to the queue --> append (seq, method, kwargs) --> reply
    every `compact_every` records: write QUEUE.state atomically, then empty QUEUE.log

Invariants: a record is appended only after the call succeeded (a call that raised changed
nothing); replay skips records whose seq the state already includes, so a crash between writing
the state and emptying the log double-applies nothing; a torn last record (the process died
mid-write) is dropped, which is the same as the call never having happened (its caller saw no
reply and, under Ray's task retries, sends it again).

Known limit: a crash *after* a record is flushed but *before* the reply reaches the caller makes a
retried call apply twice. For complete/commit/checkpoint/fail the second one is rejected by the
lease id (no double counting); a repeated pull leaves one extra lease that expires and is
requeued; a repeated submit would add the batch twice, which is why submitters should check ids.
A batch call is one record, so it replays whole or not at all; repeated, ``complete_many`` and
``complete_and_pull`` answer False for the completions the first attempt already accepted (the
results are stored once), and the repeated pull's extra batch expires and is requeued.

Trust: the files are pickles written by this process for itself, in a directory the runtime
chooses; never point ``path`` at a file someone else can write (docs/security.md).
"""
from __future__ import annotations

import logging
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Attributes of RequestQueue that are configuration or wiring, not state.
_NOT_STATE = ("_clock", "_source", "config")


@dataclass(frozen=True)
class JournalConfig:
    """``path``: the journal's base name (``.state`` and ``.log`` are added). ``compact_every``:
    records between compactions (bounds replay time and log size)."""

    path: str
    compact_every: int = 256

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("journal.path must name a file")
        if self.compact_every < 1:
            raise ValueError(f"journal.compact_every must be >= 1, got {self.compact_every}")


class QueueJournal:
    """Appends records and rebuilds a queue from them (see the module docstring)."""

    def __init__(self, config: JournalConfig) -> None:
        self.config = config
        base = Path(config.path)
        base.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.state_path, self.log_path = base.with_name(base.name + ".state"), base.with_name(base.name + ".log")
        self.seq = 0
        self._good_end = 0
        self._since_compact = 0
        self._fh = None

    # ------------------------------------------------------------- recovery
    def recover(self, queue) -> int:
        """Load the saved state into ``queue`` and replay the log; returns records replayed."""
        included = self._load_state(queue)
        replayed = 0
        for seq, method, kwargs in self._records():
            if seq <= included:
                continue
            getattr(queue, method)(**kwargs)
            self.seq, replayed = seq, replayed + 1
        self.seq = max(self.seq, included)
        if self.log_path.is_file():  # cut a torn tail, or new records would land behind it
            os.truncate(self.log_path, self._good_end)
        self._fh = open(self.log_path, "ab")
        if replayed or included:
            log.warning("request queue recovered from %s: state at record %d + %d replayed records",
                        self.log_path, included, replayed)
        return replayed

    def _load_state(self, queue) -> int:
        if not self.state_path.is_file():
            return 0
        with open(self.state_path, "rb") as fh:
            seq, fields = pickle.load(fh)
        queue.__dict__.update(fields)
        return seq

    def _records(self):
        """The log's complete records; ``_good_end`` is the offset just after the last one."""
        self._good_end = 0
        if not self.log_path.is_file():
            return
        with open(self.log_path, "rb") as fh:
            while True:
                try:
                    record = pickle.load(fh)
                except EOFError:
                    return
                except (pickle.UnpicklingError, ValueError, AttributeError) as err:
                    log.warning("dropping a torn record at the end of %s: %s", self.log_path, err)
                    return
                self._good_end = fh.tell()
                yield record

    # ------------------------------------------------------------- writing
    def append(self, queue, method: str, kwargs: dict[str, Any]) -> None:
        """Record a call that succeeded on ``queue``; compacts every ``compact_every`` records."""
        assert self._fh is not None, "call recover() before append()"
        self.seq += 1
        pickle.dump((self.seq, method, kwargs), self._fh, protocol=pickle.HIGHEST_PROTOCOL)
        self._fh.flush()
        self._since_compact += 1
        if self._since_compact >= self.config.compact_every:
            self.compact(queue)

    def compact(self, queue) -> None:
        """Write the whole state (atomically), then empty the log."""
        fields = {k: v for k, v in queue.__dict__.items() if k not in _NOT_STATE}
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        with open(tmp, "wb") as fh:
            pickle.dump((self.seq, fields), fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, self.state_path)
        self._fh.close()
        self._fh = open(self.log_path, "wb")
        self._since_compact = 0

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
