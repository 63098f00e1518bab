"""Where SP workers meet to form process groups: a file store on one host, a TCP store across hosts.

The Ray driver hosts the rendezvous (`worker.sp_group.open_rendezvous`); workers connect to it by
the picklable :class:`Rendezvous` inside the :class:`SPMembership` the driver hands them (where to
meet, under which prefix, and each member's rank: `group_memberships` makes one group's).

- ``store_host`` is a loopback address (the default, ``127.0.0.1``): every worker is on this host
  anyway, since no other host can reach a loopback address. The store is then a
  ``torch.distributed.FileStore`` in a private temporary directory (mode ``0700``), so nothing
  listens on a socket for it, and gloo's own pair sockets are bound to ``127.0.0.1``
  (``loopback=True`` in :func:`make_process_group`).
- any other ``store_host``: a ``TCPStore`` (multi-node SP). torch's TCPStore server listens on
  every interface whatever host it is given; see docs/security.md.
"""
from __future__ import annotations

import ipaddress
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from roll_spotlight.checks import require, require_choice, require_number

__all__ = ["Rendezvous", "RendezvousHost", "SPMembership", "group_memberships", "is_loopback"]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Rendezvous:
    """The address of a store: ``kind`` "file" (``path``) or "tcp" (``host``, ``port``)."""

    kind: str
    host: str = ""
    port: int = 0
    path: str = ""

    def __post_init__(self) -> None:
        require_choice("Rendezvous.kind", self.kind, ("file", "tcp"))

    @property
    def loopback(self) -> bool:
        """True when every member is on this host: gloo then binds its sockets to 127.0.0.1."""
        return self.kind == "file" or is_loopback(self.host)

    def connect(self, timeout_s: float) -> dist.Store:
        """A client of the store (workers call this once per rendezvous and keep it)."""
        if self.kind == "file":
            store = dist.FileStore(self.path, -1)
            store.set_timeout(timedelta(seconds=timeout_s))
            return store
        return dist.TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=timeout_s))


@dataclass(frozen=True)
class SPMembership:
    """One worker's place in an SP rollout group: where to meet (``rendezvous``, ``prefix``), its
    ``rank`` of ``size``, and the collectives' timeout."""

    rendezvous: "Rendezvous"
    prefix: str
    rank: int
    size: int
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        require(0 <= self.rank < self.size, "SPMembership.rank", self.rank, f"must be in [0, size={self.size})")
        require_number("SPMembership.timeout_s", self.timeout_s)


def group_memberships(rendezvous: Rendezvous, name: str, size: int, timeout_s: float = 60.0) -> list[SPMembership]:
    """The memberships of one group of ``size`` workers meeting under the prefix ``name``."""
    return [SPMembership(rendezvous, name, rank, size, timeout_s) for rank in range(size)]


class RendezvousHost:
    """The driver's side: owns the store (and its directory, removed on :meth:`close`)."""

    def __init__(self, store_host: str) -> None:
        self._cleanup: weakref.finalize | None = None
        if is_loopback(store_host):
            directory = tempfile.mkdtemp(prefix="spotlight-rdzv-")  # mode 0700
            path = str(Path(directory) / "store")
            self.store: dist.Store = dist.FileStore(path, -1)
            self.address = Rendezvous("file", path=path)
            self._cleanup = weakref.finalize(self, shutil.rmtree, directory, True)
        else:
            self.store = dist.TCPStore(store_host, 0, is_master=True, wait_for_workers=False)
            self.address = Rendezvous("tcp", host=store_host, port=self.store.port)

    def close(self) -> None:
        if self._cleanup is not None:
            self._cleanup()
