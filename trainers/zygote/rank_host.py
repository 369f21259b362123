"""A search trial's rank host: a child of the node's warm process that forks the trial's
local ranks for its trainable, run as ``python -m trainers.zygote.rank_host MODULE...``
by the warm process (``trainers.zygote.server``) on the trainable's request
(``trainers.zygote.hosted``).

A trainable forks no ranks itself: it runs in a thread beside Ray's own, so it would
need a forkserver, a fresh Python importing torch (seconds, and four of them at once
when a population starts). This process is a fork of the warm process, which imported
torch and Ray Train once for the node, so it is ready at once; it imports the modules
named on its command line (the loop's), then serves its one trainable over its stdin, a
unix socket:

- the trainable sends ``(sys.path, cwd, plan)`` for each rank (the plan pickled, as
  multiprocessing's forkserver sends it) with two descriptors, the rank's end of its
  pipe to the trainable and the rank's status socket;
- this process forks the rank (``trainers.rank_worker.run_rank``: its own process group,
  ``PR_SET_PDEATHSIG`` so it dies with this process), writes its pid on the status
  socket, and its exit code there once it ends.

It ends, killing every rank it forked, when its trainable hangs up (its stdin closes);
a trainable killed outright also closes its connection to the warm process, which ends
this process's process group (``trainers.zygote.child``), and the ranks die with it.
"""

from __future__ import annotations

import importlib
import os
import pickle
import selectors
import signal
import socket
import struct
import sys

from trainers.zygote.protocol import ended_children

LENGTH = struct.Struct("!I")
STATUS = struct.Struct("!q")  # the rank's pid, then its exit code (negative: the signal)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a plan holds the loop's config and its starting checkpoint's path


def recv_message(sock: socket.socket, maxfds: int = 2) -> tuple[bytes, list[int]] | None:
    """One length-prefixed message and the descriptors sent with it; None at EOF."""
    head, fds, _flags, _addr = socket.recv_fds(sock, LENGTH.size, maxfds)
    if not head:
        return None
    while len(head) < LENGTH.size:
        more = sock.recv(LENGTH.size - len(head))
        if not more:
            return None
        head += more
    (size,) = LENGTH.unpack(head)
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"a message of {size} bytes")
    body = bytearray()
    while len(body) < size:
        chunk = sock.recv(min(1 << 20, size - len(body)))
        if not chunk:
            return None
        body += chunk
    return bytes(body), fds


def send_message(sock: socket.socket, body: bytes, fds: list[int]) -> None:
    data = LENGTH.pack(len(body)) + body
    sent = socket.send_fds(sock, [data[:65536]], fds)
    if sent < len(data):
        sock.sendall(data[sent:])


class RankHost:
    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.ranks: dict[int, int] = {}  # pid -> its status socket's fd
        self.sel = selectors.DefaultSelector()
        self.wakeup: tuple[int, ...] = ()

    def serve(self) -> None:
        rfd, wfd = self.wakeup = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wfd)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through the pipe
        self.sel.register(self.control, selectors.EVENT_READ, "control")
        self.sel.register(rfd, selectors.EVENT_READ, "signal")
        try:
            while True:
                for key, _ in self.sel.select():
                    if key.data == "control" and not self.take():
                        return
                    if key.data == "signal":
                        try:
                            os.read(rfd, 4096)
                        except BlockingIOError:
                            pass
                self.reap()
        finally:
            for pid in list(self.ranks):
                _kill_group(pid)

    def take(self) -> bool:
        """Fork the rank the trainable asked for; False when it hung up."""
        try:
            message = recv_message(self.control)
        except (OSError, ValueError) as exc:
            print(f"raydock: rank host {os.getpid()}: bad request ({exc}); ending", file=sys.stderr, flush=True)
            return False
        if message is None:
            return False
        body, fds = message
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            return True  # not a rank's request: its status socket never hears of a pid
        link_fd, status_fd = fds
        pid = os.fork()
        if pid == 0:
            self.become_rank(body, link_fd, status_fd)
        os.close(link_fd)
        self.ranks[pid] = status_fd
        _write_status(status_fd, pid)
        return True

    def become_rank(self, body: bytes, link_fd: int, status_fd: int) -> None:
        code = 1
        try:
            os.close(status_fd)
            for fd in self.ranks.values():
                os.close(fd)
            self.sel.close()
            self.control.close()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in self.wakeup:
                os.close(fd)
            path, cwd, plan_bytes, rank = pickle.loads(body)
            os.chdir(cwd)
            sys.path[:] = path
            from multiprocessing.connection import Connection

            from trainers.rank_worker import run_rank

            run_rank(pickle.loads(plan_bytes), rank, Connection(link_fd))  # never returns
        except BaseException:  # noqa: BLE001 - whatever fails before the loop runs, the trainable sees the exit code
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)

    def reap(self) -> None:
        for pid, code in ended_children():
            fd = self.ranks.pop(pid, None)
            if fd is not None:
                _write_status(fd, code)
                os.close(fd)


def _write_status(fd: int, value: int) -> None:
    try:
        os.write(fd, STATUS.pack(value))
    except OSError:  # the trainable is gone
        pass


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the rank and whatever it started
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str]) -> int:
    for name in argv:  # the loop's module and what its ranks import: once here, not in each rank
        try:
            importlib.import_module(name)
        except ImportError as exc:
            print(f"raydock: rank host: could not import {name} ({exc}); each rank imports it", file=sys.stderr)
    control = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)  # the ranks' stdin: they never hold the trainable's socket
    os.dup2(devnull, 0)
    os.close(devnull)
    RankHost(control).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
