"""What the client and the warm process say to each other over the node's unix socket,
and where that socket lives. Standard library only: the client imports it.

The request is one length-prefixed JSON document (argv, cwd, environment, the client's
Python and code version) with the client's stdin, stdout and stderr attached as
SCM_RIGHTS. The answers are JSON lines: ``{"accepted": true, "pid": N}`` or
``{"accepted": false, "reason": ...}``, then ``{"exit": code}`` (a negative code: the
driver was killed by that signal).

The socket is ``<Ray session dir>/raydock/zygote.sock``: the session dir is per cluster
and only this user's (the local head's temp dir is 0700), the socket is 0600, and the
warm process serves only peers of its own uid.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
import socket
import struct
from pathlib import Path
from typing import Iterator

from api.cluster_contract import DRIVER_MODULES, WARM_IDLE_ENV, WARM_SOCKET_ENV

DRIVERS = DRIVER_MODULES
SOCKET_DIR = "raydock"
SOCKET_NAME = "zygote.sock"
MAX_REQUEST_BYTES = 16 * 1024 * 1024  # the environment holds the job's runtime_env as JSON
MAX_FDS = 3
START_ENV = WARM_SOCKET_ENV  # set by the client for the cold driver it execs: start the pool
IDLE_ENV = WARM_IDLE_ENV  # how long a node's pool waits for a job before it exits
CODE_PACKAGES = ("api", "trainers", "tuning")
_LEN = struct.Struct("!I")


def session_dir() -> str | None:
    """The Ray session dir of this Ray job's entrypoint: Ray writes the entrypoint's stdout
    to ``<session dir>/logs/job-driver-<id>.log``. None outside a Ray job."""
    try:
        target = os.readlink("/proc/self/fd/1")
    except OSError:
        return None
    path = Path(target)
    if path.parent.name != "logs" or not path.name.startswith("job-driver-"):
        return None
    return str(path.parent.parent)


def socket_path(session: str) -> str:
    return os.path.join(session, SOCKET_DIR, SOCKET_NAME)


def code_version(root: str) -> str:
    """A digest of raydock's code under ``root`` (each .py file's path, size and mtime):
    a warm process that imported other code than the client would run refuses the job."""
    h = hashlib.sha256(os.path.realpath(root).encode())
    for package in CODE_PACKAGES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, package)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith(".py"):
                    st = os.stat(os.path.join(dirpath, name))
                    h.update(f"{os.path.relpath(dirpath, root)}/{name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:16]


def send_request(sock: socket.socket, request: dict, fds: list[int]) -> None:
    body = json.dumps(request).encode()
    data = _LEN.pack(len(body)) + body
    sent = sock.sendmsg([data[:4096]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    if sent < len(data):  # (an empty send to a peer that has answered and hung up would raise EPIPE)
        sock.sendall(data[sent:])


def recv_request(sock: socket.socket) -> tuple[dict, list[int]]:
    """The request and the fds that came with it; ValueError for a malformed one (its fds closed)."""
    fds = array.array("i")
    data, ancdata, _flags, _addr = sock.recvmsg(4096, socket.CMSG_SPACE(MAX_FDS * fds.itemsize))
    for level, kind, cdata in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(cdata[: len(cdata) - (len(cdata) % fds.itemsize)])
    try:
        if len(data) < _LEN.size:
            raise ValueError("short request")
        (size,) = _LEN.unpack(data[: _LEN.size])
        if size > MAX_REQUEST_BYTES:
            raise ValueError(f"request of {size} bytes")
        body = bytearray(data[_LEN.size :])
        while len(body) < size:
            chunk = sock.recv(min(1 << 20, size - len(body)))
            if not chunk:
                raise ValueError("request cut short")
            body += chunk
        request = json.loads(bytes(body[:size]))
        if not isinstance(request, dict) or len(fds) != MAX_FDS:
            raise ValueError("a request is a JSON object sent with 3 file descriptors")
    except (ValueError, OSError):
        for fd in fds:
            os.close(fd)
        raise
    return request, list(fds)


def ended_children() -> Iterator[tuple[int, int]]:
    """(pid, exit code) of each child of this process that has ended, without waiting; a
    negative code: the signal that killed it."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


def send_line(sock: socket.socket, message: dict) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


class LineReader:
    """JSON lines from a socket; ``next()`` returns None at EOF."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, b""

    def next(self) -> dict | None:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)
