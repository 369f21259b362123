"""A real HTTP server in the test process that takes webhook posts on loopback: it keeps
every post (path, headers, body) and answers each path with the statuses it is told
(then 200), optionally after a delay. ``DripReceiver`` is a hostile one: it never finishes
its answer, a byte every so often, and records when each poster hangs up."""

from __future__ import annotations

import json
import select
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = 0.0  # time.perf_counter() when it arrived

    @property
    def event(self) -> dict:
        return json.loads(self.body)


class _Served:
    """A server on a thread of its own, for a ``with`` block."""

    server: socketserver.BaseServer
    thread: threading.Thread
    stopping: threading.Event

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


class Receiver(_Served):
    def __init__(self) -> None:
        self.posts: list[Received] = []
        self.answers: dict[str, list[int]] = {}  # path -> statuses to answer first, in order
        self.delays: dict[str, list[float]] = {}  # path -> seconds to wait before those answers
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer.lock:
                    outer.posts.append(Received(self.path, dict(self.headers), body, time.perf_counter()))
                    status = (outer.answers.get(self.path) or [200]).pop(0) if outer.answers.get(self.path) else 200
                    delay = outer.delays[self.path].pop(0) if outer.delays.get(self.path) else 0.0
                time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [p for p in self.posts if p.path == path]

    def wait_for(self, path: str, predicate, timeout: float = 60.0) -> list[Received]:
        return _wait(lambda: self.at(path), predicate, timeout, lambda got: f"{path}: {[p.event for p in got]}")


@dataclass
class Try:
    """One post to the drip receiver: when it came, and when and how its connection ended."""

    path: str
    event_id: str
    start: float  # time.perf_counter() once its request was read
    end: float | None = None  # when the connection ended
    cut: bool = False  # the poster hung up (the drip never ends by itself)


class DripReceiver(_Served):
    """A receiver that reads each post, then answers a byte every ``interval_s`` for ever
    (a status line, then one endless header): a post to it ends only when the poster
    hangs up, which it records."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.tries: list[Try] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                conn, head = self.request, b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
                fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                attempt = Try(lines[0].split(" ")[1], fields.get("Raydock-Event-Id", ""), time.perf_counter())
                with outer.lock:
                    outer.tries.append(attempt)
                outer.drip(conn, attempt)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def drip(self, conn: socket.socket, attempt: Try) -> None:
        answer = iter(b"HTTP/1.1 200 OK\r\nX-Drip: ")
        while not self.stopping.is_set():
            # Readable means the poster hung up (it sends nothing more): record it at once.
            if select.select([conn], [], [], self.interval_s)[0] and not conn.recv(4096):
                attempt.cut = True
                break
            try:
                conn.sendall(bytes([next(answer, ord("a"))]))
            except OSError:
                attempt.cut = True
                break
        attempt.end = time.perf_counter()

    def wait_for(self, predicate, timeout: float = 60.0) -> list[Try]:
        def tries() -> list[Try]:
            with self.lock:
                return list(self.tries)

        return _wait(tries, predicate, timeout, lambda got: f"drip tries: {got}")


def _wait(snapshot, predicate, timeout: float, describe):
    """``snapshot()`` once ``predicate`` holds of it; AssertionError (``describe``-d) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = snapshot()
        if predicate(got):
            return got
        time.sleep(0.05)
    raise AssertionError(describe(snapshot()))
