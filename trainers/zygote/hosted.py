"""Local ranks forked by a rank host (``trainers.zygote.rank_host``), a child of the node's
warm process, for a process that cannot fork them itself (a search trial's trainable runs
in a thread beside Ray's): a multiprocessing-like context whose ``Process`` objects are
those ranks, so ``trainers.ranks.RankRunner`` watches them as it watches its own.

One host serves one process (``host_context``) and is kept for its life: a trainable kept
between trials and exploits forks each start's ranks from the same host. The host lives
while this process holds its two sockets (to the host and to the warm process); this
process's end, however it comes, ends the host, and the host's end its ranks.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import sys
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable

from api.cluster_contract import RANK_HOST_MODULE
from trainers.zygote import client, peer
from trainers.zygote.protocol import LineReader, socket_path
from trainers.zygote.rank_host import STATUS, send_message

START_TIMEOUT_S = 30.0  # the host answers a fork at once; a loaded node may be slow

_host: "RankHost | None" = None


class RankHost:
    """This process's connection to its rank host."""

    def __init__(self, control: socket.socket, reader: LineReader, pid: int) -> None:
        self.control, self.reader, self.pid = control, reader, pid

    def alive(self) -> bool:
        try:
            return self.control.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def close(self) -> None:
        self.control.close()
        self.reader.sock.close()


class HostedRank:
    """One rank the host forked: ``pid``, ``sentinel`` (readable once it ended),
    ``join`` and ``exitcode`` as a ``multiprocessing.Process`` has them."""

    def __init__(self, host: RankHost, target: Callable, args: tuple, name: str = "") -> None:
        self.host, self.name = host, name
        self.plan, self.rank, self.link = args
        self.pid: int | None = None
        self.exitcode: int | None = None
        self.status: socket.socket | None = None

    @property
    def sentinel(self) -> int:
        return self.status.fileno()

    def start(self) -> None:
        mine, theirs = socket.socketpair()
        self.status = mine
        body = pickle.dumps((list(sys.path), os.getcwd(), bytes(ForkingPickler.dumps(self.plan)), self.rank))
        try:
            send_message(self.host.control, body, [self.link.fileno(), theirs.fileno()])
        finally:
            theirs.close()
        mine.settimeout(START_TIMEOUT_S)
        self.pid = _read_status(mine)
        if self.pid is None:
            raise OSError("the rank host did not fork the rank")
        mine.settimeout(None)

    def join(self, timeout: float | None = None) -> None:
        if self.exitcode is not None or self.status is None:
            return
        if wait([self.status], timeout):
            code = _read_status(self.status)
            self.exitcode = code if code is not None else -9  # the host died: so did the rank
            self.status.close()


class HostContext:
    """What ``RankRunner._start`` takes from a multiprocessing context."""

    def __init__(self, host: RankHost) -> None:
        self.host = host

    def Pipe(self, duplex: bool = True) -> tuple[Any, Any]:  # noqa: N802 - as multiprocessing names it
        return mp.Pipe(duplex)

    def Process(self, target: Callable, args: tuple, name: str = "") -> HostedRank:  # noqa: N802
        return HostedRank(self.host, target, args, name)


def host_context(modules: list[str], session_dir: str | None, gcs_address: str | None) -> HostContext | None:
    """A context forking from this process's rank host (started on first use, with
    ``modules`` imported there); None, with a line saying why, when the node's warm
    process cannot serve (the caller forks from a forkserver of its own then)."""
    global _host
    if _host is not None and _host.alive():
        return HostContext(_host)
    if _host is not None:
        _host.close()
        _host = None
    why = _why_not(session_dir, gcs_address)
    if why is None:
        try:
            supervisors = peer.supervisor_pids(gcs_address)
        except Exception as exc:  # noqa: BLE001 - any failure to ask means: do not trust
            supervisors, why = set(), f"could not ask the cluster who the warm process is ({exc})"
    if why is None:
        mine, theirs = socket.socketpair()
        asked = client.ask(
            socket_path(session_dir),
            supervisors,
            RANK_HOST_MODULE,
            modules,
            [theirs.fileno(), sys.stdout.fileno(), sys.stderr.fileno()],
        )
        theirs.close()
        if isinstance(asked, str):
            mine.close()
            why = asked
        else:
            _host = RankHost(mine, *asked)
            print(f"raydock: local ranks forked by rank host {_host.pid} of the warm process", file=sys.stderr)
            return HostContext(_host)
    print(f"raydock: local ranks from a forkserver of this process: {why}", file=sys.stderr, flush=True)
    return None


def _why_not(session_dir: str | None, gcs_address: str | None) -> str | None:
    if client.warm_starts_off():
        return "warm starts are off"
    if not session_dir or not gcs_address:
        return "not in a Ray worker"
    if not os.path.exists(socket_path(session_dir)):
        return "this node has no warm process"
    return None


def _read_status(sock: socket.socket) -> int | None:
    data = b""
    while len(data) < STATUS.size:
        try:
            chunk = sock.recv(STATUS.size - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return STATUS.unpack(data)[0]
