"""The SP rendezvous: a file store (no listening socket) when every member is on this host, and
gloo pair sockets bound to 127.0.0.1; a TCP store otherwise. Real processes, gloo."""
from __future__ import annotations

import multiprocessing as mp
import os
import stat
import traceback

import pytest
import torch

from roll_spotlight.elastic.comm import all_gather_cat, make_process_group
from roll_spotlight.elastic.rendezvous import Rendezvous, RendezvousHost, is_loopback

pytestmark = [pytest.mark.dist]


def test_loopback_addresses() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1") and is_loopback("127.0.0.7")
    assert not is_loopback("10.0.0.1") and not is_loopback("0.0.0.0") and not is_loopback("head-node")


def test_loopback_host_uses_a_private_file_store_that_close_removes() -> None:
    host = RendezvousHost("127.0.0.1")
    address = host.address
    assert address.kind == "file" and address.loopback
    directory = os.path.dirname(address.path)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    client = address.connect(5.0)
    client.set("k", b"v")
    assert host.store.get("k") == b"v"
    host.close()
    assert not os.path.exists(directory)


def test_other_hosts_get_a_tcp_store() -> None:
    with pytest.raises(ValueError, match="kind"):
        Rendezvous("udp")
    address = Rendezvous("tcp", host="10.1.2.3", port=1234)
    assert not address.loopback and Rendezvous("tcp", host="127.0.0.1", port=1).loopback


def _listening_ports(pid: int) -> list[str]:
    """Local addresses of TCP sockets in LISTEN state owned by ``pid`` (from /proc, no tools)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        try:
            lines = open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                found.append(fields[1][:width])
    return found


def _member(rank: int, address: Rendezvous, queue) -> None:
    try:
        torch.set_num_threads(1)
        store = address.connect(30.0)
        group = make_process_group(store, "gen0/sp", rank, 2, backend="gloo", loopback=address.loopback)
        out = all_gather_cat(torch.full((1, 2), float(rank)), 0, group)
        queue.put((rank, out.tolist(), _listening_ports(os.getpid()), None))
        group.barrier().wait()  # keep the sockets open until both have looked
    except Exception:  # forwarded to the test process, which fails with it
        queue.put((rank, None, None, traceback.format_exc()))


@pytest.mark.skipif(not os.path.exists("/proc/self/net/tcp"), reason="needs Linux /proc")
def test_gloo_members_meet_through_the_file_store_and_listen_on_loopback_only() -> None:
    host = RendezvousHost("127.0.0.1")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_member, args=(r, host.address, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    host.close()
    for rank, out, listening, error in results:
        assert error is None, error
        assert out == [[0.0, 0.0], [1.0, 1.0]]
        assert listening, "gloo listens for its peer"
        loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 (as /proc prints them)
        assert {addr for addr in listening} <= loopback, f"rank {rank} listens on {listening}"
